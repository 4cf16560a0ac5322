//! Changes to a conversation that are not turns (fork, active leaf,
//! system prompt) against running turns: the engine decides, under the
//! conversation's lock, that a change made while a turn runs is refused
//! and that a turn never starts in the middle of a change. Raced many
//! times on a real SQLite file, the tree stays consistent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use support::*;
use toolwire_core::{ContentBlock, ConversationId, Message, MessageId, Role, StopReason};
use toolwire_engine::{Engine, EngineConfig, EngineError};
use toolwire_providers::{Script, ScriptedProvider};
use toolwire_store::StoreError;

/// A turn of four messages (user, a call, its result, the answer),
/// streamed slowly enough for a change to land in its middle.
const TWO_STEPS: &str = r#"
steps:
  - text: "Looking."
    tool_calls:
      - {name: echo, arguments: {n: 1}}
    chunk_size: 16
    delay_ms: 1
  - text: "Done."
    chunk_size: 16
    delay_ms: 1
"#;

const ROUNDS: u32 = 200;

async fn two_step_engine() -> (Engine, tempfile::TempDir) {
    let provider = Arc::new(ScriptedProvider::new(
        Script::parse(TWO_STEPS).unwrap(),
        false,
    ));
    engine(
        provider,
        echo_tools(&["echo"], Duration::from_millis(3)),
        EngineConfig::default(),
    )
    .await
}

/// A conversation with two finished turns; the final answers of both.
async fn two_turns(engine: &Engine) -> (ConversationId, [MessageId; 2]) {
    let conversation = engine.create_conversation(None).await.unwrap().id;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let outcome = engine.run(conversation, "hello").await.unwrap();
        assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
        answers.push(outcome.final_message.unwrap().id);
    }
    (conversation, [answers[0], answers[1]])
}

async fn ids(engine: &Engine, conversation: ConversationId) -> HashSet<MessageId> {
    let messages = engine.store().messages(conversation).await.unwrap();
    messages.into_iter().map(|m| m.id).collect()
}

/// The messages stored since `before`, checked to be one whole turn: a
/// chain user → call → result → answer, each under the one before. Its
/// first message's parent is returned with it.
async fn one_whole_turn(
    engine: &Engine,
    conversation: ConversationId,
    before: &HashSet<MessageId>,
) -> (MessageId, Vec<Message>) {
    let new: Vec<Message> = engine
        .store()
        .messages(conversation)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| !before.contains(&m.id))
        .collect();
    let roles: Vec<Role> = new.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::Tool, Role::Assistant],
        "one turn's messages, whole"
    );
    for pair in new.windows(2) {
        assert_eq!(
            pair[1].parent_id,
            Some(pair[0].id),
            "a turn's message hangs under its previous one"
        );
    }
    (new[0].parent_id.unwrap(), new)
}

/// Every fourth round the change is asked first, and is made before the
/// turn's start (which then waits for it). In the others it waits for a
/// while spread over about a turn's length or more: most land during the
/// turn, some after it.
fn change_first(round: u32) -> bool {
    round.is_multiple_of(4)
}

async fn pause(round: u32) {
    if !change_first(round) {
        let ms = u64::from(round.wrapping_mul(7_919) % 150);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_leaf_change_racing_a_turn_is_made_before_after_or_refused() {
    let (engine, _dir) = two_step_engine().await;
    let (conversation, old) = two_turns(&engine).await;
    let (mut refused, mut before_turn, mut after_turn) = (0, 0, 0);
    for round in 0..ROUNDS {
        let before = ids(&engine, conversation).await;
        let leaf = engine
            .store()
            .conversation(conversation)
            .await
            .unwrap()
            .active_leaf;
        // An older answer than the current leaf, so that a move shows.
        let target = if old[0] == leaf { old[1] } else { old[0] };
        let send = engine.send(conversation, "go on", None);
        let change = async {
            pause(round).await;
            engine.set_active_leaf(conversation, target).await
        };
        let (sent, changed) = if change_first(round) {
            let (changed, sent) = tokio::join!(change, send);
            (sent, changed)
        } else {
            tokio::join!(send, change)
        };
        let outcome = sent.unwrap().wait().await;
        assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
        let (parent, turn) = one_whole_turn(&engine, conversation, &before).await;
        let active = engine
            .store()
            .conversation(conversation)
            .await
            .unwrap()
            .active_leaf;
        let answer = turn[3].id;
        match changed {
            Err(EngineError::TurnInProgress(c)) => {
                assert_eq!(c, conversation);
                assert_eq!(
                    parent, leaf,
                    "round {round}: refused, so the turn went on from the old leaf"
                );
                assert_eq!(
                    active, answer,
                    "round {round}: the refused change moved nothing"
                );
                refused += 1;
            }
            Ok(()) if parent == target => {
                assert_eq!(
                    active, answer,
                    "round {round}: changed before the turn, which went on from it"
                );
                before_turn += 1;
            }
            Ok(()) => {
                assert_eq!(
                    parent, leaf,
                    "round {round}: the turn began on a branch nobody chose"
                );
                assert_eq!(
                    active, target,
                    "round {round}: changed after the turn, so it stays"
                );
                after_turn += 1;
            }
            Err(e) => panic!("round {round}: {e}"),
        }
    }
    println!("active leaf: {refused} refused, {before_turn} before the turn, {after_turn} after");
    assert_eq!(refused + before_turn + after_turn, ROUNDS);
    assert!(
        refused > 0,
        "no change landed during a turn: the race was not run"
    );
    assert!(before_turn > 0, "no change landed before a turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_racing_a_turn_copies_whole_steps_or_is_refused() {
    let (engine, _dir) = two_step_engine().await;
    let (conversation, _) = two_turns(&engine).await;
    let (mut refused, mut forked) = (0, 0);
    for round in 0..ROUNDS {
        let before = ids(&engine, conversation).await;
        let leaf = engine
            .store()
            .conversation(conversation)
            .await
            .unwrap()
            .active_leaf;
        let send = engine.send(conversation, "go on", None);
        // Forks at whatever the leaf is when it is asked: during the turn,
        // one of its messages.
        let fork = async {
            pause(round).await;
            let at = engine
                .store()
                .conversation(conversation)
                .await
                .unwrap()
                .active_leaf;
            (at, engine.fork(at).await)
        };
        let (sent, (at, result)) = if change_first(round) {
            // A fork reads which conversation `at` is in before it takes
            // that conversation's lock, so a turn asked for at the same
            // moment could win every round on a loaded machine: here the
            // fork is asked first and answered before the turn is asked.
            let f = fork.await;
            (send.await, f)
        } else {
            tokio::join!(send, fork)
        };
        let outcome = sent.unwrap().wait().await;
        assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
        // The source is untouched by the fork: one whole turn, from the
        // leaf it had.
        let (parent, _) = one_whole_turn(&engine, conversation, &before).await;
        assert_eq!(parent, leaf, "round {round}");
        match result {
            Err(EngineError::TurnInProgress(c)) => {
                assert_eq!(c, conversation);
                refused += 1;
            }
            Ok(copy) => {
                assert_eq!(
                    copy.forked_from.map(|f| (f.conversation_id, f.message_id)),
                    Some((conversation, at)),
                    "round {round}"
                );
                let source = engine.store().path_to(at).await.unwrap();
                let copied = engine.store().path_to(copy.active_leaf).await.unwrap();
                let shape = |path: &[Message]| -> Vec<(Role, Vec<ContentBlock>)> {
                    path.iter().map(|m| (m.role, m.content.clone())).collect()
                };
                assert_eq!(
                    shape(&copied),
                    shape(&source),
                    "round {round}: the fork holds the path, whole"
                );
                forked += 1;
            }
            Err(e) => panic!("round {round}: {e}"),
        }
    }
    println!("fork: {refused} refused, {forked} made");
    assert_eq!(refused + forked, ROUNDS);
    assert!(
        refused > 0,
        "no fork landed during a turn: the race was not run"
    );
    assert!(forked > 0, "no fork was made");
}

#[tokio::test]
async fn changes_are_refused_while_a_turn_runs_and_made_when_idle() {
    let (engine, _dir) = two_step_engine().await;
    let (conversation, old) = two_turns(&engine).await;
    let mut events = engine.subscribe(conversation);
    let handle = engine.send(conversation, "go on", None).await.unwrap();
    while type_of(&events.recv().await.unwrap().event) != "text_delta" {}
    let busy = |r: Result<(), EngineError>| matches!(r, Err(EngineError::TurnInProgress(c)) if c == conversation);
    assert!(busy(engine.set_active_leaf(conversation, old[0]).await));
    assert!(busy(
        engine.set_system_prompt(conversation, "be brief").await
    ));
    assert!(busy(engine.fork(old[0]).await.map(|_| ())));
    let refused = engine
        .set_active_leaf(conversation, old[0])
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("a turn is already running"),
        "{refused}"
    );
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::EndTurn);
    let answer = outcome.final_message.unwrap().id;
    let conv = engine.store().conversation(conversation).await.unwrap();
    assert_eq!(conv.active_leaf, answer, "nothing refused was written");
    let root = engine.store().message(conv.root_id).await.unwrap();
    assert_ne!(root.text(), "be brief");

    // Idle: each is made.
    engine.set_active_leaf(conversation, old[0]).await.unwrap();
    let conv = engine.store().conversation(conversation).await.unwrap();
    assert_eq!(conv.active_leaf, old[0]);
    engine
        .set_system_prompt(conversation, "be brief")
        .await
        .unwrap();
    let root = engine.store().message(conv.root_id).await.unwrap();
    assert_eq!(root.text(), "be brief");
    engine.set_system_prompt(conversation, "").await.unwrap();
    let root = engine.store().message(conv.root_id).await.unwrap();
    assert!(root.content.is_empty(), "an empty prompt is none");
    let copy = engine.fork(old[0]).await.unwrap();
    assert_eq!(copy.forked_from.map(|f| f.message_id), Some(old[0]));
    assert_ne!(copy.id, conversation);
    let copied = engine.store().path_to(copy.active_leaf).await.unwrap();
    let source = engine.store().path_to(old[0]).await.unwrap();
    assert_eq!(copied.len(), source.len());
    // A turn goes on from the chosen leaf.
    let outcome = engine.run(conversation, "again").await.unwrap();
    let path = engine
        .store()
        .path_to(outcome.final_message.unwrap().id)
        .await
        .unwrap();
    assert!(path.iter().any(|m| m.id == old[0]));
    assert!(!path.iter().any(|m| m.id == answer));
}

#[tokio::test]
async fn changes_naming_unknown_ids_get_clear_errors() {
    let (engine, _dir) = two_step_engine().await;
    let (conversation, old) = two_turns(&engine).await;
    let other = engine.create_conversation(None).await.unwrap().id;
    let nowhere = ConversationId::new();
    let no_message = MessageId::new();

    let e = engine.fork(no_message).await.unwrap_err();
    assert!(
        matches!(e, EngineError::Store(StoreError::MessageNotFound(m)) if m == no_message),
        "{e}"
    );
    assert!(e.to_string().contains(&no_message.to_string()), "{e}");

    let e = engine.set_active_leaf(nowhere, old[0]).await.unwrap_err();
    assert!(
        matches!(e, EngineError::Store(StoreError::ConversationNotFound(c)) if c == nowhere),
        "{e}"
    );
    let e = engine
        .set_active_leaf(conversation, no_message)
        .await
        .unwrap_err();
    assert!(
        matches!(e, EngineError::Store(StoreError::MessageNotFound(m)) if m == no_message),
        "{e}"
    );
    // A message of another conversation is not a leaf of this one.
    let other_leaf = engine
        .store()
        .conversation(other)
        .await
        .unwrap()
        .active_leaf;
    let e = engine.set_active_leaf(other, old[0]).await.unwrap_err();
    assert!(e.to_string().contains(&old[0].to_string()), "{e}");
    let unchanged = engine
        .store()
        .conversation(other)
        .await
        .unwrap()
        .active_leaf;
    assert_eq!(other_leaf, unchanged, "nothing refused was written");

    let e = engine
        .set_system_prompt(nowhere, "be brief")
        .await
        .unwrap_err();
    assert!(
        matches!(e, EngineError::Store(StoreError::ConversationNotFound(c)) if c == nowhere),
        "{e}"
    );
    assert!(e.to_string().contains(&nowhere.to_string()), "{e}");
}

#[tokio::test]
async fn records_are_written_and_removed_through_the_engine() {
    let (engine, _dir) = two_step_engine().await;
    let body = serde_json::json!({"name": "a"});
    engine.put_record("thing", "t1", &body).await.unwrap();
    let doc = engine
        .store()
        .document("thing", "t1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(doc.body, body);
    engine
        .write_records(
            "thing",
            &[
                ("t1".into(), None),
                ("t2".into(), Some(serde_json::json!({"name": "b"}))),
            ],
        )
        .await
        .unwrap();
    let docs = engine.store().documents("thing").await.unwrap();
    let names: Vec<&str> = docs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(names, ["t2"]);
    assert!(engine.delete_record("thing", "t2").await.unwrap());
    assert!(!engine.delete_record("thing", "t2").await.unwrap());
    assert!(engine.store().documents("thing").await.unwrap().is_empty());
}
