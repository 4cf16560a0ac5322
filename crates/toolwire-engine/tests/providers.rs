//! The engine against mock OpenAI (chat and Responses) and Anthropic
//! servers on loopback: the stored tree, the event sequence, and the
//! request bodies the model saw.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::*;
use toolwire_core::{ContentBlock, MessageStatus, Role, StopReason};
use toolwire_engine::EngineConfig;
use toolwire_providers::{AnthropicProvider, OpenAiProvider, OpenAiResponsesProvider};

#[tokio::test]
async fn openai_parallel_calls_then_answer() {
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Checking both.",
            &[
                Call {
                    id: "call_a",
                    name: "slow",
                    arguments: json!({"path": "a.rs"}),
                },
                Call {
                    id: "call_b",
                    name: "fast",
                    arguments: json!({"path": "b.rs"}),
                },
            ],
        )),
        Reply::sse(openai_sse("Both are fine.", &[])),
    ])
    .await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let mut tools = echo_tools(&["fast"], Duration::ZERO);
    tools.register(echo_tool("slow", Duration::from_millis(150)));
    let (engine, _dir) = engine(provider, tools, EngineConfig::default()).await;
    let conv = engine.create_conversation(None).await.unwrap();

    let outcome = engine.run(conv.id, "check a and b").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(outcome.final_message.unwrap().text(), "Both are fine.");
    assert_eq!(outcome.usage.prompt_tokens, 200);

    // The tree: root → user → assistant (2 calls) → results as they
    // completed (fast first) → final answer.
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let roles: Vec<Role> = path.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Assistant
        ]
    );
    let result_ids: Vec<String> = path[3..5]
        .iter()
        .map(|m| match &m.content[0] {
            ContentBlock::ToolResult { tool_use_id, .. } => tool_use_id.0.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(result_ids, ["call_b", "call_a"], "stored as they complete");
    let assistant = &path[2];
    assert_eq!(assistant.usage.unwrap().cached_tokens, 40);
    assert_eq!(assistant.model.as_deref(), Some("gpt-test"));

    // The second request: the path, with results in the calls' order.
    let received = server.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].path, "/chat/completions");
    assert_eq!(received[0].header("authorization"), Some("Bearer test-key"));
    let tool_names: Vec<&str> = received[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tool_names, ["fast", "slow"]);
    let messages = received[1].body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
    assert_eq!(messages[1]["content"], "check a and b");
    assert_eq!(messages[2]["tool_calls"][0]["id"], "call_a");
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        "{\"path\":\"a.rs\"}"
    );
    assert_eq!(messages[3]["tool_call_id"], "call_a");
    assert_eq!(messages[4]["tool_call_id"], "call_b");
    assert_eq!(messages[3]["content"], "slow got {\"path\":\"a.rs\"}");

    // Events: the name is announced before the message is stored, each
    // tool starts and completes, and the turn ends once.
    let types = event_types(&engine, conv.id).await;
    let first = |t: &str| types.iter().position(|x| x == t).unwrap();
    assert_eq!(types[0], "turn_started");
    assert!(first("tool_call_started") < first("assistant_message_created"));
    assert!(first("argument_field") < first("tool_calls_generated"));
    assert!(first("tool_calls_generated") < first("tool_execution_started"));
    assert_eq!(
        types
            .iter()
            .filter(|t| *t == "tool_execution_completed")
            .count(),
        2
    );
    assert_eq!(
        types
            .iter()
            .filter(|t| *t == "tool_execution_progress")
            .count(),
        2
    );
    assert_eq!(types[types.len() - 2], "final_response");
    assert_eq!(types.last().unwrap(), "stopped");
    let run = engine.store().run(outcome.run_id).await.unwrap();
    assert_eq!(run.stop_reason, Some(StopReason::EndTurn));
}

#[tokio::test]
async fn anthropic_tool_use_and_results_in_one_user_message() {
    let server = MockServer::start(vec![
        Reply::sse(anthropic_sse(
            "Let me look.",
            &[
                Call {
                    id: "toolu_1",
                    name: "fast",
                    arguments: json!({"q": 1}),
                },
                Call {
                    id: "toolu_2",
                    name: "fast",
                    arguments: json!({"q": 2}),
                },
            ],
        )),
        Reply::sse(anthropic_sse("Done.", &[])),
    ])
    .await;
    let provider = Arc::new(AnthropicProvider::new(
        http(&server.url),
        "claude-test",
        true,
    ));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&["fast"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "go").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(
        outcome.usage.prompt_tokens, 200,
        "input + cached, both calls"
    );

    let received = server.received();
    assert_eq!(received[0].path, "/v1/messages");
    assert_eq!(received[0].header("x-api-key"), Some("test-key"));
    assert_eq!(received[0].header("anthropic-version"), Some("2023-06-01"));
    // The system prompt as one text block: it carries a cache breakpoint.
    assert!(
        received[0].body["system"][0]["text"]
            .as_str()
            .unwrap()
            .contains("helpful")
    );
    assert_eq!(
        received[0].body["tools"][0]["input_schema"],
        json!({"type": "object"})
    );
    let messages = received[1].body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(messages[1]["content"][1]["type"], "tool_use");
    assert_eq!(messages[1]["content"][1]["input"], json!({"q": 1}));
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
}

#[tokio::test]
async fn openai_responses_tool_loop_sends_calls_and_outputs_as_items() {
    let server = MockServer::start(vec![
        Reply::sse(responses_sse(
            "Reading both.",
            &[
                Call {
                    id: "call_a",
                    name: "slow",
                    arguments: json!({"path": "a.rs"}),
                },
                Call {
                    id: "call_b",
                    name: "fast",
                    arguments: json!({"path": "b.rs"}),
                },
            ],
        )),
        Reply::sse(responses_sse("Both read.", &[])),
    ])
    .await;
    let provider = Arc::new(OpenAiResponsesProvider::new(
        http(&server.url),
        "o4-mini",
        true,
    ));
    let mut tools = echo_tools(&["fast"], Duration::ZERO);
    tools.register(echo_tool("slow", Duration::from_millis(100)));
    let (engine, _dir) = engine(provider, tools, EngineConfig::default()).await;
    let conv = engine.create_conversation(None).await.unwrap();

    let outcome = engine.run(conv.id, "read a and b").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(outcome.final_message.unwrap().text(), "Both read.");
    assert_eq!(outcome.usage.prompt_tokens, 200);
    assert_eq!(outcome.usage.cached_tokens, 80, "input_tokens_details");

    let received = server.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].path, "/responses");
    assert_eq!(received[0].header("authorization"), Some("Bearer test-key"));
    let first = &received[0].body;
    assert_eq!(first["stream"], true);
    assert_eq!(first["max_output_tokens"], 1024);
    assert!(first["instructions"].as_str().unwrap().contains("helpful"));
    let tool_names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function");
            t["name"].as_str().unwrap()
        })
        .collect();
    assert!(
        tool_names.contains(&"fast") && tool_names.contains(&"slow"),
        "{tool_names:?}"
    );

    // The second request: the user message, the assistant's text, both
    // calls, then both outputs in the calls' order (b finished first).
    let items = received[1].body["input"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message",
            "message",
            "function_call",
            "function_call",
            "function_call_output",
            "function_call_output"
        ]
    );
    assert_eq!(items[0]["role"], "user");
    assert_eq!(items[0]["content"][0]["text"], "read a and b");
    assert_eq!(items[1]["content"][0]["text"], "Reading both.");
    assert_eq!(items[2]["call_id"], "call_a");
    assert_eq!(items[2]["name"], "slow");
    let args: serde_json::Value =
        serde_json::from_str(items[2]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"path": "a.rs"}));
    assert_eq!(items[3]["call_id"], "call_b");
    assert_eq!(items[4]["call_id"], "call_a");
    assert!(
        items[4]["output"].as_str().unwrap().contains("a.rs"),
        "{}",
        items[4]
    );
    assert_eq!(items[5]["call_id"], "call_b");

    // Stored as the other providers' steps are.
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let assistant = &path[2];
    assert_eq!(assistant.model.as_deref(), Some("o4-mini"));
    assert_eq!(assistant.tool_uses().count(), 2);
}

#[tokio::test]
async fn retries_429_with_retry_after_and_500_before_the_first_byte() {
    let server = MockServer::start(vec![
        faults::openai_rate_limit("1"),
        faults::openai_server_error(500),
        Reply::sse(openai_sse("Finally.", &[])),
    ])
    .await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "hi").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let received = server.received();
    assert_eq!(received.len(), 3);
    // The retry came no sooner than the 429's Retry-After said: measured
    // between the two requests the mock saw, not over the whole test.
    assert!(
        received[1].at.duration_since(received[0].at) >= Duration::from_secs(1),
        "Retry-After honoured"
    );
}

#[tokio::test]
async fn client_errors_are_not_retried_and_say_what_happened() {
    let server = MockServer::start(vec![Reply::Status {
        code: 401,
        headers: vec![],
        body: "{\"error\":{\"message\":\"bad key\"}}".into(),
    }])
    .await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "hi").await.unwrap();
    assert_eq!(outcome.reason, StopReason::LlmApiError);
    let error = outcome.error.unwrap();
    assert!(
        error.contains("401") && error.contains("bad key"),
        "{error}"
    );
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_stream_cut_mid_call_keeps_the_text_and_stops_with_an_error() {
    let body = openai_sse(
        "I will write the file now.",
        &[Call {
            id: "call_w",
            name: "fast",
            arguments: json!({"path": "x.rs", "content": "fn main() {}"}),
        }],
    );
    // Cut inside the call's arguments, after its name has streamed.
    let name_event = body.find("\"call_w\"").unwrap();
    let cut_at = body[name_event..].find("\n\n").unwrap() + name_event + 40;
    let server = MockServer::start(vec![Reply::Cut { body, cut_at }]).await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&["fast"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "write it").await.unwrap();
    assert_eq!(outcome.reason, StopReason::LlmApiError);
    assert!(
        outcome.error.as_deref().unwrap().contains("broke"),
        "{:?}",
        outcome.error
    );

    let conv = engine.store().conversation(conv.id).await.unwrap();
    let leaf = engine.store().message(conv.active_leaf).await.unwrap();
    assert_eq!(leaf.role, Role::Assistant);
    assert_eq!(leaf.status, MessageStatus::Interrupted);
    assert_eq!(leaf.text(), "I will write the file now.");
    assert_eq!(
        leaf.tool_uses().count(),
        0,
        "a call from a broken stream is not run"
    );
    let types = event_types(&engine, conv.id).await;
    assert!(types.contains(&"tool_call_started".to_string()));
    assert!(!types.contains(&"tool_execution_started".to_string()));
}

#[tokio::test]
async fn anthropic_overloaded_is_retried_and_an_error_mid_stream_ends_the_step() {
    let server = MockServer::start(vec![
        faults::anthropic_overloaded(),
        faults::anthropic_error_mid_stream("Half an ans"),
        Reply::sse(anthropic_sse("Whole answer.", &[])),
    ])
    .await;
    let provider = Arc::new(AnthropicProvider::new(
        http(&server.url),
        "claude-test",
        true,
    ));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    // 529 before the first byte is retried; the error event after text is
    // not (the answer had begun): the step ends naming it.
    let outcome = engine.run(conv.id, "hi").await.unwrap();
    assert_eq!(outcome.reason, StopReason::LlmApiError);
    let error = outcome.error.unwrap();
    assert!(error.contains("Overloaded"), "{error}");
    assert_eq!(server.received().len(), 2);
    // The conversation takes the next message.
    let next = engine.run(conv.id, "again").await.unwrap();
    assert_eq!(next.reason, StopReason::EndTurn, "{:?}", next.error);
    assert_eq!(next.final_message.unwrap().text(), "Whole answer.");
}
