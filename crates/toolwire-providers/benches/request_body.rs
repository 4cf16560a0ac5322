//! Building a model request's body: a 20-message path (questions,
//! answers, tool calls and their results) with 15 tools, for each wire
//! format, from the request to the bytes sent.
//!
//! `cargo bench -p toolwire-providers --bench request_body`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
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
        tools: tools().into(),
        turn: 3,
        iteration: 1,
        images: RequestImages::default(),
        reasoning_effort: None,
        response_format: None,
    }
}

/// The bytes sent for a body as the provider builds it.
fn bytes(body: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&body).unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    let request = request();
    assert_eq!(request.messages.len(), 20);
    let openai = OpenAiProvider::new(settings(), "gpt-bench", true);
    let responses = OpenAiResponsesProvider::new(settings(), "o4-mini", true);
    let anthropic = AnthropicProvider::new(settings(), "claude-bench", true);
    let mut group = c.benchmark_group("request_body_20_messages_15_tools");
    group.bench_function("openai_chat", |b| {
        b.iter(|| black_box(bytes(openai.body(black_box(&request)))).len())
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
