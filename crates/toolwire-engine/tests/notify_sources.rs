//! The engine's notification sources against a real model loop (a mock
//! OpenAI server on loopback) and a real directory: the file watcher
//! (debounced, ignoring `.git`/`target`/`node_modules` and the agent's own
//! writes) and background tasks (`run_command` with `background: true`,
//! `task_status`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use support::*;
use tempfile::TempDir;
use toolwire_core::{ConversationId, FileChange, Incoming, StopReason};
use toolwire_engine::watch::{self, WatchHandle, WatchSettings};
use toolwire_engine::{Engine, EngineConfig};
use toolwire_providers::OpenAiProvider;
use toolwire_tools::OwnWrites;
use toolwire_tools::builtin::{self, Workspace};
use toolwire_tools::{NotificationSink, Notifier, Tool, ToolContext};

const SLOW: Duration = Duration::from_millis(1500);

struct Setup {
    server: MockServer,
    engine: Engine,
    root: TempDir,
    _watcher: WatchHandle,
    _db: TempDir,
}

/// An engine over the mock model with the built-in tools in a fresh
/// workspace (holding `files` before the watcher starts), a `slow` echo
/// tool, and the file watcher on the workspace.
async fn setup(replies: Vec<Reply>, files: &[(&str, &str)]) -> Setup {
    let root = tempfile::tempdir().unwrap();
    for (path, content) in files {
        std::fs::write(root.path().join(path), content).unwrap();
    }
    let workspace = Workspace::new(root.path()).unwrap();
    let server = MockServer::start(replies).await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let mut tools = echo_tools(&["slow"], SLOW);
    for tool in builtin::all(Arc::new(workspace.clone()), support::sandbox()) {
        tools.register(tool);
    }
    let (engine, db) = engine(provider, tools, EngineConfig::default()).await;
    let watcher = watch::start(&engine, &workspace, WatchSettings::default())
        .await
        .unwrap();
    Setup {
        server,
        engine,
        root,
        _watcher: watcher,
        _db: db,
    }
}

fn call<'a>(id: &'a str, name: &'a str, arguments: Value) -> Call<'a> {
    Call {
        id,
        name,
        arguments,
    }
}

/// Waits until the mock has received `n` requests.
async fn requests(server: &MockServer, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.received().len() < n {
        assert!(
            Instant::now() < deadline,
            "the model was not called {n} times"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The content of the tool message answering `call_id` in a request body.
fn tool_result(body: &Value, call_id: &str) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .unwrap_or_else(|| panic!("no result for {call_id} in {body}"))["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The tool results of a request body that carry a notifications block.
fn blocks(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .filter(|c| c.contains("<notifications"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn an_outside_change_during_a_slow_tool_rides_on_its_result() {
    let s = setup(
        vec![
            Reply::sse(openai_sse(
                "",
                &[call("call_slow", "slow", json!({"n": 1}))],
            )),
            Reply::sse(openai_sse("Noted.", &[])),
        ],
        &[("notes.txt", "first\n")],
    )
    .await;
    let conv = s.engine.create_conversation(None).await.unwrap();
    let handle = s.engine.send(conv.id, "wait a bit", None).await.unwrap();
    // The slow tool runs now; someone edits a file meanwhile.
    requests(&s.server, 1).await;
    std::fs::write(s.root.path().join("notes.txt"), "second\n").unwrap();
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);

    let received = s.server.received();
    assert_eq!(received.len(), 2);
    let result = tool_result(&received[1].body, "call_slow");
    assert!(result.starts_with("slow got {\"n\":1}"), "{result}");
    assert!(
        result.contains("<notifications count=\"1\">\n- [file_watcher] File modified: notes.txt\n</notifications>"),
        "{result}"
    );
    // The system prompt tells the model what the block is.
    assert!(
        received[0].body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("<notifications count=\"N\">")
    );
}

#[tokio::test]
async fn the_agents_own_writes_are_not_reported_but_others_are() {
    let s = setup(
        vec![
            Reply::sse(openai_sse(
                "",
                &[
                    call(
                        "call_write",
                        "write_file",
                        json!({"path": "src/gen/own.txt", "content": "written by the agent\n"}),
                    ),
                    call("call_slow1", "slow", json!({"step": 1})),
                ],
            )),
            Reply::sse(openai_sse(
                "",
                &[
                    call(
                        "call_diff",
                        "apply_diff",
                        json!({"path": "src/gen/own.txt", "diff": "@@ -1 +1 @@\n-written by the agent\n+edited by the agent\n"}),
                    ),
                    call("call_slow2", "slow", json!({"step": 2})),
                ],
            )),
            Reply::sse(openai_sse("Done.", &[])),
        ],
        &[],
    )
    .await;
    let conv = s.engine.create_conversation(None).await.unwrap();
    let handle = s.engine.send(conv.id, "write it", None).await.unwrap();
    // During the second step (the agent edits its file, the slow tool
    // runs), someone else creates a file.
    requests(&s.server, 2).await;
    std::fs::write(s.root.path().join("external.txt"), "not the agent\n").unwrap();
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(
        std::fs::read_to_string(s.root.path().join("src/gen/own.txt")).unwrap(),
        "edited by the agent\n"
    );

    let received = s.server.received();
    assert_eq!(received.len(), 3);
    // Step 1's write (a new file in new directories) was the agent's own:
    // no block, though the slow tool ran well past the debounce.
    assert_eq!(blocks(&received[1].body), Vec::<String>::new());
    let write = tool_result(&received[1].body, "call_write");
    assert!(write.starts_with("created `src/gen/own.txt`"), "{write}");
    // Step 2: the outside write is reported, the agent's edit is not.
    let slow = tool_result(&received[2].body, "call_slow2");
    assert!(
        slow.contains("<notifications count=\"1\">\n- [file_watcher] File created: external.txt\n</notifications>"),
        "{slow}"
    );
    assert_eq!(blocks(&received[2].body), [slow]);
    assert!(!s.engine.has_pending_notifications(conv.id));
}

#[tokio::test]
async fn a_background_command_reports_its_end_and_task_status_lists_it() {
    let s = setup(
        vec![
            Reply::sse(openai_sse(
                "",
                &[
                    call(
                        "call_bg",
                        "run_command",
                        json!({"command": "sleep 0.3; echo done", "background": true}),
                    ),
                    call("call_slow", "slow", json!({})),
                ],
            )),
            Reply::sse(openai_sse(
                "",
                &[call("call_status", "task_status", json!({}))],
            )),
            Reply::sse(openai_sse("It finished.", &[])),
        ],
        &[],
    )
    .await;
    let conv = s.engine.create_conversation(None).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), s.engine.run(conv.id, "build it"))
        .await
        .expect("the turn ended (hang guard)")
        .unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);

    let received = s.server.received();
    assert_eq!(received.len(), 3);
    let started = tool_result(&received[1].body, "call_bg");
    assert!(
        started.starts_with("started `sleep 0.3; echo done` in the background as task-1."),
        "{started}"
    );
    let slow = tool_result(&received[1].body, "call_slow");
    assert!(
        slow.contains(
            "<notifications count=\"1\">\n- [background_task] `sleep 0.3; echo done` finished (exit 0) after "
        ),
        "{slow}"
    );
    assert!(slow.contains(" s: done\n</notifications>"), "{slow}");

    let status = tool_result(&received[2].body, "call_status");
    assert!(
        status.starts_with("task-1: `sleep 0.3; echo done` — exited 0, ran "),
        "{status}"
    );
    assert!(status.ends_with("\noutput:\ndone"), "{status}");
}

/// Collects what a tool sends to its notifier.
#[derive(Default)]
struct Collected(Mutex<Vec<(ConversationId, Incoming)>>);

#[async_trait]
impl NotificationSink for Collected {
    async fn notify(&self, conversation: ConversationId, event: Incoming) {
        self.0.lock().unwrap().push((conversation, event));
    }
}

fn tool(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .unwrap()
        .clone()
}

#[tokio::test]
async fn background_tasks_outlive_a_cancelled_turn_and_stay_in_their_conversation() {
    let root = tempfile::tempdir().unwrap();
    let tools = builtin::all(
        Arc::new(Workspace::new(root.path()).unwrap()),
        support::sandbox(),
    );
    let (run, status) = (tool(&tools, "run_command"), tool(&tools, "task_status"));
    let sink = Arc::new(Collected::default());
    let mut ctx = ToolContext::detached("call_1");
    ctx.notifier = Notifier::new(sink.clone());
    let conversation = ctx.conversation_id;
    let out = run
        .call(
            json!({"command": "sleep 0.2; printf 'a\\nb\\n'; exit 3", "background": true}),
            ctx.clone(),
        )
        .await
        .unwrap();
    assert!(out.content.contains("as task-1."), "{}", out.content);
    // The turn is cancelled: the task goes on.
    ctx.cancel.cancel();
    let running = status.call(json!({}), ctx.clone()).await.unwrap().content;
    assert!(running.contains("task-1: `sleep 0.2"), "{running}");
    assert!(running.contains("— running, running for "), "{running}");

    let deadline = Instant::now() + Duration::from_secs(10);
    while sink.0.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no notification");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = sink.0.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    let (to, Incoming::Text { source, text, .. }) = &sent[0] else {
        panic!("{sent:?}")
    };
    assert_eq!(*to, conversation);
    assert_eq!(source, "background_task");
    assert!(
        text.starts_with("`sleep 0.2; printf 'a\\nb\\n'; exit 3` finished (exit 3) after "),
        "{text}"
    );
    assert!(text.ends_with(" s: a ⏎ b"), "{text}");

    let one = status
        .call(json!({"task_id": "task-1"}), ctx.clone())
        .await
        .unwrap()
        .content;
    assert!(one.contains("— exited 3, ran "), "{one}");
    assert!(one.ends_with("output:\na\nb"), "{one}");
    let missing = status
        .call(json!({"task_id": "task-7"}), ctx.clone())
        .await
        .unwrap_err();
    assert!(
        missing.to_string().contains("its tasks: task-1"),
        "{missing}"
    );
    // Another conversation sees none of them.
    let other = status
        .call(json!({}), ToolContext::detached("call_2"))
        .await
        .unwrap()
        .content;
    assert_eq!(other, "No background tasks in this conversation.");
}

#[tokio::test]
async fn background_tasks_die_with_the_tools() {
    let root = tempfile::tempdir().unwrap();
    let tools = builtin::all(
        Arc::new(Workspace::new(root.path()).unwrap()),
        support::sandbox(),
    );
    let marker = support::marker();
    let out = tool(&tools, "run_command")
        .call(
            json!({"command": format!("sleep {marker} & echo $! > child.pid; wait"), "background": true}),
            ToolContext::detached("call"),
        )
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.content);
    started(root.path(), marker).await;
    drop(tools);
    assert!(
        support::none_with(marker).await,
        "the task's processes outlived its tools"
    );
}

#[tokio::test]
async fn background_tasks_die_with_the_engine() {
    let marker = support::marker();
    let s = setup(
        vec![
            Reply::sse(openai_sse(
                "",
                &[call(
                    "call_bg",
                    "run_command",
                    json!({"command": format!("sleep {marker} & echo $! > child.pid; wait"), "background": true}),
                )],
            )),
            Reply::sse(openai_sse("Started.", &[])),
        ],
        &[],
    )
    .await;
    let conv = s.engine.create_conversation(None).await.unwrap();
    let outcome = s.engine.run(conv.id, "start it").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    started(s.root.path(), marker).await;
    let Setup {
        engine,
        _watcher,
        root: _root,
        ..
    } = s;
    // The watcher holds the engine too.
    drop(_watcher);
    drop(engine);
    assert!(
        support::none_with(marker).await,
        "the task's processes outlived the engine"
    );
}

/// Waits for a test command to write `child.pid` (it started `sleep
/// MARKER`, which runs).
async fn started(root: &Path, marker: u64) {
    let pid_file = root.join("child.pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&pid_file).map_or(true, |s| s.trim().is_empty()) {
        assert!(Instant::now() < deadline, "the task did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(support::some_with(marker).await);
}

/// The watcher alone, with a sink that records what it reports.
async fn watcher(
    root: &Path,
    own: Arc<OwnWrites>,
) -> (WatchHandle, tokio::sync::mpsc::UnboundedReceiver<Incoming>) {
    watcher_ignoring(root, own, Vec::new()).await
}

/// [`watcher`], never reporting the files `ignore_paths`.
async fn watcher_ignoring(
    root: &Path,
    own: Arc<OwnWrites>,
    ignore_paths: Vec<std::path::PathBuf>,
) -> (WatchHandle, tokio::sync::mpsc::UnboundedReceiver<Incoming>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let settings = WatchSettings {
        debounce: Duration::from_millis(150),
        ignore_paths,
        ..WatchSettings::default()
    };
    let handle = watch::start_with(root, own, settings, move |event| {
        let _ = tx.send(event);
    })
    .await
    .unwrap();
    (handle, rx)
}

/// What the watcher reports until it has been quiet for a second.
async fn reported(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>,
) -> BTreeSet<(String, FileChange)> {
    let mut out = BTreeSet::new();
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
        match event {
            Incoming::File {
                source,
                path,
                change,
                ..
            } => {
                assert_eq!(source, "file_watcher");
                assert!(out.insert((path.clone(), change)), "{path} twice");
            }
            other => panic!("{other:?}"),
        }
    }
    out
}

fn set(items: &[(&str, FileChange)]) -> BTreeSet<(String, FileChange)> {
    items.iter().map(|(p, c)| ((*p).to_owned(), *c)).collect()
}

#[tokio::test]
async fn the_watcher_reports_files_relative_to_the_root_and_skips_what_it_should() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for dir in [".git", "target/debug", "node_modules/left-pad", "src"] {
        std::fs::create_dir_all(r.join(dir)).unwrap();
    }
    std::fs::write(r.join("src/keep.rs"), "fn main() {}\n").unwrap();
    std::fs::write(r.join("gone.txt"), "bye\n").unwrap();
    let own = Arc::new(OwnWrites::default());
    let (handle, mut rx) = watcher(r, own.clone()).await;

    // Ignored anywhere in the path.
    std::fs::write(r.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(r.join("target/debug/app"), "binary").unwrap();
    std::fs::write(r.join("node_modules/left-pad/index.js"), "//").unwrap();
    std::fs::create_dir_all(r.join("src/target")).unwrap();
    std::fs::write(r.join("src/target/x.o"), "").unwrap();
    // A tool's temporary file, and a file that comes and goes.
    std::fs::write(r.join("src/.keep.rs.1.2.toolwire-tmp"), "").unwrap();
    std::fs::write(r.join("blip.txt"), "").unwrap();
    std::fs::remove_file(r.join("blip.txt")).unwrap();
    // What counts: a modified file, a removed one, one in new directories.
    std::fs::write(r.join("src/keep.rs"), "fn main() { run() }\n").unwrap();
    std::fs::remove_file(r.join("gone.txt")).unwrap();
    std::fs::create_dir_all(r.join("docs/deep")).unwrap();
    std::fs::write(r.join("docs/deep/new.md"), "# new\n").unwrap();
    // The agent's write, as the tools record it.
    let canonical = std::fs::canonicalize(r).unwrap();
    own.record(&canonical.join("mine.txt"), b"the agent's\n");
    std::fs::write(r.join("mine.txt"), "the agent's\n").unwrap();

    assert_eq!(
        reported(&mut rx).await,
        set(&[
            ("docs/deep/new.md", FileChange::Created),
            ("gone.txt", FileChange::Removed),
            ("src/keep.rs", FileChange::Modified),
        ])
    );

    // Someone else changes the agent's file: that is reported (and so is a
    // file added in a directory that appeared before).
    std::fs::write(r.join("mine.txt"), "someone else's\n").unwrap();
    std::fs::write(r.join("docs/deep/more.md"), "").unwrap();
    assert_eq!(
        reported(&mut rx).await,
        set(&[
            ("docs/deep/more.md", FileChange::Created),
            ("mine.txt", FileChange::Modified),
        ])
    );

    // Dropped: it stops (and lets go of its sink).
    drop(handle);
    std::fs::write(r.join("src/keep.rs"), "after\n").unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    match end {
        Ok(None) => {}
        Ok(Some(event)) => panic!("reported after the handle was dropped: {event:?}"),
        Err(_) => panic!("the watcher's thread did not stop"),
    }
}

#[tokio::test]
async fn the_stores_own_files_are_never_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The store's database in the watched directory, named through a path
    // that is not the canonical one (a `..` detour).
    std::fs::create_dir(root.join("sub")).unwrap();
    let db = root.join("sub").join("..").join("t.db");
    let url = format!("sqlite://{}", db.display());
    let files = toolwire_store::local_files(&url);
    assert_eq!(files.len(), 5, "{files:?}");
    let (_handle, mut rx) = watcher_ignoring(root, Arc::default(), files).await;
    // The real store, writing its file and its write-ahead log.
    let store = toolwire_store::open(&url).await.unwrap();
    store.create_conversation("sys", None).await.unwrap();
    std::fs::write(root.join("t.db-journal"), "j").unwrap();
    std::fs::write(root.join("notes.txt"), "n").unwrap();
    assert!(root.join("t.db-wal").exists(), "the store writes a WAL");
    assert_eq!(
        reported(&mut rx).await,
        set(&[("notes.txt", FileChange::Created)])
    );
    drop(store);
}

#[tokio::test]
async fn the_watcher_refuses_a_missing_root() {
    let root = tempfile::tempdir().unwrap();
    let err = watch::start_with(
        &root.path().join("missing"),
        Arc::default(),
        WatchSettings::default(),
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}
