//! `Decoder::ended`: a stream that says it is over has given every event
//! by then, so the caller may stop reading there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;
use toolwire_stream::{Format, decoder_for};

#[test]
fn once_a_stream_says_it_is_over_no_event_follows() {
    let mut ended = Vec::new();
    for f in all_fixtures() {
        if f.format == Format::Xml {
            continue; // plain text has no end of its own
        }
        let mut decoder = decoder_for(f.format);
        let mut events = Vec::new();
        let mut at = None;
        for (i, byte) in f.bytes.iter().enumerate() {
            events.extend(decoder.feed(std::slice::from_ref(byte)));
            if decoder.ended() {
                at = Some(i + 1);
                break;
            }
        }
        if at.is_some() {
            assert_eq!(events, whole(f.format, &f.bytes), "{}", f.name);
            ended.push(f.name.clone());
        }
    }
    for name in [
        "openai-chat/text-only.sse",
        "anthropic/text-only.sse",
        "openai-responses/reasoning.sse",
    ] {
        assert!(ended.iter().any(|n| n == name), "{name} ended: {ended:?}");
    }
}
