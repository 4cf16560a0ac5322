//! `toolwire acp`, driven as an editor would: the real binary on stdio, the
//! client side of the `agent-client-protocol` crate, the scripted provider
//! and a real SQLite file.
//!
//! One test binary (linking one per feature would cost more than the tests
//! save): this file starts the agent, plays the editor and reads what it
//! saw; each module holds the tests of one feature.
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
    InitializeResponse, LoadSessionRequest, LoadSessionResponse, McpServer, McpServerHttp,
    McpServerSse, McpServerStdio, NewSessionRequest, PermissionOptionKind, PlanEntryPriority,
    PlanEntryStatus, PromptRequest, ReadTextFileRequest, ReadTextFileResponse,
    ReleaseTerminalRequest, ReleaseTerminalResponse, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome, SessionId,
    SessionNotification, SessionUpdate, SetSessionConfigOptionRequest,
    SetSessionConfigOptionResponse, SetSessionModeRequest, SetSessionModeResponse, StopReason,
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

mod acp_schema;

mod cancels;
mod commands;
mod editor;
mod history;
mod mcp;
mod models;
mod modes;
mod notifications;
mod parking;
mod permissions;
mod prompts;
mod sessions;
mod terminal;
mod wire_bytes;

// The mock model server (real HTTP, OpenAI's wire format).
use toolwire_test_support as support;

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
/// A model answer: `text`, then call `id` writing `content` to `path`
/// (which asks, unless allowed).
fn writes(text: &str, id: &str, path: &str, content: &str) -> support::Reply {
    support::Reply::sse(support::openai_sse(
        text,
        &[support::Call {
            id,
            name: "write_file",
            arguments: serde_json::json!({"path": path, "content": content}),
        }],
    ))
}

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
                    // `missing.txt` is not there; `broken*` fail to read
                    // (an internal error, as some clients answer for a
                    // missing file too).
                    let name = request.path.file_name().map(|n| n.to_owned());
                    l1.lock().unwrap().reads.push(request.path);
                    match name.as_ref().and_then(|n| n.to_str()) {
                        Some("missing.txt") => responder.respond_with_error(
                            agent_client_protocol::v1::schema::Error::resource_not_found(None)
                                .into(),
                        ),
                        Some(n) if n.starts_with("broken") => responder.respond_with_error(
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

/// `session/set_config_option`: option `id` set to `value`.
async fn set_option(
    cx: &ConnectionTo<Agent>,
    session: &SessionId,
    id: &str,
    value: &str,
) -> Result<SetSessionConfigOptionResponse, AcpError> {
    cx.send_request(SetSessionConfigOptionRequest::new(
        session.clone(),
        id.to_owned(),
        value,
    ))
    .block_task()
    .await
}

/// `session/set_mode` to `mode`.
async fn set_mode(
    cx: &ConnectionTo<Agent>,
    session: &SessionId,
    mode: &str,
) -> Result<SetSessionModeResponse, AcpError> {
    cx.send_request(SetSessionModeRequest::new(session.clone(), mode.to_owned()))
        .block_task()
        .await
}

/// `session/load` of `session` in `cwd`.
async fn load_session(
    cx: &ConnectionTo<Agent>,
    session: &SessionId,
    cwd: PathBuf,
) -> Result<LoadSessionResponse, AcpError> {
    cx.send_request(LoadSessionRequest::new(session.clone(), cwd))
        .block_task()
        .await
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

/// The diffs the calls that completed show, each with its result: the
/// completed update's own diff and the text after it, or, when that update
/// sent no content (its permission request showed the diff, which stays),
/// the request's diff and the result in `rawOutput`.
fn diffs_shown_when_done(
    updates: &[SessionUpdate],
    asked: &[RequestPermissionRequest],
) -> Vec<(Diff, String)> {
    let mut shown = Vec::new();
    for update in updates {
        let SessionUpdate::ToolCallUpdate(up) = update else {
            continue;
        };
        if up.fields.status != Some(ToolCallStatus::Completed) {
            continue;
        }
        if up.fields.content.is_some() {
            shown.extend(completed_diffs(std::slice::from_ref(update)));
            continue;
        }
        let request = asked
            .iter()
            .find(|r| r.tool_call.tool_call_id == up.tool_call_id);
        let diff = request.and_then(|r| first_diff(r.tool_call.fields.content.iter().flatten()));
        if let Some(diff) = diff {
            let result = up.fields.raw_output.as_ref().and_then(|r| r.as_str());
            shown.push((diff, result.unwrap_or_default().to_owned()));
        }
    }
    shown
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
