//! MCP tools: the tools of Model Context Protocol servers, shown to the
//! model as `{server}__{tool}`. A server is either a child process spoken to
//! over stdio (`command`) or an endpoint spoken to over streamable HTTP
//! (`url`, with optional `headers` such as `Authorization`); both use the
//! `rmcp` client. The deprecated HTTP+SSE transport is not supported.
//!
//! An [`McpServer`] is a [`ToolSource`]: its tool list is read when it
//! connects (again on every restart or reconnection) and whenever the
//! server sends `notifications/tools/list_changed`, and a registry holding
//! the server shows the model the list as it is now.
//!
//! A server that dies or cannot be reached is not fatal: a call that was
//! running when it died fails with an error naming the server (and its URL
//! for HTTP, without credentials or query: see [`redact_url`]), and the next
//! call starts it again (spawn or connect, initialize, list) before running.
//! A stdio server that dies while idle is noticed and restarted by the next
//! call. An HTTP session's event stream that breaks and cannot be resumed
//! counts as a lost connection too, so the next call connects again instead
//! of using a session whose notifications no longer arrive. A server that
//! refuses the session (HTTP 404, or an error saying it does not know the
//! session: it restarted) did not run the request, which then runs once in a
//! new session; any other failure of a `tools/call` is reported, never sent
//! again, as the server may have run it. A call to a server that is gone
//! fails, and the call after it connects again. Failures in a row back off
//! (see [`Backoff`]) so a server that cannot start is not spawned (or
//! dialled) again by every call. Servers that cannot start at all are
//! reported as warnings by [`connect_all`] and the engine runs without their
//! tools.
//!
//! Every call carries a progress token (rmcp puts one in each request's
//! `_meta`); the server's `notifications/progress` for it become the call's
//! progress, as text like `3/5 (60%): message`.

mod backoff;
mod config;
mod error;
mod http;
mod progress;
mod prompts;
mod stdio;
mod tool;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientRequest, ErrorCode,
    Implementation, ProgressNotificationParam, RequestId, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError};
use serde_json::Value;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

pub use backoff::{BACKOFF_FIRST, BACKOFF_MAX};
pub use config::{McpServerConfig, redact_url};
pub use error::McpError;
pub use prompts::{McpPrompt, McpPromptArgument, McpPromptMessage};
pub use stdio::Launch;
pub use tool::tool_name;

use backoff::{Again, Backoff, restart_note};
use config::Endpoint;
use error::{seconds, service_error};
use http::{HttpShared, session_expired};
use progress::ProgressRoutes;
use stdio::StderrTail;
use tool::{McpTool, hashed_name, tool_output};

use crate::{ProgressHandle, Tool, ToolError, ToolOutput, ToolSource, ToolSpec};

/// How long one tool call may run when the config does not say: long enough
/// for real work (builds, searches), short enough that a hung server does not
/// hold a turn forever.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Spawn + `initialize` (+ listing tools). Generous because `npx -y …`
/// downloads the server on first use.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts every server and lists its tools. A server that fails is reported
/// in the second list (one message each) and does not stop the others:
/// a broken MCP server should cost its tools, not the engine. Register the
/// servers with [`ToolRegistry::register_source`](crate::ToolRegistry::register_source)
/// so that changes to their tool lists reach the model.
pub async fn connect_all(
    configs: impl IntoIterator<Item = McpServerConfig>,
    launch: &Launch,
) -> (Vec<Arc<McpServer>>, Vec<String>) {
    let started = futures::future::join_all(configs.into_iter().map(|config| async move {
        let server = McpServer::new(config, launch.clone());
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
/// kills it when dropped, or the worker of the HTTP session) and what we
/// know about the process (nothing, for HTTP) or the HTTP session.
struct Connection {
    client: RunningService<RoleClient, Client>,
    pid: Option<u32>,
    stderr: StderrTail,
    http: Option<Arc<HttpShared>>,
    /// A sandboxed server's temp dir, removed when the connection ends.
    _temp_dir: Option<toolwire_sandbox::TempDir>,
}

impl Connection {
    /// Whether the connection can no longer serve calls, or (HTTP) lost
    /// the event stream that brings the server's notifications.
    fn is_closed(&self) -> bool {
        self.client.is_transport_closed() || self.http.as_ref().is_some_and(|h| h.stream_lost())
    }

    /// What the HTTP server answered when it refused the session.
    fn refusal(&self) -> String {
        self.http
            .as_ref()
            .map_or_else(|| "nothing to say why".to_owned(), |h| h.refusal())
    }
}

/// One tool as the server listed it.
struct Listed {
    /// The name the server knows the tool by.
    tool: String,
    /// Shared with every request that lists it.
    spec: Arc<ToolSpec>,
}

/// The current tool list and the process that listed it.
#[derive(Default)]
struct Listing {
    epoch: u64,
    tools: Vec<Arc<Listed>>,
}

/// Handle on one MCP server, shared by its tools. Holds at most one running
/// process or HTTP session; (re)starts or (re)connects it on demand.
pub struct McpServer {
    config: McpServerConfig,
    launch: Launch,
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
            .field("url", &self.config.url.as_deref().map(redact_url))
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// A handle; nothing starts until the first use.
    pub fn new(config: McpServerConfig, launch: Launch) -> Arc<Self> {
        let call_timeout = config
            .timeout_secs
            .map_or(DEFAULT_CALL_TIMEOUT, Duration::from_secs);
        Arc::new_cyclic(|me| McpServer {
            config,
            launch,
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
    /// and tests); always `None` for an HTTP server.
    pub async fn pid(&self) -> Option<u32> {
        let slot = self.connection.lock().await;
        slot.as_ref().filter(|c| !c.is_closed()).and_then(|c| c.pid)
    }

    /// Whether a server process (or HTTP session) is connected and its
    /// transport still open (for HTTP: its event stream too).
    pub async fn is_running(&self) -> bool {
        let slot = self.connection.lock().await;
        slot.as_ref().is_some_and(|c| !c.is_closed())
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
        // A config error is no failure to back off from: trying again
        // cannot fix it, and each use should say what is wrong.
        let endpoint = self.config.endpoint()?;
        let again = self.again();
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            if !connection.is_closed() {
                return Ok(Arc::clone(connection));
            }
            connection.stderr.settle().await;
            let why = match endpoint {
                Endpoint::Stdio { .. } => {
                    format!("exited while idle{}", connection.stderr.describe())
                }
                Endpoint::Http { url } if connection.client.is_transport_closed() => {
                    format!("at {} closed its connection while idle", redact_url(url))
                }
                Endpoint::Http { url } => {
                    format!("at {} lost its session's event stream", redact_url(url))
                }
            };
            let wait = self.backoff().exited(Instant::now(), why.clone());
            tracing::warn!(server = %server, "MCP server `{server}` {why}; {}", restart_note(wait, again));
            *slot = None;
        }
        if let Some(error) = self.backoff().holding_back(Instant::now(), server, again) {
            return Err(error);
        }
        let started = match endpoint {
            Endpoint::Stdio { command } => self.start(command).await,
            Endpoint::Http { url } => self.connect(url).await,
        };
        match started {
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

    /// How the next use gets a server back after a failure.
    fn again(&self) -> Again {
        if self.config.url.is_some() {
            Again::Reconnect
        } else {
            Again::Restart
        }
    }

    /// The rmcp handler of a new connection, and the connection's epoch.
    fn handler(&self) -> (Client, u64) {
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
        (client, epoch)
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
                    source: Box::new(source),
                });
            }
            Err(_) => {
                return Err(McpError::ListTools {
                    server: server.clone(),
                    source: Box::new(ServiceError::Timeout {
                        timeout: STARTUP_TIMEOUT,
                    }),
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
                spec: Arc::new(ToolSpec {
                    name,
                    server: Some(server.clone()),
                    description,
                    parameters: Value::Object((*tool.input_schema).clone()),
                    read_only,
                }),
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
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let timed_out = || ToolError::TimedOut(self.call_timeout.as_secs());
        // Set once the first connection is there: starting a server has its
        // own limit, and the call's time is the server's time.
        let mut deadline = None;
        // Why the server refused the session of the first attempt.
        let mut refused: Option<String> = None;
        loop {
            let connection = match deadline {
                None => self.connection().await,
                // The new session of a retry counts against the call.
                Some(deadline) => tokio::time::timeout_at(deadline, self.connection())
                    .await
                    .map_err(|_| timed_out())?,
            }
            .map_err(|e| ToolError::Failed(e.to_string()))?;
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.call_timeout);
            let call = call_tool(&connection, params.clone(), progress);
            match tokio::time::timeout_at(deadline, call).await {
                Err(_) => return Err(timed_out()),
                Ok(Ok(result)) => {
                    self.backoff().succeeded();
                    return Ok(tool_output(result));
                }
                // The server refused the session before running the request
                // (see `refuses_session`): it restarted while idle, which
                // only a request can tell over HTTP. Runs it once in a new
                // session, as a stdio server that died while idle is
                // restarted for the call. Only this answer is retried: after
                // any other the server may have run the call.
                Ok(Err(error)) if refused.is_none() && session_expired(&error) => {
                    let why = connection.refusal();
                    tracing::info!(
                        server = %self.config.name,
                        "MCP server `{}` refused the session (it answered {why}); \
                         running the call in a new session",
                        self.config.name
                    );
                    refused = Some(why);
                    self.forget(&connection).await;
                }
                Ok(Err(error)) => {
                    return Err(self
                        .call_error(&connection, error, refused.as_deref())
                        .await);
                }
            }
        }
    }

    /// The error a failed call ends with. `refused` is why the server
    /// refused the session of a first attempt, when this was the second.
    async fn call_error(
        &self,
        connection: &Arc<Connection>,
        error: ServiceError,
        refused: Option<&str>,
    ) -> ToolError {
        let server = &self.config.name;
        let retried = refused.map_or_else(String::new, |first| {
            format!(" (in a second session: the first was refused: it answered {first})")
        });
        match error {
            ServiceError::McpError(data) if data.code == ErrorCode::INVALID_PARAMS => {
                self.backoff().succeeded();
                ToolError::InvalidArguments(format!(
                    "MCP server `{server}`: {}{retried}",
                    data.message
                ))
            }
            ServiceError::McpError(data) => {
                // The server answered: it works, whatever this call's fate.
                self.backoff().succeeded();
                ToolError::Failed(format!("MCP server `{server}`: {}{retried}", data.message))
            }
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                connection.stderr.settle().await;
                let stderr = connection.stderr.describe();
                let why = if session_expired(&error) {
                    format!(
                        "it does not know the session: it answered {}{retried}",
                        connection.refusal()
                    )
                } else {
                    format!(
                        "connection lost during the call ({}){retried}",
                        service_error(&error)
                    )
                };
                let wait = if self.forget(connection).await {
                    self.backoff()
                        .exited(Instant::now(), format!("{why}{stderr}"))
                } else {
                    self.backoff().waiting(Instant::now()).unwrap_or_default()
                };
                let detail = format!("{why}; {}{stderr}", restart_note(wait, self.again()));
                let error = match &self.config.url {
                    Some(url) => McpError::Disconnected {
                        server: server.clone(),
                        url: redact_url(url),
                        detail,
                    },
                    None => McpError::Exited {
                        server: server.clone(),
                        detail,
                    },
                };
                tracing::warn!(server = %server, "{error}");
                ToolError::Failed(error.to_string())
            }
            other => ToolError::Failed(format!("MCP server `{server}`: {other}{retried}")),
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
