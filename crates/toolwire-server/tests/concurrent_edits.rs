//! Fork, active-leaf and system-prompt changes against running turns,
//! over real HTTP: the engine refuses them while a turn runs (409), makes
//! them whole when idle, and a fork raced against a turn 100 times
//! leaves every turn one whole chain (the engine's own race tests run
//! 200 rounds each, without HTTP in between).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::Server;
use toolwire_server::ServerSettings;

/// A turn of four messages (user, a call, its result, the answer),
/// streamed slowly enough to be caught running.
const TWO_STEPS: &str = r#"
steps:
  - text: "Looking."
    tool_calls:
      - {id: call_1, name: lookup, arguments: {n: 1}}
    chunk_size: 16
    delay_ms: 1
  - text: "Done."
    chunk_size: 16
    delay_ms: 1
"#;

/// [`TWO_STEPS`] taking about a second: caught running for sure.
const SLOW: &str = r#"
steps:
  - text: "Looking."
    tool_calls:
      - {id: call_1, name: lookup, arguments: {n: 1}}
    chunk_size: 16
    delay_ms: 40
  - text: "Done."
    chunk_size: 16
    delay_ms: 40
"#;

fn conv(id: &str, rest: &str) -> String {
    format!("/v1/conversations/{id}{rest}")
}

async fn tree(s: &Server, id: &str) -> Value {
    let (status, tree) = s.call("GET", &conv(id, "/tree"), None).await;
    assert_eq!(status, 200, "{tree}");
    tree
}

/// Waits until no turn runs in `id`; its tree then.
async fn idle(s: &Server, id: &str) -> Value {
    loop {
        let tree = tree(s, id).await;
        if tree["running"] == false {
            return tree;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn node_ids(tree: &Value) -> HashSet<String> {
    tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The nodes stored since `before`, checked to be one whole turn (each
/// under the one before); the parent of its first.
fn one_whole_turn(tree: &Value, before: &HashSet<String>) -> String {
    let new: Vec<&Value> = tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| !before.contains(n["id"].as_str().unwrap()))
        .collect();
    let roles: Vec<&str> = new.iter().map(|n| n["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{tree}");
    for pair in new.windows(2) {
        assert_eq!(pair[1]["parent_id"], pair[0]["id"], "{tree}");
    }
    new[0]["parent_id"].as_str().unwrap().to_owned()
}

async fn new_conversation(s: &Server) -> String {
    let (status, created) = s.call("POST", "/v1/conversations", Some(json!({}))).await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

async fn send(s: &Server, id: &str) {
    let (status, sent) = s
        .call("POST", &conv(id, "/messages"), Some(json!({"text": "go"})))
        .await;
    assert_eq!(status, 202, "{sent}");
}

#[tokio::test]
async fn fork_and_leaf_changes_are_refused_while_a_turn_runs_and_made_after() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("t.db"), SLOW, ServerSettings::default()).await;
    let id = new_conversation(&s).await;
    send(&s, &id).await;
    let first = idle(&s, &id).await;
    let old_leaf = first["active_leaf"].clone();
    send(&s, &id).await;
    let running = tree(&s, &id).await;
    assert_eq!(running["running"], true, "the turn is still running");
    let (status, refused) = s
        .call(
            "PUT",
            &conv(&id, "/active_leaf"),
            Some(json!({"message_id": old_leaf})),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["code"], "TURN_IN_PROGRESS");
    let (status, refused) = s
        .call(
            "POST",
            &conv(&id, "/fork"),
            Some(json!({"message_id": old_leaf})),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["code"], "TURN_IN_PROGRESS");

    let done = idle(&s, &id).await;
    assert_ne!(
        done["active_leaf"], old_leaf,
        "the refused change moved nothing"
    );
    let (status, moved) = s
        .call(
            "PUT",
            &conv(&id, "/active_leaf"),
            Some(json!({"message_id": old_leaf})),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["active_leaf"], old_leaf);
    let (status, fork) = s
        .call(
            "POST",
            &conv(&id, "/fork"),
            Some(json!({"message_id": old_leaf})),
        )
        .await;
    assert_eq!(status, 201, "{fork}");
    assert_eq!(fork["forked_from"]["message_id"], old_leaf);
    s.stop().await;
}

#[tokio::test]
async fn a_system_prompt_edit_is_refused_while_the_agents_turn_runs() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("t.db"), SLOW, ServerSettings::default()).await;
    let (status, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"system": "be kind", "include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{agent}");
    let agent_id = agent["id"].as_str().unwrap().to_owned();
    let conversation = agent["conversation_id"].as_str().unwrap().to_owned();
    send(&s, &conversation).await;
    let (status, refused) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{agent_id}"),
            Some(json!({"system": "be brief", "name": "renamed"})),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["code"], "CONVERSATION_BUSY");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("system prompt"),
        "{refused}"
    );
    idle(&s, &conversation).await;
    let (_, unchanged) = s.call("GET", &format!("/v1/agents/{agent_id}"), None).await;
    assert_eq!(unchanged["system"], "be kind");
    assert_ne!(
        unchanged["name"], "renamed",
        "nothing of a refused edit is stored"
    );
    let (status, changed) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{agent_id}"),
            Some(json!({"system": "be brief", "name": "renamed"})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["system"], "be brief");
    assert_eq!(changed["name"], "renamed");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_raced_against_a_turn_over_http_is_whole_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("t.db"),
        TWO_STEPS,
        ServerSettings::default(),
    )
    .await;
    let id = new_conversation(&s).await;
    send(&s, &id).await;
    let (mut refused, mut forked) = (0, 0);
    for round in 0..100u32 {
        let before_tree = idle(&s, &id).await;
        let before = node_ids(&before_tree);
        let leaf = before_tree["active_leaf"].as_str().unwrap().to_owned();
        // Every fourth fork is asked first, at the leaf before the send;
        // the others after a pause spread over about two turns, at
        // whatever the leaf is then (during the turn, one of its messages).
        let fork = async {
            let at = if round.is_multiple_of(4) {
                json!(leaf)
            } else {
                let ms = u64::from(round.wrapping_mul(7_919) % 250);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                tree(&s, &id).await["active_leaf"].clone()
            };
            let (status, body) = s
                .call("POST", &conv(&id, "/fork"), Some(json!({"message_id": at})))
                .await;
            (at, status, body)
        };
        let ((at, status, body), ()) = if round.is_multiple_of(4) {
            // A fork reads which conversation the message is in before it
            // takes that conversation's lock, so a send at the same moment
            // could win every round on a loaded machine: here the fork is
            // answered before the send is made.
            let forked = fork.await;
            (forked, send(&s, &id).await)
        } else {
            tokio::join!(fork, send(&s, &id))
        };
        let after = idle(&s, &id).await;
        assert_eq!(one_whole_turn(&after, &before), leaf, "round {round}");
        match status {
            409 => {
                assert_eq!(body["code"], "TURN_IN_PROGRESS", "{body}");
                refused += 1;
            }
            201 => {
                assert_eq!(body["forked_from"]["message_id"], at, "{body}");
                let copy = tree(&s, body["id"].as_str().unwrap()).await;
                // The path to `at`, whole: as many nodes, the same roles.
                let (_, source) = s
                    .call(
                        "GET",
                        &conv(&id, &format!("/messages/{}", at.as_str().unwrap())),
                        None,
                    )
                    .await;
                let depth = |tree: &Value, mut at: Value| {
                    let nodes = tree["nodes"].as_array().unwrap();
                    let mut n = 0;
                    while let Some(node) = nodes.iter().find(|x| x["id"] == at) {
                        n += 1;
                        at = node["parent_id"].clone();
                    }
                    n
                };
                assert_eq!(
                    copy["nodes"].as_array().unwrap().len(),
                    depth(&after, at.clone()),
                    "round {round}: {source}"
                );
                forked += 1;
            }
            other => panic!("round {round}: {other} {body}"),
        }
    }
    println!("fork over HTTP: {refused} refused, {forked} made");
    assert!(
        refused > 0,
        "no fork landed during a turn: the race was not run"
    );
    assert!(forked > 0, "no fork was made");
    s.stop().await;
}
