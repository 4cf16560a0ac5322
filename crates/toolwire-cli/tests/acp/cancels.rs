//! Prompts that end early: cancels, overlapping prompts, a call cancelled
//! while the model writes it, an agent gone while asking.

use super::*;

/// A prompt sent while one runs is no longer refused (issue 21): it waits
/// for the running one (`prompt_while_running = "queue"`, the default),
/// and a cancel sent before it holds for the running one only.
#[tokio::test]
async fn a_second_prompt_while_one_runs_waits_and_the_cancel_holds() {
    let dirs = Dirs::new();
    let (child, transport) = dirs.scripted("script.yaml", WRITE_TWICE);
    // The first prompt waits on the editor's answer (given after 2 s)
    // while the user cancels and sends another prompt.
    let editor = Editor::answering(Answer::Later("allow_once", 2000));
    let cwd = dirs.cwd();
    let asked = editor.asked.clone();
    let (first, second) = editor
        .run_within(30, transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let first = cx.send_request(prompt_request(&session, "write it"));
            while asked.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cx.send_notification(CancelNotification::new(session.clone()))?;
            let second = cx
                .send_request(prompt_request(&session, "write it again"))
                .block_task()
                .await;
            Ok((first.block_task().await?.stop_reason, second))
        })
        .await;
    let second = second.expect("the second prompt waits and is answered");
    assert_eq!(second.stop_reason, StopReason::EndTurn);
    assert!(
        dirs.project().join("out2.txt").exists(),
        "it ran after the first"
    );
    // The cancel still holds over the answer that came after it.
    assert_eq!(first, StopReason::Cancelled);
    assert!(!dirs.project().join("out.txt").exists());
    drop(child);
}

#[tokio::test]
async fn a_call_cancelled_while_the_model_writes_it_ends_failed() {
    let dirs = Dirs::new();
    let (child, transport) = dirs.scripted(
        "script.yaml",
        r#"
steps:
  - text: "Writing."
    tool_calls: [{name: write_file, arguments: {path: "slow.txt", content: "a long content that streams one byte at a time"}}]
    chunk_size: 8
    delay_ms: 40
"#,
    );
    let (editor, _) = Editor::new().telling_when_running();
    let cwd = dirs.cwd();
    let seen = editor.updates.clone();
    let stop = editor
        .run_within(30, transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let prompt = cx.send_request(prompt_request(&session, "write"));
            // Cancelled once the call is announced, while its arguments
            // still stream.
            let announced = || {
                seen.lock()
                    .unwrap()
                    .iter()
                    .any(|u| matches!(u, SessionUpdate::ToolCall(_)))
            };
            while !announced() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cx.send_notification(CancelNotification::new(session))?;
            Ok(prompt.block_task().await?.stop_reason)
        })
        .await;
    assert_eq!(stop, StopReason::Cancelled);
    let updates = editor.updates();
    let last = last_status(&updates);
    assert_eq!(last, Some(ToolCallStatus::Failed), "{updates:#?}");
    assert!(!dirs.project().join("slow.txt").exists());
    drop(child);
}

#[tokio::test]
async fn an_agent_gone_while_asking_leaves_a_session_that_loads_and_takes_prompts() {
    let dirs = Dirs::new();
    // The editor asks, the agent goes away before the answer.
    let (mut child, transport) = dirs.scripted("script.yaml", WRITE_TWICE);
    let editor = Editor::answering(Answer::Never);
    let cwd = dirs.cwd();
    let asked = editor.asked.clone();
    let id = editor
        .run_within(30, transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let _prompt = cx.send_request(prompt_request(&session, "write it"));
            while asked.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(session)
        })
        .await;
    child.kill().await.unwrap();
    child.wait().await.unwrap();

    // The next agent process: the load shows the call as not run, and a
    // prompt is taken (the script's second turn).
    let (child, transport) = dirs.scripted("script.yaml", WRITE_TWICE);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let seen = editor.updates.clone();
    let (replayed, stop) = editor
        .run_within(30, transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            load_session(&cx, &id, cwd).await?;
            let replayed = seen.lock().unwrap().clone();
            Ok((replayed, prompt(&cx, &id, "write it").await?))
        })
        .await;
    let call = first_tool_call(&replayed).expect("the call is replayed");
    assert_eq!(call.status, ToolCallStatus::Failed, "{call:#?}");
    assert!(
        call.content
            .into_iter()
            .map(content_text)
            .collect::<String>()
            .contains("not answered"),
        "{replayed:#?}"
    );
    assert_eq!(stop, StopReason::EndTurn);
    assert!(!dirs.project().join("out.txt").exists());
    assert!(dirs.project().join("out2.txt").exists());
    drop(child);
}
