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

#[path = "support/acp_schema.rs"]
mod acp_schema;

/// The client's ends of the pipes to the agent, through the schema check.
type Transport = ByteStreams<
    tokio_util::compat::Compat<tokio::io::DuplexStream>,
    tokio_util::compat::Compat<tokio::io::DuplexStream>,
>;

/// The agent's process, and the schema check of everything it wrote: when
/// dropped (or [`AgentProcess::assert_valid`]) it fails the test if the
/// agent sent a message ACP's schema rejects, naming the method and the
/// error.
struct AgentProcess {
    child: Child,
    check: acp_schema::WireCheck,
}

impl AgentProcess {
    fn assert_valid(&self) {
        self.check.assert_valid();
        assert!(self.check.checked() > 0, "the agent's lines were checked");
    }
}

impl std::ops::Deref for AgentProcess {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for AgentProcess {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.assert_valid();
        }
    }
}

/// The client's transport to `child`, every line the agent writes on
/// `stdout` checked against ACP's schema before the client reads it.
fn checked_transport<R>(mut child: Child, stdout: R) -> (AgentProcess, Transport)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let (to_agent, from_agent, check) = acp_schema::tee(child.stdin.take().unwrap(), stdout);
    let transport = ByteStreams::new(to_agent.compat_write(), from_agent.compat());
    (AgentProcess { child, check }, transport)
}

/// `toolwire acp` with the scripted provider, its stdio as an ACP transport.
fn spawn_agent(home: &Path, script: &Path, db: &str) -> (AgentProcess, Transport) {
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
    let stdout = child.stdout.take().unwrap();
    checked_transport(child, stdout)
}

#[test]
fn the_schema_check_names_the_method_and_the_error() {
    let check = acp_schema::WireCheck::default();
    check.client_line(
        br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#,
    );
    check.agent_line(br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}"#);
    check.agent_line(
        br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"in_progress"}}}"#,
    );
    assert_eq!(
        check.problems(),
        Vec::<String>::new(),
        "valid messages pass"
    );

    check.client_line(
        br#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#,
    );
    check.agent_line(br#"{"jsonrpc":"2.0","id":1,"result":{"sessionID":"s"}}"#);
    check.agent_line(
        br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","status":"running"}}}"#,
    );
    check.client_line(br#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{}}"#);
    check.agent_line(br#"{"jsonrpc":"2.0","id":2,"error":{"message":"no code"}}"#);
    check.agent_line(br#"{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"s"}}"#);
    check.agent_line(br#"{"jsonrpc":"2.0","method":"session/nonsense","params":{}}"#);
    let problems = check.problems();
    assert_eq!(problems.len(), 5, "{problems:#?}");
    assert!(
        problems[0].contains("the response to session/new"),
        "{}",
        problems[0]
    );
    assert!(
        problems[0].contains("NewSessionResponse"),
        "{}",
        problems[0]
    );
    assert!(problems[1].contains("session/update"), "{}", problems[1]);
    assert!(
        problems[1].contains("SessionNotification"),
        "{}",
        problems[1]
    );
    assert!(
        problems[2].contains("the response to session/prompt"),
        "{}",
        problems[2]
    );
    assert!(problems[2].contains("Error at"), "{}", problems[2]);
    assert!(
        problems[3].contains("RequestPermissionRequest"),
        "{}",
        problems[3]
    );
    assert!(
        problems[4].contains("no notification that the client handles"),
        "{}",
        problems[4]
    );
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
            let meta = init.agent_capabilities.meta.clone().unwrap_or_default();
            assert_eq!(meta["toolwire"]["notify"], "_toolwire/notify");
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
    // Announced with what is known (the name), then the title follows
    // the arguments.
    assert_eq!(call.title, "List .");
    assert_eq!(call.kind, ToolKind::Other);
    assert_eq!(call.status, ToolCallStatus::Pending);
    assert_eq!(
        call.locations.first().map(|l| l.path.clone()),
        Some(project.path().to_path_buf())
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
    assert_eq!(call.title, "List .");
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
        Some("Edit out.txt")
    );
    let location = &request.tool_call.fields.locations.as_ref().unwrap()[0];
    assert_eq!(location.path, asked.project.path().join("out.txt"));
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
    let last_status = asked
        .updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) => up.fields.status,
            _ => None,
        })
        .next_back();
    assert_eq!(last_status, Some(ToolCallStatus::Failed), "it did not run");
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

// ---------------------------------------------------------------------
// A real HTTP model (the engine tests' mock OpenAI server), configuration
// files, notifications and streamed command output.

#[path = "../../toolwire-engine/tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

use agent_client_protocol::UntypedMessage;
use agent_client_protocol::v1::schema::{ClientCapabilities, FileSystemCapabilities};

/// Counts the bytes the agent writes (everything the client receives).
struct Counting<R> {
    inner: R,
    bytes: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counting<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.bytes
            .fetch_add(read as u64, std::sync::atomic::Ordering::Relaxed);
        poll
    }
}

/// `toolwire acp` with `args` (after `acp`), its output counted.
fn spawn_with(
    home: &Path,
    args: &[String],
) -> (AgentProcess, Transport, Arc<std::sync::atomic::AtomicU64>) {
    spawn_logging(home, args, None)
}

/// [`spawn_with`], its log (at `info` for toolwire_acp) in `log` when given.
fn spawn_logging(
    home: &Path,
    args: &[String],
    log: Option<&Path>,
) -> (AgentProcess, Transport, Arc<std::sync::atomic::AtomicU64>) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolwire"));
    cmd.current_dir(home).env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("TOOLWIRE_") {
            cmd.env_remove(k);
        }
    }
    let stderr = match log {
        Some(path) => {
            cmd.env("RUST_LOG", "warn,toolwire_acp=info");
            Stdio::from(std::fs::File::create(path).unwrap())
        }
        None => Stdio::inherit(),
    };
    let mut child = cmd
        .arg("acp")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stdout = Counting {
        inner: child.stdout.take().unwrap(),
        bytes: bytes.clone(),
    };
    let (child, transport) = checked_transport(child, stdout);
    (child, transport, bytes)
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn a_notification_from_the_client_reaches_the_model_and_shows_as_a_thought() {
    use support::{Call, MockServer, Reply, openai_sse};
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Deploying.",
            &[Call {
                id: "call_slow",
                name: "run_command",
                arguments: serde_json::json!({"command": "sleep 1; echo deployed"}),
            }],
        )),
        Reply::sse(openai_sse("Done.", &[])),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    // Beside the config file, out of the session's directory.
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("toolwire.toml");
    // run_command is allowed by configuration: nobody is asked.
    std::fs::write(&config, "[acp.permissions]\nrun_command = \"allow\"\n").unwrap();
    let db = format!("sqlite://{}", data.path().join("t.db").display());
    let (child, transport, _) = spawn_with(
        home.path(),
        &strings(&[
            "--provider",
            "openai",
            "--model",
            "gpt-test",
            "--base-url",
            &server.url,
            "--db",
            &db,
            "--config",
            config.to_str().unwrap(),
        ]),
    );

    let updates: Arc<Mutex<Vec<SessionUpdate>>> = Arc::default();
    let asked: Arc<Mutex<u32>> = Arc::default();
    let (running_tx, mut running_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (seen, asked_count) = (updates.clone(), asked.clone());
    let cwd = project.path().to_path_buf();
    let run = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                if let SessionUpdate::ToolCallUpdate(up) = &n.update
                    && up.fields.status == Some(ToolCallStatus::InProgress)
                {
                    let _ = running_tx.send(());
                }
                seen.lock().unwrap().push(n.update);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |_request: RequestPermissionRequest, responder, _cx| {
                *asked_count.lock().unwrap() += 1;
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                        "allow_once",
                    )),
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
            let prompt = cx.send_request(PromptRequest::new(
                session.session_id.clone(),
                vec![ContentBlock::Text(TextContent::new("deploy"))],
            ));
            running_rx.recv().await;
            cx.send_notification(UntypedMessage::new(
                "_toolwire/notify",
                serde_json::json!({
                    "sessionId": session.session_id.0,
                    "source": "ci",
                    "text": "deploy finished <ok>",
                    "priority": "high"
                }),
            )?)?;
            Ok(prompt.block_task().await?.stop_reason)
        });
    let stop = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(*asked.lock().unwrap(), 0, "allowed by the config file");

    // The model's next request carries the block after the tool's output.
    let received = server.received();
    assert_eq!(received.len(), 2);
    let tool = received[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    let content = tool["content"].as_str().unwrap();
    assert!(content.contains("deployed"), "{content}");
    assert!(
        content.contains(
            "<notifications count=\"1\">\n- [ci] deploy finished &lt;ok&gt;\n</notifications>"
        ),
        "{content}"
    );

    // The editor saw it as a thought, after the call's result.
    let updates = updates.lock().unwrap().clone();
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
    let call = updates
        .iter()
        .find_map(|u| match u {
            SessionUpdate::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .unwrap();
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
async fn a_change_in_the_sessions_cwd_reaches_its_model_and_nothing_else_does() {
    use support::{Call, MockServer, Reply, openai_sse};
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Building.",
            &[Call {
                id: "call_slow",
                name: "run_command",
                arguments: serde_json::json!({"command": "sleep 2; echo built"}),
            }],
        )),
        Reply::sse(openai_sse("Done.", &[])),
    ])
    .await;
    // The process's directory, where the database lives too; the session's
    // cwd is elsewhere.
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let config = home.path().join("toolwire.toml");
    std::fs::write(&config, "[acp.permissions]\nrun_command = \"allow\"\n").unwrap();
    // The database in the session's cwd: its own writes are not changes.
    let db = format!("sqlite://{}", project.path().join("t.db").display());
    let (child, transport, _) = spawn_with(
        home.path(),
        &strings(&[
            "--provider",
            "openai",
            "--model",
            "gpt-test",
            "--base-url",
            &server.url,
            "--db",
            &db,
            "--config",
            config.to_str().unwrap(),
        ]),
    );
    let (running_tx, mut running_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let cwd = project.path().to_path_buf();
    let (inside, outside) = (
        project.path().join("changed.txt"),
        home.path().join("outside.txt"),
    );
    let run = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                if let SessionUpdate::ToolCallUpdate(up) = &n.update
                    && up.fields.status == Some(ToolCallStatus::InProgress)
                {
                    let _ = running_tx.send(());
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
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
                vec![ContentBlock::Text(TextContent::new("build"))],
            ));
            // While the command sleeps: a change in the session's cwd, and
            // one in the process's directory.
            running_rx.recv().await;
            std::fs::write(&inside, "new\n").unwrap();
            std::fs::write(&outside, "not the session's\n").unwrap();
            Ok(prompt.block_task().await?.stop_reason)
        });
    let stop = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::EndTurn);

    // The model's next request carries the session's change after the
    // tool's output, and nothing else.
    let received = server.received();
    assert_eq!(received.len(), 2);
    let tool = received[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    let content = tool["content"].as_str().unwrap();
    assert!(content.contains("built"), "{content}");
    assert!(content.contains("<notifications"), "{content}");
    assert!(content.contains("changed.txt"), "{content}");
    assert!(!content.contains("outside.txt"), "{content}");
    assert!(!content.contains("t.db"), "the store's files: {content}");
    drop(child);
}

/// 35,000 lines of 80 bytes.
const LINES: usize = 35_000;
const PRINT_LINES: &str = "awk 'BEGIN { for (i = 0; i < 35000; i++) printf \"%079d\\n\", i }'";

/// What a client saw of one `run_command`.
struct Streamed {
    updates: Vec<agent_client_protocol::v1::schema::ToolCallUpdate>,
    /// Every byte the agent wrote.
    bytes: u64,
    /// The agent's log.
    log: String,
    /// Every `session/update` on the wire, sized.
    sizes: Vec<acp_schema::UpdateSize>,
}

/// Runs [`PRINT_LINES`] in a session whose client advertises `caps`.
async fn stream_command(caps: ClientCapabilities) -> Streamed {
    stream(caps, PRINT_LINES, "").await
}

/// Runs `command` in a session whose client advertises `caps`, with
/// `config` added to the config file.
async fn stream(caps: ClientCapabilities, command: &str, config_extra: &str) -> Streamed {
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let script = data.path().join("script.json");
    let steps = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
        {"text": "Printed."}
    ]});
    std::fs::write(&script, steps.to_string()).unwrap();
    let config = data.path().join("toolwire.toml");
    std::fs::write(
        &config,
        format!("[acp]\n{config_extra}\n[acp.permissions]\nrun_command = \"allow\"\n"),
    )
    .unwrap();
    let db = format!("sqlite://{}", data.path().join("t.db").display());
    let log = data.path().join("agent.log");
    let (mut child, transport, bytes) = spawn_logging(
        home.path(),
        &strings(&[
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--db",
            &db,
            "--config",
            config.to_str().unwrap(),
        ]),
        Some(&log),
    );
    let updates: Arc<Mutex<Vec<agent_client_protocol::v1::schema::ToolCallUpdate>>> =
        Arc::default();
    let seen = updates.clone();
    let cwd = project.path().to_path_buf();
    let run = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                if let SessionUpdate::ToolCallUpdate(up) = n.update {
                    seen.lock().unwrap().push(up);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1).client_capabilities(caps))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let answer = cx
                .send_request(PromptRequest::new(
                    session.session_id,
                    vec![ContentBlock::Text(TextContent::new("print"))],
                ))
                .block_task()
                .await?;
            Ok(answer.stop_reason)
        });
    let stop = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::EndTurn);
    // The connection is closed: the agent logs its metrics and exits.
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the agent exits when its stdin closes")
        .unwrap();
    let updates = updates.lock().unwrap().clone();
    Streamed {
        updates,
        bytes: bytes.load(std::sync::atomic::Ordering::Relaxed),
        log: std::fs::read_to_string(&log).unwrap(),
        sizes: child.check.updates(),
    }
}

fn expected_output() -> String {
    (0..LINES).map(|i| format!("{i:079}\n")).collect()
}

#[tokio::test]
async fn command_output_is_appended_for_clients_that_show_terminal_output() {
    let mut meta = serde_json::Map::new();
    meta.insert("terminal_output".into(), serde_json::Value::Bool(true));
    let streamed = stream_command(ClientCapabilities::new().meta(meta)).await;
    let output: String = streamed
        .updates
        .iter()
        .filter_map(|up| up.meta.as_ref()?.get("terminal_output"))
        .map(|o| o["data"].as_str().unwrap().to_owned())
        .collect();
    let expected = expected_output();
    assert_eq!(output.len(), expected.len());
    assert!(output == expected, "every byte once, in order");
    let exit = streamed
        .updates
        .iter()
        .find_map(|up| up.meta.as_ref()?.get("terminal_exit").cloned())
        .expect("a terminal_exit");
    assert_eq!(exit["exit_code"], 0);
    let last = streamed.updates.last().unwrap();
    assert_eq!(last.fields.status, Some(ToolCallStatus::Completed));
    eprintln!(
        "appended: {} bytes on the wire for {} bytes of output ({} updates)",
        streamed.bytes,
        expected.len(),
        streamed.updates.len()
    );
    assert!(
        streamed.bytes as f64 <= 1.3 * expected.len() as f64,
        "{} bytes",
        streamed.bytes
    );
    // The session's metrics are logged when the connection ends.
    assert!(
        streamed.log.contains("updates:") && streamed.log.contains("bytes sent against"),
        "{}",
        streamed.log
    );
}

#[tokio::test]
async fn a_call_past_its_byte_budget_sends_output_once_a_second() {
    // 20 bursts of 64 KiB over about 2 s.
    let command = "for i in $(seq 20); do awk 'BEGIN { for (i = 0; i < 820; i++) printf \"%079d\\n\", i }'; sleep 0.1; done";
    let streamed = stream(
        ClientCapabilities::new(),
        command,
        "call_byte_budget = 100000",
    )
    .await;
    let with_content = streamed
        .updates
        .iter()
        .filter(|up| up.fields.content.is_some())
        .count();
    eprintln!(
        "over budget: {} bytes on the wire, {} updates with content",
        streamed.bytes, with_content
    );
    // At 20 updates a second it would be ~40; past 100 kB, one a second.
    assert!(with_content >= 2, "it streamed");
    assert!(with_content <= 8, "{with_content} updates with content");
    assert!(streamed.bytes < 1_000_000, "{} bytes", streamed.bytes);
}

#[tokio::test]
async fn command_output_is_a_bounded_tail_for_other_clients() {
    let streamed = stream_command(ClientCapabilities::new()).await;
    let expected = expected_output();
    assert!(
        streamed.updates.iter().all(|up| up.meta.is_none()),
        "no _meta for a client that did not ask"
    );
    let texts: Vec<String> = streamed
        .updates
        .iter()
        .filter_map(|up| up.fields.content.clone())
        .filter_map(|c| match c.last()? {
            ToolCallContent::Content(c) => Some(text_of(&c.content)),
            _ => None,
        })
        .collect();
    // A command this fast may finish inside one coalescing window: its
    // output then comes with the result (the budget test sees it stream).
    assert!(!texts.is_empty());
    for text in &texts {
        assert!(text.len() <= 65 * 1024 + 200, "{} bytes", text.len());
    }
    let last = texts.last().unwrap();
    assert!(last.contains(&format!("{:079}\n", LINES - 1)), "the tail");
    // While it ran, the tracker's tail; at the end, the tool's result (its
    // own tail): both say what they left out.
    assert!(
        last.contains("truncated") || last.contains("cut"),
        "says it cut"
    );
    eprintln!(
        "replaced: {} bytes on the wire for {} bytes of output ({} updates)",
        streamed.bytes,
        expected.len(),
        streamed.updates.len()
    );
    assert!(
        streamed.bytes <= 50 * 1024 * 1024,
        "{} bytes",
        streamed.bytes
    );
}

/// What the editor was asked to do for the agent.
#[derive(Default, Debug)]
struct EditorLog {
    reads: Vec<std::path::PathBuf>,
    writes: Vec<(std::path::PathBuf, String)>,
    terminals: Vec<(String, Vec<String>, Option<std::path::PathBuf>)>,
    released: Vec<String>,
}

#[tokio::test]
async fn files_and_commands_go_through_an_editor_that_offers_them() {
    use agent_client_protocol::v1::schema::{
        CreateTerminalRequest, CreateTerminalResponse, ReadTextFileRequest, ReadTextFileResponse,
        ReleaseTerminalRequest, ReleaseTerminalResponse, TerminalExitStatus, TerminalOutputRequest,
        TerminalOutputResponse, WaitForTerminalExitRequest, WaitForTerminalExitResponse,
        WriteTextFileRequest, WriteTextFileResponse,
    };
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("notes.txt"), "on disk\n").unwrap();
    let script = data.path().join("script.json");
    let steps = serde_json::json!({"steps": [
        {"tool_calls": [
            {"name": "read_file", "arguments": {"path": "notes.txt"}},
            {"name": "write_file", "arguments": {"path": "notes.txt", "content": "rewritten\n"}},
            {"name": "apply_diff", "arguments": {"path": "notes.txt", "diff": "@@ -1 +1 @@\n-unsaved buffer\n+patched\n"}},
            {"name": "run_command", "arguments": {"command": "make"}}
        ]},
        {"text": "Done."}
    ]});
    std::fs::write(&script, steps.to_string()).unwrap();
    let db = format!("sqlite://{}", data.path().join("t.db").display());
    let (child, transport, _) = spawn_with(
        home.path(),
        &strings(&[
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--db",
            &db,
        ]),
    );

    let log: Arc<Mutex<EditorLog>> = Arc::default();
    let updates: Arc<Mutex<Vec<SessionUpdate>>> = Arc::default();
    let asked: Arc<Mutex<Vec<RequestPermissionRequest>>> = Arc::default();
    let (l1, l2, l3, l4) = (log.clone(), log.clone(), log.clone(), log.clone());
    let (seen, asked_log) = (updates.clone(), asked.clone());
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
                asked_log.lock().unwrap().push(request);
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                        "allow_once",
                    )),
                ))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReadTextFileRequest, responder, _cx| {
                l1.lock().unwrap().reads.push(request.path);
                responder.respond(ReadTextFileResponse::new("unsaved buffer\n"))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WriteTextFileRequest, responder, _cx| {
                l2.lock()
                    .unwrap()
                    .writes
                    .push((request.path, request.content));
                responder.respond(WriteTextFileResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CreateTerminalRequest, responder, _cx| {
                l3.lock()
                    .unwrap()
                    .terminals
                    .push((request.command, request.args, request.cwd));
                responder.respond(CreateTerminalResponse::new("term-1"))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_request: WaitForTerminalExitRequest, responder, _cx| {
                responder.respond(WaitForTerminalExitResponse::new(
                    TerminalExitStatus::new().exit_code(0),
                ))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_request: TerminalOutputRequest, responder, _cx| {
                responder.respond(
                    TerminalOutputResponse::new("built in the editor\n", false)
                        .exit_status(TerminalExitStatus::new().exit_code(0)),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReleaseTerminalRequest, responder, _cx| {
                l4.lock()
                    .unwrap()
                    .released
                    .push(request.terminal_id.0.to_string());
                responder.respond(ReleaseTerminalResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            let caps = ClientCapabilities::new()
                .fs(FileSystemCapabilities::new()
                    .read_text_file(true)
                    .write_text_file(true))
                .terminal(true);
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1).client_capabilities(caps))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let answer = cx
                .send_request(PromptRequest::new(
                    session.session_id,
                    vec![ContentBlock::Text(TextContent::new("go"))],
                ))
                .block_task()
                .await?;
            Ok(answer.stop_reason)
        });
    let stop = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);

    let notes = project.path().join("notes.txt");
    let log = log.lock().unwrap();
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
            Some(project.path().to_path_buf())
        )]
    );
    assert_eq!(log.released, ["term-1"]);

    // The write was asked about with the editor's text as the old one.
    let asked = asked.lock().unwrap();
    let diff = asked
        .iter()
        .flat_map(|r| r.tool_call.fields.content.iter().flatten())
        .find_map(|c| match c {
            ToolCallContent::Diff(d) => Some(d.clone()),
            _ => None,
        })
        .expect("a diff");
    assert_eq!(diff.old_text.as_deref(), Some("unsaved buffer\n"));

    let updates = updates.lock().unwrap().clone();
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
}

#[tokio::test]
async fn a_cancel_while_the_editor_asks_ends_the_prompt_and_runs_nothing() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let script = home.path().join("script.yaml");
    std::fs::write(&script, WRITE_TWICE).unwrap();
    let db = format!("sqlite://{}", home.path().join("t.db").display());
    let (child, transport) = spawn_agent(home.path(), &script, &db);
    let cwd = project.path().to_path_buf();
    let run = Client
        .v1()
        .on_receive_request(
            // The user presses stop while the question is open: the client
            // cancels the session and answers the question `cancelled`, as
            // ACP asks.
            async move |request: RequestPermissionRequest, responder, cx| {
                cx.send_notification(CancelNotification::new(request.session_id))?;
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Cancelled,
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
            let first = cx
                .send_request(PromptRequest::new(
                    session.session_id.clone(),
                    vec![ContentBlock::Text(TextContent::new("write it"))],
                ))
                .block_task()
                .await?
                .stop_reason;
            Ok(first)
        });
    let stop = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the cancelled prompt was answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::Cancelled);
    assert!(!project.path().join("out.txt").exists());
    drop(child);
}

#[tokio::test]
async fn a_loaded_session_keeps_its_always_answers() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let script = home.path().join("script.yaml");
    std::fs::write(&script, WRITE_TWICE).unwrap();
    let db = format!("sqlite://{}", home.path().join("t.db").display());
    let asked: Arc<Mutex<u32>> = Arc::default();

    // Run one prompt in a new (`None`) or loaded session; returns its id.
    let prompt_once = |load: Option<agent_client_protocol::v1::schema::SessionId>| {
        let (child, transport) = spawn_agent(home.path(), &script, &db);
        let count = asked.clone();
        let cwd = project.path().to_path_buf();
        let run = Client
            .v1()
            .on_receive_request(
                async move |_request: RequestPermissionRequest, responder, _cx| {
                    *count.lock().unwrap() += 1;
                    responder.respond(RequestPermissionResponse::new(
                        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                            "allow_always",
                        )),
                    ))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                    .block_task()
                    .await?;
                let id = match load {
                    Some(id) => {
                        cx.send_request(LoadSessionRequest::new(id.clone(), cwd))
                            .block_task()
                            .await?;
                        id
                    }
                    None => {
                        cx.send_request(NewSessionRequest::new(cwd))
                            .block_task()
                            .await?
                            .session_id
                    }
                };
                let stop = cx
                    .send_request(PromptRequest::new(
                        id.clone(),
                        vec![ContentBlock::Text(TextContent::new("write it"))],
                    ))
                    .block_task()
                    .await?
                    .stop_reason;
                assert_eq!(stop, StopReason::EndTurn);
                Ok(id)
            });
        async move {
            let id = tokio::time::timeout(Duration::from_secs(60), run)
                .await
                .expect("the agent answered in time")
                .expect("the ACP exchange succeeded");
            drop(child);
            id
        }
    };
    let id = prompt_once(None).await;
    assert_eq!(*asked.lock().unwrap(), 1);
    // Another agent process (an editor restart): the stored answer holds.
    prompt_once(Some(id)).await;
    assert_eq!(*asked.lock().unwrap(), 1, "not asked again after the load");
    // The script's second turn (the conversation's second prompt).
    assert!(project.path().join("out2.txt").exists());
}

#[tokio::test]
async fn a_client_can_ask_for_complete_tool_call_objects() {
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
            let mut meta = serde_json::Map::new();
            meta.insert(
                "toolwire".into(),
                serde_json::json!({"complete_tool_calls": true}),
            );
            cx.send_request(
                InitializeRequest::new(ProtocolVersion::V1)
                    .client_capabilities(ClientCapabilities::new().meta(meta)),
            )
            .block_task()
            .await?;
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            cx.send_request(PromptRequest::new(
                session.session_id,
                vec![ContentBlock::Text(TextContent::new("what is here?"))],
            ))
            .block_task()
            .await?;
            Ok(())
        });
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    drop(child);
    let updates = updates.lock().unwrap().clone();
    let calls: Vec<_> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) => Some(up.fields.clone()),
            _ => None,
        })
        .collect();
    assert!(!calls.is_empty());
    for fields in &calls {
        assert!(
            fields.title.is_some()
                && fields.kind.is_some()
                && fields.status.is_some()
                && fields.content.is_some()
                && fields.locations.is_some(),
            "a complete object: {fields:?}"
        );
    }
}

/// The benchmark's slow case through the whole agent: 35,000 lines of 80
/// bytes over 35 s, both modes. Slow, so run by hand:
/// `cargo test -p toolwire-cli --test acp -- --ignored --nocapture slow_35000`.
#[tokio::test]
#[ignore]
async fn slow_35000_lines_stay_bounded_in_both_modes() {
    // 50 lines every 50 ms: output that never pauses long enough for the
    // rate limit to rest (the benchmark's worst case).
    let command = "for i in $(seq 700); do awk 'BEGIN { for (i = 0; i < 50; i++) printf \"%079d\\n\", i }'; sleep 0.05; done";
    let mut meta = serde_json::Map::new();
    meta.insert("terminal_output".into(), serde_json::Value::Bool(true));
    let appended = stream(ClientCapabilities::new().meta(meta), command, "").await;
    let replaced = stream(ClientCapabilities::new(), command, "").await;
    eprintln!(
        "35 s, 2,800,000 bytes of output: appended {} bytes ({} updates), replaced {} bytes ({} updates)",
        appended.bytes,
        appended.updates.len(),
        replaced.bytes,
        replaced.updates.len()
    );
    assert!(appended.bytes as f64 <= 1.3 * 2_800_000.0);
    assert!(replaced.bytes <= 50 * 1024 * 1024);
}

#[tokio::test]
async fn an_apply_diff_is_asked_about_with_the_edit_it_makes() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("a.txt"), "one\ntwo\n").unwrap();
    let script = home.path().join("script.json");
    let steps = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "apply_diff", "arguments": {
            "path": "a.txt",
            "diff": "@@ -1,2 +1,2 @@\n one\n-two\n+three\n"
        }}]},
        {"text": "Edited."}
    ]});
    std::fs::write(&script, steps.to_string()).unwrap();
    let db = format!("sqlite://{}", home.path().join("t.db").display());
    let (child, transport) = spawn_agent(home.path(), &script, &db);
    let asked: Arc<Mutex<Vec<RequestPermissionRequest>>> = Arc::default();
    let log = asked.clone();
    let cwd = project.path().to_path_buf();
    let run = Client
        .v1()
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                log.lock().unwrap().push(request);
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                        "allow_once",
                    )),
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
            let answer = cx
                .send_request(PromptRequest::new(
                    session.session_id,
                    vec![ContentBlock::Text(TextContent::new("edit"))],
                ))
                .block_task()
                .await?;
            Ok(answer.stop_reason)
        });
    let stop = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the agent answered in time")
        .expect("the ACP exchange succeeded");
    assert_eq!(stop, StopReason::EndTurn);
    drop(child);
    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    let fields = &asked[0].tool_call.fields;
    assert_eq!(fields.title.as_deref(), Some("Edit a.txt"));
    assert_eq!(fields.kind, Some(ToolKind::Edit));
    let diff = fields
        .content
        .iter()
        .flatten()
        .find_map(|c| match c {
            ToolCallContent::Diff(d) => Some(d.clone()),
            _ => None,
        })
        .expect("a diff");
    assert_eq!(diff.path, project.path().join("a.txt"));
    assert_eq!(diff.old_text.as_deref(), Some("one\ntwo\n"));
    assert_eq!(diff.new_text, "one\nthree\n");
    assert_eq!(
        std::fs::read_to_string(project.path().join("a.txt")).unwrap(),
        "one\nthree\n"
    );
}

/// A `run_command` printing 10 chunks of 5 lines of 80 characters, a
/// moment apart: 10 output progress updates.
const TEN_CHUNKS: &str = "for i in 1 2 3 4 5 6 7 8 9 10; do for j in 1 2 3 4 5; do \
     printf '%-80s\\n' \"test tests::case_${i}_${j} ... ok\"; done; sleep 0.2; done";

/// The typical lifecycle on the real wire (announce, in_progress, 10 output
/// progress updates, completed with the output), partial against complete
/// objects, with and without `_meta.terminal_output`. Prints the figures
/// (`--nocapture`).
#[tokio::test]
async fn a_command_lifecycle_costs_fewer_bytes_as_patches() {
    for appended in [false, true] {
        let caps = || {
            let mut meta = serde_json::Map::new();
            if appended {
                meta.insert("terminal_output".into(), serde_json::Value::Bool(true));
            }
            ClientCapabilities::new().meta(meta)
        };
        let partial = stream(caps(), TEN_CHUNKS, "").await;
        let complete = stream(caps(), TEN_CHUNKS, "complete_objects = true").await;
        let sum = |s: &Streamed, kind: &str, line: bool| -> usize {
            s.sizes
                .iter()
                .filter(|u| u.kind == kind)
                .map(|u| if line { u.line_bytes } else { u.update_bytes })
                .sum()
        };
        let count = |s: &Streamed| {
            s.sizes
                .iter()
                .filter(|u| u.kind == "tool_call_update")
                .count()
        };
        let output = partial
            .updates
            .iter()
            .filter_map(|up| {
                up.meta
                    .as_ref()?
                    .get("terminal_output")?
                    .get("data")?
                    .as_str()
            })
            .map(str::len)
            .sum::<usize>();
        for line in [false, true] {
            let (pa, pu) = (
                sum(&partial, "tool_call", line),
                sum(&partial, "tool_call_update", line),
            );
            let (ca, cu) = (
                sum(&complete, "tool_call", line),
                sum(&complete, "tool_call_update", line),
            );
            println!(
                "{} output, {}: {} vs {} updates; updates {pu} B partial vs {cu} B complete = {:.1}% fewer; \
                 with the announce ({pa} B / {ca} B) {} vs {} B = {:.1}% fewer{}",
                if appended { "appended" } else { "replaced" },
                if line {
                    "whole JSON-RPC lines"
                } else {
                    "update objects"
                },
                count(&partial),
                count(&complete),
                100.0 * (1.0 - pu as f64 / cu as f64),
                pa + pu,
                ca + cu,
                100.0 * (1.0 - (pa + pu) as f64 / (ca + cu) as f64),
                if appended {
                    format!(" (output data {output} B)")
                } else {
                    String::new()
                },
            );
            assert!(pu < cu && pa + pu < ca + cu);
        }
    }
}
