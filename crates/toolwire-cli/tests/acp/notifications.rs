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
