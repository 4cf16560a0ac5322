//! The path a conversation's last turn leaves in memory for the next:
//! always what the store reads to its last message, after turns with
//! tools, approvals, interjection-free edits, forks and compaction, and
//! never given to a turn once the conversation changed (here or in
//! another process on the same file).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use support::*;
use toolwire_core::{ConversationId, Decision, Message, Role, StopReason};
use toolwire_engine::{Engine, EngineConfig, Responded, TurnOptions};

/// Every turn: a call of `echo`, then an answer.
const CALL_THEN_ANSWER: &str = r#"
steps:
  - text: "Looking."
    tool_calls:
      - {name: echo, arguments: {n: 1}}
  - text: "Done."
"#;

/// Checks the kept path of `conversation` against the store's, and that
/// it ends at the active leaf; returns its length.
async fn kept_is_stored(engine: &Engine, conversation: ConversationId) -> usize {
    let kept = engine
        .kept_path(conversation)
        .expect("the last turn kept its path");
    let leaf = kept.last().unwrap().id;
    let read = engine.store().path_to(leaf).await.unwrap();
    assert_eq!(kept, read, "the kept path is what the store reads");
    let active = engine
        .store()
        .conversation(conversation)
        .await
        .unwrap()
        .active_leaf;
    assert_eq!(leaf, active, "kept for the active leaf");
    kept.len()
}

async fn ends_well(engine: &Engine, conversation: ConversationId, text: &str) -> Message {
    let outcome = engine.run(conversation, text).await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    outcome.final_message.unwrap()
}

#[tokio::test]
async fn the_kept_path_is_the_stored_one_after_every_kind_of_turn() {
    let (engine, _dir) = engine(
        script(CALL_THEN_ANSWER),
        echo_tools(&["echo"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap().id;

    // Turns with a tool call each: the second goes on from the kept path.
    ends_well(&engine, conv, "one").await;
    assert_eq!(kept_is_stored(&engine, conv).await, 5);
    ends_well(&engine, conv, "two").await;
    assert_eq!(kept_is_stored(&engine, conv).await, 9);

    // A pause for approval, then the answer: the answer's turn reads the
    // path (no revision is read on that way), and the next plain message
    // keeps it again.
    let gated = TurnOptions {
        require_approval: HashSet::from(["echo".to_owned()]),
        ..TurnOptions::default()
    };
    let paused = engine
        .send_with(conv, "three", None, gated.clone())
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(paused.reason, StopReason::RequiresApproval);
    assert_eq!(kept_is_stored(&engine, conv).await, 11);
    let pending = engine.pending_approval(conv).await.unwrap().unwrap();
    let answers = pending
        .waiting()
        .map(|c| (c.call.id.clone(), Decision::Approve))
        .collect();
    let Responded::Started(handle) = engine.respond(conv, answers, None, gated).await.unwrap()
    else {
        panic!("the answers start the turn again");
    };
    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
    ends_well(&engine, conv, "four").await;
    kept_is_stored(&engine, conv).await;

    // A compaction node on demand, then a turn after it.
    let compacted = engine
        .compact(conv, TurnOptions::default())
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(
        compacted.reason,
        StopReason::EndTurn,
        "{:?}",
        compacted.error
    );
    ends_well(&engine, conv, "five").await;
    kept_is_stored(&engine, conv).await;

    // An edit of an earlier message: a new branch, kept once it ends.
    let path = engine.kept_path(conv).unwrap();
    let first_user = path.iter().find(|m| m.role == Role::User).unwrap().id;
    let edited = engine
        .edit(first_user, "one, again")
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(edited.reason, StopReason::EndTurn);
    // Its turn read no revision: it keeps nothing of its own, and what
    // was kept stays the path to the old branch's end.
    let old = engine.kept_path(conv).unwrap();
    assert_eq!(old, path);
    assert_eq!(
        old,
        engine
            .store()
            .path_to(old.last().unwrap().id)
            .await
            .unwrap()
    );
    ends_well(&engine, conv, "six").await;
    assert_eq!(kept_is_stored(&engine, conv).await, 9);

    // A fork copies the path: the copy's turns keep their own.
    let fork = engine.fork(path.last().unwrap().id).await.unwrap().id;
    ends_well(&engine, fork, "in the fork").await;
    kept_is_stored(&engine, fork).await;
    kept_is_stored(&engine, conv).await;

    // A new system prompt: the next turn sees it, and keeps it.
    engine.set_system_prompt(conv, "be brief").await.unwrap();
    ends_well(&engine, conv, "seven").await;
    kept_is_stored(&engine, conv).await;
    let kept = engine.kept_path(conv).unwrap();
    assert_eq!(kept[0].text(), "be brief");
}

#[tokio::test]
async fn a_change_by_another_process_is_never_served_from_a_kept_path() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let config = EngineConfig::default;
    let tools = || echo_tools(&["echo"], Duration::ZERO);
    let here = engine_at(&db, script(CALL_THEN_ANSWER), tools(), config()).await;
    let there = engine_at(&db, script(CALL_THEN_ANSWER), tools(), config()).await;
    let conv = here.create_conversation(None).await.unwrap().id;
    ends_well(&here, conv, "one").await;
    let before = here.kept_path(conv).unwrap();

    // The other engine changes the root: this one's kept path is now
    // stale, and its next turn must not use it.
    there
        .set_system_prompt(conv, "changed elsewhere")
        .await
        .unwrap();
    assert_eq!(here.kept_path(conv).unwrap(), before, "kept, but stale");
    ends_well(&here, conv, "two").await;
    let kept = here.kept_path(conv).unwrap();
    assert_eq!(kept[0].text(), "changed elsewhere");
    kept_is_stored(&here, conv).await;

    // A turn there moves the leaf: here the kept path ends elsewhere and
    // is not used; the turn here goes on from the other's answer.
    let theirs = ends_well(&there, conv, "three").await;
    let mine = ends_well(&here, conv, "four").await;
    let path = here.kept_path(conv).unwrap();
    assert!(path.iter().any(|m| m.id == theirs.id));
    assert_eq!(path.last().unwrap().id, mine.id);
    kept_is_stored(&here, conv).await;
}
