//! `toolwire acp`, driven as an editor would: the real binary on stdio, the
//! client side of the `agent-client-protocol` crate, the scripted provider
//! and a real SQLite file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, CreateTerminalRequest,
    CreateTerminalResponse, Diff, FileSystemCapabilities, HttpHeader, InitializeRequest,
    InitializeResponse, LoadSessionRequest, McpServer, McpServerHttp, McpServerSse, McpServerStdio,
    NewSessionRequest, PermissionOptionKind, PlanEntryPriority, PlanEntryStatus, PromptRequest,
    ReadTextFileRequest, ReadTextFileResponse, ReleaseTerminalRequest, ReleaseTerminalResponse,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionId, SessionNotification, SessionUpdate, StopReason,
    TerminalExitStatus, TerminalOutputRequest, TerminalOutputResponse, TextContent, ToolCall,
    ToolCallContent, ToolCallStatus, ToolKind, WaitForTerminalExitRequest,
    WaitForTerminalExitResponse, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::{Agent, ByteStreams, Client, UntypedMessage};
use tokio::process::Child;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

type AcpError = agent_client_protocol::Error;

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

#[path = "../../toolwire-engine/tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

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

// ---------------------------------------------------------------------
// Starting the agent.

/// A test's directories: `home`, where the agent runs (its script and
/// database too, unless a test puts them elsewhere), and `project`, the
/// session's cwd.
struct Dirs {
    home: tempfile::TempDir,
    project: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Self {
        Dirs {
            home: tempfile::tempdir().unwrap(),
            project: tempfile::tempdir().unwrap(),
        }
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    fn project(&self) -> &Path {
        self.project.path()
    }

    /// The session's cwd.
    fn cwd(&self) -> PathBuf {
        self.project().to_path_buf()
    }

    /// The database in `home`.
    fn db(&self) -> String {
        sqlite_in(self.home())
    }

    /// `toolwire acp` in `home` playing `script` (a file written in `home`
    /// as `name`) with the database in `home`.
    fn scripted(&self, name: &str, script: &str) -> (AgentProcess, Transport) {
        let script = write_file(self.home(), name, script);
        spawn_agent(self.home(), &script, &self.db())
    }
}

/// A database `t.db` in `dir`.
fn sqlite_in(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("t.db").display())
}

/// Writes `contents` to `dir/name`; returns the path.
fn write_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// The scripted provider's script of `steps`, as `dir/script.json`.
fn json_script(dir: &Path, steps: serde_json::Value) -> PathBuf {
    write_file(
        dir,
        "script.json",
        &serde_json::json!({ "steps": steps }).to_string(),
    )
}

/// The arguments of `toolwire acp` with the scripted provider.
fn scripted_args(script: &Path, db: &str) -> Vec<String> {
    strings(&[
        "--provider",
        "scripted",
        "--script",
        script.to_str().unwrap(),
        "--db",
        db,
    ])
}

/// [`scripted_args`] with a config file.
fn scripted_config_args(script: &Path, db: &str, config: &Path) -> Vec<String> {
    let mut args = scripted_args(script, db);
    args.extend(strings(&["--config", config.to_str().unwrap()]));
    args
}

/// The arguments of `toolwire acp` with the OpenAI provider at `url`.
fn openai_args(url: &str, db: &str, config: &Path) -> Vec<String> {
    strings(&[
        "--provider",
        "openai",
        "--model",
        "gpt-test",
        "--base-url",
        url,
        "--db",
        db,
        "--config",
        config.to_str().unwrap(),
    ])
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
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
    let (child, transport, _) = spawn_with(home, &scripted_args(script, db));
    (child, transport)
}

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
    cmd.current_dir(home)
        .env_remove("RUST_LOG")
        .env("XDG_DATA_HOME", home.join(".xdg"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TOOLWIRE_") {
            cmd.env_remove(k);
        }
    }
    // A log file gets the default level (the metrics and session lines
    // among it); the test's own output only warnings.
    let stderr = match log {
        Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
        None => {
            cmd.env("RUST_LOG", "warn");
            Stdio::inherit()
        }
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

// ---------------------------------------------------------------------
// The editor's side.

/// How the editor answers `session/request_permission`.
#[derive(Clone, Copy)]
enum Answer {
    /// Selects the option with this id.
    Select(&'static str),
    /// The user presses stop while the question is open: the client
    /// cancels the session and answers the question `cancelled`, as ACP
    /// asks.
    Cancel,
    /// The question stays open (the editor goes away before answering).
    Never,
    /// Selects this option after this many milliseconds (the user
    /// thinks it over).
    Later(&'static str, u64),
}

/// What the editor was asked to do for the agent.
#[derive(Default, Debug)]
struct EditorLog {
    reads: Vec<PathBuf>,
    writes: Vec<(PathBuf, String)>,
    terminals: Vec<(String, Vec<String>, Option<PathBuf>)>,
    released: Vec<String>,
}

/// A client standing in for an editor: it keeps every session update and
/// permission request, answers the requests with its [`Answer`], and does
/// what the agent asks of an editor's files (whose buffer says "unsaved
/// buffer") and terminals (`term-1`, whose command prints "built in the
/// editor" and exits 0) — asked only of a client that advertises them.
#[derive(Clone)]
struct Editor {
    updates: Arc<Mutex<Vec<SessionUpdate>>>,
    asked: Arc<Mutex<Vec<RequestPermissionRequest>>>,
    log: Arc<Mutex<EditorLog>>,
    answer: Answer,
    /// Told each time a tool call goes in progress.
    running: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    /// Writes go to disk too, as an editor's save does.
    saves: bool,
}

impl Editor {
    fn answering(answer: Answer) -> Self {
        Editor {
            updates: Arc::default(),
            asked: Arc::default(),
            log: Arc::default(),
            answer,
            running: None,
            saves: false,
        }
    }

    /// This editor, saving what it is asked to write.
    fn saving(mut self) -> Self {
        self.saves = true;
        self
    }

    /// An editor that allows once whatever it is asked.
    fn new() -> Self {
        Self::answering(Answer::Select("allow_once"))
    }

    /// This editor, and what tells when a tool call goes in progress.
    fn telling_when_running(mut self) -> (Self, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.running = Some(tx);
        (self, rx)
    }

    fn updates(&self) -> Vec<SessionUpdate> {
        self.updates.lock().unwrap().clone()
    }

    fn asked(&self) -> Vec<RequestPermissionRequest> {
        self.asked.lock().unwrap().clone()
    }

    /// Connects to the agent over `transport` and runs `main`, which must
    /// end within 60 s.
    async fn run<R>(
        &self,
        transport: Transport,
        main: impl AsyncFnOnce(ConnectionTo<Agent>) -> Result<R, AcpError>,
    ) -> R {
        self.run_within(60, transport, main).await
    }

    /// [`Editor::run`], within `secs` seconds.
    async fn run_within<R>(
        &self,
        secs: u64,
        transport: Transport,
        main: impl AsyncFnOnce(ConnectionTo<Agent>) -> Result<R, AcpError>,
    ) -> R {
        let (seen, running) = (self.updates.clone(), self.running.clone());
        let (asked, answer, saves) = (self.asked.clone(), self.answer, self.saves);
        let (l1, l2, l3, l4) = (
            self.log.clone(),
            self.log.clone(),
            self.log.clone(),
            self.log.clone(),
        );
        let run = Client
            .v1()
            .on_receive_notification(
                async move |n: SessionNotification, _cx| {
                    if let (Some(tx), SessionUpdate::ToolCallUpdate(up)) = (&running, &n.update)
                        && up.fields.status == Some(ToolCallStatus::InProgress)
                    {
                        let _ = tx.send(());
                    }
                    seen.lock().unwrap().push(n.update);
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |request: RequestPermissionRequest, responder, cx| {
                    asked.lock().unwrap().push(request.clone());
                    match answer {
                        Answer::Select(option) => responder.respond(
                            RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
                                SelectedPermissionOutcome::new(option),
                            )),
                        ),
                        Answer::Cancel => {
                            cx.send_notification(CancelNotification::new(request.session_id))?;
                            responder.respond(RequestPermissionResponse::new(
                                RequestPermissionOutcome::Cancelled,
                            ))
                        }
                        Answer::Never => {
                            std::mem::forget(responder);
                            Ok(())
                        }
                        Answer::Later(option, ms) => cx.spawn(async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            responder.respond(RequestPermissionResponse::new(
                                RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                                    option,
                                )),
                            ))
                        }),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: ReadTextFileRequest, responder, _cx| {
                    // `missing.txt` is not there; `broken.txt` fails to read.
                    let name = request.path.file_name().map(|n| n.to_owned());
                    l1.lock().unwrap().reads.push(request.path);
                    match name.as_ref().and_then(|n| n.to_str()) {
                        Some("missing.txt") => responder.respond_with_error(
                            agent_client_protocol::v1::schema::Error::resource_not_found(None)
                                .into(),
                        ),
                        Some("broken.txt") => responder.respond_with_error(
                            agent_client_protocol::Error::internal_error()
                                .data("the disk is on fire"),
                        ),
                        _ => responder.respond(ReadTextFileResponse::new("unsaved buffer\n")),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: WriteTextFileRequest, responder, _cx| {
                    if saves {
                        std::fs::write(&request.path, &request.content).unwrap();
                    }
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
            .connect_with(transport, main);
        tokio::time::timeout(Duration::from_secs(secs), run)
            .await
            .expect("the agent answered in time")
            .expect("the ACP exchange succeeded")
    }
}

/// `initialize`, the client advertising `caps`.
async fn initialize(
    cx: &ConnectionTo<Agent>,
    caps: ClientCapabilities,
) -> Result<InitializeResponse, AcpError> {
    cx.send_request(InitializeRequest::new(ProtocolVersion::V1).client_capabilities(caps))
        .block_task()
        .await
}

/// `session/new` in `cwd`.
async fn new_session(cx: &ConnectionTo<Agent>, cwd: PathBuf) -> Result<SessionId, AcpError> {
    Ok(cx
        .send_request(NewSessionRequest::new(cwd))
        .block_task()
        .await?
        .session_id)
}

/// `initialize` (the client advertising `caps`), then `session/new` in
/// `cwd`.
async fn open_session(
    cx: &ConnectionTo<Agent>,
    caps: ClientCapabilities,
    cwd: PathBuf,
) -> Result<SessionId, AcpError> {
    initialize(cx, caps).await?;
    new_session(cx, cwd).await
}

/// The `session/prompt` of `text`.
fn prompt_request(session: &SessionId, text: &str) -> PromptRequest {
    PromptRequest::new(
        session.clone(),
        vec![ContentBlock::Text(TextContent::new(text))],
    )
}

/// Prompts `text`; how the prompt ended.
async fn prompt(
    cx: &ConnectionTo<Agent>,
    session: &SessionId,
    text: &str,
) -> Result<StopReason, AcpError> {
    Ok(cx
        .send_request(prompt_request(session, text))
        .block_task()
        .await?
        .stop_reason)
}

/// A client with `caps`: a session in `cwd` and one prompt of `text`;
/// how it ended.
async fn one_prompt(
    editor: &Editor,
    transport: Transport,
    caps: ClientCapabilities,
    cwd: PathBuf,
    text: &'static str,
) -> StopReason {
    editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, caps, cwd).await?;
            prompt(&cx, &session, text).await
        })
        .await
}

// ---------------------------------------------------------------------
// Reading what the editor saw.

/// The last status a `tool_call_update` set.
fn last_status(updates: &[SessionUpdate]) -> Option<ToolCallStatus> {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) => up.fields.status,
            _ => None,
        })
        .next_back()
}

/// The first `tool_call`.
fn first_tool_call(updates: &[SessionUpdate]) -> Option<ToolCall> {
    updates.iter().find_map(|u| match u {
        SessionUpdate::ToolCall(call) => Some(call.clone()),
        _ => None,
    })
}

/// The text of one item of a tool call's content.
fn content_text(content: ToolCallContent) -> String {
    match content {
        ToolCallContent::Content(c) => text_of(&c.content),
        other => format!("{other:?}"),
    }
}

/// The first diff among `contents`.
fn first_diff<'a>(mut contents: impl Iterator<Item = &'a ToolCallContent>) -> Option<Diff> {
    contents.find_map(|c| match c {
        ToolCallContent::Diff(d) => Some(d.clone()),
        _ => None,
    })
}

/// The diffs shown by the calls' final updates (those that completed),
/// each with the text after it (the tool's result).
fn completed_diffs(updates: &[SessionUpdate]) -> Vec<(Diff, String)> {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up)
                if up.fields.status == Some(ToolCallStatus::Completed) =>
            {
                let content = up.fields.content.as_ref()?;
                let diff = first_diff(content.iter())?;
                let rest = content.iter().skip(1).cloned().map(content_text).collect();
                Some((diff, rest))
            }
            _ => None,
        })
        .collect()
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
        .map(content_text)
        .collect()
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
    for (i, says) in [
        (0, "the response to session/new"),
        (0, "NewSessionResponse"),
        (1, "session/update"),
        (1, "SessionNotification"),
        (2, "the response to session/prompt"),
        (2, "Error at"),
        (3, "RequestPermissionRequest"),
        (4, "no notification that the client handles"),
    ] {
        assert!(problems[i].contains(says), "{}", problems[i]);
    }
}

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
    let replayed = load_session(&dirs, "script.yaml", LIST_THEN_ANSWER, session_id).await;
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
async fn load_session(
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
            cx.send_request(LoadSessionRequest::new(session, cwd))
                .block_task()
                .await?;
            Ok(())
        })
        .await;
    drop(child);
    editor.updates()
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

    let replayed = load_session(&dirs, "script.json", &steps, session).await;
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
    // The call that ran without asking shows its diff as well.
    let done = completed_diffs(&asked.updates);
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

// ---------------------------------------------------------------------
// A real HTTP model (the engine tests' mock OpenAI server), configuration
// files, notifications and streamed command output.

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
async fn a_change_in_the_sessions_cwd_reaches_its_model_and_nothing_else_does() {
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
    let (inside, outside) = (
        dirs.project().join("changed.txt"),
        dirs.home().join("outside.txt"),
    );
    let stop = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let prompt = cx.send_request(prompt_request(&session, "build"));
            // While the command sleeps: a change in the session's cwd, and
            // one in the process's directory.
            running.recv().await;
            std::fs::write(&inside, "new\n").unwrap();
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
    stream_call(caps, serde_json::json!({"command": command}), config_extra).await
}

/// [`stream`] of a `run_command` call with these arguments.
async fn stream_call(
    caps: ClientCapabilities,
    arguments: serde_json::Value,
    config_extra: &str,
) -> Streamed {
    let dirs = Dirs::new();
    let data = tempfile::tempdir().unwrap();
    let script = json_script(
        data.path(),
        serde_json::json!([
            {"tool_calls": [{"name": "run_command", "arguments": arguments}]},
            {"text": "Printed."}
        ]),
    );
    let config = write_file(
        data.path(),
        "toolwire.toml",
        &format!("[acp]\n{config_extra}\n[acp.permissions]\nrun_command = \"allow\"\n"),
    );
    let db = sqlite_in(data.path());
    let log = data.path().join("agent.log");
    let (mut child, transport, bytes) = spawn_logging(
        dirs.home(),
        &scripted_config_args(&script, &db, &config),
        Some(&log),
    );
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let stop = editor
        .run_within(120, transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, caps, cwd).await?;
            prompt(&cx, &session, "print").await
        })
        .await;
    assert_eq!(stop, StopReason::EndTurn);
    // The connection is closed: the agent logs its metrics and exits.
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the agent exits when its stdin closes")
        .unwrap();
    let updates = editor
        .updates()
        .into_iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(up) => Some(up),
            _ => None,
        })
        .collect();
    Streamed {
        updates,
        bytes: bytes.load(std::sync::atomic::Ordering::Relaxed),
        log: std::fs::read_to_string(&log).unwrap(),
        sizes: child.check.updates(),
    }
}

/// Client capabilities that ask for appended output in
/// `_meta.terminal_output` (when `appended`).
fn terminal_output_caps(appended: bool) -> ClientCapabilities {
    let mut meta = serde_json::Map::new();
    if appended {
        meta.insert("terminal_output".into(), serde_json::Value::Bool(true));
    }
    ClientCapabilities::new().meta(meta)
}

fn expected_output() -> String {
    (0..LINES).map(|i| format!("{i:079}\n")).collect()
}

#[tokio::test]
async fn command_output_is_appended_for_clients_that_show_terminal_output() {
    let streamed = stream_command(terminal_output_caps(true)).await;
    let output: String = streamed
        .updates
        .iter()
        .filter_map(|up| up.meta.as_ref()?.get("terminal_output"))
        .map(|o| o["data"].as_str().unwrap().to_owned())
        .collect();
    let expected = expected_output();
    assert_eq!(output.len(), expected.len());
    assert!(output == expected, "every byte once, in order");
    // The first output opens the terminal it goes to, once.
    let infos: Vec<(usize, &serde_json::Value)> = streamed
        .updates
        .iter()
        .enumerate()
        .filter_map(|(i, up)| Some((i, up.meta.as_ref()?.get("terminal_info")?)))
        .collect();
    assert_eq!(infos.len(), 1, "{infos:?}");
    let (at, info) = infos[0];
    let first_output = streamed.updates.iter().position(|up| {
        up.meta
            .as_ref()
            .is_some_and(|m| m.contains_key("terminal_output"))
    });
    assert_eq!(Some(at), first_output);
    let terminal = &streamed.updates[at].meta.as_ref().unwrap()["terminal_output"]["terminal_id"];
    assert_eq!(&info["terminal_id"], terminal);
    assert!(
        info["cwd"].as_str().is_some_and(|c| !c.is_empty()),
        "{info}"
    );
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
async fn a_streamed_command_that_times_out_says_so_under_its_terminal() {
    let streamed = stream_call(
        terminal_output_caps(true),
        serde_json::json!({"command": "echo started; sleep 30", "timeout_secs": 1}),
        "",
    )
    .await;
    let last = streamed.updates.last().unwrap();
    assert_eq!(last.fields.status, Some(ToolCallStatus::Failed));
    let exit = &last.meta.as_ref().unwrap()["terminal_exit"];
    assert!(
        exit["exit_code"].is_null() && exit["signal"].is_null(),
        "{exit}"
    );
    let shown: Vec<String> = last
        .fields
        .content
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(content_text)
        .collect();
    assert!(
        matches!(
            &last.fields.content.as_deref(),
            Some([ToolCallContent::Terminal(_), _])
        ),
        "{last:#?}"
    );
    assert!(shown[1].contains("timed out after 1 s"), "{shown:?}");
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
    let mut done: Vec<(Option<String>, String)> = completed_diffs(&updates)
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
                            cx.send_request(LoadSessionRequest::new(id.clone(), cwd))
                                .block_task()
                                .await?;
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
async fn a_client_can_ask_for_complete_tool_call_objects() {
    let dirs = Dirs::new();
    std::fs::write(dirs.project().join("hello.txt"), "hi\n").unwrap();
    let (child, transport) = dirs.scripted("script.yaml", LIST_THEN_ANSWER);
    let editor = Editor::new();
    let mut meta = serde_json::Map::new();
    meta.insert(
        "toolwire".into(),
        serde_json::json!({"complete_tool_calls": true}),
    );
    one_prompt(
        &editor,
        transport,
        ClientCapabilities::new().meta(meta),
        dirs.cwd(),
        "what is here?",
    )
    .await;
    drop(child);
    let updates = editor.updates();
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
    let appended = stream(terminal_output_caps(true), command, "").await;
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
    // Once run, the call keeps showing the diff it made, its result under it.
    let done = completed_diffs(&editor.updates());
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

/// Through the editor, `apply_diff` starts a file the editor reports
/// missing (`-32002`) from nothing, and fails on any other read error
/// rather than take the file as empty.
#[tokio::test]
async fn an_editor_read_error_is_not_an_empty_file() {
    let dirs = Dirs::new();
    let create = "@@ -0,0 +1 @@\n+created\n";
    let script = json_script(
        dirs.home(),
        serde_json::json!([
            {"tool_calls": [
                {"name": "apply_diff", "arguments": {"path": "missing.txt", "diff": create}},
                {"name": "apply_diff", "arguments": {"path": "broken.txt", "diff": create}}
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
    assert_eq!(
        log.writes,
        [(dirs.project().join("missing.txt"), "created\n".to_owned())],
        "{log:?}"
    );
    let results = results(&editor.updates());
    assert!(
        results.contains("`broken.txt` unchanged: the editor could not read it"),
        "{results}"
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
        let caps = || terminal_output_caps(appended);
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

// ---------------------------------------------------------------------
// MCP servers the editor passes in `session/new`.

#[path = "../../toolwire-engine/tests/mcp_http/mod.rs"]
mod mcp_http;

#[tokio::test]
async fn an_http_mcp_server_from_session_new_gives_the_model_its_tools() {
    let Some(mcp_dir) = mcp_http::mcp_dir() else {
        return;
    };
    let http = mcp_http::HttpServer::everything(&mcp_dir).await;
    let nowhere = mcp_http::nothing_listens();
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Echoing."
    tool_calls: [{name: everything__echo, arguments: {message: "over streamable HTTP"}}]
  - text: "It echoed."
"#,
    );
    let log = dirs.home().join("agent.log");
    let (child, transport, _) =
        spawn_logging(dirs.home(), &scripted_args(&script, &dirs.db()), Some(&log));

    let editor = Editor::new();
    let cwd = dirs.cwd();
    // Secrets in the query and the headers, which no log line may show.
    let url = format!("{}?key=s3cret", http.url);
    let unreachable = format!("{}?key=s3cret", nowhere.url);
    let (init, stop) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            let token = || vec![HttpHeader::new("Authorization", "Bearer t0ken")];
            let servers = vec![
                McpServer::Http(McpServerHttp::new("everything", url.as_str()).headers(token())),
                // Cannot be reached: left out with a warning.
                McpServer::Http(
                    McpServerHttp::new("unreachable", unreachable.as_str()).headers(token()),
                ),
                // Deprecated in MCP: left out with a warning, the session
                // goes on without it.
                McpServer::Sse(McpServerSse::new("legacy", url.as_str()).headers(token())),
            ];
            let session = cx
                .send_request(NewSessionRequest::new(cwd).mcp_servers(servers))
                .block_task()
                .await?
                .session_id;
            let stop = prompt(&cx, &session, "echo something").await?;
            Ok((init, stop))
        })
        .await;
    let mcp = &init.agent_capabilities.mcp_capabilities;
    assert!(mcp.http, "streamable HTTP is advertised");
    assert!(!mcp.sse, "SSE is not");
    assert_eq!(stop, StopReason::EndTurn);

    let updates = editor.updates();
    let call = first_tool_call(&updates).expect("a tool_call");
    assert_eq!(call.title, "everything__echo");
    assert_eq!(
        results(&updates),
        "Echo: over streamable HTTP",
        "{updates:#?}"
    );
    child.assert_valid();
    drop(child);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("SSE MCP servers are not supported") && log.contains("legacy"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "MCP server `unreachable` at {} failed to connect",
            nowhere.url
        )),
        "{log}"
    );
    for secret in ["s3cret", "t0ken"] {
        assert!(!log.contains(secret), "{secret:?} shows in the log: {log}");
        assert!(
            !format!("{updates:?}").contains(secret),
            "{secret:?} shows in an update: {updates:#?}"
        );
    }
    drop(http);
}

#[tokio::test]
async fn an_mcp_tools_progress_shows_on_its_call_until_the_result() {
    let Some(mcp_dir) = mcp_http::mcp_dir() else {
        return;
    };
    let http = mcp_http::HttpServer::everything(&mcp_dir).await;
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Working."
    tool_calls: [{name: everything__trigger-long-running-operation, arguments: {duration: 2, steps: 4}}]
  - text: "Done."
"#,
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let url = http.url.clone();
    let stop = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let servers = vec![McpServer::Http(McpServerHttp::new(
                "everything",
                url.as_str(),
            ))];
            let session = cx
                .send_request(NewSessionRequest::new(cwd).mcp_servers(servers))
                .block_task()
                .await?
                .session_id;
            prompt(&cx, &session, "run the long operation").await
        })
        .await;
    assert_eq!(stop, StopReason::EndTurn);

    // The call's content, update by update: the server's progress lines
    // (0.5 s apart, so none coalesce), then the result in their place.
    let shown: Vec<String> = editor
        .updates()
        .into_iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(u) => u.fields.content,
            _ => None,
        })
        .map(|content| content.into_iter().map(content_text).collect())
        .collect();
    let progress: Vec<&str> = shown
        .iter()
        .map(String::as_str)
        .filter(|s| s.contains("(25%)") || s.contains("(50%)") || s.contains("(75%)"))
        .collect();
    assert_eq!(
        progress,
        ["1/4 (25%)", "2/4 (50%)", "3/4 (75%)"],
        "{shown:#?}"
    );
    let last = shown.last().expect("content was sent");
    assert!(
        last.contains("Long running operation completed"),
        "{shown:#?}"
    );
    child.assert_valid();
    drop(http);
}

// ---------------------------------------------------------------------
// Prompts that end early: cancels, overlapping prompts, an agent gone
// while asking.

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

#[tokio::test]
async fn a_second_prompt_while_one_runs_is_refused_and_the_cancel_holds() {
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
    let refused = second.expect_err("the second prompt is refused");
    assert!(
        format!("{refused:?}").contains("a prompt is already running"),
        "{refused:?}"
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
            cx.send_request(LoadSessionRequest::new(id.clone(), cwd))
                .block_task()
                .await?;
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

/// server-everything over stdio, as a client's MCP server, when the test
/// has the npm install (`TOOLWIRE_TEST_MCP_DIR`); none otherwise.
fn everything_stdio() -> Vec<McpServer> {
    mcp_http::mcp_dir()
        .map(|dir| {
            let entry =
                dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
            vec![McpServer::Stdio(
                McpServerStdio::new("everything", "node")
                    .args(vec![entry.display().to_string(), "stdio".to_owned()]),
            )]
        })
        .unwrap_or_default()
}

/// The inotify watches process `pid` holds.
fn inotify_watches(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count()
        })
        .sum()
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| std::fs::read_to_string(p.path().join("stat")).ok())
        .filter(|stat| {
            // `pid (comm) state ppid …`; comm may hold spaces.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1) == Some(&pid.to_string())
        })
        .count()
}

/// Polls `count` until it gives `want` (a closed watcher lets go of its
/// watches on its own thread, a server process takes a moment to exit),
/// for at most 5 s; the last count.
async fn settles_to<T: PartialEq>(count: impl Fn() -> T, want: T) -> T {
    for _ in 0..100 {
        if count() == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    count()
}

/// `toolwire acp` playing `script` with at most one session open, `allow`
/// (tool names) run without asking, its log in `agent.log`: the process,
/// its transport and the log's path.
fn spawn_one_open(
    dirs: &Dirs,
    script: &Path,
    allow: &[&str],
) -> (AgentProcess, Transport, PathBuf) {
    let mut toml = "[acp]\nmax_open_sessions = 1\n[acp.permissions]\n".to_owned();
    for tool in allow {
        toml.push_str(&format!("{tool} = \"allow\"\n"));
    }
    let config = write_file(dirs.home(), "toolwire.toml", &toml);
    let log = dirs.home().join("agent.log");
    let (child, transport, _) = spawn_logging(
        dirs.home(),
        &scripted_config_args(script, &dirs.db(), &config),
        Some(&log),
    );
    (child, transport, log)
}

#[tokio::test]
async fn sessions_past_the_limit_are_parked_and_opened_again_by_their_next_prompt() {
    let dirs = Dirs::new();
    for sub in ["src", "tests", "docs"] {
        std::fs::create_dir(dirs.project().join(sub)).unwrap();
    }
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Writing."
    tool_calls: [{name: write_file, arguments: {path: "out.txt", content: "parked and back\n"}}]
  - text: "Done."
"#,
    );
    let (child, transport, log) = spawn_one_open(&dirs, &script, &["write_file"]);
    let pid = child.id().unwrap();
    let cwd = dirs.cwd();
    // Each session has its own stdio MCP server, when the test has one.
    let servers = everything_stdio();
    let with_servers = !servers.is_empty();
    let (one, three, reopened, stop) = Editor::new()
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let open = async || {
                let request = NewSessionRequest::new(cwd.clone()).mcp_servers(servers.clone());
                Ok::<_, AcpError>(cx.send_request(request).block_task().await?.session_id)
            };
            // What a session holds: watches, and server processes.
            let held = || (inotify_watches(pid), children(pid));
            let first = open().await?;
            let one = held();
            open().await?;
            open().await?;
            // One session open, one watcher: the first two were parked.
            let three = settles_to(held, one).await;
            // The first one's prompt opens it again (and parks the third).
            let stop = prompt(&cx, &first, "write it").await?;
            let reopened = settles_to(held, one).await;
            Ok((one, three, reopened, stop))
        })
        .await;
    assert_eq!(one.0, 4, "the project and its three directories");
    assert_eq!(one.1, usize::from(with_servers), "one MCP server process");
    assert_eq!(
        three, one,
        "three sessions hold one session's watches and servers"
    );
    assert_eq!(reopened, one);
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("out.txt")).unwrap(),
        "parked and back\n"
    );
    drop(child);
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(log.matches("ACP session parked").count(), 3, "{log}");
    assert!(log.contains("ACP session opened again"), "{log}");
}

#[tokio::test]
async fn a_parked_session_opens_while_the_others_prompt_and_a_cancel_while_it_opens_holds() {
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        "steps:\n  - text: \"an answer that streams a few bytes at a time\"\n    chunk_size: 4\n    delay_ms: 20\n",
    );
    let (child, transport, _) = spawn_one_open(&dirs, &script, &[]);
    let cwd = dirs.cwd();
    // Opening a session that has a stdio MCP server takes a moment.
    let servers = everything_stdio();
    let (both, cancelled) = Editor::new()
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let open = async || {
                let request = NewSessionRequest::new(cwd.clone()).mcp_servers(servers.clone());
                Ok::<_, AcpError>(cx.send_request(request).block_task().await?.session_id)
            };
            let a = open().await?;
            let b = open().await?;
            // `a` is parked; it opens while `b` prompts (one more than the
            // limit, until a prompt ends).
            let b_prompt = cx.send_request(prompt_request(&b, "talk"));
            let a_stop = prompt(&cx, &a, "talk").await?;
            let b_stop = b_prompt.block_task().await?.stop_reason;
            // `b` is parked again: a cancel sent right after its prompt, while
            // it opens, ends that prompt `cancelled`.
            let again = cx.send_request(prompt_request(&b, "talk"));
            cx.send_notification(CancelNotification::new(b))?;
            Ok(((a_stop, b_stop), again.block_task().await?.stop_reason))
        })
        .await;
    assert_eq!(both, (StopReason::EndTurn, StopReason::EndTurn));
    assert_eq!(cancelled, StopReason::Cancelled);
    drop(child);
}

#[tokio::test]
async fn a_session_whose_background_command_runs_is_not_parked() {
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Starting it."
    tool_calls: [{name: run_command, arguments: {command: "sleep 10", background: true}}]
  - text: "It runs."
"#,
    );
    let (child, transport, log) = spawn_one_open(&dirs, &script, &["run_command"]);
    let pid = child.id().unwrap();
    let cwd = dirs.cwd();
    let (one, two) = Editor::new()
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let first = new_session(&cx, cwd.clone()).await?;
            assert_eq!(prompt(&cx, &first, "start it").await?, StopReason::EndTurn);
            let one = inotify_watches(pid);
            new_session(&cx, cwd.clone()).await?;
            Ok((one, inotify_watches(pid)))
        })
        .await;
    assert_eq!(two, 2 * one, "both sessions stay open");
    drop(child);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("ACP session parked"), "{log}");
}
