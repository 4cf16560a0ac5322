//! SSE bodies as OpenAI chat completions and Anthropic messages stream
//! them: text, then tool calls whose arguments arrive in fragments, then
//! the stop reason and usage. For [`crate::Reply::sse`].

use serde_json::{Value, json};

/// A tool call for the SSE builders.
pub struct Call<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub arguments: Value,
}

/// An OpenAI chat completions SSE body: text, then calls (argument text in
/// 7-byte fragments), finish, usage, `[DONE]`.
pub fn openai_sse(text: &str, calls: &[Call<'_>]) -> String {
    let mut out = String::new();
    let mut data = |v: Value| out.push_str(&format!("data: {v}\n\n"));
    data(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}));
    if !text.is_empty() {
        data(json!({"choices": [{"index": 0, "delta": {"content": text}}]}));
    }
    for (i, c) in calls.iter().enumerate() {
        data(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]}}]}),
        );
        let args = c.arguments.to_string();
        let bytes: Vec<char> = args.chars().collect();
        for piece in bytes.chunks(7) {
            let piece: String = piece.iter().collect();
            data(
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}}]}),
            );
        }
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}));
    data(
        json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 40}}}),
    );
    out.push_str("data: [DONE]\n\n");
    out
}

/// An Anthropic messages SSE body: a text block, then tool_use blocks.
pub fn anthropic_sse(text: &str, calls: &[Call<'_>]) -> String {
    let mut out = String::new();
    let mut event = |name: &str, v: Value| out.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": {"input_tokens": 90, "cache_read_input_tokens": 10, "output_tokens": 1}}}),
    );
    let mut index = 0;
    if !text.is_empty() {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        );
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        );
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        );
        index = 1;
    }
    for c in calls {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
        );
        let args = c.arguments.to_string();
        let (a, b) = args.split_at(args.len() / 2);
        for piece in [a, b] {
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}),
            );
        }
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    let stop = if calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 20}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out
}
