//! Building a model request's body: a 20-message path (questions,
//! answers, tool calls and their results) with 15 tools, for each wire
//! format, from the request to the bytes sent. `openai_chat_value_tree`
//! is how the body was built before session 30 (a `serde_json::Value` of
//! the whole request, then serialized), kept here only as the figure to
//! compare with; it must give the same bytes.
//!
//! `cargo bench -p toolwire-providers --bench request_body`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use toolwire_core::{ContentBlock, ConversationId, Message, Role, ToolCallId, ToolSpec};
use toolwire_providers::{
    AnthropicProvider, DEFAULT_MAX_TOKENS, HttpSettings, ModelRequest, OpenAiProvider,
    OpenAiResponsesProvider, RequestImages, RetryPolicy, StreamLimits,
};

fn settings() -> HttpSettings {
    HttpSettings {
        base_url: "http://127.0.0.1:1/v1".into(),
        api_key: Some("sk-bench".into()),
        retry: RetryPolicy::default(),
        headers: Vec::new(),
        limits: StreamLimits::default(),
        max_tokens: DEFAULT_MAX_TOKENS,
    }
}

/// 15 tools with schemas the size of the built-in ones.
fn tools() -> Vec<ToolSpec> {
    (0..15)
        .map(|i| ToolSpec {
            name: format!("tool_{i}"),
            server: None,
            description: format!(
                "Tool number {i}: does one thing well, on files of the workspace, and says what it did in a few lines."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "A path relative to the workspace root."},
                    "pattern": {"type": "string", "description": "What to look for: a regular expression."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many."},
                    "options": {"type": "object", "properties": {
                        "case_sensitive": {"type": "boolean"},
                        "context": {"type": "integer", "minimum": 0}
                    }},
                },
                "required": ["path"],
                "additionalProperties": false,
            }),
            read_only: i % 2 == 0,
        })
        .collect()
}

/// 20 messages: questions and answers, and tool calls with their results.
fn path() -> Vec<Message> {
    let c = ConversationId::new();
    let mut out = Vec::new();
    let text = |t: String| ContentBlock::Text { text: t };
    for i in 0..4 {
        out.push(Message::new(
            c,
            None,
            Role::User,
            vec![text(format!(
                "Question {i}: what does the function in src/module_{i}.rs do, and is it correct when the input is empty?"
            ))],
        ));
        out.push(Message::new(
            c,
            None,
            Role::Assistant,
            vec![
                text("Let me read it.".into()),
                ContentBlock::ToolUse {
                    id: ToolCallId(format!("call_{i}")),
                    server: None,
                    name: "tool_1".into(),
                    arguments: json!({"path": format!("src/module_{i}.rs"), "limit": 200}),
                },
            ],
        ));
        out.push(Message::new(
            c,
            None,
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: ToolCallId(format!("call_{i}")),
                content: "fn f(input: &[u8]) -> usize {\n    input.iter().filter(|b| **b == b'\\n').count()\n}\n"
                    .repeat(8),
                is_error: false,
                images: Vec::new(),
            }],
        ));
        out.push(Message::new(
            c,
            None,
            Role::Assistant,
            vec![text(format!(
                "It counts the newlines of its input. With an empty input it returns 0, which is right: module {i} has no other branch. \"Quoted\" and ünïcode text too."
            ))],
        ));
        out.push(Message::new(
            c,
            None,
            Role::User,
            vec![text("Thanks.".into())],
        ));
    }
    out
}

fn request() -> ModelRequest {
    ModelRequest {
        system: "You are a helpful assistant. ".repeat(60),
        messages: path(),
        tools: tools().into_iter().map(Arc::new).collect(),
        turn: 3,
        iteration: 1,
        images: RequestImages::default(),
        reasoning_effort: None,
        response_format: None,
    }
}

/// The bytes sent for a body as the provider builds it.
fn bytes(body: Result<Vec<u8>, toolwire_providers::ProviderError>) -> Vec<u8> {
    body.unwrap_or_default()
}

/// The chat completions body as a `Value` tree, the way it was built
/// before session 30, for the kinds of messages [`path`] has (text, calls,
/// results right after their calls).
fn value_tree_body(request: &ModelRequest) -> Value {
    let mut messages = vec![json!({"role": "system", "content": request.system})];
    for m in &request.messages {
        match m.role {
            Role::User => messages.push(json!({"role": "user", "content": m.text()})),
            Role::Assistant => {
                let mut msg = json!({"role": "assistant", "content": m.text()});
                let calls: Vec<Value> = m
                    .tool_uses()
                    .map(|(id, _, name, args)| {
                        json!({
                            "id": id.0,
                            "type": "function",
                            "function": {"name": name, "arguments": args.to_string()},
                        })
                    })
                    .collect();
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                messages.push(msg);
            }
            Role::Tool | Role::System => {
                for block in &m.content {
                    if let ContentBlock::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } = block
                    {
                        messages.push(json!({"role": "tool", "tool_call_id": tool_use_id.0, "content": content.clone()}));
                    }
                }
            }
        }
    }
    let mut body = json!({
        "model": "gpt-bench",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": messages,
    });
    body["max_tokens"] = json!(DEFAULT_MAX_TOKENS);
    body["tools"] = request
        .tools
        .iter()
        .map(|spec| {
            json!({
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                }
            })
        })
        .collect();
    body
}

fn bench(c: &mut Criterion) {
    let request = request();
    assert_eq!(request.messages.len(), 20);
    let openai = OpenAiProvider::new(settings(), "gpt-bench", true);
    assert_eq!(
        serde_json::to_vec(&value_tree_body(&request)).unwrap_or_default(),
        bytes(openai.body(&request)),
        "the value tree gives the bytes sent"
    );
    let responses = OpenAiResponsesProvider::new(settings(), "o4-mini", true);
    let anthropic = AnthropicProvider::new(settings(), "claude-bench", true);
    let mut group = c.benchmark_group("request_body_20_messages_15_tools");
    group.bench_function("openai_chat", |b| {
        b.iter(|| black_box(bytes(openai.body(black_box(&request)))).len())
    });
    group.bench_function("openai_chat_value_tree", |b| {
        b.iter(|| {
            black_box(serde_json::to_vec(&value_tree_body(black_box(&request))).unwrap_or_default())
                .len()
        })
    });
    group.bench_function("openai_responses", |b| {
        b.iter(|| black_box(bytes(responses.body(black_box(&request)))).len())
    });
    group.bench_function("anthropic", |b| {
        b.iter(|| black_box(bytes(anthropic.body(black_box(&request)))).len())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
