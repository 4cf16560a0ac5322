//! Run ownership: engines sharing one database (here one SQLite file, each
//! engine on its own store, as two processes would be) leave each other's
//! turns alone, and an engine starting up interrupts only the turns whose
//! owner is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::*;
use toolwire_core::{AgentEvent, ConversationId, InstanceId, RunId, StopReason};
use toolwire_engine::{Engine, EngineConfig};
use toolwire_store::Store;

const SLOW_CALL_THEN_ANSWER: &str = r#"
steps:
  - text: "Working."
    tool_calls:
      - {name: slow, arguments: {n: 1}}
  - text: "All done."
"#;

/// A store on the file at `url`, of its own (as another process's).
async fn open(url: &str) -> Arc<dyn Store> {
    toolwire_store::open(url).await.unwrap()
}

async fn start(store: Arc<dyn Store>, config: EngineConfig) -> Engine {
    Engine::start(
        store,
        script("steps:\n  - text: hi\n"),
        echo_tools(&[], Duration::ZERO),
        config,
    )
    .await
    .unwrap()
}

/// The stop events of a conversation: run and reason.
async fn stops(store: &dyn Store, conversation: ConversationId) -> Vec<(RunId, StopReason)> {
    store
        .events_since(conversation, 0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            AgentEvent::Stopped { run_id, reason, .. } => Some((run_id, reason)),
            _ => None,
        })
        .collect()
}

/// The pid of a process that has exited (and been reaped).
fn exited_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A process that stays alive until killed.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn spawn() -> Sleeper {
        Sleeper(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_of_another_engine_is_left_alone_and_ends_normally() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let a = Engine::start(
        open(&url).await,
        script(SLOW_CALL_THEN_ANSWER),
        echo_tools(&["slow"], Duration::from_secs(2)),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let conv = a.create_conversation(None).await.unwrap();
    let mut events = a.subscribe(conv.id);
    let handle = a.send(conv.id, "go", None).await.unwrap();
    loop {
        let e = events.recv().await.unwrap();
        if type_of(&e.event) == "tool_execution_started" {
            break;
        }
    }

    // A second engine starts on the same file while the tool runs.
    let b_store = open(&url).await;
    let b = start(b_store.clone(), EngineConfig::default()).await;
    assert_ne!(b.instance().id, a.instance().id);
    let run = b_store.run(handle.run_id).await.unwrap();
    assert_eq!(
        run.stop_reason, None,
        "the running turn was not interrupted"
    );
    assert_eq!(run.owner, Some(a.instance().id));
    assert_eq!(stops(b_store.as_ref(), conv.id).await, vec![]);

    let outcome = tokio::time::timeout(Duration::from_secs(30), handle.wait())
        .await
        .unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn);
    assert_eq!(
        outcome.final_message.map(|m| m.text()).as_deref(),
        Some("All done.")
    );
    assert_eq!(
        stops(b_store.as_ref(), conv.id).await,
        vec![(outcome.run_id, StopReason::EndTurn)],
        "one stop, the real one"
    );
    assert_eq!(
        b_store.run(outcome.run_id).await.unwrap().stop_reason,
        Some(StopReason::EndTurn)
    );
}

/// Runs owned by instances this test registers by hand, standing for other
/// processes: only those whose owner is gone are interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_runs_whose_owner_is_gone_are_interrupted() {
    let (store, _dir) = sqlite_store().await;
    // An engine of this process, to know how it names this host.
    let first = start(store.clone(), EngineConfig::default()).await;
    let host = first.instance().host.clone();
    let conv = first.create_conversation(None).await.unwrap();
    drop(first);

    let owned_by = |host: String, pid: u32| {
        let store = store.clone();
        async move {
            let owner = store
                .register_instance(InstanceId::new(), &host, pid)
                .await
                .unwrap();
            let run = RunId::new();
            store.start_run(run, conv.id, owner.id).await.unwrap();
            run
        }
    };
    // Silent for longer than the threshold used below, on another host.
    let silent_elsewhere = owned_by("elsewhere".into(), 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let exited = owned_by(host.clone(), exited_pid()).await;
    let sleeper = Sleeper::spawn();
    let alive_here = owned_by(host.clone(), sleeper.0.id()).await;
    let alive_elsewhere = owned_by("elsewhere".into(), exited_pid()).await;

    let config = EngineConfig {
        stale_owner_after: Duration::from_secs(1),
        ..EngineConfig::default()
    };
    let engine = start(store.clone(), config).await;
    let reason = |run| {
        let store = store.clone();
        async move { store.run(run).await.unwrap().stop_reason }
    };
    assert_eq!(reason(exited).await, Some(StopReason::Interrupted));
    assert_eq!(
        reason(silent_elsewhere).await,
        Some(StopReason::Interrupted)
    );
    assert_eq!(reason(alive_here).await, None, "its process is alive");
    assert_eq!(
        reason(alive_elsewhere).await,
        None,
        "its heartbeat is fresh; a pid of another host means nothing here"
    );
    let mut stopped = stops(store.as_ref(), conv.id).await;
    stopped.sort_by_key(|(run, _)| *run);
    let mut expected = vec![
        (silent_elsewhere, StopReason::Interrupted),
        (exited, StopReason::Interrupted),
    ];
    expected.sort_by_key(|(run, _)| *run);
    assert_eq!(stopped, expected);
    let explanation = engine
        .events_since(conv.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            AgentEvent::Stopped {
                run_id,
                error: Some(error),
                ..
            } if run_id == exited => Some(error),
            _ => None,
        });
    assert_eq!(
        explanation.as_deref(),
        Some("the process running this turn exited during it")
    );
}

/// Two engines starting at once on an orphaned run: it is interrupted, and
/// reported, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engines_starting_together_report_an_orphan_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let store = open(&url).await;
    let conv = store.create_conversation("sys", None).await.unwrap();
    let gone = store
        .register_instance(InstanceId::new(), "elsewhere", 1)
        .await
        .unwrap();
    let runs: Vec<RunId> = (0..10).map(|_| RunId::new()).collect();
    for &run in &runs {
        store.start_run(run, conv.id, gone.id).await.unwrap();
    }
    let config = EngineConfig {
        stale_owner_after: Duration::ZERO,
        ..EngineConfig::default()
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (b, c) = tokio::join!(
        start(open(&url).await, config.clone()),
        start(open(&url).await, config),
    );
    let mut stopped = stops(store.as_ref(), conv.id).await;
    stopped.sort_by_key(|(run, _)| *run);
    let expected: Vec<_> = runs
        .iter()
        .map(|&run| (run, StopReason::Interrupted))
        .collect();
    assert_eq!(stopped, expected);
    drop((b, c));
}

/// The heartbeat goes on while the engine lives, and stops with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_heartbeat_stops_with_the_engine() {
    let (store, _dir) = sqlite_store().await;
    let config = EngineConfig {
        heartbeat_interval: Duration::from_millis(20),
        ..EngineConfig::default()
    };
    let engine = start(store.clone(), config).await;
    let clone = engine.clone();
    let conv = engine.create_conversation(None).await.unwrap();
    // A run of the engine's, to read its owner's record through.
    store
        .start_run(RunId::new(), conv.id, engine.instance().id)
        .await
        .unwrap();
    let heartbeat = || {
        let store = store.clone();
        async move {
            store.unfinished_runs().await.unwrap()[0]
                .owner
                .clone()
                .expect("the owner is known")
                .heartbeat_at
        }
    };
    // Waits for the next beat after `after` (the guard only fails a hung
    // heartbeat; a beat is due every 20 ms).
    let beat_after = |after| {
        let heartbeat = &heartbeat;
        async move {
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    let beat = heartbeat().await;
                    if beat > after {
                        return beat;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
        }
    };
    let registered = engine.instance().heartbeat_at;
    let beaten = beat_after(registered).await.expect("the heartbeat goes on");

    drop(engine);
    beat_after(beaten)
        .await
        .expect("a clone keeps the engine alive");

    drop(clone);
    // A beat in flight when the engine went may still land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let last = heartbeat().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        heartbeat().await,
        last,
        "no heartbeat after the engine is gone"
    );
}

/// What a gone owner's turn left open is answered when an engine starts:
/// each call without a result gets one (with the output its progress
/// events kept, if any), stored under the path's leaf, and the turn's last
/// assistant message is marked interrupted. Calls already answered and
/// earlier turns are left as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_calls_of_an_interrupted_turn_are_answered_at_start() {
    use toolwire_core::{ContentBlock, Message, MessageStatus, Progress, Role, ToolCallId};

    let (store, _dir) = sqlite_store().await;
    let first = start(store.clone(), EngineConfig::default()).await;
    let host = first.instance().host.clone();
    let conv = first.create_conversation(None).await.unwrap();
    // An earlier, finished turn: its message stays complete.
    let earlier = first.run(conv.id, "hello").await.unwrap();
    assert_eq!(earlier.reason, StopReason::EndTurn);
    drop(first);

    // A process that has exited left this turn: a call answered, one that
    // had shown output, one that had not.
    let owner = store
        .register_instance(InstanceId::new(), &host, exited_pid())
        .await
        .unwrap();
    let run = RunId::new();
    store.start_run(run, conv.id, owner.id).await.unwrap();
    let leaf = store.conversation(conv.id).await.unwrap().active_leaf;
    let text = |t: &str| ContentBlock::Text { text: t.into() };
    let call = |id: &str| ContentBlock::ToolUse {
        id: ToolCallId(id.into()),
        server: None,
        name: "run_command".into(),
        arguments: serde_json::json!({}),
    };
    let user = Message::new(conv.id, Some(leaf), Role::User, vec![text("go")]);
    store.append(&user).await.unwrap();
    let asked = Message::new(
        conv.id,
        Some(user.id),
        Role::Assistant,
        vec![
            text("Three."),
            call("c_done"),
            call("c_talk"),
            call("c_quiet"),
        ],
    );
    store.append(&asked).await.unwrap();
    let done = Message::new(
        conv.id,
        Some(asked.id),
        Role::Tool,
        vec![ContentBlock::ToolResult {
            tool_use_id: ToolCallId("c_done".into()),
            content: "ok".into(),
            is_error: false,
            images: Vec::new(),
        }],
    );
    store.append(&done).await.unwrap();
    for piece in ["compiling…\n", "step 2\n"] {
        store
            .append_event(
                conv.id,
                &AgentEvent::ToolExecutionProgress {
                    run_id: run,
                    call_id: ToolCallId("c_talk".into()),
                    progress: Progress::Output { text: piece.into() },
                },
            )
            .await
            .unwrap();
    }

    let engine = start(store.clone(), EngineConfig::default()).await;
    assert_eq!(
        store.run(run).await.unwrap().stop_reason,
        Some(StopReason::Interrupted)
    );
    let leaf = store.conversation(conv.id).await.unwrap().active_leaf;
    let path = store.path_to(leaf).await.unwrap();
    let tail: Vec<(&str, &str, MessageStatus)> = path
        .iter()
        .skip_while(|m| m.id != done.id)
        .skip(1)
        .map(|m| match &m.content[0] {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error: true,
                ..
            } => (tool_use_id.0.as_str(), content.as_str(), m.status),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        tail,
        [
            (
                "c_talk",
                "Cut short: toolwire stopped before this call finished. Its output until then:\ncompiling…\nstep 2\n",
                MessageStatus::Interrupted
            ),
            (
                "c_quiet",
                "Not run: toolwire stopped before this call finished.",
                MessageStatus::Interrupted
            ),
        ]
    );
    let status = |id| {
        let store = store.clone();
        async move { store.message(id).await.unwrap().status }
    };
    assert_eq!(status(asked.id).await, MessageStatus::Interrupted);
    assert_eq!(status(user.id).await, MessageStatus::Complete);
    assert_eq!(
        status(earlier.final_message.unwrap().id).await,
        MessageStatus::Complete
    );
    // The conversation goes on from the answered calls.
    let next = engine.run(conv.id, "and now?").await.unwrap();
    assert_eq!(next.reason, StopReason::EndTurn, "{:?}", next.error);
}

/// Two engines on one SQLite file (two processes, as far as the store
/// knows: each its own store and leases file handle) never run two turns
/// in one conversation: the second is refused while the first runs, and
/// starts once it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_engines_on_one_file_never_run_two_turns_in_a_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let a = Engine::start(
        open(&url).await,
        script(SLOW_CALL_THEN_ANSWER),
        echo_tools(&["slow"], Duration::from_secs(1)),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let b = start(open(&url).await, EngineConfig::default()).await;
    let conv = a.create_conversation(None).await.unwrap();
    let handle = a.send(conv.id, "go", None).await.unwrap();
    let refused = b.send(conv.id, "me too", None).await;
    assert!(
        matches!(
            refused,
            Err(toolwire_engine::EngineError::TurnInProgress(_))
        ),
        "{refused:?}"
    );
    // Another conversation is not held up.
    let other = b.create_conversation(None).await.unwrap();
    let outcome = b.run(other.id, "elsewhere").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn);

    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
    let outcome = b.run(conv.id, "now me").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn);
}
