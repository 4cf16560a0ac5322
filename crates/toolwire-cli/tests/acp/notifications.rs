//! A real HTTP model (the mock model server of `toolwire-test-support`),
//! configuration files, and notifications: from the client, and of changes in
//! the session's folders.

use super::*;

/// A model that says `text` and runs `command`, then says "Done.".
async fn model_running(text: &str, command: &str) -> support::MockServer {
    use support::{Call, MockServer, Reply, openai_sse};
    MockServer::start(vec![
        Reply::sse(openai_sse(
            text,
            &[Call {
                id: "call_slow",
                name: "run_command",
                arguments: serde_json::json!({ "command": command }),
            }],
        )),
        Reply::sse(openai_sse("Done.", &[])),
    ])
    .await
}

/// The tool result the model was sent in its second (and last) request.
fn tool_result_sent(server: &support::MockServer) -> String {
    let received = server.received();
    assert_eq!(received.len(), 2);
    let tool = received[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    tool["content"].as_str().unwrap().to_owned()
}

/// A config file allowing run_command in `dir`.
fn allow_run_command(dir: &Path) -> PathBuf {
    write_file(
        dir,
        "toolwire.toml",
        "[acp.permissions]\nrun_command = \"allow\"\n",
    )
}

#[tokio::test]
async fn a_notification_from_the_client_reaches_the_model_and_shows_as_a_thought() {
    let server = model_running("Deploying.", "sleep 1; echo deployed").await;
    let dirs = Dirs::new();
    // Beside the config file, out of the session's directory.
    let data = tempfile::tempdir().unwrap();
    // run_command is allowed by configuration: nobody is asked.
    let config = allow_run_command(data.path());
    let db = sqlite_in(data.path());
    let (child, transport, _) = spawn_with(dirs.home(), &openai_args(&server.url, &db, &config));

    let (editor, mut running) = Editor::new().telling_when_running();
    let cwd = dirs.cwd();
    let stop = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let prompt = cx.send_request(prompt_request(&session, "deploy"));
            running.recv().await;
            cx.send_notification(UntypedMessage::new(
                "_toolwire/notify",
                serde_json::json!({
                    "sessionId": session.0,
                    "source": "ci",
                    "text": "deploy finished <ok>",
                    "priority": "high"
                }),
            )?)?;
            Ok(prompt.block_task().await?.stop_reason)
        })
        .await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(editor.asked().len(), 0, "allowed by the config file");

    // The model's next request carries the block after the tool's output.
    let content = tool_result_sent(&server);
    assert!(content.contains("deployed"), "{content}");
    assert!(
        content.contains(
            "<notifications count=\"1\">\n- [ci] deploy finished &lt;ok&gt;\n</notifications>"
        ),
        "{content}"
    );

    // The editor saw it as a thought, after the call's result.
    let updates = editor.updates();
    let thought = updates
        .iter()
        .position(|u| matches!(u, SessionUpdate::AgentThoughtChunk(c) if text_of(&c.content).contains("[ci] deploy finished <ok>")))
        .unwrap_or_else(|| panic!("a thought chunk: {updates:#?}"));
    let completed = updates
        .iter()
        .position(|u| matches!(u, SessionUpdate::ToolCallUpdate(up) if up.fields.status == Some(ToolCallStatus::Completed)))
        .unwrap();
    assert!(completed < thought, "{updates:#?}");

    // The call's title and kind say what it does.
    let call = first_tool_call(&updates).unwrap();
    assert_eq!(call.kind, ToolKind::Execute);
    let titles: Vec<String> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) => up.fields.title.clone(),
            _ => None,
        })
        .collect();
    assert!(
        titles.contains(&"Run `sleep 1; echo deployed`".to_owned()),
        "{titles:?}"
    );
    drop(child);
}

#[tokio::test]
async fn a_change_in_the_sessions_folders_reaches_its_model_and_nothing_else_does() {
    let server = model_running("Building.", "sleep 2; echo built").await;
    // The process's directory, where the database lives too; the session's
    // cwd is elsewhere.
    let dirs = Dirs::new();
    let config = allow_run_command(dirs.home());
    // The database in the session's cwd: its own writes are not changes.
    let db = sqlite_in(dirs.project());
    let (child, transport, _) = spawn_with(dirs.home(), &openai_args(&server.url, &db, &config));
    let (editor, mut running) = Editor::new().telling_when_running();
    let cwd = dirs.cwd();
    // The editor's other folder of the project (`additionalDirectories`).
    let other = tempfile::tempdir().unwrap();
    let other_root = other.path().canonicalize().unwrap();
    let (inside, outside, beside) = (
        dirs.project().join("changed.txt"),
        dirs.home().join("outside.txt"),
        other_root.join("docs.md"),
    );
    let roots = vec![other_root.clone()];
    let stop = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let session = cx
                .send_request(NewSessionRequest::new(cwd).additional_directories(roots))
                .block_task()
                .await?
                .session_id;
            let prompt = cx.send_request(prompt_request(&session, "build"));
            // While the command sleeps: a change in the session's cwd, one
            // in its other folder, and one in the process's directory.
            running.recv().await;
            std::fs::write(&inside, "new\n").unwrap();
            std::fs::write(&beside, "# docs\n").unwrap();
            std::fs::write(&outside, "not the session's\n").unwrap();
            Ok(prompt.block_task().await?.stop_reason)
        })
        .await;
    assert_eq!(stop, StopReason::EndTurn);

    // The model's next request carries the session's change after the
    // tool's output, and nothing else.
    let content = tool_result_sent(&server);
    assert!(content.contains("built"), "{content}");
    assert!(content.contains("<notifications"), "{content}");
    assert!(content.contains("changed.txt"), "{content}");
    // A change in another root is named by its absolute path (a relative
    // one would be read as the cwd's).
    let absolute = other_root.join("docs.md").display().to_string();
    assert!(content.contains(&absolute), "{content}");
    assert!(!content.contains("outside.txt"), "{content}");
    assert!(!content.contains("t.db"), "the store's files: {content}");
    drop(child);
}

/// The words the agent said and thought, in order, each kind tagged.
fn said(updates: &[SessionUpdate]) -> Vec<String> {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(c) => Some(format!("said: {}", text_of(&c.content))),
            SessionUpdate::AgentThoughtChunk(c) => {
                Some(format!("thought: {}", text_of(&c.content)))
            }
            _ => None,
        })
        .collect()
}

/// A config in `dir` where notifications from `ci` wake the agent, joined
/// within `coalesce` seconds, with `more` TOML after it.
fn waking_on_ci(dir: &Path, coalesce: &str, more: &str) -> PathBuf {
    write_file(
        dir,
        "toolwire.toml",
        &format!("[notifications]\nwake = [\"ci\"]\ncoalesce_seconds = {coalesce}\n{more}"),
    )
}

/// Tells session `session` "the build failed" from source `ci` (a waking
/// source in these tests' configs).
fn ci_build_failed(cx: &ConnectionTo<Agent>, session: &SessionId) -> Result<(), AcpError> {
    cx.send_notification(UntypedMessage::new(
        "_toolwire/notify",
        serde_json::json!({"sessionId": session.0, "source": "ci", "text": "the build failed"}),
    )?)
}

/// Asserts that the editor was asked once, about `call_fix`, and that its
/// write ran.
fn fixed_once_asked(editor: &Editor, dirs: &Dirs) {
    let asked = editor.asked();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].tool_call.tool_call_id.0.as_ref(), "call_fix");
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("fix.txt")).unwrap(),
        "fixed\n"
    );
}

#[tokio::test]
async fn a_turn_a_notification_wakes_is_shown_and_asked_about_and_a_prompt_waits_for_it() {
    use support::{MockServer, Reply, openai_sse};
    let server = MockServer::start(vec![
        // The turn the notification wakes: it writes a file, which the
        // editor is asked about.
        writes("Fixing the build.", "call_fix", "fix.txt", "fixed\n"),
        Reply::sse(openai_sse("Fixed.", &[])),
        // The prompt sent while that turn waited for the answer.
        Reply::sse(openai_sse("Yes, it is fixed.", &[])),
    ])
    .await;
    let dirs = Dirs::new();
    let data = tempfile::tempdir().unwrap();
    let config = waking_on_ci(data.path(), "0.05", "");
    let db = sqlite_in(data.path());
    let (child, transport, _) = spawn_with(dirs.home(), &openai_args(&server.url, &db, &config));
    // The user takes a moment over the question.
    let editor = Editor::answering(Answer::Later("allow_once", 500));
    let watching = editor.clone();
    let cwd = dirs.cwd();
    let stop = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            // No prompt runs: the notification wakes the agent.
            ci_build_failed(&cx, &session)?;
            // While the woken turn waits for the answer, a prompt: it
            // waits for that turn, and is not refused.
            while watching.asked().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            prompt(&cx, &session, "is it fixed?").await
        })
        .await;
    drop(child);
    assert_eq!(stop, StopReason::EndTurn);
    // Asked about the woken turn's write, which then ran.
    fixed_once_asked(&editor, &dirs);
    // The editor saw the woken turn as it ran: why it woke, its words and
    // its call's end; then the prompt's answer.
    let updates = editor.updates();
    let said = said(&updates);
    let at = |what: &str| {
        said.iter()
            .position(|s| s.contains(what))
            .unwrap_or_else(|| panic!("{what}: {said:#?}"))
    };
    assert!(said[at("[ci] the build failed")].starts_with("thought: "));
    assert!(at("[ci] the build failed") < at("Fixing the build."));
    assert!(at("Fixing the build.") < at("Fixed."));
    assert!(at("Fixed.") < at("Yes, it is fixed."), "{said:#?}");
    assert!(
        updates
            .iter()
            .any(|u| matches!(u, SessionUpdate::ToolCallUpdate(up)
            if up.tool_call_id.0.as_ref() == "call_fix"
                && up.fields.status == Some(ToolCallStatus::Completed))),
        "{updates:#?}"
    );
    // The prompt's request carried the woken turn before it.
    let received = server.received();
    assert_eq!(received.len(), 3);
    let messages = received[2].body["messages"].to_string();
    assert!(
        messages.find("Fixed.").unwrap() < messages.find("is it fixed?").unwrap(),
        "{messages}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_that_finds_a_woken_turn_running_shows_it_then_runs() {
    use support::{Call, MockServer, Reply, openai_sse};
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Building.",
            &[Call {
                id: "call_build",
                name: "run_command",
                arguments: serde_json::json!({"command": "echo built"}),
            }],
        )),
        // The last answer of the first prompt comes slowly: a notification
        // sent meanwhile has no tool result left to ride on, and wakes the
        // agent when the turn ends.
        Reply::Sse {
            body: openai_sse("Built, and nothing more to run.", &[]),
            chunk: 16,
            delay: Duration::from_millis(60),
        },
        // The woken turn writes a file, which asks: whether it is still
        // running or already paused when the second prompt sends, that
        // prompt asks about it.
        writes("Woken.", "call_fix", "fix.txt", "fixed\n"),
        Reply::sse(openai_sse("Fixed.", &[])),
        Reply::sse(openai_sse("Second prompt.", &[])),
    ])
    .await;
    let dirs = Dirs::new();
    let data = tempfile::tempdir().unwrap();
    let config = waking_on_ci(
        data.path(),
        "0",
        "[acp.permissions]\nrun_command = \"allow\"\n",
    );
    let db = sqlite_in(data.path());
    let log = data.path().join("acp.log");
    let (child, transport, _) = spawn_logging(
        dirs.home(),
        &openai_args(&server.url, &db, &config),
        Some(&log),
    );
    let (editor, mut running) = Editor::new().telling_when_running();
    let cwd = dirs.cwd();
    let (first, second) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let first = cx.send_request(prompt_request(&session, "build"));
            running.recv().await;
            // The command is done and the answer streams.
            tokio::time::sleep(Duration::from_millis(300)).await;
            ci_build_failed(&cx, &session)?;
            // Queued behind the first: the woken turn is its to show.
            let second = cx.send_request(prompt_request(&session, "and now?"));
            Ok((
                first.block_task().await?.stop_reason,
                second.block_task().await?.stop_reason,
            ))
        })
        .await;
    drop(child);
    assert_eq!((first, second), (StopReason::EndTurn, StopReason::EndTurn));
    let received = server.received();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let third = received[2].body["messages"].to_string();
    assert!(third.contains("the build failed"), "{third}");
    let said = said(&editor.updates()).join("\n");
    // When the woken turn starts as the first prompt's turn ends, before
    // the second sends, that prompt shows it, then runs. Should the second
    // prompt send first, its own turn reads the notification.
    if received.len() == 5 {
        assert!(!third.contains("and now?"), "{third}");
        let (woke, fixed, then) = (
            said.find("Woken.").unwrap(),
            said.find("Fixed.").unwrap(),
            said.find("Second prompt.").unwrap(),
        );
        assert!(woke < fixed && fixed < then, "{said}");
        assert!(log.contains("before the prompt's"), "{log}");
    } else {
        // The second prompt's own turn writes the file (the script's
        // answers come in order).
        assert_eq!(received.len(), 4, "{log}");
        assert!(third.contains("and now?"), "{third}");
    }
    // Either way the write was asked about, and ran.
    fixed_once_asked(&editor, &dirs);
    eprintln!("{} model calls", received.len());
}

#[tokio::test]
async fn a_notification_to_a_parked_session_opens_it_and_its_turn_is_shown() {
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        "steps:\n  - text: \"Looking at the build.\"\n",
    );
    let config = waking_on_ci(dirs.home(), "0", "[acp]\nmax_open_sessions = 1\n");
    let log = dirs.home().join("agent.log");
    let (child, transport, _) = spawn_logging(
        dirs.home(),
        &scripted_config_args(&script, &dirs.db(), &config),
        Some(&log),
    );
    let editor = Editor::new();
    let watching = editor.clone();
    let cwd = dirs.cwd();
    editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let first = open_session(&cx, ClientCapabilities::new(), cwd.clone()).await?;
            // The second session parks the first.
            open_session(&cx, ClientCapabilities::new(), cwd).await?;
            ci_build_failed(&cx, &first)?;
            for _ in 0..250 {
                if said(&watching.updates())
                    .iter()
                    .any(|s| s.contains("Looking at the build."))
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        })
        .await;
    drop(child);
    // The woken turn was shown: why it woke, then its words.
    let said = said(&editor.updates());
    assert_eq!(
        said,
        [
            "thought: Notifications:\n- [ci] the build failed\n",
            "said: Looking at the build."
        ],
        "{said:#?}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("ACP session parked"), "{log}");
    assert!(log.contains("ACP session opened again"), "{log}");
}
