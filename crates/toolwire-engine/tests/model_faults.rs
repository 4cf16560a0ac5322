//! A faulty model server cannot wedge a conversation nor flood the
//! process: each fault ends its step with an error that names it, within
//! the configured bounds, what the step held and stored stays under the
//! caps, and the conversation then takes the next message and answers it.
//! Real HTTP over loopback to a mock server speaking OpenAI's wire format;
//! the store is a real SQLite file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use support::*;
use toolwire_core::{AgentEvent, ContentBlock, ConversationId, MessageStatus, Role, StopReason};
use toolwire_engine::{Engine, EngineConfig};
use toolwire_providers::{
    EventStream, ModelRequest, OpenAiProvider, Provider, ProviderError, StreamLimits,
};
use toolwire_stream::{FinishReason, StreamEvent};

/// Short bounds, so that every fault shows within seconds.
const FIRST_BYTE: Duration = Duration::from_millis(800);
const IDLE: Duration = Duration::from_millis(800);
const OUTPUT_CAP: usize = 64 * 1024;

fn provider(url: &str) -> Arc<OpenAiProvider> {
    let mut settings = http(url);
    settings.limits = StreamLimits {
        first_byte_timeout: FIRST_BYTE,
        idle_timeout: IDLE,
        ..StreamLimits::default()
    };
    Arc::new(OpenAiProvider::new(settings, "gpt-test", true))
}

fn config() -> EngineConfig {
    EngineConfig {
        max_step_output_bytes: OUTPUT_CAP,
        ..EngineConfig::default()
    }
}

/// An engine on `server` (this file's limits, no tools) and a new
/// conversation in it.
async fn plain_engine(
    server: &MockServer,
    config: EngineConfig,
) -> (Engine, ConversationId, tempfile::TempDir) {
    let (engine, dir) = engine(
        provider(&server.url),
        echo_tools(&[], Duration::ZERO),
        config,
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    (engine, conv.id, dir)
}

/// Sends a first message (met by `fault`), checks that the step ended with
/// an error containing each of `names`, then a second one, which the mock
/// answers normally. Returns the engine, the mock and the first error.
async fn fault_then_answer(
    fault: Reply,
    names: &[&str],
) -> (Engine, MockServer, String, tempfile::TempDir) {
    let server = MockServer::start(vec![fault, Reply::sse(openai_sse("Fine now.", &[]))]).await;
    let (engine, conv, dir) = plain_engine(&server, config()).await;

    let first = tokio::time::timeout(Duration::from_secs(60), engine.run(conv, "hello"))
        .await
        .expect("the faulty step ended")
        .unwrap();
    assert_eq!(first.reason, StopReason::LlmApiError, "{:?}", first.error);
    let error = first.error.clone().unwrap();
    for name in names {
        assert!(error.contains(name), "{name:?} not in {error:?}");
    }
    assert!(!engine.is_running(conv), "the conversation is released");

    let second = engine.run(conv, "again").await.unwrap();
    assert_eq!(second.reason, StopReason::EndTurn, "{:?}", second.error);
    assert_eq!(second.final_message.unwrap().text(), "Fine now.");
    (engine, server, error, dir)
}

use support::faults::openai_rate_limit as retry_after;

#[tokio::test]
async fn retry_after_inf_fails_the_step_at_once() {
    let (_engine, server, error, _dir) = fault_then_answer(
        retry_after("inf"),
        &["429", "an unbounded time", "max_retry_after_secs"],
    )
    .await;
    // Not retried: one request for each message.
    assert_eq!(server.received().len(), 2, "{error}");
}

#[tokio::test]
async fn retry_after_1e300_fails_the_step_at_once() {
    let (_engine, server, _error, _dir) =
        fault_then_answer(retry_after("1e300"), &["429", "max_retry_after_secs"]).await;
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn retry_after_within_the_cap_is_honoured() {
    let server = MockServer::start(vec![
        retry_after("0.2"),
        Reply::sse(openai_sse("After the wait.", &[])),
    ])
    .await;
    let (engine, conv, _dir) = plain_engine(&server, config()).await;
    let outcome = engine.run(conv, "hello").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn an_endless_stream_is_cut_at_the_output_cap_and_what_is_kept_stays_under_it() {
    let delta = |text: &str| {
        format!(
            "data: {}\n\n",
            serde_json::json!({"choices": [{"index": 0, "delta": {"content": text}}]})
        )
    };
    let fault = Reply::Endless {
        start: delta(""),
        repeat: delta(&"la ".repeat(300)),
    };
    let (engine, _server, _error, _dir) =
        fault_then_answer(fault, &["max_step_output_bytes", &OUTPUT_CAP.to_string()]).await;

    // What the step kept: the partial message, marked interrupted, under
    // the cap; and what its events carried to the log, under it too.
    let conv = engine.store().list_conversations().await.unwrap()[0]
        .conversation
        .id;
    let messages = engine.store().messages(conv).await.unwrap();
    let partial = messages
        .iter()
        .find(|m| m.role == Role::Assistant && m.status == MessageStatus::Interrupted)
        .expect("the cut step's message is stored");
    let kept = partial.text().len();
    assert!(kept > OUTPUT_CAP / 2 && kept <= OUTPUT_CAP, "{kept}");
    let logged: usize = engine
        .events_since(conv, 0, 100_000)
        .await
        .unwrap()
        .iter()
        .map(|e| match &e.event {
            AgentEvent::TextDelta { text, .. } => text.len(),
            _ => 0,
        })
        .sum();
    // Both steps' deltas: the cut one's and "Fine now.".
    assert!(logged <= OUTPUT_CAP + "Fine now.".len(), "{logged}");
}

#[tokio::test]
async fn too_many_events_cut_the_step() {
    let fault = Reply::Endless {
        start: String::new(),
        // Tiny deltas: the event cap is reached long before the byte cap.
        repeat: format!(
            "data: {}\n\n",
            serde_json::json!({"choices": [{"index": 0, "delta": {"content": "."}}]})
        ),
    };
    let server = MockServer::start(vec![fault, Reply::sse(openai_sse("Fine now.", &[]))]).await;
    // The byte cap out of the way: deltas read together are joined into
    // one event, so bytes grow faster than events.
    let config = EngineConfig {
        max_step_events: 500,
        max_step_output_bytes: usize::MAX / 2,
        ..config()
    };
    let (engine, conv, _dir) = plain_engine(&server, config).await;
    let first = engine.run(conv, "hello").await.unwrap();
    assert_eq!(first.reason, StopReason::LlmApiError);
    let error = first.error.unwrap();
    assert!(error.contains("max_step_events"), "{error}");
    let second = engine.run(conv, "again").await.unwrap();
    assert_eq!(second.reason, StopReason::EndTurn, "{:?}", second.error);
}

#[tokio::test]
async fn a_stream_that_stalls_after_its_first_bytes_hits_the_idle_timeout() {
    let first = format!(
        "data: {}\n\n",
        serde_json::json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Thinking"}}]})
    );
    let fault = Reply::Stall {
        head: true,
        sent: first,
        for_: Duration::from_secs(30),
    };
    let (engine, _server, _error, _dir) =
        fault_then_answer(fault, &["stalled", "stream_idle_timeout_secs"]).await;
    // What came before the stall is kept, marked interrupted.
    let conv = engine.store().list_conversations().await.unwrap()[0]
        .conversation
        .id;
    let messages = engine.store().messages(conv).await.unwrap();
    assert!(messages.iter().any(|m| m.role == Role::Assistant
        && m.status == MessageStatus::Interrupted
        && m.text() == "Thinking"));
}

#[tokio::test]
async fn a_server_that_sends_headers_and_then_nothing_hits_the_first_byte_timeout() {
    let fault = Reply::Stall {
        head: true,
        sent: String::new(),
        for_: Duration::from_secs(30),
    };
    fault_then_answer(fault, &["first_byte_timeout_secs"]).await;
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_first_byte_timeout() {
    let fault = Reply::Stall {
        head: false,
        sent: String::new(),
        for_: Duration::from_secs(30),
    };
    let (_engine, server, _error, _dir) =
        fault_then_answer(fault, &["sent no response", "first_byte_timeout_secs"]).await;
    // Not retried: the request may be running on the server already.
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn an_html_page_with_200_is_an_error_naming_it() {
    let page = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\
                <body><h1>Bad Gateway</h1>\u{1b}[31m</body></html>";
    let fault = Reply::Status {
        code: 200,
        headers: vec![("content-type".into(), "text/html; charset=utf-8".into())],
        body: page.into(),
    };
    let (_engine, _server, error, _dir) = fault_then_answer(
        fault,
        &["not an event stream", "text/html", "502 Bad Gateway"],
    )
    .await;
    assert!(
        !error.contains('\u{1b}') && !error.contains('\n'),
        "sanitized: {error:?}"
    );
}

#[tokio::test]
async fn a_plain_json_body_is_still_accepted() {
    let body = serde_json::json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Plain JSON."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2}
    });
    let server = MockServer::start(vec![Reply::Status {
        code: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_string(),
    }])
    .await;
    let (engine, conv, _dir) = plain_engine(&server, config()).await;
    let outcome = engine.run(conv, "hello").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(outcome.final_message.unwrap().text(), "Plain JSON.");
}

#[tokio::test]
async fn a_50_mb_line_ends_the_step_with_an_error_naming_it() {
    let mut body = String::with_capacity(50 * 1024 * 1024 + 64);
    body.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"");
    body.extend(std::iter::repeat_n('x', 50 * 1024 * 1024));
    body.push_str("\"}}]}\n\n");
    let fault = Reply::Sse {
        body,
        chunk: 256 * 1024,
        delay: Duration::ZERO,
    };
    let (_engine, server, _error, _dir) = fault_then_answer(
        fault,
        &["decoder limit", "longer than the 4194304-byte limit"],
    )
    .await;
    assert_eq!(server.received().len(), 2);
}

/// A provider whose first call panics (a bug in a provider adapter), and
/// which answers afterwards.
struct PanicsOnce {
    calls: AtomicUsize,
}

#[async_trait]
impl Provider for PanicsOnce {
    fn model(&self) -> &str {
        "panics-once"
    }

    async fn stream(&self, _request: &ModelRequest) -> Result<EventStream, ProviderError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("secret detail: index out of bounds in the adapter");
        }
        let events = vec![
            Ok(StreamEvent::TextDelta {
                text: "Recovered.".into(),
            }),
            Ok(StreamEvent::Finished {
                reason: FinishReason::EndTurn,
            }),
        ];
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

#[tokio::test]
async fn a_panicking_turn_ends_with_an_error_and_releases_the_conversation() {
    let provider = Arc::new(PanicsOnce {
        calls: AtomicUsize::new(0),
    });
    let (engine, _dir) = engine(provider, echo_tools(&[], Duration::ZERO), config()).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);

    let first = engine.run(conv.id, "hello").await.unwrap();
    assert_eq!(first.reason, StopReason::Error);
    let error = first.error.unwrap();
    assert_eq!(error, "internal error in the turn: see the server log");
    // Stored as such, and published: the panic's text goes nowhere but the log.
    let run = engine.store().run(first.run_id).await.unwrap();
    assert_eq!(run.stop_reason, Some(StopReason::Error));
    assert_eq!(run.error.as_deref(), Some(error.as_str()));
    let mut saw_stop = false;
    while let Ok(event) = events.try_recv() {
        let text = serde_json::to_string(&event.event).unwrap();
        assert!(!text.contains("secret detail"), "{text}");
        saw_stop |= matches!(
            &event.event,
            AgentEvent::Stopped {
                reason: StopReason::Error,
                ..
            }
        );
    }
    assert!(saw_stop);
    assert!(!engine.is_running(conv.id));

    let second = engine.run(conv.id, "again").await.unwrap();
    assert_eq!(second.reason, StopReason::EndTurn, "{:?}", second.error);
    assert_eq!(second.final_message.unwrap().text(), "Recovered.");
}

/// A tool whose call panics (a buggy MCP adapter or client tool): its call
/// is answered with an error and the turn goes on.
struct PanickingTool {
    spec: Arc<toolwire_tools::ToolSpec>,
}

#[async_trait]
impl toolwire_tools::Tool for PanickingTool {
    fn spec(&self) -> &Arc<toolwire_tools::ToolSpec> {
        &self.spec
    }

    async fn call(
        &self,
        _arguments: serde_json::Value,
        _ctx: toolwire_tools::ToolContext,
    ) -> Result<toolwire_tools::ToolOutput, toolwire_tools::ToolError> {
        panic!("secret detail: the adapter's state is broken");
    }
}

#[tokio::test]
async fn a_panicking_tool_is_answered_with_an_error_and_the_turn_goes_on() {
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "",
            &[Call {
                id: "call_boom",
                name: "boom",
                arguments: serde_json::json!({}),
            }],
        )),
        Reply::sse(openai_sse("The tool crashed; moving on.", &[])),
        Reply::sse(openai_sse("Next answer.", &[])),
    ])
    .await;
    let mut tools = echo_tools(&[], Duration::ZERO);
    tools.register(Arc::new(PanickingTool {
        spec: Arc::new(toolwire_tools::ToolSpec {
            name: "boom".into(),
            server: None,
            description: "panics".into(),
            parameters: serde_json::json!({"type": "object"}),
            read_only: true,
        }),
    }));
    let (engine, _dir) = engine(provider(&server.url), tools, config()).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let first = engine.run(conv.id, "hello").await.unwrap();
    assert_eq!(first.reason, StopReason::EndTurn, "{:?}", first.error);
    let sent = &server.received()[1].body["messages"];
    let result = sent
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(result["tool_call_id"], "call_boom");
    assert!(
        !result["content"]
            .as_str()
            .unwrap()
            .contains("secret detail")
    );
    let second = engine.run(conv.id, "again").await.unwrap();
    assert_eq!(second.final_message.unwrap().text(), "Next answer.");
    // The stored result is an error.
    let path = engine
        .store()
        .path_to(
            engine
                .store()
                .conversation(conv.id)
                .await
                .unwrap()
                .active_leaf,
        )
        .await
        .unwrap();
    assert!(path.iter().any(|m| {
        m.content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolResult { is_error: true, .. }))
    }));
}

#[tokio::test]
async fn max_tokens_is_always_sent() {
    let server = MockServer::start(vec![Reply::sse(openai_sse("ok", &[]))]).await;
    let (engine, conv, _dir) = plain_engine(&server, config()).await;
    engine.run(conv, "hello").await.unwrap();
    // A local OpenAI-compatible server gets the widely read name.
    assert_eq!(server.received()[0].body["max_tokens"], 1024);
    assert!(
        server.received()[0]
            .body
            .get("max_completion_tokens")
            .is_none()
    );

    // OpenAI's own API and Azure's get the name reasoning models accept;
    // Anthropic the configured value under its only name.
    let request = ModelRequest {
        system: String::new(),
        messages: Vec::new(),
        tools: Vec::new(),
        turn: 0,
        iteration: 1,
        images: Default::default(),
        reasoning_effort: None,
        response_format: None,
    };
    for base in [
        "https://api.openai.com/v1",
        "https://team.openai.azure.com/openai/deployments/x?api-version=1",
    ] {
        let mut settings = http(base);
        settings.max_tokens = 777;
        let body: serde_json::Value = serde_json::from_slice(
            &OpenAiProvider::new(settings, "o3", true)
                .body(&request)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(body["max_completion_tokens"], 777, "{base}");
        assert!(body.get("max_tokens").is_none(), "{base}");
    }
    let mut settings = http("https://api.anthropic.com");
    settings.max_tokens = 777;
    let body: serde_json::Value = serde_json::from_slice(
        &toolwire_providers::AnthropicProvider::new(settings, "claude", true)
            .body(&request)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(body["max_tokens"], 777);
}

/// Credentials in the base URL reach neither the turn's error nor any
/// stored event, whether the server answers with an error that quotes the
/// URL or cannot be reached at all.
#[tokio::test]
async fn credentials_in_the_base_url_are_redacted_from_errors() {
    let server = MockServer::start(vec![Reply::Status {
        code: 400,
        headers: vec![("content-type".into(), "application/json".into())],
        body: String::new(),
    }])
    .await;
    let port = server.url.rsplit(':').next().unwrap().to_owned();
    let with_secrets = format!("http://alice:s3cret@127.0.0.1:{port}/v1?key=k3y&api-version=1");
    // The server quotes the URL it was asked for, as some proxies do.
    let quoting = MockServer::start(vec![Reply::Status {
        code: 400,
        headers: Vec::new(),
        body: format!("bad request for {with_secrets}/chat/completions"),
    }])
    .await;
    let quoting_port = quoting.url.rsplit(':').next().unwrap().to_owned();
    // A port nothing listens on: the connection is refused (held, so that
    // no other test takes it meanwhile).
    let nowhere = support::mcp_http::nothing_listens();
    let closed = nowhere.port;
    for url in [
        with_secrets.clone(),
        with_secrets.replace(&port, &quoting_port),
        with_secrets.replace(&port, &closed.to_string()),
    ] {
        let (engine, _dir) =
            engine(provider(&url), echo_tools(&[], Duration::ZERO), config()).await;
        let conv = engine.create_conversation(None).await.unwrap();
        let outcome = engine.run(conv.id, "hello").await.unwrap();
        assert_eq!(outcome.reason, StopReason::LlmApiError);
        let error = outcome.error.unwrap();
        assert!(error.contains("127.0.0.1"), "{error}");
        let events = serde_json::to_string(
            &engine
                .events_since(conv.id, 0, 1000)
                .await
                .unwrap()
                .iter()
                .map(|e| &e.event)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        for secret in ["s3cret", "k3y", "alice"] {
            assert!(!error.contains(secret), "{secret} in {error}");
            assert!(!events.contains(secret), "{secret} in the events");
        }
    }
    // The URL with its credentials was still the one asked (redaction is
    // for what is shown, not for what is sent).
    let asked = &server.received()[0];
    assert!(asked.path.contains("key=k3y"), "{}", asked.path);
}

#[tokio::test]
async fn a_stream_that_says_it_is_over_ends_the_step_while_its_body_stays_open() {
    // The whole answer and `[DONE]`, then nothing, the body never closed:
    // the step ends at `[DONE]`, without waiting for the idle timeout.
    let open = Reply::Stall {
        head: true,
        sent: openai_sse("Done early.", &[]),
        for_: Duration::from_secs(30),
    };
    let server = MockServer::start(vec![open, Reply::sse(openai_sse("Next.", &[]))]).await;
    let (engine, conv, _dir) = plain_engine(&server, config()).await;
    let first = engine.run(conv, "hello").await.unwrap();
    assert_eq!(first.reason, StopReason::EndTurn, "{:?}", first.error);
    assert_eq!(first.final_message.unwrap().text(), "Done early.");
    let second = engine.run(conv, "again").await.unwrap();
    assert_eq!(second.final_message.unwrap().text(), "Next.");
}
