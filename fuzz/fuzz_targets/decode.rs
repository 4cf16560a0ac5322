//! Arbitrary bytes in arbitrary chunks through every decoder: no panic, and
//! the chunking never changes the events.
//!
//! The first byte picks the format, the next four the chunk sizes (1..=16
//! each, cycled); the rest is the input.
#![no_main]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../crates/toolwire-stream/tests/support/mod.rs"]
mod support;

use libfuzzer_sys::fuzz_target;
use toolwire_stream::Format;

fuzz_target!(|data: &[u8]| {
    let [selector, s0, s1, s2, s3, input @ ..] = data else {
        return;
    };
    let format = Format::ALL[usize::from(*selector) % Format::ALL.len()].0;
    let sizes: Vec<usize> = [s0, s1, s2, s3].iter().map(|s| usize::from(**s % 16) + 1).collect();
    let whole = support::canonical(&support::feed_sizes(format, input, &[input.len().max(1)]));
    let chunked = support::canonical(&support::feed_sizes(format, input, &sizes));
    assert_eq!(support::without_offsets(&chunked), support::without_offsets(&whole));
});
