//! The live view's API over real HTTP and a real WebSocket client: the
//! tree over REST, a turn's frames as they happen, reconnecting, approvals,
//! interjections, cancel and bad input. Only the model is scripted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, Socket, frame, frames_until, send_frame};
use toolwire_server::ServerSettings;

const DICE: &str = r#"
def roll_dice(sides: int) -> str:
    """Rolls a die.

    Args:
        sides: How many sides the die has.
    """
    import time
    time.sleep(0.3)
    return f"rolled d{sides}: 4"
"#;

const SLOW: &str = r#"
def slow_task(seconds: float) -> str:
    """Takes its time.

    Args:
        seconds: How long.
    """
    import time
    time.sleep(seconds)
    return "finished"
"#;

/// Turn 0 rolls two dice, then answers; later turns answer at once.
const TWO_CALLS: &str = r#"
turns:
  - steps:
      - text: "Rolling twice."
        tool_calls:
          - {id: call_1, name: roll_dice, arguments: {sides: 6}}
          - {id: call_2, name: roll_dice, arguments: {sides: 20}}
      - text: "You rolled 4 and 4."
  - steps:
      - text: "Noted."
"#;

/// Turn 0 runs a slow task, then answers; later turns answer at once.
const SLOW_CALL: &str = r#"
turns:
  - steps:
      - text: "Working."
        tool_calls:
          - {id: call_s, name: slow_task, arguments: {seconds: 3}}
      - text: "Done working."
  - steps:
      - text: "Noted."
"#;

/// Plain answers, by the number of user messages on the path.
const ANSWERS: &str = r#"
turns:
  - steps: [{text: "First answer."}]
  - steps: [{text: "More."}]
"#;

const LABEL: &str = r#"
def label_die(label: str, sides: int) -> str:
    """Labels a die.

    Args:
        label: What to call it.
        sides: How many sides the die has.
    """
    return f"{label}: d{sides}"
"#;

/// A call with two arguments, streamed slowly enough that each field
/// completes in its own coalescing window.
const SLOW_ARGUMENTS: &str = r#"
turns:
  - steps:
      - text: "Labelling."
        chunk_size: 32
        delay_ms: 30
        tool_calls:
          - {id: call_l, name: label_die, arguments: {label: "lucky one", sides: 12}}
      - text: "Labelled."
"#;

async fn server(dir: &tempfile::TempDir, script: &str) -> Server {
    Server::start(&dir.path().join("t.db"), script, ServerSettings::default()).await
}

/// A Python tool from `source`, and an agent with only it (its calls
/// waiting for approval if `approval`); the agent's conversation id.
async fn agent_with(s: &Server, source: &str, approval: bool) -> String {
    let (status, tool) = s
        .call("POST", "/v1/tools", Some(json!({"source_code": source})))
        .await;
    assert_eq!(status, 200, "{tool}");
    let name = tool["name"].as_str().unwrap().to_owned();
    let (status, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"name": "live", "tool_ids": [tool["id"]], "include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{agent}");
    if approval {
        let path = format!(
            "/v1/agents/{}/tools/approval/{name}",
            agent["id"].as_str().unwrap()
        );
        let (status, body) = s
            .call("PATCH", &path, Some(json!({"requires_approval": true})))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    agent["conversation_id"].as_str().unwrap().to_owned()
}

fn conv(id: &str, rest: &str) -> String {
    format!("/v1/conversations/{id}{rest}")
}

/// Sends `text` over REST; the run id.
async fn send(s: &Server, id: &str, text: &str) -> Value {
    let (status, body) = s
        .call("POST", &conv(id, "/messages"), Some(json!({"text": text})))
        .await;
    assert_eq!(status, 202, "{body}");
    body
}

/// The tree once no turn runs.
async fn settled_tree(s: &Server, id: &str) -> Value {
    for _ in 0..200 {
        let (status, tree) = s.call("GET", &conv(id, "/tree"), None).await;
        assert_eq!(status, 200, "{tree}");
        if tree["running"] == false {
            return tree;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the turn did not end");
}

fn node<'a>(tree: &'a Value, id: &Value) -> &'a Value {
    tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| &n["id"] == id)
        .unwrap_or_else(|| panic!("no node {id}"))
}

fn is_stop(f: &Value) -> bool {
    f["type"] == "stop"
}

/// Each call's statuses, in the order its `tool_update`s said them.
fn statuses(frames: &[Value], call: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for f in frames
        .iter()
        .filter(|f| f["type"] == "tool_update" && f["tool_call_id"] == call)
    {
        let status = f["status"].as_str().unwrap().to_owned();
        if seen.last() != Some(&status) {
            seen.push(status);
        }
    }
    seen
}

fn assert_seqs_grow(frames: &[Value]) {
    let seqs: Vec<u64> = frames.iter().filter_map(|f| f["seq"].as_u64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] <= w[1]),
        "seqs go down: {seqs:?}"
    );
}

#[tokio::test]
async fn the_tree_is_served_and_changed_over_rest() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, ANSWERS).await;
    let (status, created) = s
        .call("POST", "/v1/conversations", Some(json!({"title": "trees"})))
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["title"], "trees");
    let id = created["id"].as_str().unwrap().to_owned();

    let sent = send(&s, &id, "hello").await;
    let user = sent["message_id"].clone();
    let tree = settled_tree(&s, &id).await;
    let nodes = tree["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{tree}");
    let (root, answer) = (&nodes[0], &nodes[2]);
    assert_eq!(root["role"], "system");
    assert_eq!(tree["root_id"], root["id"]);
    assert_eq!(root["children"], json!([user]));
    assert_eq!(node(&tree, &user)["summary"], "hello");
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["summary"], "First answer.");
    assert_eq!(answer["parent_id"], user);
    assert_eq!(tree["active_leaf"], answer["id"]);
    assert!(tree["last_seq"].as_u64().unwrap() > 0);

    // One message whole.
    let (status, view) = s
        .call(
            "GET",
            &conv(&id, &format!("/messages/{}", user.as_str().unwrap())),
            None,
        )
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["content_blocks"],
        json!([{"type": "text", "text": "hello"}])
    );
    assert_eq!(view["siblings"], json!({"index": 0, "ids": [user]}));

    // An edit is a sibling with its own answer, and the active branch.
    let (status, edited) = s
        .call(
            "POST",
            &conv(&id, &format!("/messages/{}/edit", user.as_str().unwrap())),
            Some(json!({"text": "hello again"})),
        )
        .await;
    assert_eq!(status, 202, "{edited}");
    let edit = edited["message_id"].clone();
    assert_ne!(edit, user);
    let tree = settled_tree(&s, &id).await;
    assert_eq!(node(&tree, &root["id"])["children"], json!([user, edit]));
    let edit_answer = node(&tree, &edit)["children"][0].clone();
    // The script answers by the user messages on the path: one here too.
    assert_eq!(node(&tree, &edit_answer)["summary"], "First answer.");
    assert_eq!(node(&tree, &edit_answer)["role"], "assistant");
    assert_eq!(tree["active_leaf"], edit_answer);
    let (_, view) = s
        .call(
            "GET",
            &conv(&id, &format!("/messages/{}", edit.as_str().unwrap())),
            None,
        )
        .await;
    assert_eq!(view["siblings"], json!({"index": 1, "ids": [user, edit]}));

    // A regeneration is a second answer under the edit.
    let (status, regenerated) = s
        .call(
            "POST",
            &conv(
                &id,
                &format!("/messages/{}/regenerate", edit_answer.as_str().unwrap()),
            ),
            None,
        )
        .await;
    assert_eq!(status, 202, "{regenerated}");
    assert!(regenerated["run_id"].is_string());
    let tree = settled_tree(&s, &id).await;
    let answers = node(&tree, &edit)["children"].as_array().unwrap().clone();
    assert_eq!(answers.len(), 2, "{tree}");
    assert_eq!(answers[0], edit_answer);
    assert_eq!(node(&tree, &answers[1])["role"], "assistant");
    assert_eq!(tree["active_leaf"], answers[1]);

    // Back to the first branch.
    let (status, tree) = s
        .call(
            "PUT",
            &conv(&id, "/active_leaf"),
            Some(json!({"message_id": answer["id"]})),
        )
        .await;
    assert_eq!(status, 200, "{tree}");
    assert_eq!(tree["active_leaf"], answer["id"]);

    // The tree is what the store holds.
    let store = toolwire_store::open(&format!("sqlite://{}", s.db.display()))
        .await
        .unwrap();
    let stored = store.messages(id.parse().unwrap()).await.unwrap();
    let stored_ids: Vec<String> = stored.iter().map(|m| m.id.to_string()).collect();
    let tree_ids: Vec<String> = tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(stored_ids, tree_ids);
    let stored_conversation = store.conversation(id.parse().unwrap()).await.unwrap();
    assert_eq!(
        stored_conversation.active_leaf.to_string(),
        tree["active_leaf"]
    );

    // A fork holds the path to its message.
    let (status, fork) = s
        .call(
            "POST",
            &conv(&id, "/fork"),
            Some(json!({"message_id": edit})),
        )
        .await;
    assert_eq!(status, 201, "{fork}");
    assert_eq!(
        fork["forked_from"],
        json!({"conversation_id": id, "message_id": edit})
    );
    let fork_id = fork["id"].as_str().unwrap();
    let (_, fork_tree) = s.call("GET", &conv(fork_id, "/tree"), None).await;
    assert_eq!(fork_tree["nodes"].as_array().unwrap().len(), 2);
    let (status, list) = s.call("GET", "/v1/conversations", None).await;
    assert_eq!(status, 200);
    let listed: Vec<&str> = list["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [fork_id, id.as_str()], "newest first");
    s.stop().await;
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, SLOW_CALL).await;
    let (_, a) = s.call("POST", "/v1/conversations", None).await;
    let (_, b) = s.call("POST", "/v1/conversations", None).await;
    let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    let (_, tree_b) = s.call("GET", &conv(b, "/tree"), None).await;
    let root_b = tree_b["root_id"].as_str().unwrap();
    let unknown = "00000000-0000-0000-0000-000000000000";
    let cases: Vec<(&str, String, Option<Value>, u16)> = vec![
        ("GET", conv(unknown, "/tree"), None, 404),
        ("GET", conv("..%2F..%2Fetc%2Fpasswd", "/tree"), None, 404),
        ("GET", conv(&"x".repeat(5000), "/tree"), None, 404),
        ("GET", conv(a, &format!("/messages/{root_b}")), None, 404),
        ("GET", conv(a, "/messages/not-an-id"), None, 404),
        (
            "POST",
            conv(unknown, "/messages"),
            Some(json!({"text": "hi"})),
            404,
        ),
        (
            "POST",
            conv(a, "/messages"),
            Some(json!({"text": "  "})),
            400,
        ),
        (
            "POST",
            conv(a, "/messages"),
            Some(json!({"txt": "hi"})),
            422,
        ),
        ("POST", conv(a, "/messages"), Some(json!({"text": 5})), 422),
        (
            "POST",
            conv(a, "/messages"),
            Some(json!({"text": "hi", "parent_id": "nope"})),
            400,
        ),
        (
            "POST",
            conv(a, "/messages"),
            Some(json!({"text": "hi", "parent_id": root_b})),
            404,
        ),
        (
            "POST",
            conv(a, "/fork"),
            Some(json!({"message_id": unknown})),
            404,
        ),
        (
            "PUT",
            conv(a, "/active_leaf"),
            Some(json!({"message_id": root_b})),
            404,
        ),
        (
            "POST",
            conv(a, &format!("/messages/{root_b}/regenerate")),
            None,
            404,
        ),
    ];
    for (method, path, body, want) in cases {
        let (status, error) = s.call(method, &path, body.clone()).await;
        assert_eq!(status, want, "{method} {path} {body:?}: {error}");
        assert!(
            error["code"].is_string() && error["message"].is_string(),
            "{error}"
        );
    }
    // Malformed JSON and a body over the limit.
    let response = s
        .http
        .post(s.url(&conv(a, "/messages")))
        .header("content-type", "application/json")
        .body("{\"text\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 422);
    let huge = json!({"text": "x".repeat(9 * 1024 * 1024)});
    let (status, _) = s.call("POST", &conv(a, "/messages"), Some(huge)).await;
    assert_eq!(status, 413);
    // The system prompt is no user message to edit.
    let (_, tree_a) = s.call("GET", &conv(a, "/tree"), None).await;
    let root_a = tree_a["root_id"].as_str().unwrap();
    let (status, error) = s
        .call(
            "POST",
            &conv(a, &format!("/messages/{root_a}/edit")),
            Some(json!({"text": "x"})),
        )
        .await;
    assert_eq!(status, 400, "{error}");
    // One turn at a time.
    let id = agent_with(&s, SLOW, false).await;
    send(&s, &id, "work").await;
    let (status, error) = s
        .call(
            "POST",
            &conv(&id, "/messages"),
            Some(json!({"text": "again"})),
        )
        .await;
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["code"], "TURN_IN_PROGRESS");
    s.stop().await;
}

/// Opens a socket on `id` and reads its snapshot.
async fn snapshot(s: &Server, id: &str) -> (Socket, Value) {
    let mut socket = s.socket(&conv(id, "/ws")).await;
    let snap = frame(&mut socket).await;
    assert_eq!(snap["type"], "snapshot", "{snap}");
    (socket, snap)
}

#[tokio::test]
async fn a_turn_with_two_tool_calls_is_seen_live_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, TWO_CALLS).await;
    let id = agent_with(&s, DICE, false).await;
    let (mut socket, snap) = snapshot(&s, &id).await;
    assert_eq!(snap["turn"], Value::Null);
    assert_eq!(snap["tree"]["nodes"].as_array().unwrap().len(), 1);
    let sent = send(&s, &id, "roll two").await;
    let frames = frames_until(&mut socket, is_stop).await;
    assert_seqs_grow(&frames);
    assert!(
        frames
            .iter()
            .all(|f| f["seq"].as_u64().unwrap() > snap["seq"].as_u64().unwrap())
    );
    assert_eq!(frames[0]["type"], "turn_started");
    assert_eq!(frames[0]["run_id"], sent["run_id"]);
    assert_eq!(frames[1]["type"], "conv_update");
    assert_eq!(frames[1]["source"], "user");
    assert_eq!(frames[1]["message_id"], sent["message_id"]);
    for call in ["call_1", "call_2"] {
        assert_eq!(
            statuses(&frames, call),
            ["pending", "executing", "completed"],
            "{call}: {frames:#?}"
        );
        let done = frames
            .iter()
            .find(|f| f["tool_call_id"] == call && f["status"] == "completed")
            .unwrap();
        assert!(
            done["result"].as_str().unwrap().starts_with("rolled d"),
            "{done}"
        );
        assert_eq!(done["tool_name"], "roll_dice");
        assert!(done["message_id"].is_string());
        // While it runs, the card shows the tool's status line; the
        // result takes its place.
        let shown: Vec<&Value> = frames
            .iter()
            .filter(|f| f["tool_call_id"] == call)
            .filter_map(|f| f["patch"].get("content"))
            .filter(|c| c != &&json!([]))
            .collect();
        assert_eq!(
            shown.first().map(|c| c.to_string()),
            Some(
                json!([{"type": "text", "text": "Running Python function `roll_dice`"}])
                    .to_string()
            ),
            "{shown:#?}"
        );
    }
    // call_1 finishes before call_2 starts (tools of a step run in order).
    let position = |call: &str, status: &str| {
        frames
            .iter()
            .position(|f| f["tool_call_id"] == call && f["status"] == status)
            .unwrap()
    };
    assert!(position("call_1", "pending") < position("call_2", "pending"));
    let sources: Vec<&str> = frames
        .iter()
        .filter(|f| f["type"] == "conv_update")
        .map(|f| f["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["user", "assistant", "tool", "tool", "assistant"]);
    let assistant = frames
        .iter()
        .find(|f| f["type"] == "conv_update" && f["source"] == "assistant")
        .unwrap();
    assert_eq!(assistant["tool_calls"].as_array().unwrap().len(), 2);
    let text: String = frames
        .iter()
        .filter(|f| f["type"] == "text_delta")
        .map(|f| f["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Rolling twice.You rolled 4 and 4.");
    let stop = frames.last().unwrap();
    assert_eq!(stop["reason"], "end_turn");
    assert_eq!(stop["error"], Value::Null);
    // A pending tool_update announces the call whole; later ones carry
    // only what changed.
    let announce = frames
        .iter()
        .find(|f| f["tool_call_id"] == "call_1" && f["status"] == "pending")
        .unwrap();
    assert_eq!(announce["patch"]["title"], "roll_dice");
    let completed = frames
        .iter()
        .find(|f| f["tool_call_id"] == "call_1" && f["status"] == "completed")
        .unwrap();
    assert!(completed["patch"].get("title").is_none(), "{completed}");
    s.stop().await;
}

#[tokio::test]
async fn a_calls_arguments_are_seen_as_each_field_completes() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, SLOW_ARGUMENTS).await;
    let id = agent_with(&s, LABEL, false).await;
    let (mut socket, _) = snapshot(&s, &id).await;
    send(&s, &id, "label it").await;
    let frames = frames_until(&mut socket, is_stop).await;
    let updates: Vec<&Value> = frames
        .iter()
        .filter(|f| f["type"] == "tool_update" && f["tool_call_id"] == "call_l")
        .collect();
    let position = |wanted: &dyn Fn(&Value) -> bool| {
        updates
            .iter()
            .position(|f| wanted(f))
            .unwrap_or_else(|| panic!("no such tool_update: {updates:#?}"))
    };
    let first = position(&|f| f["patch"]["raw_input"] == json!({"label": "lucky one"}));
    let both = position(&|f| f["patch"]["raw_input"] == json!({"label": "lucky one", "sides": 12}));
    let executing = position(&|f| f["status"] == "executing");
    assert!(first < both && both < executing, "{updates:#?}");
    assert_eq!(updates[first]["status"], "pending");
    assert_eq!(updates[both]["status"], "pending");
    // The complete arguments, once generated, are no news: no later
    // patch sends them again.
    assert!(
        updates[both + 1..]
            .iter()
            .all(|f| f["patch"].get("raw_input").is_none()),
        "{updates:#?}"
    );
    assert_eq!(
        statuses(&frames, "call_l"),
        ["pending", "executing", "completed"]
    );
    s.stop().await;
}

/// What must be the same in two clients' frames: everything, but of a
/// `tool_update` only the status it reports (coalescing may cut field
/// changes differently).
fn comparable(frames: &[Value]) -> Vec<Value> {
    frames
        .iter()
        .filter_map(|f| {
            if f["type"] != "tool_update" {
                return Some(f.clone());
            }
            f["patch"]
                .get("status")
                .map(|_| json!({"seq": f["seq"], "call": f["tool_call_id"], "status": f["status"]}))
        })
        .collect()
}

#[tokio::test]
async fn reconnecting_after_a_seq_gets_exactly_the_missed_frames() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, TWO_CALLS).await;
    let id = agent_with(&s, DICE, false).await;
    let (mut steady, _) = snapshot(&s, &id).await;
    let (mut leaving, _) = snapshot(&s, &id).await;
    send(&s, &id, "roll two").await;
    // The leaving client goes away while call_1 runs.
    let before = frames_until(&mut leaving, |f| {
        f["tool_call_id"] == "call_1" && f["status"] == "executing"
    })
    .await;
    let after = before.last().unwrap()["seq"].as_u64().unwrap();
    drop(leaving);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut back = s.socket(&conv(&id, &format!("/ws?after={after}"))).await;
    let resumed = frames_until(&mut back, is_stop).await;
    let all = frames_until(&mut steady, is_stop).await;
    // First the running calls' whole state, as of `after` (what the closed
    // socket held back for coalescing is in it).
    let resync = resumed.iter().take_while(|f| f["resync"] == true).count();
    let (resync, resumed) = resumed.split_at(resync);
    let resynced: Vec<&str> = resync
        .iter()
        .map(|f| f["tool_call_id"].as_str().unwrap())
        .collect();
    assert!(resynced.contains(&"call_1"), "{resync:#?}");
    for f in resync {
        assert_eq!(f["seq"].as_u64(), Some(after));
        assert_eq!(f["type"], "tool_update");
        assert_ne!(f["status"], "completed");
        for field in ["title", "kind", "status", "content", "raw_input"] {
            assert!(f["patch"].get(field).is_some(), "{field}: {f:#}");
        }
    }
    assert!(resumed.iter().all(|f| f["seq"].as_u64().unwrap() > after));
    let missed: Vec<Value> = all
        .iter()
        .filter(|f| f["seq"].as_u64().unwrap() > after)
        .cloned()
        .collect();
    assert_eq!(comparable(resumed), comparable(&missed));
    // The call that was running is not announced again (its tool's status
    // line may still come, then its end).
    let call_1 = statuses(resumed, "call_1");
    assert!(
        call_1 == ["completed"] || call_1 == ["executing", "completed"],
        "{call_1:?}"
    );
    assert!(
        resumed
            .iter()
            .filter(|f| f["tool_call_id"] == "call_1")
            .all(|f| f["patch"].get("title").is_none())
    );
    // Both calls were announced as they streamed, before the gap.
    assert_eq!(statuses(resumed, "call_2"), ["executing", "completed"]);
    // A client from the start replays the whole log, no snapshot.
    let mut replay = s.socket(&conv(&id, "/ws?after=0")).await;
    let first = frame(&mut replay).await;
    assert_eq!(first["type"], "turn_started");
    assert_eq!(first["seq"], 1);
    s.stop().await;
}

#[tokio::test]
async fn calls_are_approved_and_denied_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, TWO_CALLS).await;
    let id = agent_with(&s, DICE, true).await;
    let (mut socket, _) = snapshot(&s, &id).await;
    send(&s, &id, "roll two").await;
    let paused = frames_until(&mut socket, is_stop).await;
    assert_eq!(paused.last().unwrap()["reason"], "requires_approval");
    let request = paused
        .iter()
        .find(|f| f["type"] == "approval_request")
        .unwrap();
    let waiting: Vec<&str> = request["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(waiting, ["call_1", "call_2"]);
    assert_eq!(request["tool_calls"][0]["arguments"], json!({"sides": 6}));
    // A new client sees the pause in its snapshot.
    let (_other, snap) = snapshot(&s, &id).await;
    assert_eq!(
        snap["turn"]["pending_approval"].as_array().unwrap().len(),
        2
    );

    send_frame(
        &mut socket,
        json!({"type": "approve", "tool_call_id": "call_9"}),
    )
    .await;
    let refused = frame(&mut socket).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["for"], "approve");
    send_frame(
        &mut socket,
        json!({"type": "approve", "tool_call_id": "call_1"}),
    )
    .await;
    assert_eq!(
        frame(&mut socket).await,
        json!({"type": "ack", "for": "approve"})
    );
    send_frame(
        &mut socket,
        json!({"type": "deny", "tool_call_id": "call_2", "reason": "one is enough"}),
    )
    .await;
    let frames = frames_until(&mut socket, is_stop).await;
    assert_eq!(frames[0], json!({"type": "ack", "for": "deny"}));
    assert_eq!(frames.last().unwrap()["reason"], "end_turn");
    assert_eq!(statuses(&frames, "call_1").last().unwrap(), "completed");
    let result = |call: &str| {
        frames
            .iter()
            .filter(|f| f["type"] == "conv_update" && f["source"] == "tool")
            .map(|f| &f["content_blocks"][0])
            .find(|b| b["tool_use_id"] == call)
            .unwrap_or_else(|| panic!("no result of {call}: {frames:#?}"))["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(result("call_1").starts_with("rolled d6"));
    assert!(result("call_2").contains("one is enough"));
    s.stop().await;
}

/// A client tool's result must come from its client: the live view may
/// deny it, never approve it (that would run it on the server).
#[tokio::test]
async fn a_client_tool_cannot_be_approved_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, TWO_CALLS).await;
    let (status, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"name": "live", "include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{agent}");
    let agent_id = agent["id"].as_str().unwrap();
    let id = agent["conversation_id"].as_str().unwrap().to_owned();
    let (mut socket, _) = snapshot(&s, &id).await;
    let (status, body) = s
        .call(
            "POST",
            &format!("/v1/agents/{agent_id}/messages"),
            Some(json!({
                "messages": [{"role": "user", "content": "roll two"}],
                "client_tools": [{"name": "roll_dice", "parameters": {"type": "object"}}],
            })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let paused = frames_until(&mut socket, is_stop).await;
    assert_eq!(paused.last().unwrap()["reason"], "requires_approval");
    let request = paused
        .iter()
        .find(|f| f["type"] == "approval_request")
        .unwrap();
    let client: Vec<bool> = request["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["client"].as_bool().unwrap())
        .collect();
    assert_eq!(client, [true, true]);
    let (_other, snap) = snapshot(&s, &id).await;
    assert_eq!(snap["turn"]["pending_approval"][0]["client"], true);

    send_frame(
        &mut socket,
        json!({"type": "approve", "tool_call_id": "call_1"}),
    )
    .await;
    let refused = frame(&mut socket).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["for"], "approve");
    assert!(
        refused["message"].as_str().unwrap().contains("client tool"),
        "{refused}"
    );
    for call in ["call_1", "call_2"] {
        send_frame(
            &mut socket,
            json!({"type": "deny", "tool_call_id": call, "reason": "not now"}),
        )
        .await;
    }
    let frames = frames_until(&mut socket, is_stop).await;
    assert_eq!(frames[0], json!({"type": "ack", "for": "deny"}));
    assert_eq!(frames.last().unwrap()["reason"], "end_turn");
    s.stop().await;
}

#[tokio::test]
async fn an_interjection_during_a_slow_tool_is_a_new_user_node() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, SLOW_CALL).await;
    let id = agent_with(&s, SLOW, false).await;
    let (mut socket, _) = snapshot(&s, &id).await;
    send(&s, &id, "work").await;
    frames_until(&mut socket, |f| f["status"] == "executing").await;
    send_frame(
        &mut socket,
        json!({"type": "interject", "text": "also this"}),
    )
    .await;
    let frames = frames_until(&mut socket, is_stop).await;
    assert_eq!(frames[0], json!({"type": "ack", "for": "interject"}));
    let interjection = frames
        .iter()
        .find(|f| f["type"] == "conv_update" && f["source"] == "interjection")
        .unwrap_or_else(|| panic!("no interjection: {frames:#?}"));
    assert_eq!(interjection["role"], "user");
    let tree = settled_tree(&s, &id).await;
    let user = node(&tree, &interjection["message_id"]);
    assert_eq!(user["summary"], "also this");
    s.stop().await;
}

#[tokio::test]
async fn cancel_stops_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, SLOW_CALL).await;
    let id = agent_with(&s, SLOW, false).await;
    let (mut socket, _) = snapshot(&s, &id).await;
    send(&s, &id, "work").await;
    frames_until(&mut socket, |f| f["status"] == "executing").await;
    // A snapshot taken now holds the running turn.
    let (_other, snap) = snapshot(&s, &id).await;
    assert_eq!(snap["turn"]["tool_calls"][0]["status"], "executing");
    assert_eq!(
        snap["turn"]["tool_calls"][0]["arguments"],
        json!({"seconds": 3})
    );
    send_frame(&mut socket, json!({"type": "cancel"})).await;
    let frames = frames_until(&mut socket, is_stop).await;
    assert!(frames.contains(&json!({"type": "ack", "for": "cancel"})));
    assert_eq!(frames.last().unwrap()["reason"], "cancelled");
    s.stop().await;
}

#[tokio::test]
async fn bad_frames_get_errors_and_the_socket_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, ANSWERS).await;
    let (_, created) = s.call("POST", "/v1/conversations", None).await;
    let id = created["id"].as_str().unwrap();
    let (mut socket, _) = snapshot(&s, id).await;
    for (bad, about) in [
        (json!("not an object"), None),
        (json!({"type": "dance"}), Some("dance")),
        (json!({"type": "approve"}), Some("approve")),
        (json!({"type": "interject", "text": ""}), Some("interject")),
        (
            json!({"type": "approve", "tool_call_id": "c1"}),
            Some("approve"),
        ),
    ] {
        send_frame(&mut socket, bad.clone()).await;
        let error = frame(&mut socket).await;
        assert_eq!(error["type"], "error", "{bad}: {error}");
        assert!(error["message"].is_string());
        assert_eq!(error["for"].as_str(), about, "{bad}: {error}");
    }
    {
        use futures::SinkExt;
        socket
            .send(tokio_tungstenite::tungstenite::Message::Text(
                "{oops".into(),
            ))
            .await
            .unwrap();
        socket
            .send(tokio_tungstenite::tungstenite::Message::Binary(
                vec![1, 2].into(),
            ))
            .await
            .unwrap();
    }
    assert_eq!(frame(&mut socket).await["type"], "error");
    assert_eq!(frame(&mut socket).await["type"], "error");
    // Still open: an interjection with no turn running starts one.
    send_frame(&mut socket, json!({"type": "interject", "text": "hi"})).await;
    let frames = frames_until(&mut socket, is_stop).await;
    assert_eq!(frames[0], json!({"type": "ack", "for": "interject"}));
    assert_eq!(frames.last().unwrap()["reason"], "end_turn");
    s.stop().await;
}

#[tokio::test]
async fn an_unknown_conversation_is_a_404_on_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, ANSWERS).await;
    let unknown = "00000000-0000-0000-0000-000000000000";
    assert_eq!(s.refused_socket(&conv(unknown, "/ws")).await, 404);
    assert_eq!(s.refused_socket(&conv("nope", "/ws")).await, 404);
    let (_, created) = s.call("POST", "/v1/conversations", None).await;
    let id = created["id"].as_str().unwrap();
    assert_eq!(s.refused_socket(&conv(id, "/ws?after=-1")).await, 400);
    // Plain HTTP on the socket's route is refused with a JSON error.
    let (status, error) = s.call("GET", &conv(id, "/ws"), None).await;
    assert!((400..500).contains(&status), "{status}: {error}");
    assert_eq!(error["code"], "NOT_A_WEBSOCKET");
    s.stop().await;
}

#[tokio::test]
async fn a_socket_carries_its_key_in_the_query() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ServerSettings {
        api_keys: vec!["sk-live".into()],
        ..ServerSettings::default()
    };
    let s = Server::start(&dir.path().join("t.db"), ANSWERS, settings).await;
    let response = s
        .http
        .post(s.url("/v1/conversations"))
        .bearer_auth("sk-live")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let id = response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(s.refused_socket(&conv(&id, "/ws")).await, 401);
    assert_eq!(
        s.refused_socket(&conv(&id, "/ws?token=sk-wrong")).await,
        401
    );
    let mut socket = s.socket(&conv(&id, "/ws?token=sk-live")).await;
    assert_eq!(frame(&mut socket).await["type"], "snapshot");
    // Only an upgrade may carry the key in its URL.
    let (status, _) = s.call("GET", &conv(&id, "/tree?token=sk-live"), None).await;
    assert_eq!(status, 401);
    // Nor an upgrade of any other route: only a conversation's socket.
    for path in [
        conv(&id, "/tree?token=sk-live"),
        "/v1/agents?token=sk-live".to_owned(),
    ] {
        let status = s
            .http
            .get(s.url(&path))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 401, "{path}");
    }
    s.stop().await;
}

/// An agent stored without the document naming its conversation's owner
/// (by an older version) is found again at start-up: a turn the live view
/// starts in its conversation still waits for the agent's approvals.
#[tokio::test]
async fn an_agent_stored_without_its_owner_document_is_indexed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let s = server(&dir, TWO_CALLS).await;
    let id = agent_with(&s, DICE, true).await;
    s.stop().await;
    let store = toolwire_store::open(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    assert!(
        store
            .delete_document("agent_by_conversation", &id)
            .await
            .unwrap()
    );
    drop(store);

    let s = server(&dir, TWO_CALLS).await;
    let (mut socket, _) = snapshot(&s, &id).await;
    send(&s, &id, "roll two").await;
    let frames = frames_until(&mut socket, is_stop).await;
    assert_eq!(frames.last().unwrap()["reason"], "requires_approval");
    s.stop().await;
}

#[tokio::test]
async fn messages_come_in_batches_as_they_come_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, TWO_CALLS).await;
    let id = agent_with(&s, DICE, false).await;
    let sent = send(&s, &id, "Roll twice.").await;
    settled_tree(&s, &id).await;
    // A second branch: the question edited, answered again.
    let user = sent["message_id"].as_str().unwrap();
    let (status, body) = s
        .call(
            "POST",
            &conv(&id, &format!("/messages/{user}/edit")),
            Some(json!({"text": "Roll again."})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let tree = settled_tree(&s, &id).await;
    let ids: Vec<String> = tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(ids.len() >= 8, "{tree}");
    let mut one_by_one = Vec::new();
    for mid in &ids {
        let (status, view) = s
            .call("GET", &conv(&id, &format!("/messages/{mid}")), None)
            .await;
        assert_eq!(status, 200, "{view}");
        one_by_one.push(view);
    }
    // Any order, both branches in one batch.
    let mut asked = ids.clone();
    asked.reverse();
    let (status, batch) = s
        .call(
            "GET",
            &conv(&id, &format!("/messages?ids={}", asked.join(","))),
            None,
        )
        .await;
    assert_eq!(status, 200, "{batch}");
    one_by_one.reverse();
    assert_eq!(batch["messages"].as_array().unwrap(), &one_by_one);

    let (_, other) = s.call("POST", "/v1/conversations", None).await;
    let (_, other_tree) = s
        .call("GET", &conv(other["id"].as_str().unwrap(), "/tree"), None)
        .await;
    let foreign = other_tree["root_id"].as_str().unwrap();
    let unknown = "01a201d7-f6c5-7124-836e-583bf0e142ea";
    let too_many = vec![ids[0].as_str(); 201].join(",");
    for (query, want, says) in [
        (String::new(), 400, "give 1 to 200"),
        (format!("{},not-an-id", ids[0]), 400, "not-an-id"),
        (too_many, 400, "got 201"),
        (format!("{},{unknown}", ids[0]), 404, unknown),
        (foreign.to_owned(), 404, foreign),
    ] {
        let (status, body) = s
            .call("GET", &conv(&id, &format!("/messages?ids={query}")), None)
            .await;
        assert_eq!(status, want, "{query}: {body}");
        assert!(body["message"].as_str().unwrap().contains(says), "{body}");
    }
    s.stop().await;
}

/// Two models, each a script that names itself.
fn two_models() -> toolwire_providers::Models {
    use std::sync::Arc;
    use toolwire_providers::{ModelEntry, ModelInfo, Models};
    let entry = |name: &str| ModelEntry {
        info: ModelInfo {
            name: name.into(),
            provider: "scripted".into(),
            model: format!("{name}-1"),
            ..ModelInfo::default()
        },
        provider: Arc::new(toolwire_providers::ScriptedProvider::new(
            toolwire_providers::Script::parse(&format!("steps: [{{text: \"{name} answers.\"}}]"))
                .unwrap(),
            false,
        )),
    };
    Models::new(vec![entry("alpha"), entry("beta")], Some("alpha")).unwrap()
}

/// The assistant nodes of `tree`: (model, summary), in creation order.
fn answers(tree: &Value) -> Vec<(String, String)> {
    tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "assistant")
        .map(|n| {
            (
                n["model"].as_str().unwrap_or("?").to_owned(),
                n["summary"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_conversation_picks_its_model_and_regenerates_with_another() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_models(
        &dir.path().join("t.db"),
        two_models(),
        ServerSettings::default(),
        toolwire_engine::EngineConfig::default(),
    )
    .await;
    let (status, c) = s.call("POST", "/v1/conversations", Some(json!({}))).await;
    assert_eq!(status, 201, "{c}");
    let id = c["id"].as_str().unwrap();

    let (status, model) = s.call("GET", &conv(id, "/model"), None).await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(model["model"], "alpha");
    assert_eq!(model["chosen"], Value::Null);
    assert_eq!(model["default"], "alpha");
    let names: Vec<&str> = model["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert_eq!(model["models"][1]["handle"], "scripted/beta-1");

    // The default answers; a regeneration by beta is a sibling beta wrote.
    send(&s, id, "hello").await;
    let tree = settled_tree(&s, id).await;
    assert_eq!(
        answers(&tree),
        [("alpha".to_owned(), "alpha answers.".to_owned())]
    );
    let first = tree["active_leaf"].as_str().unwrap().to_owned();
    let (status, body) = s
        .call(
            "POST",
            &conv(id, &format!("/messages/{first}/regenerate")),
            Some(json!({"model": "beta"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let tree = settled_tree(&s, id).await;
    assert_eq!(
        answers(&tree),
        [
            ("alpha".to_owned(), "alpha answers.".to_owned()),
            ("beta".to_owned(), "beta answers.".to_owned())
        ]
    );
    let regenerated = node(&tree, &tree["active_leaf"]);
    assert_eq!(
        regenerated["parent_id"],
        node(&tree, &json!(first))["parent_id"]
    );

    // Chosen for the conversation, beta answers what follows; null gives
    // the default back.
    let (status, model) = s
        .call("PUT", &conv(id, "/model"), Some(json!({"model": "beta"})))
        .await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(
        (&model["model"], &model["chosen"]),
        (&json!("beta"), &json!("beta"))
    );
    send(&s, id, "again").await;
    let tree = settled_tree(&s, id).await;
    assert_eq!(answers(&tree).last().unwrap().0, "beta");
    // One turn may name its own.
    let (status, body) = s
        .call(
            "POST",
            &conv(id, "/messages"),
            Some(json!({"text": "and you?", "model": "alpha"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let tree = settled_tree(&s, id).await;
    assert_eq!(answers(&tree).last().unwrap().0, "alpha");
    let (status, model) = s
        .call("PUT", &conv(id, "/model"), Some(json!({"model": null})))
        .await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(
        (&model["model"], &model["chosen"]),
        (&json!("alpha"), &Value::Null)
    );

    // A name the registry lacks is refused, naming the ones it has.
    for (method, path, body) in [
        ("PUT", conv(id, "/model"), json!({"model": "gamma"})),
        (
            "POST",
            conv(id, "/messages"),
            json!({"text": "x", "model": "gamma"}),
        ),
        (
            "POST",
            conv(id, &format!("/messages/{first}/regenerate")),
            json!({"model": "gamma"}),
        ),
    ] {
        let (status, error) = s.call(method, &path, Some(body)).await;
        assert_eq!(status, 400, "{method} {path}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("`gamma`") && message.contains("alpha, beta"),
            "{message}"
        );
    }
    let (status, _) = s
        .call(
            "GET",
            "/v1/conversations/00000000-0000-0000-0000-000000000000/model",
            None,
        )
        .await;
    assert_eq!(status, 404);
    s.stop().await;
}
