//! The turns the engine starts itself (a wake, an interjection that comes
//! too late for a turn or finds none running) keep the options of the
//! conversation's last turn: a tool that needed approval still does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use toolwire_core::{
    AgentEvent, ContentBlock, ConversationId, Gate, Incoming, NotifyConfig, Priority, StopReason,
};
use toolwire_engine::notify::{Activation, NotificationSettings};
use toolwire_engine::{Engine, EngineConfig, Interjection, Notified, TurnOptions};
use toolwire_providers::{Script, ScriptedProvider};

/// The first turn answers (slowly, so that an interjection can come
/// while it streams); every later one calls `risky`, then answers.
const ANSWER_THEN_RISKY: &str = r#"
turns:
  - steps:
      - text: "Hello there, this answer streams slowly."
        chunk_size: 64
        delay_ms: 20
  - steps:
      - text: "Checking."
        tool_calls:
          - {id: call_risky, name: risky, arguments: {n: 1}}
      - text: "Done."
"#;

fn approval_of(names: &[&str]) -> TurnOptions {
    TurnOptions {
        require_approval: names.iter().map(|n| n.to_string()).collect::<HashSet<_>>(),
        ..TurnOptions::default()
    }
}

async fn setup() -> (Engine, ConversationId, tempfile::TempDir) {
    let script = Script::parse(ANSWER_THEN_RISKY).unwrap();
    let provider = Arc::new(ScriptedProvider::new(script, false));
    let config = EngineConfig {
        notifications: NotificationSettings {
            activation: HashMap::from([("ci".to_owned(), Activation::Wake)]),
            queue: NotifyConfig {
                coalesce_window: Duration::from_millis(50),
                ..NotifyConfig::default()
            },
            ..NotificationSettings::default()
        },
        ..EngineConfig::default()
    };
    let (engine, dir) = engine(provider, echo_tools(&["risky"], Duration::ZERO), config).await;
    let conv = engine.create_conversation(None).await.unwrap().id;
    (engine, conv, dir)
}

/// A turn a front door starts with `risky` needing approval; the model
/// calls no tool in it, so it ends.
async fn answer_with_risky_gated(engine: &Engine, conv: ConversationId) {
    let outcome = engine
        .send_with(conv, "hi", None, approval_of(&["risky"]))
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::EndTurn);
}

/// Waits until the turn's answer starts to stream.
async fn text_streams(events: &mut toolwire_engine::Subscription) {
    loop {
        let e = events.recv().await.unwrap();
        if matches!(e.event, AgentEvent::TextDelta { .. }) {
            return;
        }
    }
}

/// Waits for the end of the next turn that starts.
async fn next_turn_end(events: &mut toolwire_engine::Subscription) -> StopReason {
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("a turn should end")
            .unwrap();
        if let AgentEvent::Stopped { reason, .. } = e.event {
            return reason;
        }
    }
}

/// The turn paused on `risky` without running it.
async fn assert_paused_on_risky(engine: &Engine, conv: ConversationId) {
    let pending = engine.pending_approval(conv).await.unwrap().unwrap();
    let waiting: Vec<(&str, Option<Gate>)> = pending
        .calls
        .iter()
        .map(|c| (c.call.name.as_str(), c.gate))
        .collect();
    assert_eq!(waiting, [("risky", Some(Gate::Approval))]);
    let leaf = engine.store().conversation(conv).await.unwrap().active_leaf;
    let path = engine.store().path_to(leaf).await.unwrap();
    let ran = path
        .iter()
        .flat_map(|m| &m.content)
        .any(|b| matches!(b, ContentBlock::ToolResult { .. }));
    assert!(!ran, "risky ran without approval");
}

#[tokio::test]
async fn a_wake_turn_keeps_the_conversations_approvals() {
    let (engine, conv, _dir) = setup().await;
    answer_with_risky_gated(&engine, conv).await;
    let mut events = engine.subscribe(conv);
    let notified = engine
        .notify(conv, Incoming::text("ci", Priority::High, "deployed"))
        .await
        .unwrap();
    assert!(matches!(notified, Notified::Waking));
    assert_eq!(
        next_turn_end(&mut events).await,
        StopReason::RequiresApproval
    );
    assert_paused_on_risky(&engine, conv).await;
}

#[tokio::test]
async fn a_late_interjection_starts_a_turn_with_the_same_options() {
    let (engine, conv, _dir) = setup().await;
    let mut events = engine.subscribe(conv);
    let first = engine
        .send_with(conv, "hi", None, approval_of(&["risky"]))
        .await
        .unwrap();
    // The answer streams: the turn calls no tool, so the interjection is
    // left for the end of the turn, which starts the next one with it.
    text_streams(&mut events).await;
    let queued = engine.interject(conv, "and check it").await.unwrap();
    assert!(matches!(queued, Interjection::Queued));
    assert_eq!(first.wait().await.reason, StopReason::EndTurn);
    // The first turn's end, then the next one's.
    assert_eq!(next_turn_end(&mut events).await, StopReason::EndTurn);
    assert_eq!(
        next_turn_end(&mut events).await,
        StopReason::RequiresApproval
    );
    assert_paused_on_risky(&engine, conv).await;
}

#[tokio::test]
async fn an_interjection_with_no_turn_running_keeps_the_options() {
    let (engine, conv, _dir) = setup().await;
    answer_with_risky_gated(&engine, conv).await;
    let Interjection::Started(handle) = engine.interject(conv, "check it").await.unwrap() else {
        panic!("no turn runs: the interjection should start one");
    };
    assert_eq!(handle.wait().await.reason, StopReason::RequiresApproval);
    assert_paused_on_risky(&engine, conv).await;
    // Forgotten, the engine's own turns get the defaults again.
    engine.forget_conversation_options(conv);
    assert!(
        engine
            .conversation_options(conv)
            .require_approval
            .is_empty()
    );
}

#[tokio::test]
async fn a_wake_with_no_remembered_options_starts_no_turn() {
    // A fresh conversation (as after a restart): nothing remembered, so a
    // wake must not fall back to every tool with no approvals.
    let (engine, conv, _dir) = setup().await;
    let notified = engine
        .notify(conv, Incoming::text("ci", Priority::High, "deployed"))
        .await
        .unwrap();
    assert!(matches!(notified, Notified::Waking));
    // Well past the coalescing window.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!engine.is_running(conv));
    assert!(engine.has_pending_notifications(conv));
    let leaf = engine.store().conversation(conv).await.unwrap().active_leaf;
    let path = engine.store().path_to(leaf).await.unwrap();
    assert!(
        path.iter().all(|m| m.role != toolwire_core::Role::User),
        "a wake started a turn with no remembered options"
    );
    // The next turn a front door starts carries them.
    answer_with_risky_gated(&engine, conv).await;
    assert!(!engine.has_pending_notifications(conv));
}

#[tokio::test]
async fn a_waking_notification_during_a_turn_that_calls_no_tool_wakes_the_agent_after_it() {
    let (engine, conv, _dir) = setup().await;
    let mut events = engine.subscribe(conv);
    let first = engine
        .send_with(conv, "hi", None, approval_of(&["risky"]))
        .await
        .unwrap();
    text_streams(&mut events).await;
    // The turn runs (and will deliver it only with a tool result, which
    // this answer has none of).
    let notified = engine
        .notify(conv, Incoming::text("ci", Priority::High, "deployed"))
        .await
        .unwrap();
    assert!(matches!(notified, Notified::Queued));
    assert_eq!(first.wait().await.reason, StopReason::EndTurn);
    assert_eq!(next_turn_end(&mut events).await, StopReason::EndTurn);
    // Its end wakes the agent: the next turn starts, with the notice.
    assert_eq!(
        next_turn_end(&mut events).await,
        StopReason::RequiresApproval
    );
    assert!(!engine.has_pending_notifications(conv));
}

#[tokio::test]
async fn a_late_interjection_to_a_turn_that_pauses_rides_on_the_approved_calls_result() {
    // One step streams slowly, then calls `risky`, which needs approval.
    let script = Script::parse(
        r#"
steps:
  - text: "Checking, slowly, before calling the tool."
    tool_calls:
      - {id: call_risky, name: risky, arguments: {n: 1}}
    chunk_size: 32
    delay_ms: 20
  - text: "Done."
"#,
    )
    .unwrap();
    let provider = Arc::new(ScriptedProvider::new(script, false));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&["risky"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap().id;
    let mut events = engine.subscribe(conv);
    let first = engine
        .send_with(conv, "check", None, approval_of(&["risky"]))
        .await
        .unwrap();
    text_streams(&mut events).await;
    let queued = engine.interject(conv, "use n=2 instead").await.unwrap();
    assert!(matches!(queued, Interjection::Queued));
    assert_eq!(first.wait().await.reason, StopReason::RequiresApproval);
    assert_paused_on_risky(&engine, conv).await;
    // The words were not lost with the paused turn's end: they come with
    // the result of the call run once the pause is answered.
    let approve = vec![(
        toolwire_core::ToolCallId("call_risky".into()),
        toolwire_core::Decision::Approve,
    )];
    let toolwire_engine::Responded::Started(next) = engine
        .respond(conv, approve, None, approval_of(&["risky"]))
        .await
        .unwrap()
    else {
        panic!("the answer starts the rest of the turn");
    };
    assert_eq!(next.wait().await.reason, StopReason::EndTurn);
    let leaf = engine.store().conversation(conv).await.unwrap().active_leaf;
    let path = engine.store().path_to(leaf).await.unwrap();
    let delivered = path.iter().flat_map(|m| &m.content).any(|b| {
        matches!(b, ContentBlock::Notification { source, text, .. }
            if source == "user" && text == "use n=2 instead")
    });
    assert!(delivered, "{path:#?}");
}

/// A front door's records of a run are stored with the run's beginning
/// (before `send_with` returns), under the run's id, and are that run's
/// alone: the options kept for the engine's own turns do not carry them.
#[tokio::test]
async fn run_records_are_stored_with_their_run_only() {
    let (engine, conv, _dir) = setup().await;
    let records = toolwire_engine::RunRecords::new(|run| {
        vec![(
            "door_run".to_owned(),
            run.to_string(),
            serde_json::json!({"run": run.to_string()}),
        )]
    });
    let handle = engine
        .send_with(
            conv,
            "hi",
            None,
            TurnOptions {
                run_records: Some(records),
                ..TurnOptions::default()
            },
        )
        .await
        .unwrap();
    let run = handle.run_id;
    let doc = engine
        .store()
        .document("door_run", &run.to_string())
        .await
        .unwrap()
        .expect("stored with the run's beginning");
    assert_eq!(doc.body, serde_json::json!({"run": run.to_string()}));
    assert_eq!(engine.store().run(run).await.unwrap().conversation_id, conv);
    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
    assert!(engine.conversation_options(conv).run_records.is_none());
    assert_eq!(engine.store().documents("door_run").await.unwrap().len(), 1);
}
