//! Bad input gets a clear event naming what was wrong; decoding goes on and
//! nothing already decoded is lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use toolwire_stream::{
    AnthropicDecoder, Decoder, Format, OpenAiChatDecoder, StreamEvent, decode_chunked,
};

fn run(format: Format, input: &[u8]) -> Vec<StreamEvent> {
    decode_chunked(format, input, Some(7))
        .into_iter()
        .map(|e| e.event)
        .collect()
}

fn messages(events: &[StreamEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ParseError { message }
            | StreamEvent::ProviderError { message }
            | StreamEvent::LimitExceeded { message } => Some(message.clone()),
            StreamEvent::ToolCallFailed { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

fn text(events: &[StreamEvent]) -> String {
    events.iter().filter_map(StreamEvent::text).collect()
}

/// A line over the limit is its own kind of event, which callers treat as
/// the end of the call (the engine does); the decoder itself goes on.
#[test]
fn overlong_sse_line_is_reported_and_skipped() {
    let big = "x".repeat(200);
    let input = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{big}\"}}}}]}}\n\n\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"ok\"}}}}]}}\n\n"
    );
    let mut d = OpenAiChatDecoder::with_max_line(128);
    let mut events = d.feed(input.as_bytes());
    events.extend(d.finish());
    assert_eq!(
        messages(&events),
        ["openai-chat: SSE line 1 is longer than the 128-byte limit; line dropped"]
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, StreamEvent::LimitExceeded { .. })),
        "{events:?}"
    );
    assert_eq!(text(&events), "ok");
}

#[test]
fn invalid_utf8_in_sse_names_the_line() {
    let input = b"event: ping\ndata: {\"type\":\"ping\"}\n\ndata: \xc3\x28\n\n";
    let events = run(Format::Anthropic, input);
    assert_eq!(
        messages(&events),
        ["anthropic: SSE line 4 is not valid UTF-8 (first bad byte at column 7)"]
    );
}

#[test]
fn invalid_utf8_in_xml_text_keeps_the_prose() {
    let events = run(Format::Xml, b"caf\xc3 ok \xff end");
    assert_eq!(text(&events), "caf\u{fffd} ok \u{fffd} end");
    assert_eq!(
        messages(&events),
        [
            "xml: invalid UTF-8 at input byte 3; replaced with U+FFFD",
            "xml: invalid UTF-8 at input byte 8; replaced with U+FFFD"
        ]
    );
    let events = run(Format::Xml, "tail é".as_bytes().split_last().unwrap().1);
    assert_eq!(text(&events), "tail \u{fffd}");
}

#[test]
fn error_body_instead_of_a_stream_is_a_provider_error() {
    let body = br#"{"error": {"message": "Rate limit reached", "type": "requests"}}"#;
    assert_eq!(
        messages(&run(Format::OpenAiChat, body)),
        ["Rate limit reached"]
    );
    assert_eq!(
        messages(&run(Format::OpenAiResponses, body)),
        ["Rate limit reached"]
    );
    let body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert_eq!(
        messages(&run(Format::Anthropic, body)),
        ["overloaded_error: Overloaded"]
    );
}

#[test]
fn garbage_body_is_a_parse_error() {
    for format in [
        Format::OpenAiChat,
        Format::OpenAiResponses,
        Format::Anthropic,
    ] {
        let m = messages(&run(format, b"  {not json at all"));
        assert_eq!(m.len(), 1, "{format}: {m:?}");
        assert!(
            m[0].contains("body is neither SSE nor valid JSON"),
            "{}",
            m[0]
        );
    }
}

#[test]
fn non_streamed_anthropic_message_and_responses_body() {
    let body = json!({
        "type": "message", "role": "assistant", "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.rs"}}
        ],
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 4}
    });
    let events = run(Format::Anthropic, body.to_string().as_bytes());
    assert_eq!(text(&events), "Looking.");
    assert!(events.contains(&StreamEvent::ToolCallReady {
        call_id: "toolu_1".into(),
        name: "read_file".into(),
        server: None,
        arguments: json!({"path": "a.rs"}),
    }));
    assert!(events.iter().any(
        |e| matches!(e, StreamEvent::Usage(u) if u.prompt_tokens == 14 && u.cached_tokens == 4)
    ));

    let body = json!({
        "object": "response", "status": "completed",
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "Hi."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{\"a\":1}"}
        ],
        "usage": {"input_tokens": 3, "output_tokens": 2}
    });
    let events = run(Format::OpenAiResponses, body.to_string().as_bytes());
    assert_eq!(text(&events), "Hi.");
    assert!(events.iter().any(|e| matches!(e, StreamEvent::ToolCallReady { arguments, .. } if arguments == &json!({"a": 1}))));
}

#[test]
fn stream_cut_mid_call_fails_the_call_and_keeps_the_text() {
    let input = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Let me\"}}]}\n\n\
                 data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\"}}]}}]}\n\n";
    let events = run(Format::OpenAiChat, input.as_bytes());
    assert_eq!(text(&events), "Let me");
    assert_eq!(
        messages(&events),
        ["the stream ended before the tool call was closed"]
    );
}

#[test]
fn arguments_that_are_not_an_object_fail() {
    let mut d = AnthropicDecoder::new();
    let mut events = d.feed(
        b"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"g\",\"input\":{}}}\n\n\
          data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"[1, 2]\"}}\n\n\
          data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    events.extend(d.finish());
    assert_eq!(
        messages(&events),
        ["arguments must be a JSON object, got an array"]
    );
}

#[test]
fn nothing_after_done_is_read() {
    let input =
        "data: [DONE]\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"late\"}}]}\n\n";
    let events = run(Format::OpenAiChat, input.as_bytes());
    assert_eq!(text(&events), "");
}

#[test]
fn nothing_after_message_stop_is_read_and_finished_comes_once() {
    let input = "data: {\"type\":\"message_stop\"}\n\n\
                 data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"rm\",\"input\":{}}}\n\n";
    let events = run(Format::Anthropic, input.as_bytes());
    assert_eq!(
        events,
        [StreamEvent::Finished {
            reason: toolwire_stream::FinishReason::Unspecified
        }]
    );
}

#[test]
fn a_repeated_finish_reason_finishes_once() {
    let finish = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    let input = format!("{finish}{finish}data: [DONE]\n\n");
    let events = run(Format::OpenAiChat, input.as_bytes());
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, StreamEvent::Finished { .. }))
            .count(),
        1
    );
}
