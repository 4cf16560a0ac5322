//! `session/request_permission`: which calls ask, what allow/reject once and
//! always do, the edit an `apply_diff` or a write shows when asked, and
//! answers kept by a loaded session.

use super::*;

/// What a client that answers every permission request with `answer` saw
/// over `prompts` prompts of one session.
struct Asked {
    requests: Vec<RequestPermissionRequest>,
    stops: Vec<StopReason>,
    updates: Vec<SessionUpdate>,
    project: tempfile::TempDir,
}

async fn prompts_answered_with(answer: &'static str, prompts: usize) -> Asked {
    let dirs = Dirs::new();
    let (child, transport) = dirs.scripted("script.yaml", WRITE_TWICE);
    let editor = Editor::answering(Answer::Select(answer));
    let cwd = dirs.cwd();
    let stops = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let mut stops = Vec::new();
            for _ in 0..prompts {
                stops.push(prompt(&cx, &session, "write it").await?);
            }
            Ok(stops)
        })
        .await;
    drop(child);
    Asked {
        requests: editor.asked(),
        stops,
        updates: editor.updates(),
        project: dirs.project,
    }
}

#[tokio::test]
async fn a_write_asks_for_permission_and_runs_when_allowed_once() {
    let asked = prompts_answered_with("allow_once", 1).await;
    assert_eq!(asked.stops, [StopReason::EndTurn]);
    assert_eq!(asked.requests.len(), 1, "{:#?}", asked.requests);
    let request = &asked.requests[0];
    assert_eq!(
        request.tool_call.fields.title.as_deref(),
        Some("Edit out.txt")
    );
    let location = &request.tool_call.fields.locations.as_ref().unwrap()[0];
    assert_eq!(location.path, asked.project.path().join("out.txt"));
    assert_eq!(request.tool_call.fields.kind, Some(ToolKind::Edit));
    assert_eq!(
        request.tool_call.fields.raw_input,
        Some(serde_json::json!({"path": "out.txt", "content": "hello\n"}))
    );
    let diff = first_diff(request.tool_call.fields.content.iter().flatten()).expect("a diff");
    assert_eq!(diff.new_text, "hello\n");
    assert_eq!(diff.old_text, None, "a new file");
    assert_eq!(diff.path, asked.project.path().join("out.txt"));
    let kinds: Vec<PermissionOptionKind> = request.options.iter().map(|o| o.kind).collect();
    assert_eq!(
        kinds,
        [
            PermissionOptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways,
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ]
    );
    let written = std::fs::read_to_string(asked.project.path().join("out.txt")).unwrap();
    assert_eq!(written, "hello\n");
}

#[tokio::test]
async fn a_rejected_write_is_not_run_and_the_model_is_told() {
    let asked = prompts_answered_with("reject_once", 1).await;
    assert_eq!(asked.stops, [StopReason::EndTurn]);
    assert_eq!(asked.requests.len(), 1);
    assert!(!asked.project.path().join("out.txt").exists());
    let results = results(&asked.updates);
    assert!(results.contains("denied"), "{results}");
    let last_status = last_status(&asked.updates);
    assert_eq!(last_status, Some(ToolCallStatus::Failed), "it did not run");
    assert_eq!(
        completed_diffs(&asked.updates),
        [],
        "no diff of an edit not made"
    );
}

#[tokio::test]
async fn allow_always_is_not_asked_again_in_the_session() {
    let asked = prompts_answered_with("allow_always", 2).await;
    assert_eq!(asked.stops, [StopReason::EndTurn, StopReason::EndTurn]);
    assert_eq!(asked.requests.len(), 1, "{:#?}", asked.requests);
    let project = asked.project.path();
    assert_eq!(
        std::fs::read_to_string(project.join("out.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("out2.txt")).unwrap(),
        "again\n"
    );
    // The call that ran without asking shows its diff as well (the one
    // asked about keeps the diff its request showed).
    let done = diffs_shown_when_done(&asked.updates, &asked.requests);
    let shown: Vec<(PathBuf, Option<&str>, &str)> = done
        .iter()
        .map(|(d, _)| (d.path.clone(), d.old_text.as_deref(), d.new_text.as_str()))
        .collect();
    assert_eq!(
        shown,
        [
            (project.join("out.txt"), None, "hello\n"),
            (project.join("out2.txt"), None, "again\n"),
        ]
    );
}

#[tokio::test]
async fn reject_always_rejects_later_calls_without_asking() {
    let asked = prompts_answered_with("reject_always", 2).await;
    assert_eq!(asked.stops, [StopReason::EndTurn, StopReason::EndTurn]);
    assert_eq!(asked.requests.len(), 1, "{:#?}", asked.requests);
    assert!(!asked.project.path().join("out.txt").exists());
    assert!(!asked.project.path().join("out2.txt").exists());
    let results = results(&asked.updates);
    assert_eq!(results.matches("denied").count(), 2, "{results}");
}

#[tokio::test]
async fn a_cancel_while_the_editor_asks_ends_the_prompt_and_runs_nothing() {
    let dirs = Dirs::new();
    let (child, transport) = dirs.scripted("script.yaml", WRITE_TWICE);
    let editor = Editor::answering(Answer::Cancel);
    let stop = one_prompt(
        &editor,
        transport,
        ClientCapabilities::new(),
        dirs.cwd(),
        "write it",
    )
    .await;
    assert_eq!(stop, StopReason::Cancelled);
    assert!(!dirs.project().join("out.txt").exists());
    drop(child);
}

#[tokio::test]
async fn a_loaded_session_keeps_its_always_answers() {
    let dirs = Dirs::new();
    let editor = Editor::answering(Answer::Select("allow_always"));

    // Run one prompt in a new (`None`) or loaded session; returns its id.
    let prompt_once = |load: Option<SessionId>| {
        let (child, transport) = dirs.scripted("script.yaml", WRITE_TWICE);
        let cwd = dirs.cwd();
        let editor = editor.clone();
        async move {
            let id = editor
                .run(transport, async move |cx: ConnectionTo<Agent>| {
                    initialize(&cx, ClientCapabilities::new()).await?;
                    let id = match load {
                        Some(id) => {
                            load_session(&cx, &id, cwd).await?;
                            id
                        }
                        None => new_session(&cx, cwd).await?,
                    };
                    let stop = prompt(&cx, &id, "write it").await?;
                    assert_eq!(stop, StopReason::EndTurn);
                    Ok(id)
                })
                .await;
            drop(child);
            id
        }
    };
    let id = prompt_once(None).await;
    assert_eq!(editor.asked().len(), 1);
    // Another agent process (an editor restart): the stored answer holds.
    prompt_once(Some(id)).await;
    assert_eq!(editor.asked().len(), 1, "not asked again after the load");
    // The script's second turn (the conversation's second prompt).
    assert!(dirs.project().join("out2.txt").exists());
}

#[tokio::test]
async fn an_apply_diff_is_asked_about_with_the_edit_it_makes() {
    let dirs = Dirs::new();
    std::fs::write(dirs.project().join("a.txt"), "one\ntwo\n").unwrap();
    let script = json_script(
        dirs.home(),
        serde_json::json!([
            {"tool_calls": [{"name": "apply_diff", "arguments": {
                "path": "a.txt",
                "diff": "@@ -1,2 +1,2 @@\n one\n-two\n+three\n"
            }}]},
            {"text": "Edited."}
        ]),
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::new();
    let stop = one_prompt(
        &editor,
        transport,
        ClientCapabilities::new(),
        dirs.cwd(),
        "edit",
    )
    .await;
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);
    let asked = editor.asked();
    assert_eq!(asked.len(), 1);
    let fields = &asked[0].tool_call.fields;
    assert_eq!(fields.title.as_deref(), Some("Edit a.txt"));
    assert_eq!(fields.kind, Some(ToolKind::Edit));
    let diff = first_diff(fields.content.iter().flatten()).expect("a diff");
    assert_eq!(diff.path, dirs.project().join("a.txt"));
    assert_eq!(diff.old_text.as_deref(), Some("one\ntwo\n"));
    assert_eq!(diff.new_text, "one\nthree\n");
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("a.txt")).unwrap(),
        "one\nthree\n"
    );
    // Once run, the call keeps showing the diff it made (its request
    // showed it: the completed update does not send it again), its result
    // beside it.
    let done = diffs_shown_when_done(&editor.updates(), &editor.asked());
    assert_eq!(done.len(), 1, "{done:#?}");
    let (diff, result) = &done[0];
    assert_eq!(diff.path, dirs.project().join("a.txt"));
    assert_eq!(diff.old_text.as_deref(), Some("one\ntwo\n"));
    assert_eq!(diff.new_text, "one\nthree\n");
    assert_eq!(result, "applied 1 hunk to `a.txt`");
}

/// The permission request of an edit outside the session's cwd shows
/// nothing of the file there: the preview goes through the sandbox, and the
/// tool refuses the path when run.
#[tokio::test]
async fn a_write_outside_the_cwd_does_not_show_the_file_there() {
    let dirs = Dirs::new();
    let outer = tempfile::tempdir().unwrap();
    let cwd = outer.path().join("project");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::write(outer.path().join("outside.txt"), "top secret 4242\n").unwrap();
    let script = json_script(
        dirs.home(),
        serde_json::json!([
            {"tool_calls": [{"name": "write_file", "arguments": {
                "path": "../outside.txt",
                "content": "new\n"
            }}]},
            {"text": "Tried."}
        ]),
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::new();
    let stop = one_prompt(&editor, transport, ClientCapabilities::new(), cwd, "edit").await;
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);
    let asked = editor.asked();
    assert_eq!(asked.len(), 1);
    let fields = &asked[0].tool_call.fields;
    let shown = serde_json::to_string(&fields.content).unwrap();
    assert!(!shown.contains("top secret"), "{shown}");
    assert!(
        first_diff(fields.content.iter().flatten()).is_none(),
        "{shown}"
    );
    assert!(shown.contains("outside the workspace root"), "{shown}");
    assert_eq!(
        std::fs::read_to_string(outer.path().join("outside.txt")).unwrap(),
        "top secret 4242\n"
    );
}

/// Only a regular file is read for a preview: a FIFO would hang the
/// permission request.
#[cfg(unix)]
#[tokio::test]
async fn a_write_to_a_fifo_is_asked_about_without_reading_it() {
    let dirs = Dirs::new();
    let fifo = dirs.project().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let script = json_script(
        dirs.home(),
        serde_json::json!([
            {"tool_calls": [{"name": "write_file", "arguments": {
                "path": "pipe",
                "content": "new\n"
            }}]},
            {"text": "Tried."}
        ]),
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::answering(Answer::Select("reject_once"));
    let stop = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        one_prompt(
            &editor,
            transport,
            ClientCapabilities::new(),
            dirs.cwd(),
            "edit",
        ),
    )
    .await
    .expect("the permission request does not hang on the FIFO");
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);
    let asked = editor.asked();
    assert_eq!(asked.len(), 1);
    let shown = serde_json::to_string(&asked[0].tool_call.fields.content).unwrap();
    assert!(shown.contains("not a regular file"), "{shown}");
}

#[tokio::test]
async fn allow_always_covers_the_rest_of_its_batch() {
    let dirs = Dirs::new();
    let (child, transport) = dirs.scripted(
        "script.yaml",
        r#"
steps:
  - text: "Writing two."
    tool_calls:
      - {name: write_file, arguments: {path: "a.txt", content: "a\n"}}
      - {name: write_file, arguments: {path: "b.txt", content: "b\n"}}
  - text: "Done."
"#,
    );
    let editor = Editor::answering(Answer::Select("allow_always"));
    let stop = one_prompt(
        &editor,
        transport,
        ClientCapabilities::new(),
        dirs.cwd(),
        "go",
    )
    .await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(editor.asked().len(), 1, "{:#?}", editor.asked());
    for (name, text) in [("a.txt", "a\n"), ("b.txt", "b\n")] {
        assert_eq!(
            std::fs::read_to_string(dirs.project().join(name)).unwrap(),
            text
        );
    }
    drop(child);
}
