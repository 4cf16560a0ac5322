//! A prompt from start to end: streamed text and the tool call's life, a
//! cancel, the plan, and a session loaded again by a new agent process.

use super::*;

#[tokio::test]
async fn a_prompt_streams_text_and_the_tool_call_life_then_ends_the_turn() {
    let dirs = Dirs::new();
    std::fs::write(dirs.project().join("hello.txt"), "hi\n").unwrap();
    let (child, transport) = dirs.scripted("script.yaml", LIST_THEN_ANSWER);

    let editor = Editor::new();
    let cwd = dirs.cwd();
    let (stop, session_id) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            assert_eq!(init.protocol_version, ProtocolVersion::V1);
            assert!(init.agent_capabilities.load_session);
            let meta = init.agent_capabilities.meta.clone().unwrap_or_default();
            assert_eq!(meta["toolwire"]["notify"], "_toolwire/notify");
            let session = new_session(&cx, cwd).await?;
            let stop = prompt(&cx, &session, "what is here?").await?;
            Ok((stop, session))
        })
        .await;
    assert_eq!(stop, StopReason::EndTurn);

    let updates = editor.updates();
    let text: String = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(chunk) => Some(text_of(&chunk.content)),
            _ => None,
        })
        .collect();
    assert_eq!(text, "Looking around.There is one file.", "{updates:#?}");

    let call = first_tool_call(&updates).expect("a tool_call");
    // Announced with what is known (the name), then the title follows
    // the arguments.
    assert_eq!(call.title, "List .");
    assert_eq!(call.kind, ToolKind::Other);
    assert_eq!(call.status, ToolCallStatus::Pending);
    assert_eq!(
        call.locations.first().map(|l| l.path.clone()),
        Some(dirs.cwd())
    );

    let statuses: Vec<ToolCallStatus> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) if up.tool_call_id == call.tool_call_id => {
                up.fields.status
            }
            _ => None,
        })
        .collect();
    // Every status change reaches the client, even for a call quicker
    // than the coalescing window.
    assert_eq!(
        statuses,
        [ToolCallStatus::InProgress, ToolCallStatus::Completed],
        "{updates:#?}"
    );
    let result: String = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up)
                if up.fields.status == Some(ToolCallStatus::Completed) =>
            {
                up.fields.content.clone()
            }
            _ => None,
        })
        .flatten()
        .map(content_text)
        .collect();
    assert!(result.contains("hello.txt"), "{result}");
    drop(child);

    // An editor restarted: a new agent process loads the session from the
    // database and replays it before answering.
    let replayed = replayed_by_another(&dirs, "script.yaml", LIST_THEN_ANSWER, session_id).await;
    assert!(
        matches!(&replayed[0], SessionUpdate::UserMessageChunk(c) if text_of(&c.content) == "what is here?"),
        "{replayed:#?}"
    );
    let call = first_tool_call(&replayed).expect("the tool call replayed");
    assert_eq!(call.title, "List .");
    assert_eq!(call.status, ToolCallStatus::Completed);
    assert!(format!("{:?}", call.content).contains("hello.txt"));
    let last = replayed.last().unwrap();
    assert!(
        matches!(last, SessionUpdate::AgentMessageChunk(c) if text_of(&c.content) == "There is one file."),
        "{replayed:#?}"
    );
}

/// A new agent process (`script` as `name` in `dirs`' home, its database)
/// loads `session`; what it replayed.
async fn replayed_by_another(
    dirs: &Dirs,
    name: &str,
    script: &str,
    session: SessionId,
) -> Vec<SessionUpdate> {
    let (child, transport) = dirs.scripted(name, script);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            load_session(&cx, &session, cwd).await?;
            Ok(())
        })
        .await;
    drop(child);
    // The session's slash commands follow the answer; they are no part of
    // the replay.
    editor
        .updates()
        .into_iter()
        .filter(|u| !matches!(u, SessionUpdate::AvailableCommandsUpdate(_)))
        .collect()
}

#[tokio::test]
async fn session_cancel_ends_the_prompt_with_cancelled() {
    let dirs = Dirs::new();
    let (child, transport) = dirs.scripted(
        "script.yaml",
        "steps:\n  - text: \"a long answer that streams one byte at a time\"\n    chunk_size: 1\n    delay_ms: 100\n",
    );
    let cwd = dirs.home().to_path_buf();
    let stop = Editor::new()
        .run_within(30, transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let prompt = cx.send_request(prompt_request(&session, "talk"));
            tokio::time::sleep(Duration::from_millis(500)).await;
            cx.send_notification(CancelNotification::new(session))?;
            Ok(prompt.block_task().await?.stop_reason)
        })
        .await;
    assert_eq!(stop, StopReason::Cancelled);
    drop(child);
}

#[tokio::test]
async fn an_update_plan_call_shows_as_the_plan_and_is_replayed() {
    let dirs = Dirs::new();
    let steps = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "update_plan", "arguments": {
            "explanation": "Starting.",
            "plan": [
                {"step": "Read the code", "status": "completed"},
                {"step": "Fix the bug", "status": "in_progress"},
                {"step": "Run the tests", "status": "pending"}
            ]
        }}]},
        {"text": "On it."}
    ]})
    .to_string();
    let (child, transport) = dirs.scripted("script.json", &steps);
    let editor = Editor::answering(Answer::Select("reject_once"));
    let cwd = dirs.cwd();
    let (stop, session) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            Ok((prompt(&cx, &session, "fix it").await?, session))
        })
        .await;
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);
    assert!(editor.asked().is_empty(), "update_plan does not ask");
    let updates = editor.updates();
    let expected: Vec<(String, PlanEntryStatus)> = [
        ("Read the code", PlanEntryStatus::Completed),
        ("Fix the bug", PlanEntryStatus::InProgress),
        ("Run the tests", PlanEntryStatus::Pending),
    ]
    .into_iter()
    .map(|(step, status)| (step.to_owned(), status))
    .collect();
    assert_eq!(
        plans(&updates),
        std::slice::from_ref(&expected),
        "{updates:#?}"
    );
    assert!(
        first_tool_call(&updates).is_none(),
        "the plan, not a tool call: {updates:#?}"
    );
    let plan_at = updates
        .iter()
        .position(|u| matches!(u, SessionUpdate::Plan(_)))
        .unwrap();
    let text_at = updates
        .iter()
        .position(|u| matches!(u, SessionUpdate::AgentMessageChunk(_)))
        .unwrap();
    assert!(
        plan_at < text_at,
        "the plan before the answer: {updates:#?}"
    );

    let replayed = replayed_by_another(&dirs, "script.json", &steps, session).await;
    assert_eq!(
        plans(&replayed),
        std::slice::from_ref(&expected),
        "{replayed:#?}"
    );
    assert!(first_tool_call(&replayed).is_none(), "{replayed:#?}");
}

/// The `plan` updates: their entries' content and status (each of medium
/// priority).
fn plans(updates: &[SessionUpdate]) -> Vec<Vec<(String, PlanEntryStatus)>> {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::Plan(plan) => Some(
                plan.entries
                    .iter()
                    .map(|e| {
                        assert_eq!(e.priority, PlanEntryPriority::Medium);
                        (e.content.clone(), e.status.clone())
                    })
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
