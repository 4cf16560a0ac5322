//! Models through the Letta door, over real HTTP: each agent's turns go to
//! the model its `model` names (a Letta handle or a registry name), an
//! unknown handle is refused naming it, `/v1/models` lists the registry,
//! and the tree shows which model wrote each answer. The models are mock
//! servers on loopback speaking OpenAI's and Anthropic's wire formats.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use support::Server;
use toolwire_engine::EngineConfig;
use toolwire_providers::{AnthropicProvider, ModelEntry, Models, OpenAiProvider};
use toolwire_server::ServerSettings;
use toolwire_test_support::{
    MockServer, Reply, anthropic_sse, http, model_entry, openai_sse, script,
};

/// `mini` (OpenAI `gpt-4o-mini`, the default) and `sonnet` (Anthropic
/// `claude-sonnet-4-5`, with a 200k window).
fn two_models(mini_url: &str, sonnet_url: &str) -> Models {
    let mut sonnet = model_entry(
        "sonnet",
        "anthropic",
        Arc::new(AnthropicProvider::new(
            http(sonnet_url),
            "claude-sonnet-4-5",
            true,
        )),
        &[],
    );
    sonnet.info.context_window = Some(200_000);
    Models::new(
        vec![
            model_entry(
                "mini",
                "openai",
                Arc::new(OpenAiProvider::new(http(mini_url), "gpt-4o-mini", true)),
                &[],
            ),
            sonnet,
        ],
        Some("mini"),
    )
    .unwrap()
}

async fn start(dir: &tempfile::TempDir, models: Models) -> Server {
    Server::start_models(
        &dir.path().join("t.db"),
        models,
        ServerSettings::default(),
        EngineConfig::default(),
    )
    .await
}

async fn create_agent(s: &Server, body: Value) -> (u16, Value) {
    s.call("POST", "/v1/agents/", Some(body)).await
}

/// Sends `text` to agent `id`; the assistant's reply text.
async fn ask(s: &Server, id: &str, text: &str) -> String {
    let (status, reply) = s
        .call(
            "POST",
            &format!("/v1/agents/{id}/messages"),
            Some(json!({"messages": [{"role": "user", "content": text}]})),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"]["stop_reason"], "end_turn", "{reply}");
    reply["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["message_type"] == "assistant_message")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .unwrap()
}

#[tokio::test]
async fn each_agent_is_answered_by_its_model() {
    let mini = MockServer::start(vec![Reply::sse(openai_sse("Mini here.", &[]))]).await;
    let sonnet = MockServer::start(vec![Reply::sse(anthropic_sse("Sonnet here.", &[]))]).await;
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir, two_models(&mini.url, &sonnet.url)).await;

    // A: Letta's handle. B: the registry's name.
    let (status, a) = create_agent(
        &s,
        json!({"name": "a", "model": "openai/gpt-4o-mini", "include_base_tools": false}),
    )
    .await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["model"], "openai/gpt-4o-mini");
    assert_eq!(a["llm_config"]["model"], "gpt-4o-mini");
    assert_eq!(a["llm_config"]["model_endpoint_type"], "openai");
    assert_eq!(a["model_settings"]["provider_type"], "openai");
    let (status, b) = create_agent(
        &s,
        json!({"name": "b", "model": "sonnet", "include_base_tools": false,
               "model_settings": {"provider_type": "anthropic", "max_output_tokens": 2048}}),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["model"], "sonnet");
    assert_eq!(b["llm_config"]["model"], "claude-sonnet-4-5");
    assert_eq!(b["llm_config"]["handle"], "anthropic/claude-sonnet-4-5");
    assert_eq!(b["llm_config"]["model_endpoint_type"], "anthropic");
    assert_eq!(b["llm_config"]["context_window"], 200_000);
    // Kept as given.
    assert_eq!(
        b["model_settings"],
        json!({"provider_type": "anthropic", "max_output_tokens": 2048})
    );
    // Without a model: the default's handle.
    let (status, c) = create_agent(&s, json!({"include_base_tools": false})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["model"], "openai/gpt-4o-mini");

    let a_id = a["id"].as_str().unwrap();
    let b_id = b["id"].as_str().unwrap();
    assert_eq!(ask(&s, a_id, "hi a").await, "Mini here.");
    assert_eq!(ask(&s, b_id, "hi b").await, "Sonnet here.");
    let asked = mini.received();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].body["model"], "gpt-4o-mini");
    let asked = sonnet.received();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].path, "/v1/messages");
    assert_eq!(asked[0].body["model"], "claude-sonnet-4-5");

    // Switched: A's next turn goes to sonnet.
    let (status, switched) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{a_id}"),
            Some(json!({"model": "anthropic/claude-sonnet-4-5"})),
        )
        .await;
    assert_eq!(status, 200, "{switched}");
    assert_eq!(switched["llm_config"]["model"], "claude-sonnet-4-5");
    assert_eq!(ask(&s, a_id, "again").await, "Sonnet here.");
    assert_eq!(sonnet.received().len(), 2);
    assert_eq!(mini.received().len(), 1);

    // The tree shows who wrote each answer.
    let conversation = a["conversation_id"].as_str().unwrap();
    let (status, tree) = s
        .call(
            "GET",
            &format!("/v1/conversations/{conversation}/tree"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{tree}");
    let models: Vec<&Value> = tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "assistant")
        .map(|n| &n["model"])
        .collect();
    assert_eq!(models, [&json!("mini"), &json!("sonnet")]);
}

#[tokio::test]
async fn an_unknown_handle_is_refused_naming_it() {
    let mini = MockServer::start(vec![Reply::sse(openai_sse("Mini here.", &[]))]).await;
    let sonnet = MockServer::start(vec![Reply::sse(anthropic_sse("Sonnet here.", &[]))]).await;
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir, two_models(&mini.url, &sonnet.url)).await;

    let (status, error) = create_agent(&s, json!({"model": "google_ai/gemini-2.5-pro"})).await;
    assert_eq!(status, 404, "{error}");
    let text = error.to_string();
    assert!(
        text.contains("Handle google_ai/gemini-2.5-pro not found")
            && text.contains("openai/gpt-4o-mini")
            && text.contains("anthropic/claude-sonnet-4-5"),
        "{text}"
    );
    let (status, agents) = s.call("GET", "/v1/agents/", None).await;
    assert_eq!(status, 200);
    assert_eq!(agents, json!([]), "nothing was created");

    // Letta's deprecated llm_config names a model too.
    let (status, agent) = create_agent(
        &s,
        json!({"llm_config": {"model": "claude-sonnet-4-5", "model_endpoint_type": "anthropic", "context_window": 1000}}),
    )
    .await;
    assert_eq!(status, 200, "{agent}");
    assert_eq!(agent["llm_config"]["model"], "claude-sonnet-4-5");

    let id = agent["id"].as_str().unwrap();
    let (status, error) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{id}"),
            Some(json!({"model": "openai/gpt-5"})),
        )
        .await;
    assert_eq!(status, 404, "{error}");
    assert!(error.to_string().contains("openai/gpt-5"), "{error}");
    let (_, kept) = s.call("GET", &format!("/v1/agents/{id}"), None).await;
    assert_eq!(kept["llm_config"]["model"], "claude-sonnet-4-5");

    // model_settings is an object (schemathesis sent an array once).
    for body in [
        json!({"model_settings": [null, null]}),
        json!({"model_settings": "x"}),
    ] {
        let (status, error) = create_agent(&s, body.clone()).await;
        assert_eq!(status, 422, "{body}: {error}");
        assert!(error.to_string().contains("model_settings"), "{error}");
        let (status, error) = s
            .call("PATCH", &format!("/v1/agents/{id}"), Some(body.clone()))
            .await;
        assert_eq!(status, 422, "{body}: {error}");
    }
}

#[tokio::test]
async fn one_model_answers_every_handle() {
    // Today's deployments: one (scripted) model, agents made with Letta's
    // usual handle.
    let dir = tempfile::tempdir().unwrap();
    let s = start(
        &dir,
        Models::from(script("steps: [{text: Scripted here.}]")),
    )
    .await;
    let (status, agent) = create_agent(
        &s,
        json!({"model": "openai/gpt-4o-mini", "include_base_tools": false}),
    )
    .await;
    assert_eq!(status, 200, "{agent}");
    assert_eq!(agent["model"], "openai/gpt-4o-mini");
    assert_eq!(agent["llm_config"]["model"], "scripted");
    let id = agent["id"].as_str().unwrap();
    assert_eq!(ask(&s, id, "hi").await, "Scripted here.");
}

#[tokio::test]
async fn the_models_route_lists_the_registry_default_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut models: Vec<ModelEntry> = two_models("http://127.0.0.1:9", "http://127.0.0.1:9")
        .iter()
        .cloned()
        .collect();
    models[1].info.max_output = Some(4096);
    let s = start(&dir, Models::new(models, Some("sonnet")).unwrap()).await;
    for path in ["/v1/models", "/v1/models/"] {
        let (status, list) = s.call("GET", path, None).await;
        assert_eq!(status, 200, "{list}");
        let list = list.as_array().unwrap();
        assert_eq!(list.len(), 2);
        let first = &list[0];
        assert_eq!(first["handle"], "anthropic/claude-sonnet-4-5");
        assert_eq!(first["name"], "claude-sonnet-4-5");
        assert_eq!(first["model"], "claude-sonnet-4-5");
        assert_eq!(first["display_name"], "sonnet");
        assert_eq!(first["model_endpoint_type"], "anthropic");
        assert_eq!(first["provider_type"], "anthropic");
        assert_eq!(first["provider_name"], "anthropic");
        assert_eq!(first["model_type"], "llm");
        assert_eq!(first["context_window"], 200_000);
        assert_eq!(first["max_context_window"], 200_000);
        assert_eq!(first["max_tokens"], 4096);
        assert_eq!(list[1]["handle"], "openai/gpt-4o-mini");
        assert_eq!(list[1]["model_endpoint_type"], "openai");
    }
}
