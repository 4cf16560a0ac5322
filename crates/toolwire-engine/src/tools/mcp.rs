//! MCP tools: the tools of Model Context Protocol servers run as child
//! processes (stdio transport, `rmcp` client), shown to the model as
//! `{server}__{tool}`.
//!
//! A server is started when its tools are listed ([`connect_all`]) and kept
//! in an [`McpServer`] handle shared by its tools. A server that dies is not
//! fatal: a call that was running when it died fails with an error naming the
//! server, and the next call starts it again (spawn, initialize) before
//! running. Servers that cannot start are reported as warnings and the engine
//! runs without their tools.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    ErrorCode, Implementation, ResourceContents,
};
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceError, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// How long one tool call may run when the config does not say: long enough
/// for real work (builds, searches), short enough that a hung server does not
/// hold a turn forever.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Spawn + `initialize` (+ listing tools). Generous because `npx -y …`
/// downloads the server on first use.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// OpenAI (and others) accept tool names matching `^[a-zA-Z0-9_-]{1,64}$`.
const MAX_NAME_LEN: usize = 64;
/// Lines of the server's stderr kept to explain why it died.
const STDERR_TAIL_LINES: usize = 10;
/// A kept stderr line is cut here so a chatty server cannot bloat errors.
const STDERR_LINE_MAX: usize = 400;
/// How long an error waits for the rest of a dead server's stderr.
const STDERR_SETTLE: Duration = Duration::from_millis(500);

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
}

/// Starts every server and lists its tools. A server that fails is reported
/// in the second list (one message each) and does not stop the others:
/// a broken MCP server should cost its tools, not the engine.
pub async fn connect_all(
    configs: impl IntoIterator<Item = McpServerConfig>,
) -> (Vec<Arc<dyn Tool>>, Vec<String>) {
    let started = futures::future::join_all(configs.into_iter().map(|config| async move {
        let server = McpServer::new(config);
        server.tools().await
    }))
    .await;
    let mut tools = Vec::new();
    let mut warnings = Vec::new();
    for result in started {
        match result {
            Ok(server_tools) => tools.extend(server_tools),
            Err(error) => {
                tracing::warn!("{error}");
                warnings.push(error.to_string());
            }
        }
    }
    (tools, warnings)
}

/// A live connection: the rmcp client (which owns the child process and
/// kills it when dropped) and what we know about the process.
struct Connection {
    client: RunningService<RoleClient, ClientConfig>,
    pid: Option<u32>,
    stderr: StderrTail,
}

/// Handle on one MCP server, shared by its tools. Holds at most one running
/// process; (re)starts it on demand.
pub struct McpServer {
    config: McpServerConfig,
    call_timeout: Duration,
    /// A tokio mutex because starting awaits; concurrent calls wait for one
    /// start instead of each spawning a process.
    connection: Mutex<Option<Arc<Connection>>>,
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
        Arc::new(McpServer {
            config,
            call_timeout,
            connection: Mutex::new(None),
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Starts the server if needed and returns one tool per MCP tool (all
    /// pages of `tools/list`).
    pub async fn tools(self: &Arc<Self>) -> Result<Vec<Arc<dyn Tool>>, McpError> {
        let connection = self.connection().await?;
        let listed =
            match tokio::time::timeout(STARTUP_TIMEOUT, connection.client.list_all_tools()).await {
                Ok(Ok(listed)) => listed,
                Ok(Err(source)) => {
                    return Err(McpError::ListTools {
                        server: self.config.name.clone(),
                        source,
                    });
                }
                Err(_) => {
                    return Err(McpError::ListTools {
                        server: self.config.name.clone(),
                        source: ServiceError::Timeout {
                            timeout: STARTUP_TIMEOUT,
                        },
                    });
                }
            };
        let mut used = HashSet::new();
        let mut tools: Vec<Arc<dyn Tool>> = Vec::with_capacity(listed.len());
        for tool in listed {
            let mut name = tool_name(&self.config.name, &tool.name);
            if !used.insert(name.clone()) {
                // Two MCP names sanitized to the same string: the hashed
                // form keeps both, and stays stable across restarts.
                name = hashed_name(&format!("{}__{}", self.config.name, tool.name));
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
            tools.push(Arc::new(McpTool {
                server: Arc::clone(self),
                tool: tool.name.to_string(),
                spec: ToolSpec {
                    name,
                    server: Some(self.config.name.clone()),
                    description,
                    parameters: Value::Object((*tool.input_schema).clone()),
                    read_only,
                },
            }));
        }
        Ok(tools)
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

    /// The live connection, starting (or restarting) the server if it is
    /// not running.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            if !connection.client.is_transport_closed() {
                return Ok(Arc::clone(connection));
            }
            tracing::warn!(
                server = %self.config.name,
                "MCP server `{}` exited while idle{}; restarting it",
                self.config.name,
                connection.stderr.describe()
            );
            *slot = None;
        }
        let connection = Arc::new(start(&self.config).await?);
        tracing::info!(server = %self.config.name, pid = ?connection.pid, "MCP server started");
        *slot = Some(Arc::clone(&connection));
        Ok(connection)
    }

    /// Drops `dead` from the slot (if it is still there) so the next call
    /// starts a fresh process; dropping the client kills what is left.
    async fn forget(&self, dead: &Arc<Connection>) {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
            *slot = None;
        }
    }

    async fn call(&self, tool: &str, arguments: serde_json::Map<String, Value>) -> CallResult {
        let connection = self
            .connection()
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        // Dropping the call future (timeout, cancellation) makes rmcp send
        // `notifications/cancelled` for the request.
        match tokio::time::timeout(self.call_timeout, connection.client.call_tool(params)).await {
            Err(_) => Err(ToolError::TimedOut(self.call_timeout.as_secs())),
            Ok(Ok(result)) => Ok(tool_output(result)),
            Ok(Err(error)) => Err(self.call_error(&connection, error).await),
        }
    }

    async fn call_error(&self, connection: &Arc<Connection>, error: ServiceError) -> ToolError {
        let server = &self.config.name;
        match error {
            ServiceError::McpError(data) if data.code == ErrorCode::INVALID_PARAMS => {
                ToolError::InvalidArguments(format!("MCP server `{server}`: {}", data.message))
            }
            ServiceError::McpError(data) => {
                ToolError::Failed(format!("MCP server `{server}`: {}", data.message))
            }
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                connection.stderr.settle().await;
                let detail = format!(
                    "connection lost during the call ({error}); it restarts on next use{}",
                    connection.stderr.describe()
                );
                tracing::warn!(server = %server, "MCP server `{server}` exited: {detail}");
                self.forget(connection).await;
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

type CallResult = Result<ToolOutput, ToolError>;

/// Spawns the process and runs the MCP handshake.
async fn start(config: &McpServerConfig) -> Result<Connection, McpError> {
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
    let client_config = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("toolwire", env!("CARGO_PKG_VERSION")),
    );
    // On error or timeout the transport is dropped, which kills the child.
    match tokio::time::timeout(STARTUP_TIMEOUT, client_config.serve(transport)).await {
        Ok(Ok(client)) => Ok(Connection {
            client,
            pid,
            stderr: tail,
        }),
        Ok(Err(source)) => {
            tail.settle().await;
            Err(McpError::Initialize {
                server: config.name.clone(),
                source: Box::new(source),
                stderr: tail.describe(),
            })
        }
        Err(_) => Err(McpError::StartTimedOut {
            server: config.name.clone(),
            secs: STARTUP_TIMEOUT.as_secs(),
            stderr: tail.describe(),
        }),
    }
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

/// One MCP tool of one server.
struct McpTool {
    server: Arc<McpServer>,
    /// The name the server knows the tool by.
    tool: String,
    spec: ToolSpec,
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
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
            result = self.server.call(&self.tool, arguments) => result,
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
}
