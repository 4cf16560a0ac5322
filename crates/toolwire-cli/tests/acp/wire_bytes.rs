//! What an edit and a read cost on the wire, and an edit replayed as it was
//! shown live: a one-line edit of a 200-line file sends the changed region
//! with three lines of context, once (the permission request's diff counts
//! as sent, so the completed update does not repeat it), and a reloaded
//! session shows the diff, not "applied 1 hunk". Prints the figures
//! (`--nocapture`); docs/performance.md has them.

use super::*;

/// 200 lines of 56 bytes (11,200 bytes).
fn two_hundred_lines() -> String {
    (1..=200)
        .map(|i| format!("{i:03} the quick brown fox jumps over the lazy dog, {i:03}\n"))
        .collect()
}

/// The calls' final content, locations and raw output among `updates`
/// (the announce, then each update's fields over it).
fn shown(
    updates: &[SessionUpdate],
) -> (
    Vec<ToolCallContent>,
    Vec<PathBuf>,
    Option<serde_json::Value>,
) {
    let (mut content, mut locations, mut raw) = (Vec::new(), Vec::new(), None);
    for update in updates {
        match update {
            SessionUpdate::ToolCall(call) => {
                content.clone_from(&call.content);
                locations = call.locations.iter().map(|l| l.path.clone()).collect();
                raw.clone_from(&call.raw_output);
            }
            SessionUpdate::ToolCallUpdate(up) => {
                if let Some(c) = &up.fields.content {
                    content.clone_from(c);
                }
                if let Some(l) = &up.fields.locations {
                    locations = l.iter().map(|l| l.path.clone()).collect();
                }
                if let Some(r) = &up.fields.raw_output {
                    raw = Some(r.clone());
                }
            }
            _ => {}
        }
    }
    (content, locations, raw)
}

#[tokio::test]
async fn a_one_line_edit_sends_its_hunk_once_and_replays_as_it_was_shown() {
    let dirs = Dirs::new();
    let original = two_hundred_lines();
    std::fs::write(dirs.project().join("big.txt"), &original).unwrap();
    let script = json_script(
        dirs.home(),
        serde_json::json!([
            {"text": "Editing.", "tool_calls": [{"name": "apply_diff", "arguments": {
                "path": "big.txt",
                "diff": "@@ -99,3 +99,3 @@\n 099 the quick brown fox jumps over the lazy dog, 099\n-100 the quick brown fox jumps over the lazy dog, 100\n+100 the quick brown fox jumps over the lazy cat, 100\n 101 the quick brown fox jumps over the lazy dog, 101\n"
            }}]},
            {"text": "Edited."}
        ]),
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let session = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            assert_eq!(prompt(&cx, &session, "edit").await?, StopReason::EndTurn);
            Ok(session)
        })
        .await;
    let calls: usize = child
        .check
        .updates()
        .iter()
        .filter(|u| u.kind.starts_with("tool_call"))
        .map(|u| u.line_bytes)
        .sum();
    let asked: usize = child
        .check
        .requests()
        .iter()
        .filter(|(method, _)| method == "session/request_permission")
        .map(|(_, bytes)| bytes)
        .sum();
    drop(child);
    eprintln!(
        "a one-line edit of a 200-line file: {} bytes ({calls} of tool call updates, {asked} of permission request)",
        calls + asked
    );
    assert!(calls + asked <= 2_500, "{} bytes", calls + asked);
    let edited = std::fs::read_to_string(dirs.project().join("big.txt")).unwrap();
    assert_eq!(edited, original.replace("lazy dog, 100", "lazy cat, 100"));
    // The request showed the changed line with three lines either side.
    let request = &editor.asked()[0];
    let diff = first_diff(request.tool_call.fields.content.iter().flatten()).expect("a diff");
    let old = diff.old_text.clone().unwrap();
    assert_eq!(old.lines().count(), 7, "{old}");
    assert!(
        old.starts_with("097 ")
            && old.ends_with("103 the quick brown fox jumps over the lazy dog, 103\n"),
        "{old}"
    );
    assert_eq!(diff.new_text, old.replace("lazy dog, 100", "lazy cat, 100"));
    // The completed update did not send the diff again; the result went
    // beside it.
    let live = editor.updates();
    let completed: Vec<_> = live
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up)
                if up.fields.status == Some(ToolCallStatus::Completed) =>
            {
                Some(up.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].fields.content, None, "{completed:?}");
    assert_eq!(
        completed[0].fields.raw_output,
        Some(serde_json::json!("applied 1 hunk to `big.txt`"))
    );
    // What the editor ended up showing: the request's diff, the last
    // locations.
    let (_, live_locations, _) = shown(&live);

    // Another agent process replays the call as it was last shown.
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
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
    let (content, locations, raw) = shown(&editor.updates());
    let replayed = first_diff(content.iter()).expect("the reloaded edit shows its diff");
    assert_eq!(replayed, diff);
    assert_eq!(locations, live_locations);
    assert_eq!(raw, Some(serde_json::json!("applied 1 hunk to `big.txt`")));
}

#[tokio::test]
async fn a_plain_read_stays_small() {
    let dirs = Dirs::new();
    std::fs::write(dirs.project().join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    let script = json_script(
        dirs.home(),
        serde_json::json!([
            {"text": "Reading.", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "It counts to three."}
        ]),
    );
    let (child, transport, bytes) = spawn_with(dirs.home(), &scripted_args(&script, &dirs.db()));
    let editor = Editor::new();
    let stop = one_prompt(
        &editor,
        transport,
        ClientCapabilities::new(),
        dirs.cwd(),
        "What is in notes.txt?",
    )
    .await;
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);
    let total = bytes.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("a plain read: {total} bytes from the agent in all");
    // Issue 21 asks for 2,100 on its own scenario (not met): this one
    // measured 2,349 with the model picker, a title and usage, 3,318 once
    // sessions also offered modes, the mode option and slash commands,
    // and 3,084 with initialize's defaults left out and no descriptions
    // on the modes and the model option. What is left is mostly the
    // ~120-byte envelope of each of the 7 session/update notifications
    // (docs/performance.md). The bound keeps it from growing (with room
    // for a longer temporary directory, which the read location names).
    assert!(total <= 3_150, "{total} bytes");
    assert!(results(&editor.updates()).contains("three"));
}
