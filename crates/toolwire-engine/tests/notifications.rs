//! Notifications reach the model: with the next tool result (appended, or
//! as a synthetic call pair), at the next turn's start, or by waking the
//! agent. (Coalescing and rate limits on tokio's paused clock are tested
//! next to the queue, in `notify.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::*;
use toolwire_core::{
    ContentBlock, ConversationId, Incoming, Message, NotifyConfig, Priority, Role, StopReason,
};
use toolwire_engine::notify::{Activation, InjectionMode, NotificationSettings};
use toolwire_engine::{Engine, EngineConfig, Notified, TurnOptions};
use toolwire_providers::{OpenAiProvider, Script, ScriptedProvider};

fn config(mode: InjectionMode) -> EngineConfig {
    EngineConfig {
        notifications: NotificationSettings {
            mode,
            ..NotificationSettings::default()
        },
        ..EngineConfig::default()
    }
}

/// A mock OpenAI model that calls `slow` once, then answers; the engine
/// and a conversation on it.
async fn slow_call_engine(
    mode: InjectionMode,
) -> (MockServer, Engine, ConversationId, tempfile::TempDir) {
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Deploying.",
            &[Call {
                id: "call_slow",
                name: "slow",
                arguments: json!({"n": 1}),
            }],
        )),
        Reply::sse(openai_sse("Done.", &[])),
    ])
    .await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let tools = echo_tools(&["slow"], Duration::from_millis(800));
    let (engine, dir) = engine(provider, tools, config(mode)).await;
    let conv = engine.create_conversation(None).await.unwrap();
    (server, engine, conv.id, dir)
}

/// Runs "go", posting a notification while the slow tool runs.
async fn run_with_notification_during_the_tool(engine: &Engine, conv: ConversationId) {
    let mut events = engine.subscribe(conv);
    let handle = engine.send(conv, "go", None).await.unwrap();
    loop {
        if type_of(&events.recv().await.unwrap().event) == "tool_execution_started" {
            break;
        }
    }
    let notified = engine
        .notify(
            conv,
            Incoming::text("ci", Priority::Normal, "deploy finished <ok>"),
        )
        .await
        .unwrap();
    assert!(matches!(notified, Notified::Queued));
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
}

const BLOCK: &str =
    "<notifications count=\"1\">\n- [ci] deploy finished &lt;ok&gt;\n</notifications>";

#[tokio::test]
async fn a_notification_rides_on_the_next_tool_result() {
    let (server, engine, conv, _dir) = slow_call_engine(InjectionMode::Augment).await;
    run_with_notification_during_the_tool(&engine, conv).await;

    // The second model call sees it after the tool's own output.
    let second = &server.received()[1].body;
    let tool = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(
        tool["content"],
        format!("slow got {{\"n\":1}}\n\n{BLOCK}"),
        "the tool's output, then the block"
    );
    let system = second["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("<notifications count="),
        "the system prompt explains the block"
    );

    // Stored apart from the tool's output, and announced.
    let result = tool_message(&engine, conv).await;
    assert_eq!(
        result.content[1],
        ContentBlock::Notification {
            source: "ci".into(),
            priority: Priority::Normal,
            text: "deploy finished <ok>".into(),
        }
    );
    let types = event_types(&engine, conv).await;
    let completed = types
        .iter()
        .position(|t| t == "tool_execution_completed")
        .unwrap();
    assert_eq!(types[completed + 1], "notifications_injected");
}

#[tokio::test]
async fn a_notification_can_come_as_a_synthetic_call() {
    let (server, engine, conv, _dir) = slow_call_engine(InjectionMode::SyntheticTool).await;
    run_with_notification_during_the_tool(&engine, conv).await;
    let second = &server.received()[1].body;
    let messages = second["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "assistant", "tool"]
    );
    assert_eq!(
        messages[3]["content"], "slow got {\"n\":1}",
        "the result alone"
    );
    assert_eq!(
        messages[4]["tool_calls"][0]["function"]["name"],
        "_system_notification"
    );
    assert_eq!(
        messages[5]["tool_call_id"],
        messages[4]["tool_calls"][0]["id"]
    );
    assert_eq!(messages[5]["content"], BLOCK);
    let tools: Vec<&str> = second["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"_system_notification"),
        "declared: {tools:?}"
    );
}

/// The active path's first tool message.
async fn tool_message(engine: &Engine, conv: ConversationId) -> Message {
    path(engine, conv)
        .await
        .into_iter()
        .find(|m| m.role == Role::Tool)
        .unwrap()
}

async fn path(engine: &Engine, conv: ConversationId) -> Vec<Message> {
    let leaf = engine.store().conversation(conv).await.unwrap().active_leaf;
    engine.store().path_to(leaf).await.unwrap()
}

/// The notification texts stored on the active path's user messages.
async fn user_notifications(engine: &Engine, conv: ConversationId) -> Vec<String> {
    path(engine, conv)
        .await
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            ContentBlock::Notification { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn scripted(settings: NotificationSettings) -> (Arc<ScriptedProvider>, EngineConfig) {
    let script = Script::parse("steps:\n  - text: \"Noted.\"\n").unwrap();
    (
        Arc::new(ScriptedProvider::new(script, false)),
        EngineConfig {
            notifications: settings,
            ..EngineConfig::default()
        },
    )
}

#[tokio::test]
async fn what_waits_at_the_end_of_a_turn_comes_with_the_next() {
    let server = MockServer::start(vec![Reply::sse(openai_sse("Noted.", &[]))]).await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap().id;
    let notified = engine
        .notify(
            conv,
            Incoming::text(
                "background_task",
                Priority::Normal,
                "build finished (exit 0)",
            ),
        )
        .await
        .unwrap();
    assert!(
        matches!(notified, Notified::Queued),
        "passive: no turn starts"
    );
    assert!(!engine.is_running(conv));
    engine.run(conv, "status?").await.unwrap();
    let user = server.received()[0].body["messages"][1].clone();
    assert_eq!(
        user["content"],
        "status?\n\n<notifications count=\"1\">\n- [background_task] build finished (exit 0)\n</notifications>"
    );
    assert!(!engine.has_pending_notifications(conv));
}

#[tokio::test]
async fn a_waking_source_starts_a_turn_once_its_window_has_passed() {
    let (provider, config) = scripted(NotificationSettings {
        activation: HashMap::from([("diagnostics".to_owned(), Activation::Wake)]),
        queue: NotifyConfig {
            coalesce_window: Duration::from_millis(300),
            ..NotifyConfig::default()
        },
        ..NotificationSettings::default()
    });
    let (engine, _dir) = engine(provider, echo_tools(&[], Duration::ZERO), config).await;
    let conv = engine.create_conversation(None).await.unwrap().id;
    // A wake needs the conversation's options (it fails closed without).
    engine.set_conversation_options(conv, TurnOptions::default());
    let mut events = engine.subscribe(conv);
    let diagnostic = |text: &str| Incoming::text("diagnostics", Priority::High, text);
    // The first wakes the agent once the window has passed, so that what
    // comes inside it joins the same turn.
    let first = engine
        .notify(conv, diagnostic("2 errors in src/lib.rs"))
        .await
        .unwrap();
    assert!(matches!(first, Notified::Waking));
    let second = engine
        .notify(conv, diagnostic("1 warning in src/main.rs"))
        .await
        .unwrap();
    assert!(matches!(second, Notified::Waking));
    loop {
        let e = events.recv().await.unwrap();
        if let toolwire_core::AgentEvent::Stopped { reason, .. } = &e.event {
            assert_eq!(*reason, StopReason::EndTurn);
            break;
        }
    }
    assert_eq!(
        user_notifications(&engine, conv).await,
        ["2 errors in src/lib.rs; 1 warning in src/main.rs"]
    );
    // A passive source does not wake it.
    let notified = engine
        .notify(conv, Incoming::text("ci", Priority::Normal, "deployed"))
        .await
        .unwrap();
    assert!(matches!(notified, Notified::Queued));
    assert!(!engine.is_running(conv));
    // Unknown conversations are an error, not a queue.
    let unknown = engine
        .notify(
            ConversationId::new(),
            Incoming::text("ci", Priority::Normal, "x"),
        )
        .await;
    assert!(unknown.is_err());
}

#[tokio::test]
async fn notifications_can_be_turned_off() {
    let (provider, config) = scripted(NotificationSettings {
        enabled: false,
        ..NotificationSettings::default()
    });
    let (engine, _dir) = engine(provider, echo_tools(&[], Duration::ZERO), config).await;
    let conv = engine.create_conversation(None).await.unwrap().id;
    let n = engine
        .notify(conv, Incoming::text("ci", Priority::Normal, "x"))
        .await
        .unwrap();
    assert!(matches!(n, Notified::Dropped));
    engine.run(conv, "hi").await.unwrap();
    assert!(user_notifications(&engine, conv).await.is_empty());
}

/// Storing the tool result that carries a batch fails (a real SQLite
/// trigger refuses it): the batch is not lost, it comes with the next
/// message instead.
#[tokio::test]
async fn a_batch_whose_message_cannot_be_stored_waits_for_the_next() {
    let (server, engine, conv, dir) = slow_call_engine(InjectionMode::Augment).await;
    let db = rusqlite::Connection::open(dir.path().join("test.db")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_tool_results BEFORE INSERT ON messages \
         WHEN NEW.role = 'tool' BEGIN SELECT RAISE(ABORT, 'disk says no'); END",
    )
    .unwrap();

    let mut events = engine.subscribe(conv);
    let handle = engine.send(conv, "go", None).await.unwrap();
    loop {
        if type_of(&events.recv().await.unwrap().event) == "tool_execution_started" {
            break;
        }
    }
    engine
        .notify(
            conv,
            Incoming::text("ci", Priority::Normal, "deploy finished <ok>"),
        )
        .await
        .unwrap();
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::Error, "{outcome:?}");
    assert!(
        outcome
            .error
            .as_deref()
            .unwrap_or("")
            .contains("disk says no"),
        "{outcome:?}"
    );
    assert!(engine.has_pending_notifications(conv), "put back");

    db.execute_batch("DROP TRIGGER refuse_tool_results")
        .unwrap();
    engine.run(conv, "again").await.unwrap();
    let sent = &server.received()[1].body["messages"];
    let last = sent.as_array().unwrap().last().unwrap();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"], format!("again\n\n{BLOCK}"));
    assert!(!engine.has_pending_notifications(conv));
}

/// The pending notifications kept in `store`, as (owner, texts) pairs.
async fn kept(store: &dyn toolwire_store::Store) -> Vec<(String, Vec<String>)> {
    let mut kept: Vec<(String, Vec<String>)> = store
        .documents("pending_notifications")
        .await
        .unwrap()
        .into_iter()
        .map(|d| {
            let texts = d.body["notices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["text"].as_str().unwrap().to_owned())
                .collect();
            (d.body["instance"].as_str().unwrap().to_owned(), texts)
        })
        .collect();
    kept.sort();
    kept
}

/// Polls `store` until what is kept is `want` (the engine writes in the
/// background); fails after 10 s.
async fn kept_becomes(store: &dyn toolwire_store::Store, want: Vec<(String, Vec<String>)>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = kept(store).await;
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kept {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Notifications waiting when an engine goes are not lost: the engine
/// keeps them in the store as they change (nobody asks it to), an engine
/// started while it lives leaves them alone, and the next engine on the
/// database once it is gone takes them over and delivers them.
#[tokio::test]
async fn pending_notifications_outlive_their_engine() {
    let (store, dir) = sqlite_store().await;
    let (provider, config) = scripted(NotificationSettings::default());
    let start = |store: Arc<dyn toolwire_store::Store>| {
        let (provider, config) = (provider.clone(), config.clone());
        async move {
            Engine::start(store, provider, echo_tools(&[], Duration::ZERO), config)
                .await
                .unwrap()
        }
    };
    let first = start(store.clone()).await;
    let conv = first.create_conversation(None).await.unwrap().id;
    for text in ["build finished (exit 0)", "deploy finished"] {
        first
            .notify(
                conv,
                Incoming::text("background_task", Priority::Normal, text),
            )
            .await
            .unwrap();
    }
    let first_id = first.instance().id.to_string();
    let both = vec!["build finished (exit 0); deploy finished".to_owned()];
    kept_becomes(store.as_ref(), vec![(first_id.clone(), both.clone())]).await;

    let alongside = start(store.clone()).await;
    assert!(
        !alongside.has_pending_notifications(conv),
        "its owner is alive"
    );
    drop(alongside);
    drop(first);

    // Another process on the same file.
    let url = format!("sqlite://{}", dir.path().join("test.db").display());
    let reopened = toolwire_store::open(&url).await.unwrap();
    let next = start(reopened.clone()).await;
    assert!(next.has_pending_notifications(conv));
    assert_eq!(
        kept(reopened.as_ref()).await,
        vec![(next.instance().id.to_string(), both.clone())],
        "kept as the new owner's, the old one's gone"
    );
    next.run(conv, "status?").await.unwrap();
    assert_eq!(user_notifications(&next, conv).await, both);
    kept_becomes(reopened.as_ref(), Vec::new()).await;
}
