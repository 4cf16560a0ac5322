//! Files and terminals through an editor that offers them: reads, writes and
//! commands asked of the client, a cwd reached through a symlink, the
//! editor's read errors, and its saves of the agent's writes.

use super::*;

#[tokio::test]
async fn files_and_commands_go_through_an_editor_that_offers_them() {
    files_and_commands_through_the_editor(false).await;
}

/// A project opened through a symlink (macOS's `/tmp`, a linked folder):
/// the editor is asked about its files by the names it gave.
#[tokio::test]
async fn an_editor_whose_cwd_is_a_symlink_is_asked_by_its_own_names() {
    files_and_commands_through_the_editor(true).await;
}

async fn files_and_commands_through_the_editor(cwd_is_a_link: bool) {
    let dirs = Dirs::new();
    let cwd = if cwd_is_a_link {
        let link = dirs.home().join("linked-project");
        std::os::unix::fs::symlink(dirs.project(), &link).unwrap();
        link
    } else {
        dirs.cwd()
    };
    let data = tempfile::tempdir().unwrap();
    std::fs::write(dirs.project().join("notes.txt"), "on disk\n").unwrap();
    let script = json_script(
        data.path(),
        serde_json::json!([
            {"tool_calls": [
                {"name": "read_file", "arguments": {"path": "notes.txt"}},
                {"name": "write_file", "arguments": {"path": "notes.txt", "content": "rewritten\n"}},
                {"name": "apply_diff", "arguments": {"path": "notes.txt", "diff": "@@ -1 +1 @@\n-unsaved buffer\n+patched\n"}},
                {"name": "run_command", "arguments": {"command": "make"}}
            ]},
            {"text": "Done."}
        ]),
    );
    let db = sqlite_in(data.path());
    let (child, transport, _) = spawn_with(dirs.home(), &scripted_args(&script, &db));

    let editor = Editor::new();
    let caps = ClientCapabilities::new()
        .fs(FileSystemCapabilities::new()
            .read_text_file(true)
            .write_text_file(true))
        .terminal(true);
    let stop = one_prompt(&editor, transport, caps, cwd.clone(), "go").await;
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);

    let notes = cwd.join("notes.txt");
    let log = editor.log.lock().unwrap();
    assert!(log.reads.contains(&notes), "{log:?}");
    // The diff applied to the editor's buffer, not to the file on disk.
    assert_eq!(log.writes.len(), 2, "{log:?}");
    assert!(
        log.writes
            .contains(&(notes.clone(), "rewritten\n".to_owned()))
    );
    assert!(
        log.writes
            .contains(&(notes.clone(), "patched\n".to_owned()))
    );
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "on disk\n",
        "the editor wrote, not the agent"
    );
    assert_eq!(
        log.terminals,
        [(
            "sh".to_owned(),
            vec!["-c".to_owned(), "make".to_owned()],
            Some(cwd.clone())
        )]
    );
    assert_eq!(log.released, ["term-1"]);

    // The write was asked about with the editor's text as the old one.
    let asked = editor.asked();
    let diff = first_diff(
        asked
            .iter()
            .flat_map(|r| r.tool_call.fields.content.iter().flatten()),
    )
    .expect("a diff");
    assert_eq!(diff.old_text.as_deref(), Some("unsaved buffer\n"));

    let updates = editor.updates();
    // Both edits show what they did to the editor's buffer once run.
    let mut done: Vec<(Option<String>, String)> = diffs_shown_when_done(&updates, &asked)
        .into_iter()
        .map(|(d, _)| (d.old_text, d.new_text))
        .collect();
    done.sort();
    assert_eq!(
        done,
        [
            (Some("unsaved buffer\n".into()), "patched\n".into()),
            (Some("unsaved buffer\n".into()), "rewritten\n".into()),
        ]
    );
    let results = results(&updates);
    assert!(results.contains("unsaved buffer"), "{results}");
    let terminal = updates.iter().any(|u| match u {
        SessionUpdate::ToolCallUpdate(up) => up.fields.content.iter().flatten().any(
            |c| matches!(c, ToolCallContent::Terminal(t) if t.terminal_id.0.as_ref() == "term-1"),
        ),
        _ => false,
    });
    assert!(
        terminal,
        "the command's call shows the editor's terminal: {updates:#?}"
    );
    // Every location shown is under the cwd the editor gave.
    for u in &updates {
        if let SessionUpdate::ToolCallUpdate(up) = u {
            for l in up.fields.locations.iter().flatten() {
                assert!(l.path.starts_with(&cwd), "{l:?} is not under {cwd:?}");
            }
        }
    }
}

/// Through the editor, `apply_diff` starts a file the editor reports
/// missing (`-32002`) from nothing, and one it fails to read that is not
/// on disk either (a client that answers a missing file with another
/// error); it fails on a read error for a file that exists rather than
/// take the file as empty.
#[tokio::test]
async fn an_editor_read_error_is_not_an_empty_file() {
    let dirs = Dirs::new();
    std::fs::write(dirs.project().join("broken.txt"), "on disk\n").unwrap();
    let create = "@@ -0,0 +1 @@\n+created\n";
    let script = json_script(
        dirs.home(),
        serde_json::json!([
            {"tool_calls": [
                {"name": "apply_diff", "arguments": {"path": "missing.txt", "diff": create}},
                {"name": "apply_diff", "arguments": {"path": "broken.txt", "diff": create}},
                {"name": "apply_diff", "arguments": {"path": "broken-new.txt", "diff": create}}
            ]},
            {"text": "Done."}
        ]),
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::new();
    let caps = ClientCapabilities::new().fs(FileSystemCapabilities::new()
        .read_text_file(true)
        .write_text_file(true));
    let stop = one_prompt(&editor, transport, caps, dirs.cwd(), "go").await;
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);
    let log = editor.log.lock().unwrap();
    // The batch's calls run side by side: in either order.
    let mut writes = log.writes.clone();
    writes.sort();
    assert_eq!(
        writes,
        [
            (
                dirs.project().join("broken-new.txt"),
                "created\n".to_owned()
            ),
            (dirs.project().join("missing.txt"), "created\n".to_owned()),
        ],
        "{log:?}"
    );
    let results = results(&editor.updates());
    assert!(
        results.contains("`broken.txt` unchanged: the editor could not read it"),
        "{results}"
    );
    // What each permission request showed: the new files as created, the
    // unreadable one without a diff.
    let mut shown: Vec<String> = editor
        .asked()
        .iter()
        .flat_map(|asked| asked.tool_call.fields.content.iter().flatten())
        .map(|content| match content {
            ToolCallContent::Diff(diff) => format!(
                "diff of {}, old text {:?}",
                diff.path.file_name().unwrap().to_string_lossy(),
                diff.old_text
            ),
            other => format!("{other:?}"),
        })
        .collect();
    shown.sort();
    assert_eq!(shown.len(), 3, "{shown:#?}");
    assert!(
        shown[0].contains("No diff of `broken.txt`: the editor could not read it"),
        "{shown:#?}"
    );
    assert_eq!(
        shown[1..],
        [
            "diff of broken-new.txt, old text None",
            "diff of missing.txt, old text None"
        ]
    );
}

#[tokio::test]
async fn an_editor_saving_the_agents_write_is_not_an_outside_change() {
    use support::{Call, MockServer, Reply, openai_sse};
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Writing, then building.",
            &[
                Call {
                    id: "call_write",
                    name: "write_file",
                    arguments: serde_json::json!({"path": "made.txt", "content": "made\n"}),
                },
                Call {
                    id: "call_build",
                    name: "run_command",
                    arguments: serde_json::json!({"command": "sleep 2; echo built"}),
                },
            ],
        )),
        Reply::sse(openai_sse("Done.", &[])),
    ])
    .await;
    let dirs = Dirs::new();
    let config = write_file(
        dirs.home(),
        "toolwire.toml",
        "[acp.permissions]\nrun_command = \"allow\"\nwrite_file = \"allow\"\n",
    );
    let (child, transport, _) =
        spawn_with(dirs.home(), &openai_args(&server.url, &dirs.db(), &config));
    let editor = Editor::new().saving();
    let caps = ClientCapabilities::new().fs(FileSystemCapabilities::new()
        .read_text_file(true)
        .write_text_file(true));
    let stop = one_prompt(&editor, transport, caps, dirs.cwd(), "make it").await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("made.txt")).unwrap(),
        "made\n",
        "the editor saved it"
    );
    // While the command slept the watcher saw the save: the agent's own.
    let received = server.received();
    assert_eq!(received.len(), 2);
    let results: Vec<String> = received[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert!(results[1].contains("built"), "{results:?}");
    assert!(
        results.iter().all(|r| !r.contains("file_watcher")),
        "{results:?}"
    );
    drop(child);
}
