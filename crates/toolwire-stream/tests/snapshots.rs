//! The event sequences, pinned. Each fixture is fed one byte at a time and
//! shown in canonical form, so `offset` is the earliest byte at which each
//! event was known.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;
use toolwire_stream::{Format, StreamEvent};

fn snapshot_of(name: &str) -> String {
    let f = fixture(name);
    json_lines(&canonical(&feed_sizes(f.format, &f.bytes, &[1])))
}

macro_rules! fixture_snapshots {
    ($($test:ident => $file:literal,)*) => {$(
        #[test]
        fn $test() {
            insta::assert_snapshot!(stringify!($test), snapshot_of($file));
        }
    )*};
}

fixture_snapshots! {
    xml_plain_text => "xml/plain-text.txt",
    xml_one_call => "xml/one-call.txt",
    xml_two_calls_prose_between => "xml/two-calls-prose-between.txt",
    xml_cdata_with_closing_tags => "xml/cdata-with-closing-tags.txt",
    xml_code_fenced => "xml/code-fenced.txt",
    xml_unclosed_call => "xml/unclosed-call.txt",
    xml_invalid_json_arguments => "xml/invalid-json-arguments.txt",
    xml_entities => "xml/entities.txt",
    xml_unknown_element => "xml/unknown-element.txt",
    xml_nested_tool_call => "xml/nested-tool-call.txt",
    xml_whitespace_free => "xml/whitespace-free.txt",
    openai_parallel_tool_calls => "openai-chat/parallel-tool-calls.sse",
    openai_single_tool_call => "openai-chat/single-tool-call.sse",
    openai_text_only => "openai-chat/text-only.sse",
    openai_usage_twice => "openai-chat/usage-twice.sse",
    openai_empty_name_second_chunk => "openai-chat/empty-name-second-chunk.sse",
    openai_no_index => "openai-chat/no-index.sse",
    openai_reasoning_then_call => "openai-chat/reasoning-then-call.sse",
    openai_max_tokens_cutoff => "openai-chat/max-tokens-cutoff.sse",
    openai_crlf => "openai-chat/crlf.sse",
    openai_plain_json => "openai-chat/plain-json.sse",
    openai_malformed_json => "openai-chat/malformed-json.sse",
    openai_invalid_arguments => "openai-chat/invalid-arguments.sse",
    responses_function_call => "openai-responses/function-call.sse",
    responses_text_and_two_calls => "openai-responses/text-and-two-calls.sse",
    responses_custom_tool => "openai-responses/custom-tool.sse",
    responses_reasoning => "openai-responses/reasoning.sse",
    anthropic_tool_use_mid_key_split => "anthropic/tool-use.sse",
    anthropic_text_only => "anthropic/text-only.sse",
    anthropic_tool_no_args => "anthropic/tool-no-args.sse",
    anthropic_thinking_then_tool => "anthropic/thinking-then-tool.sse",
    anthropic_two_tools => "anthropic/two-tools.sse",
    anthropic_max_tokens_unclosed => "anthropic/max-tokens-unclosed.sse",
    anthropic_invalid_json => "anthropic/invalid-json.sse",
    anthropic_error => "anthropic/error.sse",
}

/// One XML call split into two chunks at every byte position: the events
/// never change, and the name is always announced by the chunk that
/// completes `</tool_name>`.
#[test]
fn xml_tag_split_at_every_byte_position() {
    let input = "Sure.\n<tool_call><tool_name>read_file</tool_name>\
                 <arguments>{\"path\": \"a.rs\"}</arguments></tool_call> done";
    let bytes = input.as_bytes();
    let name_end = input.find("</tool_name>").unwrap() + "</tool_name>".len();
    let reference = canonical(&feed_cuts(Format::Xml, bytes, &[]));
    for cut in 1..bytes.len() {
        let events = feed_cuts(Format::Xml, bytes, &[cut]);
        assert_eq!(
            without_offsets(&canonical(&events)),
            without_offsets(&reference),
            "cut at {cut}"
        );
        let started_at = started(&events)[0].0;
        let expected = if cut >= name_end { cut } else { bytes.len() };
        assert_eq!(started_at, expected, "cut at {cut}");
    }
    insta::assert_snapshot!(json_lines(&canonical(&feed_sizes(
        Format::Xml,
        bytes,
        &[1]
    ))));
}

/// A 50 KB diff: the `path` field is complete long before the diff is.
#[test]
fn anthropic_large_diff_reports_path_first() {
    let f = fixture("anthropic/large-diff.sse");
    let events = feed_sizes(f.format, &f.bytes, &[4096]);
    let path_at = events
        .iter()
        .find(|(_, e)| matches!(e, StreamEvent::ArgumentField { key, .. } if &**key == "path"))
        .map(|(o, _)| *o)
        .unwrap();
    let diff_at = events
        .iter()
        .find(|(_, e)| matches!(e, StreamEvent::ArgumentField { key, .. } if &**key == "diff"))
        .map(|(o, _)| *o)
        .unwrap();
    assert!(path_at < 8192, "path known at byte {path_at}");
    assert!(diff_at > 100_000, "diff complete at byte {diff_at}");
    let streamed: String = events
        .iter()
        .filter_map(|(_, e)| match e {
            StreamEvent::ArgumentFieldDelta { key, fragment, .. } if &**key == "diff" => {
                Some(fragment.as_str())
            }
            _ => None,
        })
        .collect();
    let ready = events
        .iter()
        .find_map(|(_, e)| match e {
            StreamEvent::ToolCallReady { arguments, .. } => Some(arguments.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(ready["diff"].as_str().unwrap(), streamed);
    assert!(streamed.len() > 40_000);
}
