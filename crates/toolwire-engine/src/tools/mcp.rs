//! MCP tools: the tools of Model Context Protocol servers run as child
//! processes (stdio transport, `rmcp` client), shown to the model as
//! `{server}__{tool}`.
//!
//! An [`McpServer`] is a [`ToolSource`]: its tool list is read when the
//! process starts (again on every restart) and whenever the server sends
//! `notifications/tools/list_changed`, and a registry holding the server
//! shows the model the list as it is now.
//!
//! A server that dies is not fatal: a call that was running when it died
//! fails with an error naming the server, and the next call starts it again
//! (spawn, initialize, list) before running. Failures in a row back off
//! (see [`Backoff`]) so a server that cannot start is not spawned again by
//! every call. Servers that cannot start at all are reported as warnings by
//! [`connect_all`] and the engine runs without their tools.
//!
//! Every call carries a progress token (rmcp puts one in each request's
//! `_meta`); the server's `notifications/progress` for it become the call's
//! progress, as text like `3/5 (60%): message`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientRequest, ContentBlock,
    ErrorCode, Implementation, ProgressNotificationParam, ProgressToken, RequestId,
    ResourceContents, ServerResult,
};
use rmcp::service::{
    ClientInitializeError, NotificationContext, PeerRequestOptions, RunningService,
};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::tools::{
    ProgressHandle, Tool, ToolContext, ToolError, ToolOutput, ToolSource, ToolSpec,
};

/// How long one tool call may run when the config does not say: long enough
/// for real work (builds, searches), short enough that a hung server does not
/// hold a turn forever.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Spawn + `initialize` (+ listing tools). Generous because `npx -y …`
/// downloads the server on first use.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The wait after the first failure that backs off; it doubles with each
/// further failure in a row.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two starts of a failing server: a server fixed
/// while toolwire runs is picked up within a minute.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// OpenAI (and others) accept tool names matching `^[a-zA-Z0-9_-]{1,64}$`.
const MAX_NAME_LEN: usize = 64;
/// Lines of the server's stderr kept to explain why it died.
const STDERR_TAIL_LINES: usize = 10;
/// A kept stderr line is cut here so a chatty server cannot bloat errors.
const STDERR_LINE_MAX: usize = 400;
/// How long an error waits for the rest of a dead server's stderr.
const STDERR_SETTLE: Duration = Duration::from_millis(500);
/// Progress notifications kept for a token no call has claimed yet.
const EARLY_PROGRESS_KEPT: usize = 16;

/// One MCP server from the config: `[mcp_servers.NAME]` with `command`,
/// `args` and `env` (added to toolwire's own environment).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of the server's tool names; in TOML it is the table's key.
    #[serde(default)]
    pub name: String,
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds one tool call may take [default: 120].
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Why an MCP server could not be used. Messages name the server: they end
/// up in logs, startup warnings and tool results.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP server `{server}` could not be started (`{command}`): {source}")]
    Spawn {
        server: String,
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("MCP server `{server}` failed to initialize: {source}{stderr}")]
    Initialize {
        server: String,
        /// Boxed: rmcp's error is large and this path is rare.
        #[source]
        source: Box<ClientInitializeError>,
        stderr: String,
    },
    #[error("MCP server `{server}` did not start within {secs} s{stderr}")]
    StartTimedOut {
        server: String,
        secs: u64,
        stderr: String,
    },
    #[error("MCP server `{server}` failed to list its tools: {source}")]
    ListTools {
        server: String,
        #[source]
        source: ServiceError,
    },
    #[error("MCP server `{server}` exited: {detail}")]
    Exited { server: String, detail: String },
    #[error(
        "MCP server `{server}` is not restarted yet: it failed {failures} time{} in a row; \
         it will be restarted by the first use in {} or later (last failure: {last})",
        plural(*.failures),
        seconds(*.retry_in)
    )]
    BackingOff {
        server: String,
        failures: u32,
        retry_in: Duration,
        last: String,
    },
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `1.0 s`, `59.5 s`: precise enough for a person deciding whether to wait.
fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// Starts every server and lists its tools. A server that fails is reported
/// in the second list (one message each) and does not stop the others:
/// a broken MCP server should cost its tools, not the engine. Register the
/// servers with [`ToolRegistry::register_source`](crate::tools::ToolRegistry::register_source)
/// so that changes to their tool lists reach the model.
pub async fn connect_all(
    configs: impl IntoIterator<Item = McpServerConfig>,
) -> (Vec<Arc<McpServer>>, Vec<String>) {
    let started = futures::future::join_all(configs.into_iter().map(|config| async move {
        let server = McpServer::new(config);
        server.tools().await.map(|_| server)
    }))
    .await;
    let mut servers = Vec::new();
    let mut warnings = Vec::new();
    for result in started {
        match result {
            Ok(server) => servers.push(server),
            Err(error) => {
                tracing::warn!("{error}");
                warnings.push(error.to_string());
            }
        }
    }
    (servers, warnings)
}

/// A live connection: the rmcp client (which owns the child process and
/// kills it when dropped) and what we know about the process.
struct Connection {
    client: RunningService<RoleClient, Client>,
    pid: Option<u32>,
    stderr: StderrTail,
}

/// One tool as the server listed it.
struct Listed {
    /// The name the server knows the tool by.
    tool: String,
    spec: ToolSpec,
}

/// The current tool list and the process that listed it.
#[derive(Default)]
struct Listing {
    epoch: u64,
    tools: Vec<Arc<Listed>>,
}

/// Handle on one MCP server, shared by its tools. Holds at most one running
/// process; (re)starts it on demand.
pub struct McpServer {
    config: McpServerConfig,
    call_timeout: Duration,
    /// For the tools handed out and for each connection's handler, which
    /// must not keep the server (and so its process) alive by itself.
    me: Weak<McpServer>,
    /// A tokio mutex because starting awaits; concurrent calls wait for one
    /// start instead of each spawning a process.
    connection: Mutex<Option<Arc<Connection>>>,
    /// A std mutex: never held across an await, so a call that ends never
    /// waits for a start in progress to record its outcome.
    backoff: StdMutex<Backoff>,
    /// Numbers the processes, so that a list read from an old process
    /// cannot replace one read from a newer process.
    epochs: AtomicU64,
    /// Read synchronously by the registry; holds specs only (tools are made
    /// on demand) so the server is not kept alive by its own list.
    listing: RwLock<Listing>,
    /// One `tools/list` at a time: an answer to an older request cannot
    /// land after the answer to a newer one.
    listing_read: Mutex<()>,
    /// Counts the reads of the tool list, for whoever shows the tools and
    /// wants to know when to look again.
    list_reads: watch::Sender<u64>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.config.name)
            .field("command", &self.config.command)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// A handle; nothing starts until the first use.
    pub fn new(config: McpServerConfig) -> Arc<Self> {
        let call_timeout = config
            .timeout_secs
            .map_or(DEFAULT_CALL_TIMEOUT, Duration::from_secs);
        Arc::new_cyclic(|me| McpServer {
            config,
            call_timeout,
            me: me.clone(),
            connection: Mutex::new(None),
            backoff: StdMutex::new(Backoff::default()),
            epochs: AtomicU64::new(0),
            listing: RwLock::new(Listing::default()),
            listing_read: Mutex::new(()),
            list_reads: watch::Sender::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Starts the server if needed and returns its tools (all pages of
    /// `tools/list`, as last read).
    pub async fn tools(&self) -> Result<Vec<Arc<dyn Tool>>, McpError> {
        self.connection().await?;
        Ok(self.current_tools())
    }

    /// A receiver whose value counts the reads of the tool list (at each
    /// start and on each `notifications/tools/list_changed`): it changes
    /// whenever the tools may have changed, for whoever shows them.
    pub fn watch_tool_list(&self) -> watch::Receiver<u64> {
        self.list_reads.subscribe()
    }

    /// The process id of the running server, if one runs (for diagnostics
    /// and tests).
    pub async fn pid(&self) -> Option<u32> {
        let slot = self.connection.lock().await;
        slot.as_ref()
            .filter(|c| !c.client.is_transport_closed())
            .and_then(|c| c.pid)
    }

    /// Whether a server process is connected and its transport still open.
    pub async fn is_running(&self) -> bool {
        let slot = self.connection.lock().await;
        slot.as_ref()
            .is_some_and(|c| !c.client.is_transport_closed())
    }

    /// Stops the server (it starts again on next use).
    pub async fn shutdown(&self) {
        let taken = self.connection.lock().await.take();
        if let Some(connection) = taken
            && let Ok(mut connection) = Arc::try_unwrap(connection)
        {
            let _ = connection.client.close_with_timeout(STARTUP_TIMEOUT).await;
        }
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live connection, starting (or restarting) the server if it is
    /// not running and its backoff allows.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let server = &self.config.name;
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            if !connection.client.is_transport_closed() {
                return Ok(Arc::clone(connection));
            }
            connection.stderr.settle().await;
            let why = format!("exited while idle{}", connection.stderr.describe());
            let wait = self.backoff().exited(Instant::now(), why.clone());
            tracing::warn!(server = %server, "MCP server `{server}` {why}; {}", restart_note(wait));
            *slot = None;
        }
        if let Some(error) = self.backoff().holding_back(Instant::now(), server) {
            return Err(error);
        }
        match self.start().await {
            Ok(connection) => {
                let connection = Arc::new(connection);
                tracing::info!(server = %server, pid = ?connection.pid, "MCP server started");
                *slot = Some(Arc::clone(&connection));
                Ok(connection)
            }
            Err(error) => {
                let wait = self.backoff().failed(Instant::now(), error.to_string());
                tracing::warn!(server = %server, "{error}; the first use in {} or later tries again", seconds(wait));
                Err(error)
            }
        }
    }

    /// Spawns the process, runs the MCP handshake and reads the tool list
    /// (a restarted server may offer other tools than the process before).
    async fn start(&self) -> Result<Connection, McpError> {
        let config = &self.config;
        let mut command = tokio::process::Command::new(&config.command);
        command.args(&config.args).envs(&config.env);
        let spawn_error = |source| McpError::Spawn {
            server: config.name.clone(),
            command: config.command.clone(),
            source,
        };
        // stderr is piped (not inherited) so a server cannot write into a
        // terminal UI, and so its last words can explain a crash.
        let (transport, stderr) = TokioChildProcess::builder(command)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let pid = transport.id();
        let tail = StderrTail::default();
        if let Some(stderr) = stderr {
            tail.follow(config.name.clone(), stderr);
        }
        let epoch = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
        let client = Client {
            info: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("toolwire", env!("CARGO_PKG_VERSION")),
            ),
            server: self.me.clone(),
            epoch,
            progress: ProgressRoutes::default(),
        };
        // On error or timeout the transport is dropped, which kills the child.
        let client = match tokio::time::timeout(STARTUP_TIMEOUT, client.serve(transport)).await {
            Ok(Ok(client)) => client,
            Ok(Err(source)) => {
                tail.settle().await;
                return Err(McpError::Initialize {
                    server: config.name.clone(),
                    source: Box::new(source),
                    stderr: tail.describe(),
                });
            }
            Err(_) => {
                return Err(McpError::StartTimedOut {
                    server: config.name.clone(),
                    secs: STARTUP_TIMEOUT.as_secs(),
                    stderr: tail.describe(),
                });
            }
        };
        self.read_tool_list(client.peer(), epoch).await?;
        Ok(Connection {
            client,
            pid,
            stderr: tail,
        })
    }

    /// Reads the tool list of process `epoch` through `peer` and makes it
    /// the current list, unless a newer process has been listed since.
    async fn read_tool_list(&self, peer: &Peer<RoleClient>, epoch: u64) -> Result<(), McpError> {
        let server = &self.config.name;
        let _one_at_a_time = self.listing_read.lock().await;
        let listed = match tokio::time::timeout(STARTUP_TIMEOUT, peer.list_all_tools()).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(source)) => {
                return Err(McpError::ListTools {
                    server: server.clone(),
                    source,
                });
            }
            Err(_) => {
                return Err(McpError::ListTools {
                    server: server.clone(),
                    source: ServiceError::Timeout {
                        timeout: STARTUP_TIMEOUT,
                    },
                });
            }
        };
        let mut used = HashSet::new();
        let mut tools = Vec::with_capacity(listed.len());
        for tool in listed {
            let mut name = tool_name(server, &tool.name);
            if !used.insert(name.clone()) {
                // Two MCP names sanitized to the same string: the hashed
                // form keeps both, and stays stable across restarts.
                name = hashed_name(&format!("{server}__{}", tool.name));
                used.insert(name.clone());
            }
            let description = tool
                .description
                .as_deref()
                .map(str::to_owned)
                .or(tool.title.clone())
                .unwrap_or_default();
            let read_only = tool
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false);
            tools.push(Arc::new(Listed {
                tool: tool.name.to_string(),
                spec: ToolSpec {
                    name,
                    server: Some(server.clone()),
                    description,
                    parameters: Value::Object((*tool.input_schema).clone()),
                    read_only,
                },
            }));
        }
        {
            let mut listing = self.listing.write().unwrap_or_else(PoisonError::into_inner);
            if listing.epoch > epoch {
                return Ok(());
            }
            *listing = Listing { epoch, tools };
        }
        self.list_reads.send_modify(|reads| *reads += 1);
        tracing::debug!(server = %server, epoch, "MCP tool list read");
        Ok(())
    }

    /// Drops `dead` from the slot if it is still there (so the next call
    /// starts a fresh process; dropping the client kills what is left).
    /// Returns whether it was: only the first to notice a death counts it.
    async fn forget(&self, dead: &Arc<Connection>) -> bool {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
            *slot = None;
            return true;
        }
        false
    }

    async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        progress: &ProgressHandle,
    ) -> CallResult {
        let connection = self
            .connection()
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let call = call_tool(&connection, params, progress);
        match tokio::time::timeout(self.call_timeout, call).await {
            Err(_) => Err(ToolError::TimedOut(self.call_timeout.as_secs())),
            Ok(Ok(result)) => {
                self.backoff().succeeded();
                Ok(tool_output(result))
            }
            Ok(Err(error)) => Err(self.call_error(&connection, error).await),
        }
    }

    async fn call_error(&self, connection: &Arc<Connection>, error: ServiceError) -> ToolError {
        let server = &self.config.name;
        match error {
            ServiceError::McpError(data) if data.code == ErrorCode::INVALID_PARAMS => {
                self.backoff().succeeded();
                ToolError::InvalidArguments(format!("MCP server `{server}`: {}", data.message))
            }
            ServiceError::McpError(data) => {
                // The server answered: it works, whatever this call's fate.
                self.backoff().succeeded();
                ToolError::Failed(format!("MCP server `{server}`: {}", data.message))
            }
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                connection.stderr.settle().await;
                let stderr = connection.stderr.describe();
                let why = format!("connection lost during the call ({error})");
                let wait = if self.forget(connection).await {
                    self.backoff()
                        .exited(Instant::now(), format!("{why}{stderr}"))
                } else {
                    self.backoff().waiting(Instant::now()).unwrap_or_default()
                };
                let detail = format!("{why}; {}{stderr}", restart_note(wait));
                tracing::warn!(server = %server, "MCP server `{server}` exited: {detail}");
                ToolError::Failed(
                    McpError::Exited {
                        server: server.clone(),
                        detail,
                    }
                    .to_string(),
                )
            }
            other => ToolError::Failed(format!("MCP server `{server}`: {other}")),
        }
    }
}

impl ToolSource for McpServer {
    fn current_tools(&self) -> Vec<Arc<dyn Tool>> {
        let Some(server) = self.me.upgrade() else {
            return Vec::new();
        };
        let listing = self.listing.read().unwrap_or_else(PoisonError::into_inner);
        listing
            .tools
            .iter()
            .map(|listed| McpTool::shared(&server, listed))
            .collect()
    }

    fn current_tool(&self, name: &str) -> Option<Arc<dyn Tool>> {
        let server = self.me.upgrade()?;
        let listing = self.listing.read().unwrap_or_else(PoisonError::into_inner);
        listing
            .tools
            .iter()
            .find(|listed| listed.spec.name == name)
            .map(|listed| McpTool::shared(&server, listed))
    }
}

type CallResult = Result<ToolOutput, ToolError>;

/// `tools/call` with the request's progress token routed to `progress`.
/// rmcp's `call_tool` would send the same request, but it does not say
/// which progress token it put in the request's `_meta`.
async fn call_tool(
    connection: &Connection,
    params: CallToolRequestParams,
    progress: &ProgressHandle,
) -> Result<CallToolResult, ServiceError> {
    let client = &connection.client;
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
    let handle = client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await?;
    let _route = client
        .service()
        .progress
        .route(handle.progress_token.clone(), progress.clone());
    let mut cancel = CancelOnDrop {
        peer: handle.peer.clone(),
        request: Some(handle.id.clone()),
    };
    let response = handle.await_response().await;
    cancel.request = None;
    match response? {
        ServerResult::CallToolResult(result) => Ok(result),
        // The server wants input first (MRTR): each round is a new
        // `tools/call` by design, so rmcp's driver, which answers the
        // rounds through this client's handler, can start over (without
        // progress for the rounds).
        ServerResult::InputRequiredResult(_) => client.call_tool(params).await,
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// Sends `notifications/cancelled` for a request whose caller stopped
/// waiting (timeout, cancelled turn) so the server can stop working on it,
/// as rmcp's own `call_tool` does.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    request: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        // Sending awaits; a drop cannot, so a task sends it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let params = CancelledNotificationParam::new(
                Some(request),
                Some("the caller stopped waiting".to_owned()),
            );
            let _ = peer
                .send_notification(CancelledNotification::new(params).into())
                .await;
        });
    }
}

/// When a failed server may be started again.
///
/// A server that was working and exits is restarted at once on its next
/// use (one crash says little). Every further failure in a row — a start
/// that fails, or a restarted process that exits before a call succeeds —
/// holds starts back: [`BACKOFF_FIRST`] after the first, doubling up to
/// [`BACKOFF_MAX`]. Without it a server that cannot start would be spawned
/// again by every call the model makes. A call that gets an answer resets
/// it.
#[derive(Debug, Default)]
struct Backoff {
    /// Failures in a row that hold starts back.
    failures: u32,
    /// The immediate restart has been used since the last answered call.
    restarted: bool,
    retry_at: Option<Instant>,
    /// The last failure, for the error shown while starts are held back.
    last: String,
}

impl Backoff {
    /// A process that had started exited. Returns how long until it may be
    /// started again.
    fn exited(&mut self, now: Instant, why: String) -> Duration {
        if self.failures == 0 && !self.restarted {
            self.restarted = true;
            self.last = why;
            return Duration::ZERO;
        }
        self.failed(now, why)
    }

    /// A start failed. Returns how long until the next may be tried.
    fn failed(&mut self, now: Instant, why: String) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = backoff_delay(self.failures);
        self.retry_at = Some(now + wait);
        self.last = why;
        wait
    }

    fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    /// How long starts are still held back, if they are.
    fn waiting(&self, now: Instant) -> Option<Duration> {
        let wait = self.retry_at?.saturating_duration_since(now);
        (!wait.is_zero()).then_some(wait)
    }

    /// The error for a use while starts are held back.
    fn holding_back(&self, now: Instant, server: &str) -> Option<McpError> {
        let retry_in = self.waiting(now)?;
        Some(McpError::BackingOff {
            server: server.to_owned(),
            failures: self.failures,
            retry_in,
            last: self.last.clone(),
        })
    }
}

/// The wait after `failures` failures in a row (1 or more).
fn backoff_delay(failures: u32) -> Duration {
    // 2^6 s is past the cap already; the bound keeps the shift in range.
    let doublings = failures.saturating_sub(1).min(6);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
}

fn restart_note(wait: Duration) -> String {
    if wait.is_zero() {
        "it restarts on next use".to_owned()
    } else {
        format!("it restarts on the first use in {} or later", seconds(wait))
    }
}

/// The rmcp client handler of one connection: takes the server's
/// notifications.
struct Client {
    info: ClientConfig,
    server: Weak<McpServer>,
    /// The process this connection talks to.
    epoch: u64,
    progress: ProgressRoutes,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.deliver(params);
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let Some(server) = self.server.upgrade() else {
            return;
        };
        tracing::info!(server = %server.name(), "MCP server changed its tools; reading the list again");
        if let Err(error) = server.read_tool_list(&context.peer, self.epoch).await {
            tracing::warn!(server = %server.name(), "{error}; keeping the list read before");
        }
    }
}

/// Where the progress notifications of one connection go: the progress
/// handle of the call whose request carried the token.
#[derive(Default)]
struct ProgressRoutes(StdMutex<Routes>);

#[derive(Default)]
struct Routes {
    calls: HashMap<ProgressToken, Route>,
    /// Notifications for tokens no call has claimed: the server can answer
    /// before the call has registered its token.
    early: VecDeque<ProgressNotificationParam>,
}

struct Route {
    handle: ProgressHandle,
    last: Option<f64>,
}

impl Route {
    /// The text to report, or `None` for a notification that does not
    /// advance: each is handled on its own task so they can arrive out of
    /// order, and progress must increase.
    fn advance(&mut self, params: &ProgressNotificationParam) -> Option<String> {
        if self.last.is_some_and(|last| params.progress <= last) {
            return None;
        }
        self.last = Some(params.progress);
        Some(progress_text(
            params.progress,
            params.total,
            params.message.as_deref(),
        ))
    }
}

impl ProgressRoutes {
    fn lock(&self) -> MutexGuard<'_, Routes> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the progress of the request with `token` to `handle` until the
    /// returned guard is dropped.
    fn route(&self, token: ProgressToken, handle: ProgressHandle) -> RouteGuard<'_> {
        let mut route = Route {
            handle: handle.clone(),
            last: None,
        };
        let mut reports = Vec::new();
        {
            let mut routes = self.lock();
            let early = std::mem::take(&mut routes.early);
            for params in early {
                if params.progress_token == token {
                    reports.extend(route.advance(&params));
                } else {
                    routes.early.push_back(params);
                }
            }
            routes.calls.insert(token.clone(), route);
        }
        for text in reports {
            handle.status(text);
        }
        RouteGuard {
            routes: self,
            token,
        }
    }

    fn deliver(&self, params: ProgressNotificationParam) {
        let mut routes = self.lock();
        let Some(route) = routes.calls.get_mut(&params.progress_token) else {
            if routes.early.len() == EARLY_PROGRESS_KEPT {
                routes.early.pop_front();
            }
            routes.early.push_back(params);
            return;
        };
        if let Some(text) = route.advance(&params) {
            let handle = route.handle.clone();
            drop(routes);
            handle.status(text);
        }
    }
}

struct RouteGuard<'a> {
    routes: &'a ProgressRoutes,
    token: ProgressToken,
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        self.routes.lock().calls.remove(&self.token);
    }
}

/// `3/5 (60%)`, `3/5 (60%): copying`, `progress 3` when the total is
/// unknown. `f64` prints `3`, not `3.0`.
fn progress_text(progress: f64, total: Option<f64>, message: Option<&str>) -> String {
    let mut text = match total {
        Some(total) if total > 0.0 => {
            format!("{progress}/{total} ({:.0}%)", progress / total * 100.0)
        }
        _ => format!("progress {progress}"),
    };
    if let Some(message) = message.map(str::trim).filter(|m| !m.is_empty()) {
        text.push_str(": ");
        text.push_str(message);
    }
    text
}

/// The last lines a server wrote to stderr. Everything it writes also goes
/// to `tracing` at debug level.
#[derive(Clone, Default)]
struct StderrTail {
    lines: Arc<StdMutex<VecDeque<String>>>,
    /// Cancelled when the reader saw the end of stderr.
    done: CancellationToken,
}

impl StderrTail {
    fn follow(&self, server: String, stderr: ChildStderr) {
        let lines = Arc::clone(&self.lines);
        let done = self.done.clone();
        tokio::spawn(async move {
            let _done = done.drop_guard();
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                tracing::debug!(server = %server, "MCP server stderr: {line}");
                let line = cut(&line, STDERR_LINE_MAX).to_owned();
                let mut lines = lines.lock().unwrap_or_else(PoisonError::into_inner);
                if lines.len() == STDERR_TAIL_LINES {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
        });
    }

    /// A dead process's last words may still be in the pipe when its death
    /// is noticed: waits (briefly) until the reader has seen the end.
    async fn settle(&self) {
        let _ = tokio::time::timeout(STDERR_SETTLE, self.done.cancelled()).await;
    }

    /// `"; stderr: …"`, or nothing when the server wrote nothing.
    fn describe(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.is_empty() {
            return String::new();
        }
        let joined: Vec<&str> = lines.iter().map(String::as_str).collect();
        format!("; stderr: {}", joined.join(" | "))
    }
}

/// One MCP tool of one server, as last listed.
struct McpTool {
    server: Arc<McpServer>,
    listed: Arc<Listed>,
}

impl McpTool {
    fn shared(server: &Arc<McpServer>, listed: &Arc<Listed>) -> Arc<dyn Tool> {
        Arc::new(McpTool {
            server: Arc::clone(server),
            listed: Arc::clone(listed),
        })
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.listed.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let arguments = match arguments {
            // Models send `null` for "no arguments".
            Value::Null => serde_json::Map::new(),
            Value::Object(map) => map,
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "arguments must be a JSON object, got {other}"
                )));
            }
        };
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
            result = self.server.call(&self.listed.tool, arguments, &ctx.progress) => result,
        }
    }
}

/// What the model sees of a result: text items as they are, other items as
/// a short marker (the model cannot use base64 payloads).
fn tool_output(result: CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = Vec::with_capacity(result.content.len());
    for block in result.content {
        parts.push(match block {
            ContentBlock::Text(text) => text.text,
            ContentBlock::Image(image) => format!("[image: {}]", image.mime_type),
            ContentBlock::Audio(audio) => format!("[audio: {}]", audio.mime_type),
            ContentBlock::Resource(embedded) => match embedded.resource {
                // The text of an embedded text resource is the answer (a file
                // read, say); keep it after its uri.
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource: {uri}]\n{text}")
                }
                ResourceContents::BlobResourceContents { uri, mime_type, .. } => match mime_type {
                    Some(mime) => format!("[resource: {uri} ({mime})]"),
                    None => format!("[resource: {uri}]"),
                },
                _ => "[resource]".to_owned(),
            },
            ContentBlock::ResourceLink(link) => format!("[resource: {}]", link.uri),
            _ => "[unsupported content]".to_owned(),
        });
    }
    if parts.is_empty()
        && let Some(structured) = result.structured_content
    {
        parts.push(structured.to_string());
    }
    ToolOutput {
        content: parts.join("\n"),
        is_error: result.is_error.unwrap_or(false),
    }
}

/// The registry name of `tool` of `server`: `{server}__{tool}` with every
/// character outside `[a-zA-Z0-9_-]` replaced by `_`; names longer than 64
/// are cut and end in a hash of the full name so they stay unique and
/// stable.
pub fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("{server}__{tool}");
    let clean: String = full.chars().map(sanitize).collect();
    if clean.is_empty() || clean.len() > MAX_NAME_LEN {
        return hashed_name(&full);
    }
    clean
}

fn sanitize(c: char) -> char {
    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
        c
    } else {
        '_'
    }
}

/// At most 64 characters: a sanitized prefix, `_`, 8 hex digits of FNV-1a.
fn hashed_name(full: &str) -> String {
    let hash = full.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let prefix: String = full.chars().map(sanitize).take(MAX_NAME_LEN - 9).collect();
    format!("{prefix}_{hash:08x}")
}

/// The longest prefix of `s` of at most `max` bytes ending on a char
/// boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_api_safe() {
        assert_eq!(tool_name("everything", "echo"), "everything__echo");
        assert_eq!(
            tool_name("my server", "get.thing/v2"),
            "my_server__get_thing_v2"
        );
        let long = tool_name("server", &"x".repeat(100));
        assert_eq!(long.len(), MAX_NAME_LEN);
        assert!(
            long.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
        assert_ne!(long, tool_name("server", &"x".repeat(101)));
        assert_eq!(long, tool_name("server", &"x".repeat(100)));
    }

    #[test]
    fn config_from_toml_shape() {
        let config: McpServerConfig = serde_json::from_value(serde_json::json!({
            "command": "node",
            "args": ["server.js"],
            "env": {"A": "1"}
        }))
        .unwrap_or_default();
        assert_eq!(config.command, "node");
        assert_eq!(config.args, ["server.js"]);
        assert_eq!(config.env.get("A").map(String::as_str), Some("1"));
    }

    #[test]
    fn backoff_doubles_from_one_second_up_to_a_minute() {
        let waits: Vec<u64> = (1..=9).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn a_working_server_that_exits_gets_one_immediate_restart_then_waits() {
        let now = Instant::now();
        let mut backoff = Backoff::default();
        assert_eq!(backoff.exited(now, "crashed".into()), Duration::ZERO);
        assert!(backoff.holding_back(now, "s").is_none());

        assert_eq!(
            backoff.exited(now, "crashed again".into()),
            Duration::from_secs(1)
        );
        let message = backoff
            .holding_back(now + Duration::from_millis(400), "s")
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            message,
            "MCP server `s` is not restarted yet: it failed 1 time in a row; it will be \
             restarted by the first use in 0.6 s or later (last failure: crashed again)"
        );
        assert!(
            backoff
                .holding_back(now + Duration::from_secs(1), "s")
                .is_none()
        );
        assert_eq!(
            backoff.failed(now, "no start".into()),
            Duration::from_secs(2)
        );

        // An answered call: the next exit is a first one again.
        backoff.succeeded();
        assert_eq!(backoff.exited(now, "crashed".into()), Duration::ZERO);
    }

    #[test]
    fn a_failed_start_holds_the_next_back_at_once() {
        let now = Instant::now();
        let mut backoff = Backoff::default();
        assert_eq!(backoff.failed(now, "exit 1".into()), Duration::from_secs(1));
        assert!(matches!(
            backoff.holding_back(now, "s"),
            Some(McpError::BackingOff { failures: 1, .. })
        ));
        assert_eq!(
            backoff.exited(now, "exit 1".into()),
            Duration::from_secs(2),
            "no immediate restart for a server that has not worked since"
        );
    }

    #[test]
    fn progress_reads_as_steps_and_percent() {
        assert_eq!(progress_text(3.0, Some(5.0), None), "3/5 (60%)");
        assert_eq!(
            progress_text(1.0, Some(3.0), Some(" copying ")),
            "1/3 (33%): copying"
        );
        assert_eq!(progress_text(2.5, None, Some("")), "progress 2.5");
        assert_eq!(progress_text(1.0, Some(0.0), None), "progress 1");
    }

    fn token(n: i64) -> ProgressToken {
        ProgressToken(rmcp::model::NumberOrString::Number(n))
    }

    fn notification(n: i64, progress: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(token(n), progress).with_total(4.0)
    }

    #[test]
    fn progress_goes_to_the_call_that_owns_the_token_in_order() {
        let routes = ProgressRoutes::default();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let handle = ProgressHandle::new("call-1".into(), tx);

        // The server can report before the call has registered its token.
        routes.deliver(notification(1, 1.0));
        routes.deliver(notification(2, 1.0));
        let route = routes.route(token(1), handle);
        routes.deliver(notification(1, 3.0));
        // Handled out of order: progress must increase, so it is stale.
        routes.deliver(notification(1, 2.0));
        drop(route);
        routes.deliver(notification(1, 4.0));

        let mut texts = Vec::new();
        while let Ok((call_id, progress)) = rx.try_recv() {
            assert_eq!(call_id.0, "call-1");
            match progress {
                toolwire_core::Progress::Status { text } => texts.push(text),
                other => panic!("expected a status, got {other:?}"),
            }
        }
        assert_eq!(texts, ["1/4 (25%)", "3/4 (75%)"]);
        // The other call's early report waits for its call; the late one is
        // kept (bounded) in case a call claims it, and claimed by none.
        assert_eq!(routes.lock().early.len(), 2);
    }

    #[test]
    fn unclaimed_progress_is_bounded() {
        let routes = ProgressRoutes::default();
        for n in 0..100 {
            routes.deliver(notification(n, 1.0));
        }
        assert_eq!(routes.lock().early.len(), EARLY_PROGRESS_KEPT);
    }
}
