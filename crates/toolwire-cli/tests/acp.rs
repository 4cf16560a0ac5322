//! `toolwire acp`, driven as an editor would: the real binary on stdio, the
//! client side of the `agent-client-protocol` crate, the scripted provider
//! and a real SQLite file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, InitializeRequest, LoadSessionRequest, NewSessionRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, SessionUpdate,
    StopReason, TextContent, ToolCallContent, ToolCallStatus, ToolKind,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use tokio::process::Child;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

const LIST_THEN_ANSWER: &str = r#"
steps:
  - text: "Looking around."
    tool_calls: [{name: list_dir, arguments: {path: "."}}]
  - text: "There is one file."
"#;

fn text_of(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        other => format!("{other:?}"),
    }
}

type Transport = ByteStreams<
    tokio_util::compat::Compat<tokio::process::ChildStdin>,
    tokio_util::compat::Compat<tokio::process::ChildStdout>,
>;

/// `toolwire acp` with the scripted provider, its stdio as an ACP transport.
fn spawn_agent(home: &Path, script: &Path, db: &str) -> (Child, Transport) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolwire"));
    cmd.current_dir(home).env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("TOOLWIRE_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .args(["acp", "--provider", "scripted", "--script"])
        .arg(script)
        .args(["--db", db])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = ByteStreams::new(
        child.stdin.take().unwrap().compat_write(),
        child.stdout.take().unwrap().compat(),
    );
    (child, transport)
}

#[tokio::test]
async fn a_prompt_streams_text_and_the_tool_call_life_then_ends_the_turn() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("hello.txt"), "hi\n").unwrap();
    let script = home.path().join("script.yaml");
    std::fs::write(&script, LIST_THEN_ANSWER).unwrap();
    let db = format!("sqlite://{}", home.path().join("t.db").display());

    let (child, transport) = spawn_agent(home.path(), &script, &db);

    let updates: Arc<Mutex<Vec<SessionUpdate>>> = Arc::default();
    let seen = updates.clone();
    let cwd = project.path().to_path_buf();
    let run = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                seen.lock().unwrap().push(n.update);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            let init = cx
                .send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            assert_eq!(init.protocol_version, ProtocolVersion::V1);
            assert!(init.agent_capabilities.load_session);
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let answer = cx
                .send_request(PromptRequest::new(
                    session.session_id.clone(),
                    vec![ContentBlock::Text(TextContent::new("what is here?"))],
                ))
                .block_task()
                .await?;
            Ok((answer.stop_reason, session.session_id))
        });
    let (stop, session_id) = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::EndTurn);

    let updates = updates.lock().unwrap().clone();
    let text: String = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(chunk) => Some(text_of(&chunk.content)),
            _ => None,
        })
        .collect();
    assert_eq!(text, "Looking around.There is one file.", "{updates:#?}");

    let call = updates
        .iter()
        .find_map(|u| match u {
            SessionUpdate::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .expect("a tool_call");
    assert_eq!(call.title, "list_dir");
    assert_eq!(call.kind, ToolKind::Other);
    assert_eq!(call.status, ToolCallStatus::Pending);

    let statuses: Vec<ToolCallStatus> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) if up.tool_call_id == call.tool_call_id => {
                up.fields.status
            }
            _ => None,
        })
        .collect();
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
        .map(|c| match c {
            ToolCallContent::Content(c) => text_of(&c.content),
            other => format!("{other:?}"),
        })
        .collect();
    assert!(result.contains("hello.txt"), "{result}");
    drop(child);

    // An editor restarted: a new agent process loads the session from the
    // database and replays it before answering.
    let (child, transport) = spawn_agent(home.path(), &script, &db);
    let replayed: Arc<Mutex<Vec<SessionUpdate>>> = Arc::default();
    let seen = replayed.clone();
    let cwd = project.path().to_path_buf();
    let run = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                seen.lock().unwrap().push(n.update);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            cx.send_request(LoadSessionRequest::new(session_id, cwd))
                .block_task()
                .await?;
            Ok(())
        });
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent loaded the session in time")
        .expect("session/load succeeded");
    let replayed = replayed.lock().unwrap().clone();
    assert!(
        matches!(&replayed[0], SessionUpdate::UserMessageChunk(c) if text_of(&c.content) == "what is here?"),
        "{replayed:#?}"
    );
    let call = replayed
        .iter()
        .find_map(|u| match u {
            SessionUpdate::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .expect("the tool call replayed");
    assert_eq!(call.title, "list_dir");
    assert_eq!(call.status, ToolCallStatus::Completed);
    assert!(format!("{:?}", call.content).contains("hello.txt"));
    let last = replayed.last().unwrap();
    assert!(
        matches!(last, SessionUpdate::AgentMessageChunk(c) if text_of(&c.content) == "There is one file."),
        "{replayed:#?}"
    );
    drop(child);
}

#[tokio::test]
async fn session_cancel_ends_the_prompt_with_cancelled() {
    let home = tempfile::tempdir().unwrap();
    let script = home.path().join("script.yaml");
    std::fs::write(
        &script,
        "steps:\n  - text: \"a long answer that streams one byte at a time\"\n    chunk_size: 1\n    delay_ms: 100\n",
    )
    .unwrap();
    let db = format!("sqlite://{}", home.path().join("t.db").display());
    let (child, transport) = spawn_agent(home.path(), &script, &db);
    let cwd = home.path().to_path_buf();
    let run = Client
        .v1()
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let prompt = cx.send_request(PromptRequest::new(
                session.session_id.clone(),
                vec![ContentBlock::Text(TextContent::new("talk"))],
            ));
            tokio::time::sleep(Duration::from_millis(500)).await;
            cx.send_notification(CancelNotification::new(session.session_id))?;
            Ok(prompt.block_task().await?.stop_reason)
        });
    let stop = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the cancelled prompt was answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::Cancelled);
    drop(child);
}

/// Two prompts, each of which has the model write a file, then answer.
const WRITE_TWICE: &str = r#"
turns:
  - steps:
      - text: "Writing."
        tool_calls: [{name: write_file, arguments: {path: "out.txt", content: "hello\n"}}]
      - text: "Done."
  - steps:
      - text: "Writing again."
        tool_calls: [{name: write_file, arguments: {path: "out2.txt", content: "again\n"}}]
      - text: "Done again."
"#;

/// What a client that answers every permission request with `answer` saw
/// over `prompts` prompts of one session.
struct Asked {
    requests: Vec<RequestPermissionRequest>,
    stops: Vec<StopReason>,
    updates: Vec<SessionUpdate>,
    project: tempfile::TempDir,
}

async fn prompts_answered_with(answer: &'static str, prompts: usize) -> Asked {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let script = home.path().join("script.yaml");
    std::fs::write(&script, WRITE_TWICE).unwrap();
    let db = format!("sqlite://{}", home.path().join("t.db").display());
    let (child, transport) = spawn_agent(home.path(), &script, &db);

    let requests: Arc<Mutex<Vec<RequestPermissionRequest>>> = Arc::default();
    let updates: Arc<Mutex<Vec<SessionUpdate>>> = Arc::default();
    let (asked, seen) = (requests.clone(), updates.clone());
    let cwd = project.path().to_path_buf();
    let run = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                seen.lock().unwrap().push(n.update);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                asked.lock().unwrap().push(request);
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(answer)),
                ))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let mut stops = Vec::new();
            for _ in 0..prompts {
                let answer = cx
                    .send_request(PromptRequest::new(
                        session.session_id.clone(),
                        vec![ContentBlock::Text(TextContent::new("write it"))],
                    ))
                    .block_task()
                    .await?;
                stops.push(answer.stop_reason);
            }
            Ok(stops)
        });
    let stops = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    drop(child);
    let requests = requests.lock().unwrap().clone();
    let updates = updates.lock().unwrap().clone();
    Asked {
        requests,
        stops,
        updates,
        project,
    }
}

/// The text of the results of the session's tool calls.
fn results(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) => up.fields.content.clone(),
            _ => None,
        })
        .flatten()
        .map(|c| match c {
            ToolCallContent::Content(c) => text_of(&c.content),
            other => format!("{other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_write_asks_for_permission_and_runs_when_allowed_once() {
    let asked = prompts_answered_with("allow_once", 1).await;
    assert_eq!(asked.stops, [StopReason::EndTurn]);
    assert_eq!(asked.requests.len(), 1, "{:#?}", asked.requests);
    let request = &asked.requests[0];
    assert_eq!(
        request.tool_call.fields.title.as_deref(),
        Some("write_file")
    );
    assert_eq!(request.tool_call.fields.kind, Some(ToolKind::Edit));
    assert_eq!(
        request.tool_call.fields.raw_input,
        Some(serde_json::json!({"path": "out.txt", "content": "hello\n"}))
    );
    let diff = request
        .tool_call
        .fields
        .content
        .iter()
        .flatten()
        .find_map(|c| match c {
            ToolCallContent::Diff(d) => Some(d.clone()),
            _ => None,
        })
        .expect("a diff");
    assert_eq!(diff.new_text, "hello\n");
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
