//! The context window through the doors, over real HTTP: Letta's
//! `POST /v1/agents/{id}/summarize` stores a compaction node, the live
//! view's tree shows it and what it covers, later requests send its
//! summary, the live view's own compact route does the same, a long
//! conversation compacts by itself before the mock's window (Anthropic's
//! real "prompt is too long" answers anything over it), and an agent
//! budget stops a turn with Letta's nearest stop reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::Server;
use toolwire_engine::EngineConfig;
use toolwire_engine::context::{Budgets, Limit};
use toolwire_providers::{AnthropicProvider, Models};
use toolwire_server::ServerSettings;
use toolwire_test_support::{
    Answer, MockServer, Windowed, Wire, http, is_summary_request, model_entry,
};

const WINDOW: u64 = 8_000;

/// An Anthropic model with an 8,000-token window on the mock: summaries
/// are numbered, other requests answered "Noted."
async fn claude() -> (MockServer, Windowed, Arc<AtomicUsize>) {
    let window = Windowed::new(Wire::Anthropic, WINDOW);
    let summaries = Arc::new(AtomicUsize::new(0));
    let s = summaries.clone();
    let server = MockServer::start(vec![window.reply(move |r| {
        if is_summary_request(r) {
            let k = s.fetch_add(1, Ordering::SeqCst);
            Answer::Text(format!(
                "Summary {k}: the user sent notes about the project."
            ))
        } else {
            Answer::Text("Noted.".into())
        }
    })])
    .await;
    (server, window, summaries)
}

fn models(url: &str) -> Models {
    let mut entry = model_entry(
        "claude",
        "anthropic",
        Arc::new(AnthropicProvider::new(http(url), "claude-sonnet-4-5", true)),
        &[],
    );
    entry.info.context_window = Some(WINDOW);
    Models::new(vec![entry], None).unwrap()
}

async fn start(dir: &tempfile::TempDir, url: &str, config: EngineConfig) -> Server {
    Server::start_models(
        &dir.path().join("t.db"),
        models(url),
        ServerSettings::default(),
        config,
    )
    .await
}

async fn agent(s: &Server) -> (String, String) {
    let (status, a) = s
        .call(
            "POST",
            "/v1/agents/",
            Some(json!({"name": "a", "include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{a}");
    let id = a["id"].as_str().unwrap().to_owned();
    let (_, list) = s.call("GET", "/v1/conversations", None).await;
    let conv = list["conversations"]
        .as_array()
        .or_else(|| list.as_array())
        .unwrap()
        .iter()
        .find(|c| c["agent_id"] == id.as_str())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (id, conv)
}

/// A note of about 600 tokens.
fn note(n: usize) -> String {
    format!(
        "Note {n}: {}",
        "the build runs on two cores and the tests talk to loopback only. ".repeat(45)
    )
}

async fn say(s: &Server, id: &str, text: &str) -> Value {
    let (status, reply) = s
        .call(
            "POST",
            &format!("/v1/agents/{id}/messages"),
            Some(json!({"messages": [{"role": "user", "content": text}]})),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    reply
}

fn compaction_nodes(tree: &Value) -> Vec<Value> {
    tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| !n["compaction"].is_null())
        .cloned()
        .collect()
}

#[tokio::test]
async fn letta_summarize_stores_a_node_the_tree_shows_and_later_turns_send() {
    let (mock, _window, _summaries) = claude().await;
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir, &mock.url, EngineConfig::default()).await;
    let (id, conv) = agent(&s).await;
    for n in 0..4 {
        let reply = say(&s, &id, &note(n)).await;
        assert_eq!(reply["stop_reason"]["stop_reason"], "end_turn", "{reply}");
    }

    let (status, done) = s
        .call(
            "POST",
            &format!("/v1/agents/{id}/summarize"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert!(done["covered"].as_u64().unwrap() >= 1, "{done}");
    assert!(done["tokens_after"].as_u64() < done["tokens_before"].as_u64());

    // The tree: the node, what it covers; every message still there.
    let (_, tree) = s
        .call("GET", &format!("/v1/conversations/{conv}/tree"), None)
        .await;
    let nodes = compaction_nodes(&tree);
    assert_eq!(nodes.len(), 1, "{tree}");
    let node = &nodes[0];
    assert_eq!(node["id"], done["message_id"]);
    assert_eq!(node["role"], "system");
    assert_eq!(node["compaction"]["covered"], done["covered"]);
    let through = node["compaction"]["through"].as_str().unwrap();
    assert!(
        tree["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == through)
    );
    assert_eq!(tree["active_leaf"], node["id"]);
    assert_eq!(tree["nodes"].as_array().unwrap().len(), 1 + 8 + 1);
    // Its view carries the summary.
    let (status, view) = s
        .call(
            "GET",
            &format!(
                "/v1/conversations/{conv}/messages/{}",
                node["id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(view["content_blocks"][0]["type"], "compaction");
    assert!(
        view["content_blocks"][0]["summary"]
            .as_str()
            .unwrap()
            .starts_with("Summary 0")
    );

    // Letta's history shows it as a system message with the summary.
    let (_, history) = s
        .call("GET", &format!("/v1/agents/{id}/messages"), None)
        .await;
    let text = history.to_string();
    assert!(text.contains("Summary 0"), "{history}");

    // The next turn sends the summary, not the first note.
    let before = mock.received().len();
    say(&s, &id, "And now?").await;
    let body = mock.received()[before].body.to_string();
    assert!(body.contains("Summary 0"));
    assert!(!body.contains("Note 0:"));
}

#[tokio::test]
async fn a_long_conversation_compacts_itself_before_the_window() {
    let (mock, window, summaries) = claude().await;
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir, &mock.url, EngineConfig::default()).await;
    let (id, conv) = agent(&s).await;
    // 30 notes of ~600 tokens: more than twice the window.
    for n in 0..30 {
        let reply = say(&s, &id, &note(n)).await;
        assert_eq!(reply["stop_reason"]["stop_reason"], "end_turn", "{reply}");
    }
    assert!(window.sizes().iter().all(|size| *size <= WINDOW));
    assert!(summaries.load(Ordering::SeqCst) >= 2);
    let (_, tree) = s
        .call("GET", &format!("/v1/conversations/{conv}/tree"), None)
        .await;
    assert_eq!(
        compaction_nodes(&tree).len(),
        summaries.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn the_live_compact_route_starts_a_run_whose_node_comes_over_the_socket() {
    let (mock, _window, _summaries) = claude().await;
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir, &mock.url, EngineConfig::default()).await;
    let (status, conv) = s.call("POST", "/v1/conversations", Some(json!({}))).await;
    assert_eq!(status, 201, "{conv}");
    let conv = conv["id"].as_str().unwrap().to_owned();
    let mut socket = s.socket(&format!("/v1/conversations/{conv}/ws")).await;
    // The snapshot first: the socket follows the events after the one it
    // was taken at, so a run started before it would be in the snapshot,
    // not in the frames.
    let snapshot = support::frame(&mut socket).await;
    assert_eq!(snapshot["type"], "snapshot", "{snapshot}");
    // An empty conversation: nothing to compact, nothing stored.
    let (status, r) = s
        .call("POST", &format!("/v1/conversations/{conv}/compact"), None)
        .await;
    assert_eq!(status, 202, "{r}");
    let frames = support::frames_until(&mut socket, |f| f["type"] == "stop").await;
    let stop = frames.last().unwrap();
    assert_eq!(stop["reason"], "error");
    assert!(
        stop["error"]
            .as_str()
            .unwrap()
            .contains("nothing to compact")
    );
    let (_, tree) = s
        .call("GET", &format!("/v1/conversations/{conv}/tree"), None)
        .await;
    assert_eq!(tree["nodes"].as_array().unwrap().len(), 1);

    for n in 0..3 {
        let (status, r) = s
            .call(
                "POST",
                &format!("/v1/conversations/{conv}/messages"),
                Some(json!({"text": note(n)})),
            )
            .await;
        assert_eq!(status, 202, "{r}");
        support::frames_until(&mut socket, |f| f["type"] == "stop").await;
    }
    let (status, r) = s
        .call("POST", &format!("/v1/conversations/{conv}/compact"), None)
        .await;
    assert_eq!(status, 202, "{r}");
    let frames = support::frames_until(&mut socket, |f| f["type"] == "stop").await;
    let node = frames
        .iter()
        .find(|f| f["type"] == "conv_update" && f["source"] == "compaction")
        .expect("the node's frame");
    assert_eq!(node["role"], "system");
    assert_eq!(node["content_blocks"][0]["type"], "compaction");
    assert_eq!(frames.last().unwrap()["reason"], "end_turn");
    let (_, tree) = s
        .call("GET", &format!("/v1/conversations/{conv}/tree"), None)
        .await;
    assert_eq!(compaction_nodes(&tree).len(), 1);
    assert_eq!(tree["active_leaf"], node["message_id"]);
}

#[tokio::test]
async fn an_agent_budget_stops_a_turn_with_lettas_nearest_reason() {
    let (mock, _window, _summaries) = claude().await;
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        budgets: Budgets {
            agent: Limit {
                max_tokens: Some(2_000),
                max_cost: None,
            },
            ..Budgets::default()
        },
        ..EngineConfig::default()
    };
    let s = start(&dir, &mock.url, config).await;
    let (id, _) = agent(&s).await;
    // ~620 tokens a turn: the fourth turn finds the budget used up.
    let mut stopped = None;
    for n in 0..6 {
        let reply = say(&s, &id, &note(n)).await;
        if reply["stop_reason"]["stop_reason"] != "end_turn" {
            stopped = Some((n, reply));
            break;
        }
    }
    let (n, reply) = stopped.expect("the budget stopped a turn");
    assert!(n >= 2, "stopped at turn {n}");
    assert_eq!(reply["stop_reason"]["stop_reason"], "max_steps", "{reply}");
    let error = reply["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["message_type"] == "error_message")
        .expect("an error message");
    assert_eq!(error["error_type"], "budget_exceeded");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("the agent's token budget"),
        "{reply}"
    );
}
