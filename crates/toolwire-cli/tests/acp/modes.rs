//! Session modes: offered in `modes` and as the `mode` config option,
//! switched by `session/set_mode` (and the option, which sends
//! `current_mode_update`), kept with the session for another process;
//! each mode's policy (read-only refuses a write without asking,
//! accept-edits runs an edit unasked and asks about a command,
//! full-access asks nothing) and each mode's sandbox for commands.

use agent_client_protocol::v1::schema::{
    NewSessionRequest, SessionConfigKind, SessionConfigOption,
};

use super::*;

/// The modes the editor was told of.
fn mode_updates(updates: &[SessionUpdate]) -> Vec<String> {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::CurrentModeUpdate(m) => Some(m.current_mode_id.0.to_string()),
            _ => None,
        })
        .collect()
}

fn option_value(options: &[SessionConfigOption], id: &str) -> Option<String> {
    options.iter().find(|o| o.id.0.as_ref() == id).map(|o| {
        let SessionConfigKind::Select(select) = &o.kind else {
            panic!("a select: {o:?}");
        };
        select.current_value.0.to_string()
    })
}

fn data(e: &AcpError) -> String {
    e.data.clone().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_mode_decides_what_asks_and_the_mode_is_kept() {
    let dirs = Dirs::new();
    // One turn per prompt: read-only, accept-edits, full-access.
    let script = write_file(
        dirs.home(),
        "script.json",
        &serde_json::json!({"turns": [
            {"steps": [
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "ro.txt", "content": "no"}}]},
                {"text": "Refused."}
            ]},
            {"steps": [
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "edit.txt", "content": "yes"}}]},
                {"tool_calls": [{"name": "run_command", "arguments": {"command": "true"}}]},
                {"text": "Edited."}
            ]},
            {"steps": [
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "full.txt", "content": "yes"}}]},
                {"text": "Done."}
            ]}
        ]})
        .to_string(),
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::answering(Answer::Select("reject_once"));
    let cwd = dirs.cwd();
    let watching = editor.clone();
    let (session, offered, asked_per_prompt, unknown_mode, unknown_value, after_set_option) =
        editor
            .run(transport, async move |cx: ConnectionTo<Agent>| {
                initialize(&cx, ClientCapabilities::new()).await?;
                let new = cx
                    .send_request(NewSessionRequest::new(cwd))
                    .block_task()
                    .await?;
                let session = new.session_id.clone();
                let modes = new.modes.clone().expect("modes offered");
                let offered = (
                    modes.current_mode_id.0.to_string(),
                    modes
                        .available_modes
                        .iter()
                        .map(|m| m.id.0.to_string())
                        .collect::<Vec<_>>(),
                    option_value(&new.config_options.clone().unwrap_or_default(), "mode"),
                );
                let mut asked = Vec::new();
                set_mode(&cx, &session, "read-only").await?;
                prompt(&cx, &session, "write it").await?;
                asked.push(watching.asked().len());
                let set = set_option(&cx, &session, "mode", "accept-edits").await?;
                let after_set_option = option_value(&set.config_options, "mode");
                prompt(&cx, &session, "edit, then build").await?;
                asked.push(watching.asked().len());
                set_mode(&cx, &session, "full-access").await?;
                prompt(&cx, &session, "anything").await?;
                asked.push(watching.asked().len());
                let unknown_mode = set_mode(&cx, &session, "yolo").await.unwrap_err();
                let unknown_value = set_option(&cx, &session, "mode", "sometimes")
                    .await
                    .unwrap_err();
                Ok((
                    session,
                    offered,
                    asked,
                    unknown_mode,
                    unknown_value,
                    after_set_option,
                ))
            })
            .await;
    drop(child);
    assert_eq!(
        offered,
        (
            "ask".to_owned(),
            strings(&["read-only", "ask", "accept-edits", "full-access"]),
            Some("ask".to_owned())
        )
    );
    // read-only: the write refused without asking; accept-edits: the
    // edit ran unasked, the command asked (and was rejected);
    // full-access: nothing asked.
    assert_eq!(asked_per_prompt, [0, 1, 1]);
    let asked = editor.asked();
    assert_eq!(
        asked[0].tool_call.fields.kind,
        Some(ToolKind::Execute),
        "{asked:?}"
    );
    assert!(!dirs.project().join("ro.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("edit.txt")).unwrap(),
        "yes"
    );
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("full.txt")).unwrap(),
        "yes"
    );
    let refused = results(&editor.updates());
    assert!(refused.contains("read-only mode"), "{refused}");
    // The option change was told as a mode update; the option follows.
    assert_eq!(mode_updates(&editor.updates()), ["accept-edits"]);
    assert_eq!(after_set_option.as_deref(), Some("accept-edits"));
    assert!(data(&unknown_mode).contains("`yolo`"), "{unknown_mode:?}");
    assert!(
        data(&unknown_value).contains("`sometimes`"),
        "{unknown_value:?}"
    );

    // Another process loads it in the mode it was left in.
    let script = write_file(dirs.home(), "answer.yaml", "steps:\n  - text: \"Hi.\"\n");
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let loaded = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let loaded = load_session(&cx, &session, cwd).await?;
            assert_eq!(
                prompt(&cx, &session, "still usable").await?,
                StopReason::EndTurn
            );
            Ok((
                loaded.modes.map(|m| m.current_mode_id.0.to_string()),
                option_value(&loaded.config_options.unwrap_or_default(), "mode"),
            ))
        })
        .await;
    drop(child);
    assert_eq!(
        loaded,
        (
            Some("full-access".to_owned()),
            Some("full-access".to_owned())
        )
    );
}

/// Issue 17's policy per ACP mode: with `run_command` allowed outright, a
/// command in read-only mode runs under the read-only sandbox and cannot
/// write even the workspace; in ask mode (the configured
/// workspace-write) it cannot write outside the workspace; in
/// full-access (sandbox `full`) it can.
#[tokio::test(flavor = "multi_thread")]
async fn each_mode_runs_commands_under_its_sandbox() {
    let dirs = Dirs::new();
    let outside = tempfile::tempdir().unwrap();
    let inside_cmd = "echo x > inside.txt";
    let outside_cmd = format!("echo x > {}/outside.txt", outside.path().display());
    let call = |command: &str| {
        serde_json::json!({"steps": [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            {"text": "Ran."}
        ]})
    };
    let script = write_file(
        dirs.home(),
        "script.json",
        &serde_json::json!({"turns": [
            call(inside_cmd), call(&outside_cmd), call(&outside_cmd)
        ]})
        .to_string(),
    );
    let config = write_file(
        dirs.home(),
        "toolwire.toml",
        "[acp.permissions]\nrun_command = \"allow\"\n",
    );
    let args = scripted_config_args(&script, &dirs.db(), &config);
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let out = outside.path().to_path_buf();
    let (in_read_only, outside_in_ask) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd.clone()).await?;
            set_mode(&cx, &session, "read-only").await?;
            prompt(&cx, &session, "write inside").await?;
            let in_read_only = cwd.join("inside.txt").exists();
            set_mode(&cx, &session, "ask").await?;
            prompt(&cx, &session, "write outside").await?;
            let outside_in_ask = out.join("outside.txt").exists();
            set_mode(&cx, &session, "full-access").await?;
            prompt(&cx, &session, "write outside again").await?;
            Ok((in_read_only, outside_in_ask))
        })
        .await;
    drop(child);
    assert!(editor.asked().is_empty(), "allowed outright: nothing asks");
    assert!(
        !in_read_only,
        "read-only mode: the command could not write the workspace"
    );
    assert!(
        !outside_in_ask,
        "ask mode (workspace-write): not outside the workspace"
    );
    assert!(
        outside.path().join("outside.txt").exists(),
        "full-access (full): the command wrote outside the workspace: {}",
        results(&editor.updates())
    );
}
