//! The loop's control: cancellation, interjections, the step limit, edits
//! and regenerations, the XML tool format, and recovery after a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::*;
use toolwire_core::{ContentBlock, Role, StopReason};
use toolwire_engine::{Engine, EngineConfig, Interjection, InterjectionMode};
use toolwire_providers::{OpenAiProvider, Script, ScriptedProvider, ToolFormat};

const TWO_CALLS_THEN_ANSWER: &str = r#"
steps:
  - text: "Working."
    tool_calls:
      - {name: slow, arguments: {n: 1}}
      - {name: slow, arguments: {n: 2}}
      - {name: slow, arguments: {n: 3}}
  - text: "All done."
"#;

#[tokio::test]
async fn cancel_stops_running_tools_and_answers_every_call() {
    let tools = echo_tools(&["slow"], Duration::from_secs(30));
    let config = EngineConfig {
        tool_concurrency: 2,
        ..EngineConfig::default()
    };
    let (engine, _dir) = engine(script(TWO_CALLS_THEN_ANSWER), tools, config).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    // Wait until both permitted tools run, then cancel.
    let mut started = 0;
    while started < 2 {
        let e = events.recv().await.unwrap();
        if type_of(&e.event) == "tool_execution_started" {
            started += 1;
        }
    }
    assert!(engine.cancel(conv.id));
    let outcome = tokio::time::timeout(Duration::from_secs(5), handle.wait())
        .await
        .unwrap();
    assert_eq!(outcome.reason, StopReason::Cancelled);

    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let results: Vec<String> = path
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| match &m.content[0] {
            ContentBlock::ToolResult { content, .. } => content.clone(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(results.len(), 3, "every call has a result: {results:?}");
    assert_eq!(
        results
            .iter()
            .filter(|r| r.as_str() == "Error: cancelled")
            .count(),
        2
    );
    assert!(results.iter().any(|r| r.contains("user cancelled")));
    assert!(!engine.is_running(conv.id));
}

#[tokio::test]
async fn interjection_becomes_a_user_message_and_skips_unstarted_calls() {
    let tools = echo_tools(&["slow"], Duration::from_millis(300));
    let config = EngineConfig {
        tool_concurrency: 1,
        ..EngineConfig::default()
    };
    let (engine, _dir) = engine(script(TWO_CALLS_THEN_ANSWER), tools, config).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    loop {
        let e = events.recv().await.unwrap();
        if type_of(&e.event) == "tool_execution_started" {
            break;
        }
    }
    assert!(matches!(
        engine.interject(conv.id, "also check n=4").await.unwrap(),
        Interjection::Queued
    ));
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);

    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let shape: Vec<String> = path
        .iter()
        .map(|m| match (m.role, m.content.first()) {
            (Role::Tool, Some(ContentBlock::ToolResult { content, .. }))
                if content.starts_with("Not run") =>
            {
                "skipped".into()
            }
            (Role::Tool, _) => "result".into(),
            (role, _) => role.as_str().into(),
        })
        .collect();
    assert_eq!(
        shape,
        [
            "system",
            "user",
            "assistant",
            "result",
            "skipped",
            "skipped",
            "user",
            "assistant"
        ]
    );
    assert_eq!(path[6].text(), "also check n=4");
    assert!(
        event_types(&engine, conv.id)
            .await
            .contains(&"user_interjection".to_string())
    );
}

#[tokio::test]
async fn interjection_in_reminder_mode_rides_on_the_tool_result() {
    let tools = echo_tools(&["slow"], Duration::from_millis(300));
    let config = EngineConfig {
        tool_concurrency: 1,
        interjections: InterjectionMode::Reminder,
        ..EngineConfig::default()
    };
    let (engine, _dir) = engine(script(TWO_CALLS_THEN_ANSWER), tools, config).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    loop {
        if type_of(&events.recv().await.unwrap().event) == "tool_execution_started" {
            break;
        }
    }
    engine.interject(conv.id, "use n=9 instead").await.unwrap();
    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let first_result = path.iter().find(|m| m.role == Role::Tool).unwrap();
    let ContentBlock::ToolResult { content, .. } = &first_result.content[0] else {
        panic!()
    };
    assert!(content.starts_with("slow got {\"n\":1}"));
    // The interjection rides on the result as a notification from the
    // user, apart from the tool's own output.
    assert!(
        first_result.content[1..].contains(&ContentBlock::Notification {
            source: "user".into(),
            priority: toolwire_core::Priority::High,
            text: "use n=9 instead".into(),
        }),
        "{:?}",
        first_result.content
    );
    assert_eq!(path.iter().filter(|m| m.role == Role::User).count(), 1);
}

#[tokio::test]
async fn interjection_with_no_turn_running_starts_one() {
    let (engine, _dir) = engine(
        script("steps:\n  - text: hi\n"),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let Interjection::Started(handle) = engine.interject(conv.id, "hello?").await.unwrap() else {
        panic!("expected a new turn")
    };
    assert_eq!(handle.wait().await.reason, StopReason::EndTurn);
}

/// Words queued for a turn that is then cancelled start no turn of their
/// own: they are stored, answered by no model; words that come after the
/// cancel, while the turn ends, do. `interject_running` with no turn
/// running starts none.
#[tokio::test]
async fn words_for_a_cancelled_turn_are_kept_and_start_nothing() {
    let (engine, _dir) = engine(
        script("steps:\n  - text: \"a slow answer\"\n    chunk_size: 8\n    delay_ms: 10\n"),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    assert!(
        !engine
            .interject_running(conv.id, "nobody runs")
            .await
            .unwrap()
    );
    assert!(!engine.is_running(conv.id), "nothing started");
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    // A step with no tool call: the words come too late for it.
    assert!(
        engine
            .interject_running(conv.id, "and also this")
            .await
            .unwrap()
    );
    assert!(engine.cancel(conv.id));
    assert_eq!(handle.wait().await.reason, StopReason::Cancelled);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!engine.is_running(conv.id), "no turn for the late words");
    let stored = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(stored.active_leaf).await.unwrap();
    let last = path.last().unwrap();
    assert_eq!(
        (last.role, last.text()),
        (Role::User, "and also this".to_owned())
    );
    // Words sent after the cancel, while the turn is still ending, are
    // the user speaking again: they start the next turn.
    let handle = engine.send(conv.id, "go on", None).await.unwrap();
    assert!(engine.cancel(conv.id));
    assert!(
        engine
            .interject_running(conv.id, "then this")
            .await
            .unwrap()
    );
    assert_eq!(handle.wait().await.reason, StopReason::Cancelled);
    let mut answered = false;
    // (The answer streams as slowly as the first.)
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stored = engine.store().conversation(conv.id).await.unwrap();
        let path = engine.store().path_to(stored.active_leaf).await.unwrap();
        let n = path.len();
        answered = n >= 2
            && path[n - 2].text() == "then this"
            && path[n - 1].role == Role::Assistant
            && !engine.is_running(conv.id);
        if answered {
            break;
        }
    }
    let stored = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(stored.active_leaf).await.unwrap();
    let texts: Vec<_> = path.iter().map(|m| (m.role, m.text())).collect();
    assert!(
        answered,
        "the words after the cancel were answered: {texts:?}"
    );
}

#[tokio::test]
async fn step_limit_stops_a_model_that_never_answers() {
    let looping =
        "steps:\n".to_string() + &"  - tool_calls: [{name: fast, arguments: {}}]\n".repeat(10);
    let config = EngineConfig {
        max_steps: 3,
        ..EngineConfig::default()
    };
    let (engine, _dir) = engine(
        script(&looping),
        echo_tools(&["fast"], Duration::ZERO),
        config,
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "loop").await.unwrap();
    assert_eq!(outcome.reason, StopReason::MaxSteps);
    assert!(outcome.error.unwrap().contains("max_steps"));
}

#[tokio::test]
async fn a_second_send_during_a_turn_is_refused() {
    let tools = echo_tools(&["slow"], Duration::from_millis(200));
    let (engine, _dir) = engine(
        script(TWO_CALLS_THEN_ANSWER),
        tools,
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    let err = engine.send(conv.id, "again", None).await.unwrap_err();
    assert!(err.to_string().contains("already running"), "{err}");
    handle.wait().await;
}

#[tokio::test]
async fn edit_regenerate_and_switch_change_what_the_model_sees() {
    let server = MockServer::start(vec![Reply::sse(openai_sse("answer", &[]))]).await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let (engine, _dir) = engine(
        provider,
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let store = engine.store();
    let conv = engine.create_conversation(None).await.unwrap();
    engine.run(conv.id, "first question").await.unwrap();
    let leaf = store.conversation(conv.id).await.unwrap().active_leaf;
    let path = store.path_to(leaf).await.unwrap();
    let (user, answer) = (path[1].id, path[2].id);

    // Edit: a sibling user message; the model sees only the new text.
    engine
        .edit(user, "edited question")
        .await
        .unwrap()
        .wait()
        .await;
    let last = server.received().pop().unwrap();
    let contents: Vec<&str> = last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(contents.len(), 2);
    assert!(contents[0].starts_with(engine.config().system_prompt.as_str()));
    assert_eq!(contents[1], "edited question");
    assert_eq!(store.siblings(user).await.unwrap().len(), 2);

    // Regenerate the first answer: a sibling under the original question.
    engine.regenerate(answer).await.unwrap().wait().await;
    let last = server.received().pop().unwrap();
    assert_eq!(last.body["messages"][1]["content"], "first question");
    assert_eq!(store.siblings(answer).await.unwrap().len(), 2);

    // Switch back to the original branch and continue from it.
    engine.set_active_leaf(conv.id, answer).await.unwrap();
    engine.run(conv.id, "follow-up").await.unwrap();
    let last = server.received().pop().unwrap();
    let contents: Vec<&str> = last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(contents[1..], ["first question", "answer", "follow-up"]);
    assert_eq!(store.leaves(conv.id).await.unwrap().len(), 3);
}

#[tokio::test]
async fn xml_tool_format_parses_calls_from_text() {
    let yaml = r#"
steps:
  - text: "Reading it."
    tool_calls: [{name: fast, arguments: {path: "a.rs"}}]
    chunk_size: 5
  - text: "Read."
"#;
    let provider = Arc::new(ScriptedProvider::new(Script::parse(yaml).unwrap(), true));
    let config = EngineConfig {
        tool_format: ToolFormat::Xml,
        ..EngineConfig::default()
    };
    let (engine, _dir) = engine(provider, echo_tools(&["fast"], Duration::ZERO), config).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "read a.rs").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let assistant = &path[2];
    assert_eq!(assistant.text().trim(), "Reading it.");
    let calls: Vec<_> = assistant.tool_uses().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].2, "fast");
    assert_eq!(calls[0].3, &json!({"path": "a.rs"}));
    let types = event_types(&engine, conv.id).await;
    assert!(types.contains(&"tool_call_started".to_string()));
    assert!(types.contains(&"tool_execution_completed".to_string()));
}

#[tokio::test]
async fn unknown_tools_and_unreadable_calls_get_error_results() {
    let yaml = r#"
steps:
  - tool_calls: [{name: nonexistent, arguments: {}}]
  - text: "ok"
"#;
    let (engine, _dir) = engine(
        script(yaml),
        echo_tools(&["fast"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    assert_eq!(
        engine.run(conv.id, "x").await.unwrap().reason,
        StopReason::EndTurn
    );
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let ContentBlock::ToolResult {
        content, is_error, ..
    } = &path[3].content[0]
    else {
        panic!()
    };
    assert!(*is_error);
    assert!(
        content.contains("no tool named `nonexistent`") && content.contains("fast"),
        "{content}"
    );
}

#[tokio::test]
async fn restart_marks_the_unfinished_turn_interrupted() {
    let (store, _dir) = sqlite_store().await;
    let engine = Engine::start(
        store.clone(),
        script("steps:\n  - text: hi\n"),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let conv = engine.create_conversation(None).await.unwrap();
    // A run the "previous process" never finished: it had our pid, and its
    // engine is gone.
    let run = toolwire_core::RunId::new();
    store
        .start_run(run, conv.id, engine.instance().id)
        .await
        .unwrap();
    drop(engine);
    let engine = Engine::start(
        store.clone(),
        script("steps:\n  - text: hi\n"),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        store.run(run).await.unwrap().stop_reason,
        Some(StopReason::Interrupted)
    );
    let events = engine.events_since(conv.id, 0, 100).await.unwrap();
    assert!(matches!(
        events.last().unwrap().event,
        toolwire_core::AgentEvent::Stopped {
            reason: StopReason::Interrupted,
            ..
        }
    ));
}

/// A tool that panics, or one that ignores cancellation.
struct Misbehaving {
    spec: Arc<toolwire_tools::ToolSpec>,
    panics: bool,
}

#[async_trait::async_trait]
impl toolwire_tools::Tool for Misbehaving {
    fn spec(&self) -> &Arc<toolwire_tools::ToolSpec> {
        &self.spec
    }

    async fn call(
        &self,
        _arguments: serde_json::Value,
        _ctx: toolwire_tools::ToolContext,
    ) -> Result<toolwire_tools::ToolOutput, toolwire_tools::ToolError> {
        if self.panics {
            panic!("tool bug");
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(toolwire_tools::ToolOutput::ok("late"))
    }
}

fn misbehaving(name: &str, panics: bool) -> toolwire_tools::ToolRegistry {
    let mut r = toolwire_tools::ToolRegistry::new();
    r.register(Arc::new(Misbehaving {
        spec: Arc::new(toolwire_tools::ToolSpec {
            name: name.into(),
            server: None,
            description: String::new(),
            parameters: json!({"type": "object"}),
            read_only: false,
        }),
        panics,
    }));
    r
}

fn tool_results(path: &[toolwire_core::Message]) -> Vec<String> {
    path.iter()
        .filter_map(|m| match m.content.first() {
            Some(ContentBlock::ToolResult { content, .. }) => Some(content.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_tool_that_panics_still_answers_its_call() {
    let yaml = "steps:\n  - tool_calls: [{name: buggy, arguments: {}}]\n  - text: recovered\n";
    let (engine, _dir) = engine(
        script(yaml),
        misbehaving("buggy", true),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "go").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    assert_eq!(tool_results(&path), ["Error: the tool crashed"]);
}

#[tokio::test]
async fn a_tool_that_ignores_cancellation_is_aborted_after_the_grace_period() {
    let yaml = "steps:\n  - tool_calls: [{name: stubborn, arguments: {}}]\n";
    let config = EngineConfig {
        tool_cancel_grace: Duration::from_millis(100),
        ..EngineConfig::default()
    };
    let (engine, _dir) = engine(script(yaml), misbehaving("stubborn", false), config).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut events = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "go", None).await.unwrap();
    loop {
        if type_of(&events.recv().await.unwrap().event) == "tool_execution_started" {
            break;
        }
    }
    engine.cancel(conv.id);
    let outcome = tokio::time::timeout(Duration::from_secs(5), handle.wait())
        .await
        .expect("not stuck");
    assert_eq!(outcome.reason, StopReason::Cancelled);
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    assert_eq!(tool_results(&path), ["Error: cancelled"]);
}

/// Words sent one after the other while short turns start and end are
/// stored in the order they were sent: a turn's late words and words sent
/// while the next turn starts never swap places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interjections_are_stored_in_order_of_arrival() {
    let (engine, _dir) = engine(
        script("steps:\n  - text: ok\n    chunk_size: 64\n"),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    // Other conversations' turns keep the store busy meanwhile, so that
    // its reads take varying time (as on a loaded server).
    let busy = tokio_util::sync::CancellationToken::new();
    let mut others = Vec::new();
    for _ in 0..4 {
        let (engine, busy) = (engine.clone(), busy.clone());
        let other = engine.create_conversation(None).await.unwrap();
        others.push(tokio::spawn(async move {
            while !busy.is_cancelled() {
                engine.run(other.id, "busy").await.unwrap();
            }
        }));
    }
    let sent: Vec<String> = (0..2000).map(|i| format!("w{i}")).collect();
    // Spaced as a person's (or a socket's) frames are, so that turns end
    // and start between them.
    for (i, word) in sent.iter().enumerate() {
        // As the live view's socket does: a turn that started in between
        // takes the words.
        loop {
            match engine.interject(conv.id, word).await {
                Ok(_) => break,
                Err(toolwire_engine::EngineError::TurnInProgress(_)) => continue,
                Err(e) => panic!("{e}"),
            }
        }
        tokio::time::sleep(Duration::from_micros(200 * (i as u64 % 8))).await;
    }
    busy.cancel();
    for other in others {
        other.await.unwrap();
    }
    // Until every turn has ended.
    let mut quiet = 0;
    while quiet < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        quiet = if engine.is_running(conv.id) {
            0
        } else {
            quiet + 1
        };
    }
    let conv = engine.store().conversation(conv.id).await.unwrap();
    let path = engine.store().path_to(conv.active_leaf).await.unwrap();
    let stored: Vec<String> = path
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| {
            m.text()
                .split("\n\n")
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(stored.len(), sent.len(), "every word is stored once");
    // Words stored after one sent later than them.
    let index = |w: &String| w[1..].parse::<usize>().unwrap();
    let late: Vec<&[String]> = stored
        .windows(2)
        .filter(|pair| index(&pair[1]) < index(&pair[0]))
        .collect();
    assert!(
        late.is_empty(),
        "{} stored out of order: {late:?}",
        late.len()
    );
}

/// A turn's final answer is stored with the run's end, in one
/// transaction: when its `FinalResponse` is published the run is already
/// recorded as ended, the answer stored as the active leaf; the events
/// come out in the order they are stored (the answer, its
/// `FinalResponse`, then `Stopped`), each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_answer_is_stored_with_the_runs_end() {
    use toolwire_core::AgentEvent;
    let (engine, _dir) = engine(
        script("steps:\n  - text: hello there\n"),
        echo_tools(&[], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let mut live = engine.subscribe(conv.id);
    let handle = engine.send(conv.id, "hi", None).await.unwrap();
    let mut published = Vec::new();
    let mut at_final = None;
    loop {
        let event = live.recv().await.unwrap();
        if let AgentEvent::FinalResponse {
            run_id, message_id, ..
        } = &event.event
        {
            let run = engine.store().run(*run_id).await.unwrap();
            let answer = engine.store().message(*message_id).await.unwrap();
            let leaf = engine
                .store()
                .conversation(conv.id)
                .await
                .unwrap()
                .active_leaf;
            at_final = Some((run.stop_reason, answer.id == leaf, answer.content));
        }
        let stopped = matches!(event.event, AgentEvent::Stopped { .. });
        published.push(event);
        if stopped {
            break;
        }
    }
    let outcome = handle.wait().await;
    assert_eq!(outcome.reason, StopReason::EndTurn);
    let (ended, is_leaf, content) = at_final.expect("a FinalResponse was published");
    assert_eq!(ended, Some(StopReason::EndTurn), "ended when announced");
    assert!(is_leaf);
    assert_eq!(
        content,
        [ContentBlock::Text {
            text: "hello there".into()
        }]
    );
    let kinds: Vec<&str> = published
        .iter()
        .rev()
        .take(3)
        .map(|e| match e.event {
            AgentEvent::AssistantMessageCreated { .. } => "message",
            AgentEvent::FinalResponse { .. } => "final",
            AgentEvent::Stopped { .. } => "stopped",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["stopped", "final", "message"]);
    let stored = engine.events_since(conv.id, 0, 100).await.unwrap();
    assert_eq!(
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        published.iter().map(|e| e.seq).collect::<Vec<_>>(),
        "published as stored, each once"
    );
    assert_eq!(
        stored.iter().map(|e| &e.event).collect::<Vec<_>>(),
        published.iter().map(|e| &e.event).collect::<Vec<_>>()
    );
}
