//! # toolwire-acp
//!
//! **Owns** toolwire's Agent Client Protocol (v1) front door: JSON-RPC over
//! a byte stream (stdio for `toolwire acp`), built with the
//! `agent-client-protocol` crate. An ACP session is one conversation of the
//! engine (the session id is the conversation id); the session's `cwd` is
//! the root of its built-in tools. The engine's events become
//! `session/update` notifications, tool calls through a
//! [`toolwire_core::ToolCallTracker`] so that every `tool_call_update`
//! carries only what changed (`updates.rs`; titles and locations from the
//! arguments in `titles.rs`). Which calls run without asking is
//! `policy.rs`; asking the editor about the others, `permissions.rs`. An
//! open session is `state.rs`, a prompt's run `session.rs`. When the
//! editor offers files or terminals, the
//! session's `read_file`/`write_file`/`run_command` go through it
//! (`client_fs.rs`, `terminal.rs`) — the engine only sees tools of those
//! names. Edits show the diff they make (`edits.rs`). `_toolwire/notify`
//! (`notify.rs`) feeds the engine's notifications. A prompt's images and
//! linked files become the user message in `prompt.rs`; usage goes out
//! from `usage.rs`, the session's title (one rule, `sessions::title_of`)
//! from `session.rs`; what a call's last update showed is kept for
//! `session/load` by `views.rs`; `initialize` is answered without the
//! fields equal to their schema defaults (`initialize.rs`).
//! A session's mode
//! (`modes.rs`) decides what asks and which sandbox its commands run
//! under; its config options are `config.rs`; what is kept beside the
//! conversation for `session/list` and for other agent processes,
//! `sessions.rs`; list/resume/close/delete/fork/set_mode, `history.rs`; an
//! editor's other project folders named to the model, `roots.rs`; slash
//! commands, `commands.rs`; the missing-key authentication method,
//! `auth.rs`.
//!
//! **Invariants.** ACP names and JSON live here and nowhere below; the
//! engine is used only through its public API, and the store only read
//! (writes go through the engine). Nothing but the protocol is
//! written to the output stream (logs go through `tracing`). Every
//! `session/prompt` is answered exactly once, with `cancelled` after a
//! `session/cancel`.
//!
//! **Entry points.** [`serve`] (any reader/writer pair), [`serve_stdio`],
//! [`AcpError`].

// Stdout is the protocol: one stray print corrupts the editor's stream.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod auth;
mod client_fs;
mod commands;
mod config;
mod convert;
mod edits;
mod errors;
mod history;
mod initialize;
mod modes;
mod notify;
mod permissions;
mod policy;
mod prompt;
mod roots;
mod session;
mod sessions;
mod state;
mod terminal;
mod titles;
mod updates;
mod usage;
mod views;
mod wire;
mod woken;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthenticateRequest, CancelNotification, CloseSessionRequest,
    DeleteSessionRequest, ForkSessionRequest, InitializeRequest, InitializeResponse,
    ListSessionsRequest, LoadSessionRequest, LoadSessionResponse, McpCapabilities, McpServer,
    NewSessionRequest, NewSessionResponse, PromptCapabilities, PromptRequest, PromptResponse,
    ResumeSessionRequest, SessionId, SessionNotification, SetSessionConfigOptionRequest,
    SetSessionConfigOptionResponse, SetSessionModeRequest, StopReason,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, Lines};
use tokio::io::{AsyncRead, AsyncWrite};
use toolwire_core::{ConversationId, TrackerConfig, TrackerMetrics};
use toolwire_engine::Engine;
use toolwire_engine::watch::{self, WatchHandle, WatchSettings};
use toolwire_tools::OwnWrites;
use toolwire_tools::ToolRegistry;
use toolwire_tools::builtin::{self, Workspace};
use toolwire_tools::confined::Sandbox;
use toolwire_tools::mcp::{self, McpServerConfig};

pub use auth::KeyCheck;
use errors::{AcpResult, internal, invalid_params};
pub use modes::SessionMode;
pub use notify::{METHOD as NOTIFY_METHOD, NotifyNotification};
pub use policy::{Policies, Policy};
use state::Session;
pub use toolwire_core::kind_of;
use updates::session_metrics_line;

/// How `toolwire acp` behaves beyond the protocol: tool policies and how
/// tool call updates are sent.
#[derive(Debug, Clone, PartialEq)]
pub struct AcpSettings {
    /// Per tool: `allow`, `ask` or `deny` (unnamed tools: read-only ones
    /// allow, the others ask).
    pub policies: Policies,
    /// Coalescing window, rate per call, complete objects, output tail and
    /// per-call byte budget (past it a call's output goes out once a
    /// second, so a command that prints for minutes cannot flood the
    /// editor; status changes are never held for it). `appended_output`
    /// is ignored here: it follows the client's `_meta.terminal_output`
    /// capability.
    pub tracker: TrackerConfig,
    /// Each session watches its own cwd with these settings and tells only
    /// its own conversation about outside changes; `None`: no watching.
    pub watch: Option<WatchSettings>,
    /// Sessions kept open: their tools, MCP servers and file watcher. Past
    /// it, the least recently used session not prompting is parked (all of
    /// that closed) and opened again by its next prompt or notification,
    /// so an editor that opens thread after thread does not pile up
    /// watchers and server processes. At least 1.
    pub max_open_sessions: usize,
    /// What sessions' commands run under (`run_command`): the configured
    /// sandbox, whose mode each session mode may change
    /// (`mode_sandboxes`). The default has no helper: commands are
    /// refused.
    pub sandbox: Arc<Sandbox>,
    /// The sandbox mode of each session mode's commands, where configured
    /// (`[acp.modes.MODE] sandbox`); the others: read-only → read-only,
    /// ask and accept-edits → the configured one, full-access → full.
    pub mode_sandboxes: std::collections::BTreeMap<SessionMode, toolwire_tools::confined::Mode>,
    /// The mode of a new session.
    pub default_mode: SessionMode,
    /// Where the default model's API key is read from, when it may be
    /// missing (offered as an authentication method while it is).
    pub key: Option<KeyCheck>,
    /// What becomes of a prompt sent while one runs in its session.
    pub prompt_while_running: PromptWhileRunning,
}

/// `acp.prompt_while_running`: a prompt sent while a turn runs in its
/// session is never refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptWhileRunning {
    /// Answered after the running prompt, in the order they came (as
    /// claude-agent-acp does).
    #[default]
    Queue,
    /// Its words join the running turn, read by the model after the call
    /// it is running (as codex-acp steers); answered when that turn ends.
    /// A prompt with images is queued instead (interjections are text).
    Interject,
}

impl Default for AcpSettings {
    fn default() -> Self {
        AcpSettings {
            policies: Policies::default(),
            tracker: TrackerConfig {
                call_byte_budget: Some(8 * 1024 * 1024),
                bound_replaced_output: true,
                ..TrackerConfig::coalescing()
            },
            watch: Some(WatchSettings::default()),
            max_open_sessions: 16,
            sandbox: Arc::new(Sandbox::none()),
            prompt_while_running: PromptWhileRunning::default(),
            mode_sandboxes: Default::default(),
            default_mode: SessionMode::default(),
            key: None,
        }
    }
}

/// The extensions this agent offers, so clients can tell before using
/// them: `_toolwire/notify`, and complete tool call objects on request.
fn agent_meta() -> serde_json::Map<String, serde_json::Value> {
    let mut meta = serde_json::Map::new();
    meta.insert(
        "toolwire".into(),
        serde_json::json!({"notify": notify::METHOD, "complete_tool_calls": true}),
    );
    meta
}

/// What the client said it can do in `initialize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClientCaps {
    pub read_text_file: bool,
    pub write_text_file: bool,
    pub terminal: bool,
    /// `_meta.terminal_output: true` (codex-acp / claude-agent-acp
    /// convention): the client shows appended output.
    pub terminal_output: bool,
    /// `_meta.toolwire.complete_tool_calls: true`: every update carries the
    /// complete tool call.
    pub complete_tool_calls: bool,
}

impl ClientCaps {
    fn from_request(request: &InitializeRequest) -> Self {
        let caps = &request.client_capabilities;
        let meta = caps.meta.as_ref();
        let flag =
            |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_bool) == Some(true);
        ClientCaps {
            read_text_file: caps.fs.read_text_file,
            write_text_file: caps.fs.write_text_file,
            terminal: caps.terminal,
            terminal_output: flag(meta.and_then(|m| m.get("terminal_output"))),
            complete_tool_calls: flag(
                meta.and_then(|m| m.get("toolwire"))
                    .and_then(|t| t.get("complete_tool_calls")),
            ),
        }
    }
}

/// Why the ACP connection ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error("ACP connection: {0}")]
    Protocol(agent_client_protocol::Error),
}

/// Serves ACP on the process's stdin and stdout until stdin closes.
pub async fn serve_stdio(engine: Engine, settings: AcpSettings) -> Result<(), AcpError> {
    serve(engine, settings, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Serves ACP, reading the client's messages from `input` and writing to
/// `output`, until `input` closes.
pub async fn serve(
    engine: Engine,
    settings: AcpSettings,
    input: impl AsyncRead + Send + Unpin + 'static,
    output: impl AsyncWrite + Send + Unpin + 'static,
) -> Result<(), AcpError> {
    let sandboxes = Arc::new(modes::ModeSandboxes::new(
        &settings.sandbox,
        &settings.mode_sandboxes,
    ));
    let agent = AcpAgent {
        engine,
        sandboxes,
        settings: Arc::new(settings),
        caps: Arc::default(),
        sessions: Arc::new(Mutex::new(HashMap::new())),
        parked: Arc::new(Mutex::new(HashMap::new())),
        reopening: Arc::default(),
        clock: Arc::default(),
        waiting_prompts: Arc::default(),
    };
    let (a1, a2, a3, a4, a5, a6, a7) = (
        agent.clone(),
        agent.clone(),
        agent.clone(),
        agent.clone(),
        agent.clone(),
        agent.clone(),
        agent.clone(),
    );
    let served = Agent
        .v1()
        .name("toolwire")
        .on_receive_request(
            async move |request: initialize::Initialize, responder, _cx| {
                a1.initialize(request.0, responder)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx| {
                a2.new_session(request, responder, cx).await
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                a3.load_session(request, responder, cx).await
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| a4.prompt(request, responder, cx),
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionConfigOptionRequest, responder, cx| {
                a7.set_config_option(request, responder, cx).await
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: AuthenticateRequest, responder, _cx| {
                    agent.authenticate(request, responder)
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ListSessionsRequest, responder, _cx| {
                    agent.list_sessions(request, responder).await
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ResumeSessionRequest, responder, cx| {
                    agent.resume_session(request, responder, cx).await
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: CloseSessionRequest, responder, _cx| {
                    agent.close_session(request, responder)
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: DeleteSessionRequest, responder, _cx| {
                    agent.delete_session(request, responder).await
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ForkSessionRequest, responder, cx| {
                    agent.fork_session(request, responder, cx).await
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: SetSessionModeRequest, responder, cx| {
                    agent.set_mode(request, responder, cx).await
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                a5.cancel(&notification.session_id);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_notification(
            async move |notification: NotifyNotification, cx: ConnectionTo<Client>| {
                // Off the dispatch loop: opening a parked session starts its
                // MCP servers.
                let agent = a6.clone();
                cx.clone().spawn(async move {
                    agent.notify(notification, cx).await;
                    Ok(())
                })
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(Lines::new(wire::line_sink(output), wire::lines(input)))
        .await
        .map_err(AcpError::Protocol);
    agent.log_metrics();
    served
}

/// A session's tools, and the editor side of those that go through it.
struct SessionTools {
    tools: ToolRegistry,
    /// The editor's connection.
    cx: ConnectionTo<Client>,
    /// The editor's other roots the built-in tools reach.
    additional: Arc<[PathBuf]>,
    /// What the built-in tools wrote, for the session's file watcher.
    own_writes: Arc<OwnWrites>,
    terminals: terminal::Terminals,
    /// What edit previews read.
    edits: edits::EditView,
    /// The diffs of the edits that ran.
    diffs: edits::Diffs,
    /// `run_command`'s background tasks.
    tasks: Arc<builtin::BackgroundTasks>,
    /// The session's mode, which its `run_command` reads at each call.
    mode: Arc<Mutex<SessionMode>>,
    /// The client's MCP servers that connected (their prompts are
    /// commands).
    mcp: Arc<[Arc<mcp::McpServer>]>,
}

#[derive(Clone)]
struct AcpAgent {
    engine: Engine,
    settings: Arc<AcpSettings>,
    /// The sandbox of each mode's commands.
    sandboxes: Arc<modes::ModeSandboxes>,
    caps: Arc<Mutex<ClientCaps>>,
    sessions: Arc<Mutex<HashMap<Arc<str>, Session>>>,
    /// Sessions closed to keep at most `max_open_sessions` open, with what
    /// opens them again.
    parked: Arc<Mutex<HashMap<Arc<str>, Parked>>>,
    /// Held while a parked session is opened again, so that two requests
    /// for it open it once.
    reopening: Arc<tokio::sync::Mutex<()>>,
    /// Ticks at each use of a session: the least recent is parked first.
    clock: Arc<AtomicU64>,
    /// Prompts waiting for their parked session to open, and whether a
    /// `session/cancel` came meanwhile.
    waiting_prompts: Arc<Mutex<HashMap<Arc<str>, bool>>>,
}

/// The built-in tools' workspace of a session: its cwd, and the editor's
/// other roots of the project (`additionalDirectories`); a bad one is a
/// JSON-RPC error naming it.
fn workspace_of(
    cwd: &Path,
    additional: &[PathBuf],
) -> Result<Workspace, agent_client_protocol::Error> {
    Workspace::new(cwd)
        .map_err(|e| invalid_params(format!("cwd {}: {e}", cwd.display())))?
        .with_additional_roots(additional)
        .map_err(|e| invalid_params(format!("additionalDirectories: {e}")))
}

/// What a parked session keeps: enough to open it as it was.
struct Parked {
    cwd: PathBuf,
    additional: Arc<[PathBuf]>,
    mode: SessionMode,
    mcp_servers: Arc<[McpServer]>,
    metrics: TrackerMetrics,
}

impl AcpAgent {
    fn initialize(
        &self,
        request: InitializeRequest,
        responder: Responder<initialize::Answer>,
    ) -> AcpResult {
        tracing::info!(client = ?request.client_info, "ACP initialize");
        if let Ok(mut caps) = self.caps.lock() {
            *caps = ClientCaps::from_request(&request);
        }
        // One answer for every session, before any: images are offered
        // when the model a new session starts with (the default) can see
        // them. A session on a model that cannot (chosen, or stored with
        // the session) refuses an image with an error naming the model,
        // never a silent drop; one switched to a model that can takes
        // images even though the editor was not offered them.
        let vision = self
            .engine
            .models()
            .default_entry()
            .info
            .capabilities
            .vision;
        let capabilities = AgentCapabilities::new()
            .load_session(true)
            .session_capabilities(history::capabilities())
            .prompt_capabilities(
                PromptCapabilities::new()
                    .embedded_context(true)
                    .image(vision),
            )
            // Streamable HTTP; SSE is deprecated in MCP and not offered.
            .mcp_capabilities(McpCapabilities::new().http(true))
            .meta(agent_meta());
        responder.respond(initialize::Answer(
            InitializeResponse::new(agent_client_protocol::schema::ProtocolVersion::V1)
                .agent_capabilities(capabilities)
                .auth_methods(self.auth_methods())
                .agent_info(agent_client_protocol::v1::schema::Implementation::new(
                    "toolwire",
                    env!("CARGO_PKG_VERSION"),
                )),
        ))
    }

    /// The engine's tools with the built-in ones rooted at `cwd` (file
    /// and terminal tools through the editor when it offers them), and the
    /// tools of the client's stdio and streamable HTTP MCP servers (a
    /// server that fails to start or to connect is logged and left out; SSE
    /// servers are not offered, and left out with a warning).
    async fn tools_for(
        &self,
        cwd: &Path,
        additional: &[PathBuf],
        mcp_servers: &[McpServer],
        session_id: &SessionId,
        cx: &ConnectionTo<Client>,
        mode: SessionMode,
    ) -> Result<SessionTools, agent_client_protocol::Error> {
        let workspace = Arc::new(workspace_of(cwd, additional)?);
        let mut tools = self.engine.tools().clone();
        let tasks = Arc::new(builtin::BackgroundTasks::new());
        for tool in builtin::all_with(
            workspace.clone(),
            tasks.clone(),
            self.settings.sandbox.clone(),
        ) {
            tools.register(tool);
        }
        // `run_command` under the sandbox of the session's mode of the
        // moment.
        let mode = Arc::new(Mutex::new(mode));
        if let Some(fallback) = tools.get("run_command") {
            let by_mode =
                SessionMode::ALL
                    .into_iter()
                    .filter_map(|m| {
                        let sandbox = self.sandboxes.of(m)?.clone();
                        let tool: Arc<dyn toolwire_tools::Tool> = Arc::new(
                            builtin::RunCommand::new(workspace.clone(), tasks.clone(), sandbox),
                        );
                        Some((m, tool))
                    })
                    .collect();
            tools.register(Arc::new(modes::ModeRunCommand {
                by_mode,
                mode: mode.clone(),
                fallback,
            }));
        }
        let caps = self.client_caps();
        let terminals = terminal::Terminals::default();
        let fs = (caps.read_text_file || caps.write_text_file).then(|| client_fs::ClientFs {
            cx: cx.clone(),
            session_id: session_id.clone(),
            read: caps.read_text_file,
            write: caps.write_text_file,
            workspace: workspace.clone(),
            cwd: cwd.to_path_buf(),
        });
        // The editor's versions take the built-in names (and specs), so the
        // model sees the same tools either way.
        if let Some(fs) = &fs {
            if let (true, Some(builtin)) = (fs.read, tools.get("read_file")) {
                tools.register(Arc::new(client_fs::ClientReadFile {
                    spec: builtin.spec().clone(),
                    fs: fs.clone(),
                }));
            }
            if let (true, Some(builtin)) = (fs.read && fs.write, tools.get("apply_diff")) {
                tools.register(Arc::new(client_fs::ClientApplyDiff {
                    spec: builtin.spec().clone(),
                    fs: fs.clone(),
                }));
            }
            if let (true, Some(builtin)) = (fs.write, tools.get("write_file")) {
                tools.register(Arc::new(client_fs::ClientWriteFile {
                    spec: builtin.spec().clone(),
                    fs: fs.clone(),
                }));
            }
        }
        let edits = edits::EditView {
            workspace: workspace.clone(),
            cwd: cwd.to_path_buf(),
            fs,
        };
        let diffs = edits::Diffs::default();
        edits::ShowsDiff::wrap(&mut tools, &edits, &diffs);
        if let (true, Some(builtin)) = (caps.terminal, tools.get("run_command")) {
            tools.register(Arc::new(terminal::ClientRunCommand {
                cx: cx.clone(),
                session_id: session_id.clone(),
                workspace: workspace.clone(),
                cwd: cwd.to_path_buf(),
                terminals: terminals.clone(),
                builtin,
            }));
        }
        let configs = mcp_servers.iter().filter_map(|server| match server {
            McpServer::Stdio(stdio) => Some(McpServerConfig {
                args: stdio.args.clone(),
                env: stdio
                    .env
                    .iter()
                    .map(|v| (v.name.clone(), v.value.clone()))
                    .collect(),
                ..McpServerConfig::stdio(&stdio.name, stdio.command.display().to_string())
            }),
            McpServer::Http(http) => Some(McpServerConfig {
                headers: http
                    .headers
                    .iter()
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
                ..McpServerConfig::http(&http.name, &http.url)
            }),
            // Named, with the URL redacted and without headers: either may
            // hold credentials.
            McpServer::Sse(sse) => {
                tracing::warn!(
                    server = %sse.name,
                    url = %mcp::redact_url(&sse.url),
                    "SSE MCP servers are not supported (the transport is deprecated in MCP); \
                     use streamable HTTP"
                );
                None
            }
            // Not shown with `Debug`, which would show whatever credentials
            // the unknown kind holds.
            _ => {
                tracing::warn!("an MCP server of a transport toolwire does not know is left out");
                None
            }
        });
        // connect_all logs each server that failed.
        let launch = mcp::Launch {
            sandbox: self.settings.sandbox.clone(),
            workspace: cwd.to_path_buf(),
        };
        let (servers, _warnings) = mcp::connect_all(configs, &launch).await;
        for server in &servers {
            tools.register_source(server.clone());
        }
        Ok(SessionTools {
            tools,
            cx: cx.clone(),
            additional: additional.into(),
            own_writes: workspace.own_writes().clone(),
            terminals,
            edits,
            diffs,
            tasks,
            mode,
            mcp: servers.into(),
        })
    }

    /// Watches `cwd` and each of the `additional` roots for the session of
    /// `conversation`: each outside change is told to that conversation
    /// only, a change in another root by its absolute path (relative paths
    /// are the cwd's). A root whose watcher cannot start is a warning, not
    /// an error.
    async fn watch(
        &self,
        conversation: ConversationId,
        cwd: &Path,
        additional: &[PathBuf],
        own_writes: &Arc<OwnWrites>,
    ) -> Arc<[WatchHandle]> {
        let Some(settings) = self.settings.watch.clone() else {
            return Arc::from(Vec::new());
        };
        let mut watchers = Vec::with_capacity(1 + additional.len());
        // A change in the cwd is named relative to it; elsewhere, under
        // its root.
        let roots = std::iter::once((cwd, None))
            .chain(additional.iter().map(|r| (r.as_path(), Some(r.clone()))));
        for (root, named) in roots {
            let engine = self.engine.clone();
            // The sink runs on the watcher's own thread; the notification
            // is async.
            let runtime = tokio::runtime::Handle::current();
            let sink = move |event| {
                let engine = engine.clone();
                let event = match &named {
                    Some(root) => roots::beneath(root, event),
                    None => event,
                };
                runtime.spawn(async move {
                    if let Err(e) = engine.notify(conversation, event).await {
                        tracing::debug!(%conversation, error = %e, "a file change was not told");
                    }
                });
            };
            match watch::start_with(root, own_writes.clone(), settings.clone(), sink).await {
                Ok(handle) => watchers.push(handle),
                Err(e) => tracing::warn!(
                    root = %root.display(),
                    error = %e,
                    "file changes in this folder of the session will not be reported"
                ),
            }
        }
        watchers.into()
    }

    async fn insert(
        &self,
        conversation: ConversationId,
        tools: SessionTools,
        cwd: PathBuf,
        permissions: policy::Permissions,
        mcp_servers: Arc<[McpServer]>,
        metrics: TrackerMetrics,
    ) -> SessionId {
        let watchers = self
            .watch(conversation, &cwd, &tools.additional, &tools.own_writes)
            .await;
        let chosen = match self.engine.chosen_model(conversation).await {
            Ok(chosen) => chosen,
            Err(e) => {
                tracing::warn!(%conversation, error = %e, "the session's model could not be read; the default answers");
                None
            }
        };
        let effort = sessions::load(&self.engine, conversation)
            .await
            .and_then(|r| r.reasoning_effort);
        let reasons = config::reasons(&self.engine, chosen.as_deref());
        let id: Arc<str> = conversation.to_string().into();
        let caps = self.client_caps();
        let tracker = TrackerConfig {
            appended_output: caps.terminal_output,
            complete_objects: self.settings.tracker.complete_objects || caps.complete_tool_calls,
            ..self.settings.tracker.clone()
        };
        let session = Session {
            conversation,
            tools: tools.tools,
            terminals: tools.terminals,
            cwd,
            additional: tools.additional,
            edits: tools.edits,
            diffs: tools.diffs,
            permissions: Arc::new(Mutex::new(permissions)),
            cancelled: Arc::default(),
            prompting: Arc::default(),
            policies: self.settings.policies.clone(),
            tracker,
            metrics: Arc::new(Mutex::new(metrics)),
            mcp_servers,
            last_used: Arc::new(AtomicU64::new(self.tick())),
            tasks: tools.tasks,
            model: Arc::new(Mutex::new(chosen)),
            tally: Arc::default(),
            interjected: Arc::default(),
            late_words: state::LateWords::default(),
            turns: Arc::default(),
            waiting: Arc::default(),
            cancels: Arc::default(),
            mode: tools.mode,
            mcp: tools.mcp,
            effort: Arc::new(Mutex::new(effort)),
            model_reasons: Arc::new(std::sync::atomic::AtomicBool::new(reasons)),
            _watchers: watchers,
            shown_through: Arc::default(),
            _woken: Arc::new(self.follow_woken(&id, tools.cx)),
        };
        // Turns the engine starts itself (a waking notification, a late
        // interjection) run with the session's tools and permission
        // policy, even before its first prompt after a load.
        self.engine
            .set_conversation_options(conversation, session.turn_options());
        if let Ok(mut parked) = self.parked.lock() {
            parked.remove(&id);
        }
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(id.clone(), session);
        }
        self.park_idle(Some(&id));
        SessionId::new(id)
    }

    /// Shows the turns the engine starts itself in open session `id`
    /// (`woken`).
    fn follow_woken(&self, id: &Arc<str>, cx: ConnectionTo<Client>) -> state::AbortOnDrop {
        let sessions = self.sessions.clone();
        let key = id.clone();
        woken::follow(
            self.engine.clone(),
            SessionId::new(id.clone()),
            cx,
            move || sessions.lock().ok()?.get(&key).cloned(),
        )
    }

    /// The open session `id`, marked as used now.
    fn session(&self, id: &SessionId) -> Option<Session> {
        let session = self.sessions.lock().ok()?.get(&id.0).cloned()?;
        session.last_used.store(self.tick(), Ordering::SeqCst);
        Some(session)
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// Parks the least recently used sessions not prompting, with no
    /// background task running (and not `keep`, one just opened) until at
    /// most `max_open_sessions` are open: while no other one may go, the
    /// limit is exceeded until a prompt ends or another session opens. A parked session's tools, MCP servers and watcher close with
    /// it; the engine forgets its turn options.
    fn park_idle(&self, keep: Option<&Arc<str>>) {
        let max = self.settings.max_open_sessions.max(1);
        let Ok(mut sessions) = self.sessions.lock() else {
            return;
        };
        while sessions.len() > max {
            let oldest = sessions
                .iter()
                .filter(|(id, s)| {
                    !s.is_prompting()
                        && s.waiting.load(Ordering::SeqCst) == 0
                        && s.tasks.running() == 0
                        && Some(*id) != keep
                })
                .min_by_key(|(_, s)| s.last_used.load(Ordering::SeqCst))
                .map(|(id, _)| id.clone());
            let Some(session) = oldest.and_then(|id| sessions.remove(&id)) else {
                return;
            };
            self.engine
                .forget_conversation_options(session.conversation);
            tracing::info!(
                session = %session.conversation,
                open = sessions.len(),
                "ACP session parked (its next prompt opens it again)"
            );
            if let Ok(mut parked) = self.parked.lock() {
                parked.insert(
                    session.conversation.to_string().into(),
                    Parked {
                        cwd: session.cwd.clone(),
                        additional: session.additional.clone(),
                        mode: session.mode(),
                        mcp_servers: session.mcp_servers.clone(),
                        metrics: session.metrics(),
                    },
                );
            }
        }
    }

    /// The session `id`, opened again if it was parked: its tools, MCP
    /// servers and watcher as when it was created; its "always" answers
    /// from the store.
    async fn open(
        &self,
        id: &SessionId,
        cx: &ConnectionTo<Client>,
    ) -> Result<Session, agent_client_protocol::Error> {
        if let Some(session) = self.session(id) {
            return Ok(session);
        }
        let _one_at_a_time = self.reopening.lock().await;
        if let Some(session) = self.session(id) {
            return Ok(session);
        }
        let unknown = || {
            invalid_params(format!(
                "unknown session `{}`: it is not open in this agent (load or resume it first)",
                id.0
            ))
        };
        let Some(parked) = self.parked.lock().ok().and_then(|mut p| p.remove(&id.0)) else {
            // A session deleted from the history is named as such.
            sessions::stored(&self.engine, id).await?;
            return Err(unknown());
        };
        let conversation = id.0.parse::<ConversationId>().map_err(|_| unknown())?;
        let tools = match self
            .tools_for(
                &parked.cwd,
                &parked.additional,
                &parked.mcp_servers,
                id,
                cx,
                parked.mode,
            )
            .await
        {
            Ok(tools) => tools,
            Err(e) => {
                if let Ok(mut p) = self.parked.lock() {
                    p.insert(id.0.clone(), parked);
                }
                return Err(e);
            }
        };
        let permissions = policy::Permissions::load(&self.engine, conversation).await;
        self.insert(
            conversation,
            tools,
            parked.cwd,
            permissions,
            parked.mcp_servers,
            parked.metrics,
        )
        .await;
        tracing::info!(session = %id.0, "ACP session opened again");
        self.session(id).ok_or_else(unknown)
    }

    fn client_caps(&self) -> ClientCaps {
        self.caps.lock().map(|c| *c).unwrap_or_default()
    }

    /// `_toolwire/notify`: queued for the session's conversation. A
    /// notification cannot be answered, so what goes wrong is logged.
    async fn notify(&self, notification: NotifyNotification, cx: ConnectionTo<Client>) {
        let id = SessionId::new(notification.session_id.clone());
        let session = match self.open(&id, &cx).await {
            Ok(session) => session,
            Err(e) => {
                tracing::warn!(session = %id.0, error = %e, "{}: no such session", notify::METHOD);
                return;
            }
        };
        let incoming = match notification.incoming() {
            Ok(incoming) => incoming,
            Err(e) => {
                tracing::warn!(session = %id.0, error = %e, "{} refused", notify::METHOD);
                return;
            }
        };
        match self.engine.notify(session.conversation, incoming).await {
            Ok(notified) => tracing::info!(session = %id.0, ?notified, "{}", notify::METHOD),
            Err(e) => tracing::warn!(session = %id.0, error = %e, "{} failed", notify::METHOD),
        }
    }

    /// Each session's update metrics, on stderr: the connection is over,
    /// and with it every session.
    fn log_metrics(&self) {
        let Ok(sessions) = self.sessions.lock() else {
            return;
        };
        let parked = self.parked.lock();
        let parked = parked
            .iter()
            .flat_map(|p| p.iter().map(|(id, p)| (id, p.metrics)));
        let open = sessions.iter().map(|(id, s)| (id, s.metrics()));
        for (id, metrics) in open.chain(parked) {
            if metrics.announced > 0 {
                tracing::info!(session = %id, "{}", session_metrics_line(&metrics));
            }
        }
    }

    async fn new_session(
        &self,
        request: NewSessionRequest,
        responder: Responder<NewSessionResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        if let Err(e) = self.check_key() {
            return responder.respond_with_error(e);
        }
        // Checked before a conversation is made for it.
        if let Err(e) = workspace_of(&request.cwd, &request.additional_directories) {
            return responder.respond_with_error(e);
        }
        let conversation = match self.engine.create_conversation(None).await {
            Ok(c) => c.id,
            Err(e) => return responder.respond_with_error(internal(e)),
        };
        let session_id = SessionId::new(conversation.to_string());
        let mode = self.settings.default_mode;
        let tools = match self
            .tools_for(
                &request.cwd,
                &request.additional_directories,
                &request.mcp_servers,
                &session_id,
                &cx,
                mode,
            )
            .await
        {
            Ok(tools) => tools,
            Err(e) => return responder.respond_with_error(e),
        };
        sessions::save(
            &self.engine,
            conversation,
            &sessions::SessionRecord::new(&request.cwd, &request.additional_directories, mode),
        )
        .await;
        let id = self
            .insert(
                conversation,
                tools,
                request.cwd.clone(),
                policy::Permissions::default(),
                request.mcp_servers.clone().into(),
                TrackerMetrics::default(),
            )
            .await;
        tracing::info!(session = %id.0, cwd = %request.cwd.display(), "ACP session/new");
        let options = self.config_options(&id);
        responder.respond(
            NewSessionResponse::new(id.clone())
                .modes(modes::state(mode))
                .config_options(options),
        )?;
        self.announce_commands(id, cx)
    }

    async fn load_session(
        &self,
        request: LoadSessionRequest,
        responder: Responder<LoadSessionResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        let (id, branch, mode) = match self
            .open_stored(
                &request.session_id,
                &request.cwd,
                &request.additional_directories,
                &request.mcp_servers,
                &cx,
            )
            .await
        {
            Ok(opened) => opened,
            Err(e) => return responder.respond_with_error(e),
        };
        tracing::info!(session = %id.0, "ACP session/load");
        // The history first, then the answer (as the protocol asks): each
        // call as its last live update left it, images as images.
        let views = views::load(&self.engine, &branch).await;
        let images = session::replay_images(self.engine.store(), &branch).await;
        for update in session::replay(&branch, &request.cwd, &views, &images) {
            cx.send_notification(SessionNotification::new(id.clone(), update))?;
        }
        responder.respond(
            LoadSessionResponse::new()
                .modes(modes::state(mode))
                .config_options(self.config_options(&id)),
        )?;
        self.announce_commands(id, cx)
    }

    /// Sends session `id`'s slash commands, off the dispatch loop (an MCP
    /// server's prompts are asked for).
    fn announce_commands(&self, id: SessionId, cx: ConnectionTo<Client>) -> AcpResult {
        let Some(session) = self.session(&id) else {
            return Ok(());
        };
        cx.clone().spawn(async move {
            if let Err(e) = commands::send_available(&cx, &id, &session).await {
                tracing::warn!(session = %id.0, error = %e, "the session's commands were not sent");
            }
            Ok(())
        })
    }

    /// Opens stored session `session_id` in `cwd` (for `session/load` and
    /// `session/resume`): a turn left waiting for answers is ended first;
    /// its mode is the stored one. Returns its id, its active branch and
    /// its mode.
    async fn open_stored(
        &self,
        session_id: &SessionId,
        cwd: &Path,
        additional: &[PathBuf],
        mcp_servers: &[McpServer],
        cx: &ConnectionTo<Client>,
    ) -> Result<(SessionId, Vec<toolwire_core::Message>, SessionMode), agent_client_protocol::Error>
    {
        self.check_key()?;
        let (conversation, stored) = sessions::stored(&self.engine, session_id).await?;
        let conversation = conversation.id;
        let store = self.engine.store();
        if self.session(session_id).is_some_and(|s| s.is_prompting()) {
            return Err(invalid_params(
                "a prompt is running in this session: wait for its answer, or cancel it",
            ));
        }
        // Not while the session is being opened again for a prompt.
        let _one_at_a_time = self.reopening.lock().await;
        // A turn left waiting for answers (the agent or the editor went
        // away while asking) would show its calls pending forever and
        // refuse every prompt: its calls are recorded as not run first, so
        // the history shows them ended.
        session::abandon_pending(
            &self.engine,
            conversation,
            "not answered before the session was loaded again",
        )
        .await;
        let branch = match store.conversation(conversation).await {
            Ok(c) => store.path_to(c.active_leaf).await.map_err(internal)?,
            Err(e) => return Err(invalid_params(format!("session: {e}"))),
        };
        let mode = stored
            .as_ref()
            .map_or(self.settings.default_mode, |r| r.mode);
        let tools = self
            .tools_for(cwd, additional, mcp_servers, session_id, cx, mode)
            .await?;
        let permissions = policy::Permissions::load(&self.engine, conversation).await;
        // A parked session's metrics carry over; an open one is replaced.
        let metrics = self
            .session(session_id)
            .map(|s| s.metrics())
            .or_else(|| {
                let parked = self.parked.lock().ok()?;
                parked.get(&session_id.0).map(|p| p.metrics)
            })
            .unwrap_or_default();
        let id = self
            .insert(
                conversation,
                tools,
                cwd.to_path_buf(),
                permissions,
                mcp_servers.to_vec().into(),
                metrics,
            )
            .await;
        // Listed under the cwd and roots it was opened with last.
        sessions::update(&self.engine, conversation, cwd, mode, |r| {
            r.cwd = cwd.to_path_buf();
            r.additional = additional.to_vec();
        })
        .await;
        Ok((id, branch, mode))
    }

    /// The configuration options of open session `id`.
    fn config_options(
        &self,
        id: &SessionId,
    ) -> Vec<agent_client_protocol::v1::schema::SessionConfigOption> {
        self.session(id)
            .map(|session| config::options(&self.engine, &session))
            .unwrap_or_default()
    }

    /// `session/set_config_option`: the model picker.
    async fn set_config_option(
        &self,
        request: SetSessionConfigOptionRequest,
        responder: Responder<SetSessionConfigOptionResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        let session = match self.open(&request.session_id, &cx).await {
            Ok(session) => session,
            Err(e) => return responder.respond_with_error(e),
        };
        let mode_before = session.mode();
        if let Err(e) = config::set(&self.engine, &session, &request).await {
            return responder.respond_with_error(e);
        }
        tracing::info!(session = %request.session_id.0, option = %request.config_id.0, "ACP session/set_config_option");
        responder.respond(SetSessionConfigOptionResponse::new(config::options(
            &self.engine,
            &session,
        )))?;
        // The mode picker follows the mode option.
        if session.mode() != mode_before {
            history::send_mode(&cx, &request.session_id, session.mode())?;
        }
        Ok(())
    }

    /// Starts the turn outside the dispatch loop (so that `session/cancel`
    /// gets through while it runs); the turn answers the prompt.
    fn prompt(
        &self,
        request: PromptRequest,
        responder: Responder<PromptResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        // A parked session is opened again first (off the dispatch loop);
        // a cancel that comes meanwhile answers the prompt `cancelled`.
        let Some(session) = self.session(&request.session_id) else {
            let id = request.session_id.0.clone();
            if let Ok(mut waiting) = self.waiting_prompts.lock() {
                waiting.insert(id.clone(), false);
            }
            let agent = self.clone();
            return cx.clone().spawn(async move {
                let opened = agent.open(&request.session_id, &cx).await;
                let cancelled = agent
                    .waiting_prompts
                    .lock()
                    .ok()
                    .and_then(|mut w| w.remove(&id))
                    .unwrap_or(false);
                match opened {
                    Ok(_) if cancelled => {
                        responder.respond(PromptResponse::new(StopReason::Cancelled))
                    }
                    Ok(session) => agent.start_prompt(session, request, responder, cx),
                    Err(e) => responder.respond_with_error(e),
                }
            });
        };
        self.start_prompt(session, request, responder, cx)
    }

    /// Runs `request` in `session`: at once when nothing runs there;
    /// otherwise after the running prompt (queued), or, with
    /// `prompt_while_running = "interject"`, as words for the running
    /// turn, answered when it ends. Never refused for the running one.
    fn start_prompt(
        &self,
        session: Session,
        request: PromptRequest,
        responder: Responder<PromptResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        let engine = self.engine.clone();
        let agent = self.clone();
        let interject = self.settings.prompt_while_running == PromptWhileRunning::Interject;
        // A cancel after this also cancels this prompt, should it wait.
        let cancels = session.cancels.load(Ordering::SeqCst);
        let session_id = request.session_id.clone();
        cx.clone().spawn(async move {
            // Counted from now until it holds the session's turn: a
            // session with prompts on their way is not parked under them.
            let waiting = state::Waiting::new(&session);
            // Checked (and images stored) before it waits: bad input is
            // answered at once, and the session stays usable.
            let (mut content, mut text) = match prompt::content(&engine, &session, &request.prompt).await
            {
                Ok(converted) => converted,
                Err(e) => return responder.respond_with_error(e),
            };
            let has_images = prompt::has_images(&content);
            // How a prompt whose words joined a running turn ends once
            // that turn is over: cancelled if the editor cancelled since
            // the prompt came, else end_turn.
            let ended_as = |session: &Session| {
                if session.cancels.load(Ordering::SeqCst) == cancels {
                    StopReason::EndTurn
                } else {
                    StopReason::Cancelled
                }
            };
            // The session's turn, when taken while words waited for it.
            let mut held = None;
            // Not into a turn being cancelled: a prompt sent after the
            // cancel runs on its own, after it.
            if interject
                && !has_images
                && session.is_prompting()
                && !session.cancelled.load(Ordering::SeqCst)
            {
                // Counted before the words are queued: should the running
                // turn end without reading them, the running prompt follows
                // the turn they start.
                session.interjected.fetch_add(1, Ordering::SeqCst);
                let queued = engine.interject_running(session.conversation, &text).await;
                if !matches!(queued, Ok(true)) {
                    state::uncount(&session.interjected);
                }
                match queued {
                    Ok(true) => {
                        tracing::info!(session = %session_id.0, "ACP prompt interjected into the running turn");
                        // It starts no turn of its own.
                        drop(waiting);
                        // Answered once the turn that reads it has ended.
                        let _ended = session.turns.clone().lock_owned().await;
                        return responder.respond(PromptResponse::new(ended_as(&session)));
                    }
                    // No turn runs (the running prompt is ending): a prompt
                    // of its own, queued. (Starting a turn here would leave
                    // it to whichever prompt saw its start first.)
                    Ok(false) => {}
                    // The running prompt's turn waits for the editor's
                    // permission answer: the words join the turn that goes
                    // on after it (handed over by the running prompt), and
                    // this prompt is answered when that turn ends.
                    Err(toolwire_engine::EngineError::ApprovalPending { .. }) => {
                        let ticket = session.late_words.add(&text);
                        tracing::info!(session = %session_id.0, "ACP prompt kept for the turn paused for a permission answer");
                        let turn = session.turns.clone().lock_owned().await;
                        if !session.late_words.withdraw(ticket) {
                            return responder.respond(PromptResponse::new(ended_as(&session)));
                        }
                        // Never handed over (the turn was cancelled, or did
                        // not go on): a prompt of its own, as if queued.
                        held = Some(turn);
                    }
                    Err(e) => return responder.respond_with_error(internal(e)),
                }
            }
            // A session with prompts waiting is not parked under them.
            let _turn = match held {
                Some(turn) => turn,
                None => session.turns.clone().lock_owned().await,
            };
            drop(waiting);
            if session.cancels.load(Ordering::SeqCst) != cancels {
                return responder.respond(PromptResponse::new(StopReason::Cancelled));
            }
            let Some(running) = session.start_prompt() else {
                return responder.respond_with_error(invalid_params(
                    "a prompt is already running in this session: wait for its answer, or cancel it",
                ));
            };
            session.cancelled.store(false, Ordering::SeqCst);
            // A slash command runs in its turn; an MCP prompt's makes the
            // text (the prompt's images kept after it).
            match agent.run_command(&session, &session_id, text.clone(), &cx).await {
                Ok(commands::Outcome::Prompt(made)) if made != text => {
                    content.retain(|b| !matches!(b, toolwire_core::ContentBlock::Text { .. }));
                    content.insert(0, toolwire_core::ContentBlock::Text { text: made.clone() });
                    text = made;
                }
                Ok(commands::Outcome::Prompt(_)) => {}
                Ok(commands::Outcome::Answered(response)) => {
                    drop(running);
                    return responder.respond(response);
                }
                Err(e) => {
                    drop(running);
                    return responder.respond_with_error(e);
                }
            }
            let start = session::Start::Send(content);
            let answer =
                session::run_prompt(&engine, &session, session_id.clone(), start, &text, &cx)
                    .await;
            // Listed as used now, titled by its first prompt.
            sessions::touch(
                &engine,
                session.conversation,
                &session.cwd,
                session.mode(),
                &text,
            )
            .await;
            // Before the answer: the client may send its next prompt as
            // soon as it reads it.
            drop(running);
            // Sessions left open past the limit while others prompted.
            agent.park_idle(None);
            match answer {
                Ok(response) => responder.respond(response),
                Err(e) => {
                    tracing::warn!(session = %session_id.0, error = %e, "ACP session/prompt failed");
                    responder.respond_with_error(e)
                }
            }
        })
    }

    fn cancel(&self, id: &SessionId) {
        if let Some(session) = self.session(id) {
            session.cancels.fetch_add(1, Ordering::SeqCst);
            session.cancelled.store(true, Ordering::SeqCst);
            let was_running = self.engine.cancel(session.conversation);
            tracing::info!(session = %id.0, was_running, "ACP session/cancel");
        } else if let Some(cancelled) = self
            .waiting_prompts
            .lock()
            .ok()
            .as_mut()
            .and_then(|w| w.get_mut(&id.0))
        {
            *cancelled = true;
            tracing::info!(session = %id.0, "ACP session/cancel (while the session opens)");
        } else {
            tracing::warn!(session = %id.0, "ACP session/cancel: unknown session");
        }
    }
}
