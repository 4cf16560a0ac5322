//! What every handler shares: the engine, the store and the settings.

use std::sync::Arc;

use toolwire_engine::{Engine, Held, KeyedLocks};
use toolwire_store::StoreRead;
use toolwire_tools::confined::Sandbox;
use toolwire_tools::python::{PythonLimits, PythonSandbox};

use crate::decisions::Decisions;
use crate::event_index::EventIndex;
use crate::tools_memo::ToolsMemo;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Bearer keys a request must carry; none means no check (and the
    /// server then listens on loopback only).
    pub api_keys: Vec<String>,
    /// Limits of Python-source tools.
    pub python: PythonLimits,
    /// Where Python-source tools run. The default has no helper: they
    /// are refused.
    pub python_sandbox: PythonSandbox,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
    /// Seconds between keep-alive pings on a stream that asked for them.
    pub ping_interval: std::time::Duration,
    /// Names (`host` or `host:port`; `*`: any) requests may be addressed
    /// to beyond loopback and the listen address (`allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// Web pages (`scheme://host[:port]`; `*`: any) that may change state
    /// and open sockets beyond the server's own (`allowed_origins`).
    pub allowed_origins: Vec<String>,
    /// Connections open at once; more wait to be accepted
    /// (`max_connections`).
    pub max_connections: usize,
    /// How long a request's head may take to arrive
    /// (`header_timeout_secs`).
    pub header_timeout: std::time::Duration,
    /// How long a request's body may take to arrive after its head
    /// (`body_timeout_secs`); past it the request is answered 408.
    pub body_timeout: std::time::Duration,
    /// How long a kept-alive connection may wait for its next request
    /// (`idle_timeout_secs`).
    pub idle_timeout: std::time::Duration,
    /// On shutdown, how long running turns get to reach their next stored
    /// step before they are cancelled (`shutdown_grace_secs`).
    pub shutdown_grace: std::time::Duration,
}

impl ServerSettings {
    /// Half of the usual 1,024 file descriptors a process may open: the
    /// rest stay for the database, tools and MCP servers.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
    /// A request's head is a few hundred bytes: ten seconds is generous
    /// even on a bad network, and bounds a slowloris connection.
    pub const DEFAULT_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    /// A body of the default 8 MiB limit arrives within a second on any
    /// usable link; thirty leave room for a slow one and bound a client
    /// that trickles its body in.
    pub const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
    /// Longer than the SDKs keep an unused connection (httpx: 5 s), so
    /// that the server is seldom the one to close it under a request.
    pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            api_keys: Vec::new(),
            python: PythonLimits::default(),
            python_sandbox: PythonSandbox::new(Arc::new(Sandbox::none()), "."),
            body_limit: 8 * 1024 * 1024,
            ping_interval: std::time::Duration::from_secs(10),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            header_timeout: Self::DEFAULT_HEADER_TIMEOUT,
            body_timeout: Self::DEFAULT_BODY_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            shutdown_grace: std::time::Duration::from_secs(10),
        }
    }
}

/// Shared by every request. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub settings: Arc<ServerSettings>,
    /// Cancelled when the server shuts down: open streams end.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// One writer at a time per agent: a request that reads an agent and
    /// writes it back (or its tools) holds the agent's lock.
    locks: Arc<KeyedLocks<String>>,
    /// What the live view keeps between requests and sockets.
    pub(crate) live: Arc<LiveShared>,
    /// The records of the engine's tools, made once per set of tools.
    pub(crate) tools_memo: Arc<ToolsMemo>,
    /// The stored tool records, read again only when they changed.
    pub(crate) stored_tools: Arc<crate::tools_memo::Versioned>,
}

/// What the live view keeps across requests and sockets.
#[derive(Default)]
pub(crate) struct LiveShared {
    /// Where each conversation's log and running turn stand.
    pub(crate) index: Arc<EventIndex>,
    /// Approvals given one call at a time, until every waiting call has one.
    pub(crate) decisions: Decisions,
    /// The connections of the MCP servers added through the API.
    pub(crate) mcp: crate::mcp_connections::McpConnections,
}

impl AppState {
    pub fn new(engine: Engine, settings: ServerSettings) -> Self {
        let live = Arc::new(LiveShared::default());
        engine.observe(live.index.clone());
        AppState {
            engine,
            settings: Arc::new(settings),
            shutdown: tokio_util::sync::CancellationToken::new(),
            locks: Arc::default(),
            live,
            tools_memo: Arc::default(),
            stored_tools: Arc::default(),
        }
    }

    pub fn store(&self) -> &dyn StoreRead {
        self.engine.store()
    }

    /// The lock of resource `key` (an agent id, or "tools" for the tool
    /// names).
    pub async fn lock(&self, key: &str) -> Held<String> {
        self.locks.hold(key.to_owned()).await
    }

    /// The locks themselves, for what takes them outside a request (an
    /// agent's memory tools).
    pub(crate) fn locks(&self) -> Arc<KeyedLocks<String>> {
        Arc::clone(&self.locks)
    }
}
