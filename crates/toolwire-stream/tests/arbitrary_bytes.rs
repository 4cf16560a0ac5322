//! Arbitrary bytes in arbitrary chunks: no decoder panics, and chunking
//! never changes the events. The inputs mix random bytes with pieces of
//! each wire format so that the fuzzing reaches deep parser states. (The
//! coverage-guided version of this check is `fuzz/`, run with cargo fuzz.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use proptest::prelude::*;
use support::*;
use toolwire_stream::Format;

const PIECES: &[&str] = &[
    // XML tool calls and markdown
    "<tool_call>",
    "</tool_call>",
    "<tool_name>",
    "</tool_name>",
    "<server_name>",
    "</server_name>",
    "<arguments>",
    "</arguments>",
    "<![CDATA[",
    "]]>",
    "]]",
    "&lt;",
    "&#x263A;",
    "&amp",
    "<",
    ">",
    "&",
    "```",
    "~~~",
    "`",
    "\n",
    "  ",
    "<tool_",
    "</tool_call",
    "<foo>",
    // JSON
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "\\",
    "\\u00e9",
    "\\ud83d",
    "\\ude00",
    "\"path\"",
    "\"diff\"",
    "true",
    "-1.5e3",
    "null",
    "\\ud83dy",
    "\\q",
    "\u{1}",
    "\t",
    "```ls```",
    "``` x",
    " ",
    "é",
    "日本",
    "🍰",
    // SSE and provider events
    "data: ",
    "event: ",
    "id: 1",
    ": ping",
    "\r\n",
    "\r",
    "\n\n",
    "[DONE]",
    r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"a\":"}}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"","arguments":"1}"}}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
    r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"g","input":{}}}"#,
    r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"k\": \"v"}}"#,
    r#"{"type":"content_block_stop","index":1}"#,
    r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":3}}"#,
    r#"{"type":"message_stop"}"#,
    r#"{"type":"response.output_item.added","item":{"type":"function_call","id":"fc","call_id":"c","name":"h"}}"#,
    r#"{"type":"response.function_call_arguments.delta","item_id":"fc","delta":"{\"x\":[1,"}"#,
    r#"{"type":"response.output_item.done","item":{"type":"function_call","id":"fc"}}"#,
    r#"{"type":"response.completed","response":{"status":"completed"}}"#,
];

fn input() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        3 => prop::sample::select(PIECES).prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 1..8),
        1 => "[a-z ]{1,12}".prop_map(String::into_bytes),
    ];
    prop::collection::vec(piece, 0..60).prop_map(|v| v.concat())
}

fn format() -> impl Strategy<Value = Format> {
    prop::sample::select(Format::ALL.map(|(f, _)| f).to_vec())
}

/// 512 cases by default; `TOOLWIRE_FUZZ_CASES` asks for a longer run.
fn cases() -> u32 {
    std::env::var("TOOLWIRE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_input_any_chunking_same_events(
        format in format(),
        bytes in input(),
        sizes in prop::collection::vec(0usize..=17, 1..8),
    ) {
        let whole = canonical(&feed_sizes(format, &bytes, &[bytes.len().max(1)]));
        let chunked = canonical(&feed_sizes(format, &bytes, &sizes));
        prop_assert_eq!(without_offsets(&chunked), without_offsets(&whole));
        let one = canonical(&feed_sizes(format, &bytes, &[1]));
        prop_assert_eq!(without_offsets(&one), without_offsets(&whole));
    }

    #[test]
    fn xml_prose_is_never_lost(
        text in "[a-z <>`~\n&;!/_\\[\\]]{0,200}",
        sizes in prop::collection::vec(1usize..=9, 1..6),
    ) {
        // Text without a complete `<tool_call>` is all prose, byte for byte.
        prop_assume!(!text.contains("<tool_call>"));
        let events = feed_sizes(Format::Xml, text.as_bytes(), &sizes);
        let prose: String = events.iter().filter_map(|(_, e)| e.text()).collect();
        prop_assert_eq!(prose, text);
    }
}
