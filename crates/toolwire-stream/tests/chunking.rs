//! Any chunking of a recorded stream gives the same events, and every
//! `ToolCallStarted` comes out of the chunk holding the last byte of the
//! name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use proptest::prelude::*;
use support::*;

/// Checks one fixture under one chunking against its whole-input events.
fn check_chunking(f: &Fixture, sizes: &[usize]) -> Result<(), TestCaseError> {
    let reference = canonical(&feed_sizes(f.format, &f.bytes, &[f.bytes.len().max(1)]));
    let chunked = feed_sizes(f.format, &f.bytes, sizes);
    prop_assert_eq!(
        without_offsets(&canonical(&chunked)),
        without_offsets(&reference),
        "{} with chunk sizes {:?}",
        &f.name,
        sizes
    );

    // The chunk ends of this chunking.
    let mut bounds = Vec::new();
    let mut pos = 0;
    let mut k = 0;
    while pos < f.bytes.len() {
        pos += sizes[k % sizes.len()].max(1).min(f.bytes.len() - pos);
        k += 1;
        bounds.push(pos);
    }
    let one_byte = started(&feed_sizes(f.format, &f.bytes, &[1]));
    let names: Vec<String> = one_byte.iter().map(|(_, n)| n.clone()).collect();
    let expected = expected_name_ends(f.format, &f.bytes, &names);
    for (((exact, name), allowed), (offset, _)) in
        one_byte.iter().zip(&expected).zip(started(&chunked))
    {
        prop_assert!(
            allowed.contains(exact),
            "{}: `{}` started at byte {} with 1-byte chunks; its name ends at {:?}",
            &f.name,
            name,
            exact,
            allowed
        );
        prop_assert_eq!(
            offset,
            ceil_to_boundary(&bounds, *exact),
            "{}: `{}` not started by the chunk ending its name",
            &f.name,
            name
        );
    }
    Ok(())
}

#[test]
fn every_fixture_one_byte_at_a_time() {
    let fixtures = all_fixtures();
    assert!(fixtures.len() >= 30, "fixtures missing: {}", fixtures.len());
    for f in &fixtures {
        check_chunking(f, &[1]).unwrap();
    }
}

#[test]
fn every_fixture_split_in_two_at_every_byte() {
    for f in all_fixtures().iter().filter(|f| f.bytes.len() < 16 * 1024) {
        let reference = without_offsets(&canonical(&feed_cuts(f.format, &f.bytes, &[])));
        for cut in 1..f.bytes.len() {
            let got = without_offsets(&canonical(&feed_cuts(f.format, &f.bytes, &[cut])));
            assert_eq!(got, reference, "{} cut at {cut}", f.name);
        }
    }
}

#[test]
fn tool_calls_are_found_in_every_tool_fixture() {
    // Guards the property tests against fixtures that decode to nothing.
    for f in all_fixtures() {
        let events = whole(f.format, &f.bytes);
        let calls = events
            .iter()
            .filter(|e| matches!(e, toolwire_stream::StreamEvent::ToolCallStarted { .. }))
            .count();
        let expects_calls = !(f.name.contains("text-only")
            || f.name.contains("plain-text")
            || f.name.contains("malformed-json")
            || f.name.contains("reasoning.sse")
            || f.name.ends_with("error.sse"));
        assert_eq!(calls > 0, expects_calls, "{}: {calls} calls", f.name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_chunkings_give_the_same_events(
        index in any::<prop::sample::Index>(),
        sizes in prop::collection::vec(0usize..=64, 1..24),
    ) {
        let fixtures = all_fixtures();
        let f = &fixtures[index.index(fixtures.len())];
        check_chunking(f, &sizes)?;
    }
}
