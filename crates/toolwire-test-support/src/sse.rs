//! SSE bodies as OpenAI chat completions, the OpenAI Responses API and
//! Anthropic messages stream them: text, then tool calls whose arguments
//! arrive in fragments, then the stop reason and usage. For
//! [`crate::Reply::sse`].

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
    openai_sse_with_usage(
        text,
        calls,
        json!({"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 40}}),
    )
}

/// [`openai_sse`] reporting `usage` (the chunk's `usage` object).
pub fn openai_sse_with_usage(text: &str, calls: &[Call<'_>], usage: Value) -> String {
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
    data(json!({"choices": [], "usage": usage}));
    out.push_str("data: [DONE]\n\n");
    out
}

/// An OpenAI Responses API SSE body: a message item with the text, then
/// `function_call` items (arguments in 7-character deltas), then
/// `response.completed` with usage.
pub fn responses_sse(text: &str, calls: &[Call<'_>]) -> String {
    let mut out = String::new();
    let mut event = |v: Value| {
        let name = v["type"].as_str().unwrap_or("").to_owned();
        out.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    };
    event(
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
    );
    let mut output_index = 0;
    if !text.is_empty() {
        event(
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
        );
        event(
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text}),
        );
        event(
            json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": text}]}}),
        );
        output_index = 1;
    }
    for (i, c) in calls.iter().enumerate() {
        let item_id = format!("fc_{i}");
        let index = output_index + i;
        event(
            json!({"type": "response.output_item.added", "output_index": index, "item": {"type": "function_call", "id": item_id, "call_id": c.id, "name": c.name, "arguments": ""}}),
        );
        let args = c.arguments.to_string();
        let chars: Vec<char> = args.chars().collect();
        for piece in chars.chunks(7) {
            let piece: String = piece.iter().collect();
            event(
                json!({"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": index, "delta": piece}),
            );
        }
        event(
            json!({"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": index, "arguments": args}),
        );
        event(
            json!({"type": "response.output_item.done", "output_index": index, "item": {"type": "function_call", "id": item_id, "call_id": c.id, "name": c.name, "arguments": args}}),
        );
    }
    event(
        json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 40}, "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 8}}}}),
    );
    out
}

/// An Anthropic messages SSE body: a text block, then tool_use blocks.
pub fn anthropic_sse(text: &str, calls: &[Call<'_>]) -> String {
    anthropic_sse_with_usage(
        text,
        calls,
        json!({"input_tokens": 90, "cache_read_input_tokens": 10, "output_tokens": 1}),
    )
}

/// [`anthropic_sse`] with `usage` as `message_start` reports it
/// (`input_tokens`, `cache_read_input_tokens`,
/// `cache_creation_input_tokens`).
pub fn anthropic_sse_with_usage(text: &str, calls: &[Call<'_>], usage: Value) -> String {
    let mut out = String::new();
    let mut event = |name: &str, v: Value| out.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": usage}}),
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
