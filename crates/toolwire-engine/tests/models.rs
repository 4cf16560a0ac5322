//! Several models in one engine: a turn is answered by the model it names
//! (the default otherwise), and a model that is busy or out of reach hands
//! its step to the next model of its fallback list. Real HTTP over
//! loopback to mock servers speaking OpenAI's and Anthropic's wire
//! formats, recording what they were asked; the store is a real SQLite
//! file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::*;
use toolwire_core::{AgentEvent, Role, StopReason};
use toolwire_engine::{Engine, EngineConfig, EngineError, TurnOptions};
use toolwire_providers::{AnthropicProvider, Models, OpenAiProvider};

fn openai(url: &str, model: &str) -> Arc<OpenAiProvider> {
    Arc::new(OpenAiProvider::new(http(url), model, true))
}

fn anthropic(url: &str, model: &str) -> Arc<AnthropicProvider> {
    Arc::new(AnthropicProvider::new(http(url), model, true))
}

/// `sonnet` (Anthropic, at `sonnet_url`, falling back to `gpt`) and `gpt`
/// (OpenAI, at `gpt_url`), `sonnet` the default.
fn registry(sonnet_url: &str, gpt_url: &str) -> Models {
    Models::new(
        vec![
            model_entry(
                "sonnet",
                "anthropic",
                anthropic(sonnet_url, "claude-sonnet-4-5"),
                &["gpt"],
            ),
            model_entry("gpt", "openai", openai(gpt_url, "gpt-4o-mini"), &[]),
        ],
        Some("sonnet"),
    )
    .unwrap()
}

async fn engine_of(models: Models) -> (Engine, tempfile::TempDir) {
    engine(
        models,
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await
}

fn with_model(name: &str) -> TurnOptions {
    TurnOptions {
        model: Some(name.into()),
        ..TurnOptions::default()
    }
}

/// The fallbacks announced in `conversation`'s stored events.
async fn fallbacks(
    engine: &Engine,
    conversation: toolwire_core::ConversationId,
) -> Vec<AgentEvent> {
    engine
        .events_since(conversation, 0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .filter(|e| matches!(e, AgentEvent::ModelFallback { .. }))
        .collect()
}

#[tokio::test]
async fn each_turn_is_answered_by_the_model_it_names() {
    let sonnet = MockServer::start(vec![Reply::sse(anthropic_sse("From sonnet.", &[]))]).await;
    let gpt = MockServer::start(vec![Reply::sse(openai_sse("From gpt.", &[]))]).await;
    let (engine, _dir) = engine_of(registry(&sonnet.url, &gpt.url)).await;
    let conv = engine.create_conversation(None).await.unwrap();

    // No model named: the default.
    let first = engine.run(conv.id, "hello").await.unwrap();
    let answer = first.final_message.unwrap();
    assert_eq!(answer.text(), "From sonnet.");
    assert_eq!(answer.model.as_deref(), Some("sonnet"));

    // Named: that model, with its own model id, at its own server.
    let second = engine
        .send_with(conv.id, "and you?", None, with_model("gpt"))
        .await
        .unwrap()
        .wait()
        .await;
    let answer = second.final_message.unwrap();
    assert_eq!(answer.text(), "From gpt.");
    assert_eq!(answer.model.as_deref(), Some("gpt"));
    let asked = gpt.received();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].body["model"], "gpt-4o-mini");
    assert_eq!(sonnet.received().len(), 1);
    assert_eq!(sonnet.received()[0].body["model"], "claude-sonnet-4-5");

    // Regenerated with the other model: a sibling written by it, whose
    // request carried the same history.
    let regenerated = engine
        .regenerate_with(answer.id, with_model("sonnet"))
        .await
        .unwrap()
        .wait()
        .await;
    let sibling = regenerated.final_message.unwrap();
    assert_eq!(sibling.parent_id, answer.parent_id);
    assert_eq!(sibling.model.as_deref(), Some("sonnet"));
    let asked = sonnet.received();
    assert_eq!(asked.len(), 2);
    let last_user = asked[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .cloned()
        .unwrap();
    assert_eq!(last_user["content"][0]["text"], "and you?", "{last_user}");

    // A name the registry lacks is refused before anything is stored.
    let before = engine
        .store()
        .children(answer.parent_id.unwrap())
        .await
        .unwrap();
    let refused = engine
        .send_with(conv.id, "?", None, with_model("gemini"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, EngineError::UnknownModel(name) if name == "gemini"),
        "{refused}"
    );
    let after = engine
        .store()
        .children(answer.parent_id.unwrap())
        .await
        .unwrap();
    assert_eq!(before.len(), after.len());
}

#[tokio::test]
async fn an_overloaded_model_hands_the_step_to_its_fallback() {
    // Anthropic's 529, every time (the provider's retries included).
    let sonnet = MockServer::start(vec![faults::anthropic_overloaded()]).await;
    let gpt = MockServer::start(vec![Reply::sse(openai_sse("From the fallback.", &[]))]).await;
    let (engine, _dir) = engine_of(registry(&sonnet.url, &gpt.url)).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut follower = engine.follow(conv.id);

    let outcome = engine.run(conv.id, "hello").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let answer = outcome.final_message.unwrap();
    assert_eq!(answer.text(), "From the fallback.");
    // The stored message names the model that wrote it.
    let stored = engine.store().message(answer.id).await.unwrap();
    assert_eq!(stored.model.as_deref(), Some("gpt"));
    assert_eq!(stored.role, Role::Assistant);

    // Sonnet was asked once and retried by its provider (3 retries);
    // then gpt, once, with its own model id.
    assert_eq!(sonnet.received().len(), 4);
    let asked = gpt.received();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].body["model"], "gpt-4o-mini");
    // Both were sent the conversation (the path moves into the last
    // model's request, and is copied for those with fallbacks left).
    assert!(asked[0].body["messages"].to_string().contains("hello"));
    assert!(
        sonnet.received()[0].body["messages"]
            .to_string()
            .contains("hello")
    );

    // The step keeps why: a stored event tied to the message.
    let [
        AgentEvent::ModelFallback {
            message_id,
            from,
            to,
            reason,
            error,
            ..
        },
    ] = &fallbacks(&engine, conv.id).await[..]
    else {
        panic!("one model_fallback event");
    };
    assert_eq!(*message_id, answer.id);
    assert_eq!((from.as_str(), to.as_str()), ("sonnet", "gpt"));
    assert_eq!(reason, "overloaded");
    assert!(
        error.contains("529") && error.contains("overloaded_error"),
        "{error}"
    );

    // Followers saw it, before the step's first text.
    let mut seen = Vec::new();
    while let Ok(Ok(Some(batch))) =
        tokio::time::timeout(Duration::from_millis(500), follower.next()).await
    {
        seen.extend(batch.into_iter().map(|e| type_of(&e.event)));
        if seen.iter().any(|t| t == "stopped") {
            break;
        }
    }
    let at = |t: &str| seen.iter().position(|s| s == t).unwrap_or(usize::MAX);
    assert!(at("model_fallback") < at("text_delta"), "{seen:?}");
    // Its JSON, as the doors get it.
    let json = serde_json::to_value(&fallbacks(&engine, conv.id).await[0]).unwrap();
    assert_eq!(json["type"], "model_fallback");
    assert_eq!(json["from"], "sonnet");
    assert_eq!(json["to"], json!("gpt"));
}

#[tokio::test]
async fn an_unreachable_model_hands_the_step_to_its_fallback() {
    // A port nothing listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let gpt = MockServer::start(vec![Reply::sse(openai_sse("Reached.", &[]))]).await;
    let (engine, _dir) = engine_of(registry(&closed, &gpt.url)).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "hello").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(outcome.final_message.unwrap().model.as_deref(), Some("gpt"));
    let events = fallbacks(&engine, conv.id).await;
    assert!(
        matches!(&events[..], [AgentEvent::ModelFallback { reason, .. }] if reason == "unreachable"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_bad_request_does_not_fall_back() {
    let sonnet = MockServer::start(vec![Reply::Status {
        code: 400,
        headers: Vec::new(),
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210341 tokens > 200000 maximum"}}"#.into(),
    }])
    .await;
    let gpt = MockServer::start(vec![Reply::sse(openai_sse("Never.", &[]))]).await;
    let (engine, _dir) = engine_of(registry(&sonnet.url, &gpt.url)).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "hello").await.unwrap();
    assert_eq!(outcome.reason, StopReason::LlmApiError);
    assert!(
        outcome
            .error
            .as_deref()
            .unwrap()
            .contains("prompt is too long"),
        "{:?}",
        outcome.error
    );
    // Not retried, not handed on.
    assert_eq!(sonnet.received().len(), 1);
    assert!(gpt.received().is_empty());
    assert!(fallbacks(&engine, conv.id).await.is_empty());
}

#[tokio::test]
async fn when_every_fallback_fails_the_step_fails_naming_the_last() {
    let sonnet = MockServer::start(vec![faults::anthropic_overloaded()]).await;
    let gpt = MockServer::start(vec![faults::openai_server_error(503)]).await;
    let (engine, _dir) = engine_of(registry(&sonnet.url, &gpt.url)).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "hello").await.unwrap();
    assert_eq!(outcome.reason, StopReason::LlmApiError);
    assert!(
        outcome.error.as_deref().unwrap().contains("503"),
        "{:?}",
        outcome.error
    );
    // Each model asked once (with its retries), no loop back.
    assert_eq!(sonnet.received().len(), 4);
    assert_eq!(gpt.received().len(), 4);
    assert_eq!(fallbacks(&engine, conv.id).await.len(), 1);
}
