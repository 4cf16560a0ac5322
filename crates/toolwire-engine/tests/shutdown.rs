//! Stopping the engine (what `serve` does on SIGTERM): no turn starts,
//! running turns reach their next stored step or are cut after the grace
//! with what they had stored and marked interrupted, and nothing a front
//! door was told it accepted is lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use support::*;
use toolwire_core::{ContentBlock, Message, MessageStatus, Role, StopReason};
use toolwire_engine::{Engine, EngineConfig, EngineError, Interjection};

async fn active_path(engine: &Engine, conversation: toolwire_core::ConversationId) -> Vec<Message> {
    let conv = engine.store().conversation(conversation).await.unwrap();
    engine.store().path_to(conv.active_leaf).await.unwrap()
}

fn tool_results(path: &[Message]) -> Vec<String> {
    path.iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            ContentBlock::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect()
}

/// A step that takes about a second and asks for a tool, then an answer.
const SLOW_STEP_THEN_CALL: &str = r#"
steps:
  - text: "Let me look."
    tool_calls:
      - {name: fast, arguments: {n: 1}}
    chunk_size: 16
    delay_ms: 40
  - text: "Done."
"#;

#[tokio::test]
async fn a_running_step_is_stored_and_its_calls_answered_as_not_run() {
    let (engine, _dir) = engine(
        script(SLOW_STEP_THEN_CALL),
        echo_tools(&["fast"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    while type_of(&events.recv().await.unwrap().event) != "text_delta" {}

    let report = engine.shutdown(Duration::from_secs(30)).await;
    assert_eq!((report.running, report.cut, report.left), (1, 0, 0));
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::Interrupted);
    assert!(outcome.error.unwrap().contains("interrupted by shutdown"));

    let path = active_path(&engine, conv.id).await;
    let roles: Vec<Role> = path.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::Tool],
        "{path:?}"
    );
    // The step ran to its end: complete, with its call answered unrun.
    assert_eq!(path[2].status, MessageStatus::Complete);
    assert_eq!(path[2].text(), "Let me look.");
    let results = tool_results(&path);
    assert_eq!(results.len(), 1);
    assert!(results[0].contains("shutting down"), "{results:?}");

    // Nothing starts any more, and says why.
    let refused = engine.send(conv.id, "more", None).await;
    assert!(
        matches!(refused, Err(EngineError::ShuttingDown)),
        "{refused:?}"
    );
    assert!(engine.is_stopping());
}

#[tokio::test]
async fn a_step_that_outlasts_the_grace_is_cut_and_stored_interrupted() {
    let slow = "steps:\n  - text: \"A long answer that streams for many seconds, piece by piece.\"\n    chunk_size: 8\n    delay_ms: 100\n";
    let (engine, _dir) = engine(
        script(slow),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    while type_of(&events.recv().await.unwrap().event) != "text_delta" {}

    let report = engine.shutdown(Duration::from_millis(300)).await;
    assert_eq!((report.running, report.cut, report.left), (1, 1, 0));
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::Interrupted);

    let path = active_path(&engine, conv.id).await;
    let last = path.last().unwrap();
    assert_eq!(last.role, Role::Assistant, "{path:?}");
    assert_eq!(last.status, MessageStatus::Interrupted);
    assert!(last.text().starts_with("A long"), "{}", last.text());
    let run = engine.store().run(outcome.run_id).await.unwrap();
    assert_eq!(run.stop_reason, Some(StopReason::Interrupted), "{run:?}");
}

#[tokio::test]
async fn words_interjected_into_a_stopping_turn_are_stored() {
    let calls = "steps:\n  - tool_calls: [{name: slow, arguments: {}}]\n  - text: never\n";
    let (engine, _dir) = engine(
        script(calls),
        echo_tools(&["slow"], Duration::from_millis(500)),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    while type_of(&events.recv().await.unwrap().event) != "tool_execution_started" {}
    let stopping = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.shutdown(Duration::from_secs(30)).await })
    };
    // Interject once the shutdown has begun (the guard only fails a hang).
    tokio::time::timeout(Duration::from_secs(10), async {
        while !engine.is_stopping() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the shutdown began");
    assert!(matches!(
        engine
            .interject(conv.id, "wait, one more thing")
            .await
            .unwrap(),
        Interjection::Queued
    ));
    let report = stopping.await.unwrap();
    assert_eq!(report.cut, 0);
    assert_eq!(handle.wait().await.reason, StopReason::Interrupted);
    let path = active_path(&engine, conv.id).await;
    let last = path.last().unwrap();
    assert_eq!(last.role, Role::User, "{path:?}");
    assert_eq!(last.text(), "wait, one more thing");
}

/// A front door answers "accepted" once `send` returns: by then the user
/// message is stored (before, it was stored by the turn's task, later).
#[tokio::test]
async fn the_user_message_is_stored_when_send_returns() {
    let (engine, _dir) = engine(
        script("steps:\n  - text: hi\n    delay_ms: 50\n"),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let handle = engine.send(conv.id, "stored already?", None).await.unwrap();
    let path = active_path(&engine, conv.id).await;
    assert!(
        path.iter()
            .any(|m| m.role == Role::User && m.text() == "stored already?"),
        "{path:?}"
    );
    handle.wait().await;
}
