//! Paused turns: calls that wait for approval or for the client, the
//! answers, and what the tree holds after each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;
use support::*;
use toolwire_core::{ContentBlock, Decision, Gate, Message, Role, StopReason, ToolCallId};
use toolwire_engine::{Engine, EngineConfig, EngineError, Responded, TurnOptions};
use toolwire_tools::ToolSpec;

/// The first turn calls a tool that needs approval; the second answers.
const RISKY_THEN_DONE: &str = r#"
turns:
  - steps:
      - text: "Let me check."
        tool_calls:
          - {id: call_risky, name: risky, arguments: {n: 1}}
          - {id: call_safe, name: safe, arguments: {n: 2}}
      - text: "All done."
  - steps:
      - text: "Another way, then."
"#;

fn approval_of(names: &[&str]) -> TurnOptions {
    TurnOptions {
        require_approval: names.iter().map(|n| n.to_string()).collect::<HashSet<_>>(),
        ..TurnOptions::default()
    }
}

async fn active_path(engine: &Engine, conv: toolwire_core::ConversationId) -> Vec<Message> {
    let leaf = engine.store().conversation(conv).await.unwrap().active_leaf;
    engine.store().path_to(leaf).await.unwrap()
}

/// The results on a path, as (call id, text).
fn results(path: &[Message]) -> Vec<(String, String)> {
    path.iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                ..
            } => Some((tool_use_id.0.clone(), content.clone())),
            _ => None,
        })
        .collect()
}

async fn paused_engine() -> (Engine, toolwire_core::ConversationId, tempfile::TempDir) {
    let tools = echo_tools(&["risky", "safe"], Duration::ZERO);
    let (engine, dir) = engine(script(RISKY_THEN_DONE), tools, EngineConfig::default()).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine
        .send_with(conv.id, "go", None, approval_of(&["risky"]))
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::RequiresApproval);
    assert_eq!(outcome.error, None);
    (engine, conv.id, dir)
}

#[tokio::test]
async fn a_call_needing_approval_pauses_the_turn_and_runs_once_approved() {
    let (engine, conv, _dir) = paused_engine().await;

    let pending = engine.pending_approval(conv).await.unwrap().unwrap();
    let gates: Vec<(&str, Option<Gate>)> = pending
        .calls
        .iter()
        .map(|c| (c.call.id.0.as_str(), c.gate))
        .collect();
    assert_eq!(
        gates,
        [("call_risky", Some(Gate::Approval)), ("call_safe", None)]
    );
    let path = active_path(&engine, conv).await;
    assert_eq!(path.last().unwrap().id, pending.message_id);
    assert!(results(&path).is_empty(), "nothing ran before the answer");
    let types = event_types(&engine, conv).await;
    assert_eq!(
        types[types.len() - 3..],
        ["assistant_message_created", "approval_requested", "stopped"],
        "the waiting calls are announced with their message"
    );

    // A new message under the waiting one is refused.
    let err = engine.send(conv, "hello?", None).await.unwrap_err();
    assert!(
        matches!(err, EngineError::ApprovalPending { message_id, .. } if message_id == pending.message_id),
        "{err}"
    );

    // Answers must cover exactly the waiting calls.
    let err = engine
        .respond(
            conv,
            vec![(ToolCallId("call_safe".into()), Decision::Approve)],
            None,
            approval_of(&["risky"]),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::ApprovalMismatch { .. }));
    assert!(err.to_string().contains("call_risky"), "{err}");
    assert!(err.to_string().contains("do not wait: call_safe"), "{err}");
    assert!(engine.pending_approval(conv).await.unwrap().is_some());

    let answers = vec![(ToolCallId("call_risky".into()), Decision::Approve)];
    let Responded::Started(handle) = engine
        .respond(conv, answers.clone(), None, approval_of(&["risky"]))
        .await
        .unwrap()
    else {
        panic!("the turn should go on");
    };
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(outcome.final_message.unwrap().text(), "All done.");

    let path = active_path(&engine, conv).await;
    let got = results(&path);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0, "call_risky");
    assert!(got[0].1.contains("risky got"), "{got:?}");
    assert_eq!(got[1].0, "call_safe");
    assert!(engine.pending_approval(conv).await.unwrap().is_none());

    // The same answers again: applied already, nothing runs twice.
    assert!(matches!(
        engine
            .respond(conv, answers, None, TurnOptions::default())
            .await
            .unwrap(),
        Responded::AlreadyApplied
    ));
    assert_eq!(results(&active_path(&engine, conv).await).len(), 2);
    // Answers for calls that never waited.
    let err = engine
        .respond(
            conv,
            vec![(ToolCallId("nope".into()), Decision::Approve)],
            None,
            TurnOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::NothingPending(_)), "{err}");
}

#[tokio::test]
async fn a_denied_call_is_answered_with_the_reason_and_a_message_may_follow() {
    let (engine, conv, _dir) = paused_engine().await;
    let answers = vec![(
        ToolCallId("call_risky".into()),
        Decision::Deny {
            reason: Some("too risky today".into()),
        },
    )];
    let Responded::Started(handle) = engine
        .respond(
            conv,
            answers,
            Some("Do it another way.".into()),
            approval_of(&["risky"]),
        )
        .await
        .unwrap()
    else {
        panic!("the turn should go on");
    };
    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
    let path = active_path(&engine, conv).await;
    let got = results(&path);
    assert_eq!(
        got[0],
        (
            "call_risky".to_owned(),
            "Error: request to call tool denied. User reason: too risky today".to_owned()
        )
    );
    assert!(got[1].1.contains("safe got"), "the other call ran: {got:?}");
    let roles: Vec<Role> = path.iter().map(|m| m.role).collect();
    assert_eq!(
        roles[roles.len() - 4..],
        [Role::Tool, Role::Tool, Role::User, Role::Assistant]
    );
    assert_eq!(path[path.len() - 2].text(), "Do it another way.");
    assert_eq!(path[path.len() - 1].text(), "Another way, then.");
}

#[tokio::test]
async fn a_client_tool_waits_for_the_clients_result() {
    let yaml = r#"
steps:
  - tool_calls:
      - {id: call_pick, name: pick_color, arguments: {}}
  - text: "You picked it."
"#;
    let (engine, _dir) = engine(
        script(yaml),
        echo_tools(&["pick_color"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let options = TurnOptions {
        client_tools: vec![ToolSpec {
            name: "pick_color".into(),
            server: None,
            description: "Asks the user for a color".into(),
            parameters: json!({"type": "object", "properties": {}}),
            read_only: false,
        }],
        ..TurnOptions::default()
    };
    let outcome = engine
        .send_with(conv.id, "pick", None, options.clone())
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::RequiresApproval);
    let pending = engine.pending_approval(conv.id).await.unwrap().unwrap();
    assert_eq!(
        pending.calls[0].gate,
        Some(Gate::Client),
        "a client tool wins over the server tool of the same name"
    );
    // Approving it would run it on the server: refused, the pause stays.
    let err = engine
        .respond(
            conv.id,
            vec![(ToolCallId("call_pick".into()), Decision::Approve)],
            None,
            options.clone(),
        )
        .await
        .expect_err("approving a client tool is refused");
    assert!(
        matches!(&err, EngineError::ClientToolApproved(id) if id.0 == "call_pick"),
        "{err}"
    );
    assert!(engine.pending_approval(conv.id).await.unwrap().is_some());
    assert!(!engine.is_running(conv.id));
    let answer = Decision::Result {
        content: "teal".into(),
        is_error: false,
    };
    let Responded::Started(handle) = engine
        .respond(
            conv.id,
            vec![(ToolCallId("call_pick".into()), answer)],
            None,
            options,
        )
        .await
        .unwrap()
    else {
        panic!("the turn should go on");
    };
    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
    let got = results(&active_path(&engine, conv.id).await);
    assert_eq!(got, [("call_pick".to_owned(), "teal".to_owned())]);
}

#[tokio::test]
async fn a_pause_survives_a_restart() {
    let (engine, conv, dir) = paused_engine().await;
    drop(engine);
    // The file reopened, as a restarted process opens it.
    let tools = echo_tools(&["risky", "safe"], Duration::ZERO);
    let engine = engine_at(
        &dir.path().join("test.db"),
        script(RISKY_THEN_DONE),
        tools,
        EngineConfig::default(),
    )
    .await;
    let pending = engine.pending_approval(conv).await.unwrap().unwrap();
    assert_eq!(pending.waiting_ids(), [ToolCallId("call_risky".into())]);
    let Responded::Started(handle) = engine
        .respond(
            conv,
            vec![(ToolCallId("call_risky".into()), Decision::Approve)],
            None,
            TurnOptions::default(),
        )
        .await
        .unwrap()
    else {
        panic!("the turn should go on");
    };
    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
    drop(dir);
}

#[tokio::test]
async fn abandoning_a_pause_answers_every_call_unrun() {
    let (engine, conv, _dir) = paused_engine().await;
    let outcome = engine
        .abandon_pending(conv, "the user cancelled")
        .await
        .unwrap()
        .expect("a pause to abandon")
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::Cancelled);
    assert!(engine.pending_approval(conv).await.unwrap().is_none());
    let got = results(&active_path(&engine, conv).await);
    assert_eq!(got.len(), 2);
    assert!(
        got.iter().all(|(_, t)| t == "Not run: the user cancelled"),
        "{got:?}"
    );
    // Nothing waits now: a new message goes through.
    let outcome = engine.run(conv, "again").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert!(engine.abandon_pending(conv, "x").await.unwrap().is_none());
}
