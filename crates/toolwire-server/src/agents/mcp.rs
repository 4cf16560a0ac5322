//! MCP servers added through the API, wire-neutral: their records (kind
//! `mcp_server`), the live connection of each (a `toolwire-tools`
//! [`McpServer`], started on first use and again after a restart), and
//! their tools as tool records (kind `tool`, `external_mcp`, named as the
//! server names them) that agents attach like any other tool.
//!
//! The config file's servers are the engine's and stay as they are; these
//! live beside them. A server that cannot start costs its own tools only:
//! listing them says why, an agent's turn goes on without them.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolwire_tools::mcp::{Launch, McpServer, McpServerConfig, tool_name};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSource, ToolSpec};

use crate::agents::ids::{check_id, stable_tool_id};
use crate::agents::schema;
use crate::agents::tools::{self as tool_records, ToolRecord};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The kind of an MCP server's record.
pub const KIND: &str = "mcp_server";

/// The `tool_type` of an MCP server's tools.
pub const TOOL_TYPE: &str = "external_mcp";

/// How long a request waits for a server to start and list its tools: the
/// MCP client's own start-up limit (`npx -y …` may download the server
/// first) and a margin, so that the client's error, and its backoff,
/// come first.
pub const START_TIMEOUT: Duration =
    Duration::from_secs(toolwire_tools::mcp::STARTUP_TIMEOUT.as_secs() + 5);

/// Headers the MCP client sets itself on every request.
const CLIENT_HEADERS: [&str; 3] = ["Accept", "Mcp-Session-Id", "Last-Event-Id"];

/// How a server is reached: Letta's `mcp_server_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerType {
    Stdio,
    /// The deprecated HTTP+SSE transport: kept and served, but toolwire
    /// cannot connect to it (its MCP client speaks streamable HTTP).
    Sse,
    StreamableHttp,
}

/// An MCP server as stored and served (Letta's `StdioMCPServer`,
/// `SSEMCPServer`, `StreamableHTTPMCPServer`, flattened).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct McpServerRecord {
    pub id: String,
    pub server_name: String,
    pub mcp_server_type: ServerType,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub server_url: Option<String>,
    #[serde(default)]
    pub auth_header: Option<String>,
    #[serde(default)]
    pub auth_token: Option<String>,
    #[serde(default)]
    pub custom_headers: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The `config` of a create or update request (Letta's
/// `CreateStdioMCPServer` … tagged by `mcp_server_type`, or `type`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServerConfig {
    #[serde(alias = "type")]
    pub mcp_server_type: Option<ServerType>,
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub server_url: Option<String>,
    pub auth_header: Option<String>,
    pub auth_token: Option<String>,
    pub custom_headers: Option<BTreeMap<String, String>>,
}

impl McpServerRecord {
    /// A new record, checked, from a name and a config.
    pub fn create(server_name: String, config: ServerConfig) -> ApiResult<McpServerRecord> {
        let now = Utc::now();
        let kind = config.mcp_server_type.ok_or_else(|| {
            ApiError::bad_request(
                "config.mcp_server_type is required: `stdio`, `sse` or `streamable_http`",
            )
        })?;
        let mut record = McpServerRecord {
            id: crate::agents::ids::new_id("mcp_server"),
            server_name,
            mcp_server_type: kind,
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            server_url: None,
            auth_header: None,
            auth_token: None,
            custom_headers: BTreeMap::new(),
            created_at: now,
            updated_at: now,
        };
        record.apply(config)?;
        Ok(record)
    }

    /// This record changed by `config` (fields given replace those
    /// stored; a new type starts from a clean config), checked.
    pub fn apply(&mut self, config: ServerConfig) -> ApiResult<()> {
        if let Some(kind) = config.mcp_server_type
            && kind != self.mcp_server_type
        {
            self.mcp_server_type = kind;
            self.command = None;
            self.args.clear();
            self.env.clear();
            self.server_url = None;
            self.auth_header = None;
            self.auth_token = None;
            self.custom_headers.clear();
        }
        if let Some(c) = config.command {
            self.command = Some(c);
        }
        if let Some(a) = config.args {
            self.args = a;
        }
        if let Some(e) = config.env {
            self.env = e;
        }
        if let Some(u) = config.server_url {
            self.server_url = Some(u);
        }
        if let Some(h) = config.auth_header {
            self.auth_header = Some(h);
        }
        if let Some(t) = config.auth_token {
            self.auth_token = Some(t);
        }
        if let Some(h) = config.custom_headers {
            self.custom_headers = h;
        }
        self.updated_at = Utc::now();
        self.check()
    }

    fn check(&self) -> ApiResult<()> {
        if self.server_name.trim().is_empty() {
            return Err(ApiError::bad_request("server_name may not be empty"));
        }
        match self.mcp_server_type {
            ServerType::Stdio => {
                if self.command.as_deref().is_none_or(|c| c.trim().is_empty()) {
                    return Err(ApiError::bad_request(
                        "a stdio MCP server needs a `command`",
                    ));
                }
            }
            ServerType::Sse | ServerType::StreamableHttp => {
                let url = self.server_url.as_deref().unwrap_or("");
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(ApiError::bad_request(format!(
                        "an HTTP MCP server needs a `server_url` starting with http:// or \
                         https://, not `{}`",
                        toolwire_tools::mcp::redact_url(url)
                    )));
                }
            }
        }
        if self.mcp_server_type != ServerType::Sse {
            self.client_config()
                .validate()
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        Ok(())
    }

    /// The MCP client's config of this server.
    pub fn client_config(&self) -> McpServerConfig {
        match self.mcp_server_type {
            ServerType::Stdio => McpServerConfig {
                name: self.server_name.clone(),
                command: self.command.clone(),
                args: self.args.clone(),
                env: self.env.clone(),
                ..McpServerConfig::default()
            },
            ServerType::Sse | ServerType::StreamableHttp => {
                // Letta's clients send `Accept` among their custom headers;
                // the MCP client sets it (and the session's headers)
                // itself, so these are left out rather than refused.
                let mut headers: BTreeMap<String, String> = self
                    .custom_headers
                    .iter()
                    .filter(|(name, _)| {
                        !CLIENT_HEADERS
                            .iter()
                            .any(|own| name.eq_ignore_ascii_case(own))
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if let Some(token) = &self.auth_token {
                    let header = self
                        .auth_header
                        .clone()
                        .unwrap_or_else(|| "Authorization".to_owned());
                    // Letta sends `Bearer` before a token given without it
                    // for `Authorization`.
                    let value = if header.eq_ignore_ascii_case("authorization")
                        && !token.starts_with("Bearer ")
                    {
                        format!("Bearer {token}")
                    } else {
                        token.clone()
                    };
                    headers.insert(header, value);
                }
                McpServerConfig {
                    name: self.server_name.clone(),
                    url: self.server_url.clone(),
                    headers,
                    ..McpServerConfig::default()
                }
            }
        }
    }

    /// Letta's JSON of the server.
    pub fn to_json(&self) -> Value {
        let mut body = json!({
            "id": self.id,
            "server_name": self.server_name,
            "mcp_server_type": self.mcp_server_type,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        });
        if let Value::Object(map) = &mut body {
            match self.mcp_server_type {
                ServerType::Stdio => {
                    map.insert("command".into(), json!(self.command));
                    map.insert("args".into(), json!(self.args));
                    map.insert("env".into(), json!(self.env));
                }
                ServerType::Sse | ServerType::StreamableHttp => {
                    map.insert("server_url".into(), json!(self.server_url));
                    map.insert("auth_header".into(), json!(self.auth_header));
                    map.insert("auth_token".into(), json!(self.auth_token));
                    map.insert("custom_headers".into(), json!(self.custom_headers));
                }
            }
        }
        body
    }
}

/// The live connection of `record` (made, not started, if there is
/// none): a stdio server starts as the config's do, with the allow-listed
/// environment, and through the sandbox (in the workspace) when its
/// config asks.
pub fn handle(state: &AppState, record: &McpServerRecord) -> Arc<McpServer> {
    state.live.mcp.handle(&record.id, || {
        let python = &state.settings.python_sandbox;
        let launch = Launch {
            sandbox: python.sandbox.clone(),
            workspace: python.workspace.clone(),
        };
        McpServer::new(record.client_config(), launch)
    })
}

fn unreadable(id: &str, e: serde_json::Error) -> ApiError {
    ApiError::internal(format!("MCP server {id} is unreadable: {e}"))
}

/// Server `id`; not found unless it is one.
pub async fn load(state: &AppState, id: &str) -> ApiResult<McpServerRecord> {
    check_id("mcp_server", id)?;
    let doc = state
        .store()
        .document(KIND, id)
        .await?
        .ok_or_else(|| ApiError::not_found("MCP server", id))?;
    serde_json::from_value(doc.body).map_err(|e| unreadable(id, e))
}

/// Every server, oldest first.
pub async fn all(state: &AppState) -> ApiResult<Vec<McpServerRecord>> {
    let mut servers = Vec::new();
    for doc in state.store().documents(KIND).await? {
        servers.push(serde_json::from_value(doc.body).map_err(|e| unreadable(&doc.id, e))?);
    }
    Ok(servers)
}

/// Stores `record`, in place of its earlier version.
pub async fn save(state: &AppState, record: &McpServerRecord) -> ApiResult<()> {
    let body = serde_json::to_value(record)
        .map_err(|e| ApiError::internal(format!("an MCP server cannot be stored: {e}")))?;
    state.engine.put_record(KIND, &record.id, &body).await?;
    Ok(())
}

/// Removes server `record`, its tool records and its connection.
pub async fn delete(state: &AppState, record: &McpServerRecord) -> ApiResult<()> {
    let gone: Vec<(String, Option<Value>)> = stored_tools(state, &record.id)
        .await?
        .into_iter()
        .map(|t| (t.id, None))
        .collect();
    tool_records::write(state, gone).await?;
    state.engine.delete_record(KIND, &record.id).await?;
    state.live.mcp.forget(&record.id).await;
    Ok(())
}

/// The stable id of tool `name` of server `server_id`.
pub fn tool_id(server_id: &str, name: &str) -> String {
    stable_tool_id(&format!("mcp:{server_id}:{name}"))
}

/// The server id a tool record belongs to, if it is an API server's tool.
pub fn server_of(tool: &ToolRecord) -> Option<&str> {
    if tool.tool_type != TOOL_TYPE {
        return None;
    }
    tool.metadata.as_ref()?.get("mcp_server_id")?.as_str()
}

/// The stored tool records of server `id`.
pub async fn stored_tools(state: &AppState, id: &str) -> ApiResult<Vec<ToolRecord>> {
    let docs = state.store().documents(tool_records::KIND).await?;
    Ok(tool_records::records_of(docs)?
        .into_iter()
        .filter(|tool| server_of(tool) == Some(id))
        .collect())
}

/// The name the server knows `spec` by: the client names its tools
/// `{server}__{tool}`; an API server's tools keep the server's names.
fn plain_name(server_name: &str, spec: &ToolSpec) -> Option<String> {
    let prefix = tool_name(server_name, "");
    spec.name.strip_prefix(&prefix).map(str::to_owned)
}

/// Connects to `record`'s server (if it is not connected), lists its tools
/// and stores them as tool records (a tool gone from the list loses its
/// record). The error says why the server cannot be used.
pub async fn sync_tools(state: &AppState, record: &McpServerRecord) -> ApiResult<Vec<ToolRecord>> {
    if record.mcp_server_type == ServerType::Sse {
        return Err(unavailable(
            record,
            "the HTTP+SSE transport is deprecated and toolwire does not speak it; \
             use `streamable_http`",
        ));
    }
    let server = handle(state, record);
    let listed = match tokio::time::timeout(START_TIMEOUT, server.tools()).await {
        Ok(Ok(tools)) => tools,
        Ok(Err(e)) => return Err(unavailable(record, &e.to_string())),
        Err(_) => {
            return Err(unavailable(
                record,
                &format!("it did not start within {} s", START_TIMEOUT.as_secs()),
            ));
        }
    };
    let before = stored_tools(state, &record.id).await?;
    let mut now = Vec::new();
    for tool in &listed {
        let spec = tool.spec();
        let Some(name) = plain_name(&record.server_name, spec) else {
            tracing::warn!(server = %record.server_name, tool = %spec.name, "an MCP tool whose name is too long is left out");
            continue;
        };
        let id = tool_id(&record.id, &name);
        let kept = before.iter().find(|t| t.id == id);
        let epoch = kept.map_or_else(Utc::now, |t| t.created_at);
        now.push(ToolRecord {
            id,
            name: name.clone(),
            description: spec.description.clone(),
            json_schema: schema::to_json(&toolwire_tools::python::ToolSchemaInfo {
                name: name.clone(),
                description: spec.description.clone(),
                parameters: spec.parameters.clone(),
            }),
            tags: vec![format!("mcp:{}", record.server_name)],
            default_requires_approval: kept.is_some_and(|t| t.default_requires_approval),
            source_code: None,
            source_type: None,
            tool_type: TOOL_TYPE.into(),
            return_char_limit: None,
            metadata: Some(json!({
                "mcp_server_id": record.id,
                "mcp_server_name": record.server_name,
            })),
            created_at: epoch,
            updated_at: Utc::now(),
        });
    }
    let ids: HashSet<&str> = now.iter().map(|t| t.id.as_str()).collect();
    let mut changes: Vec<(String, Option<Value>)> = before
        .iter()
        .filter(|t| !ids.contains(t.id.as_str()))
        .map(|t| (t.id.clone(), None))
        .collect();
    for tool in &now {
        let body = serde_json::to_value(tool)
            .map_err(|e| ApiError::internal(format!("a tool cannot be stored: {e}")))?;
        changes.push((tool.id.clone(), Some(body)));
    }
    tool_records::write(state, changes).await?;
    Ok(now)
}

/// A server that cannot be used: `424 Failed Dependency`, naming it and
/// why (the request was right; what it depends on failed).
pub fn unavailable(record: &McpServerRecord, why: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::FAILED_DEPENDENCY,
        "MCP_SERVER_UNAVAILABLE",
        format!(
            "MCP server `{}` ({}) cannot be used: {why}",
            record.server_name, record.id
        ),
    )
}

/// Starts every stored server in the background (after a restart), so
/// that their tools are there for the agents' next turns; one that fails
/// is logged with why.
pub(crate) async fn reconnect_all(state: &AppState) {
    let servers = match all(state).await {
        Ok(servers) => servers,
        Err(e) => {
            tracing::warn!(error = %e.message, "reading the MCP servers");
            return;
        }
    };
    for record in servers {
        let state = state.clone();
        tokio::spawn(async move {
            match sync_tools(&state, &record).await {
                Ok(tools) => {
                    tracing::info!(server = %record.server_name, tools = tools.len(), "MCP server connected")
                }
                Err(e) => tracing::warn!(error = %e.message, "MCP server not connected"),
            }
        });
    }
}

/// A server's tool under the name the server gives it.
struct Renamed {
    inner: Arc<dyn Tool>,
    spec: Arc<ToolSpec>,
}

#[async_trait::async_trait]
impl Tool for Renamed {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.inner.call(arguments, ctx).await
    }
}

/// The tools an agent has of one API server, read from the server's list
/// as it is at each step (so a restarted server's tools come back).
pub struct AttachedTools {
    server: Arc<McpServer>,
    server_name: String,
    names: HashSet<String>,
}

impl AttachedTools {
    pub fn new(server: Arc<McpServer>, server_name: &str, names: HashSet<String>) -> Self {
        AttachedTools {
            server,
            server_name: server_name.to_owned(),
            names,
        }
    }
}

impl ToolSource for AttachedTools {
    fn current_tools(&self) -> Vec<Arc<dyn Tool>> {
        self.server
            .current_tools()
            .into_iter()
            .filter_map(|tool| {
                let name = plain_name(&self.server_name, tool.spec())?;
                if !self.names.contains(&name) {
                    return None;
                }
                let spec = Arc::new(ToolSpec {
                    name,
                    ..ToolSpec::clone(tool.spec())
                });
                Some(Arc::new(Renamed { inner: tool, spec }) as Arc<dyn Tool>)
            })
            .collect()
    }
}

/// Tool `name` of server `record`, to run directly.
pub async fn tool(
    state: &AppState,
    record: &McpServerRecord,
    name: &str,
) -> ApiResult<Arc<dyn Tool>> {
    sync_tools(state, record).await?;
    let server = handle(state, record);
    let source = AttachedTools::new(
        server,
        &record.server_name,
        HashSet::from([name.to_owned()]),
    );
    source
        .current_tools()
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::not_found("tool of this MCP server", name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked_and_kept_as_given() {
        let stdio = McpServerRecord::create(
            "everything".into(),
            ServerConfig {
                mcp_server_type: Some(ServerType::Stdio),
                command: Some("npx".into()),
                args: Some(vec!["-y".into(), "x".into()]),
                ..ServerConfig::default()
            },
        )
        .unwrap();
        assert_eq!(stdio.to_json()["args"], json!(["-y", "x"]));
        assert!(
            McpServerRecord::create("x".into(), ServerConfig::default()).is_err(),
            "a type is required"
        );
        let no_command = McpServerRecord::create(
            "x".into(),
            ServerConfig {
                mcp_server_type: Some(ServerType::Stdio),
                ..ServerConfig::default()
            },
        )
        .unwrap_err();
        assert!(
            no_command.message.contains("command"),
            "{}",
            no_command.message
        );

        let http = McpServerRecord::create(
            "remote".into(),
            ServerConfig {
                mcp_server_type: Some(ServerType::StreamableHttp),
                server_url: Some("https://example.com/mcp".into()),
                auth_token: Some("t".into()),
                custom_headers: Some(BTreeMap::from([(
                    "accept".into(),
                    "application/json".into(),
                )])),
                ..ServerConfig::default()
            },
        )
        .unwrap();
        assert_eq!(
            http.client_config()
                .headers
                .get("Authorization")
                .map(String::as_str),
            Some("Bearer t")
        );
        assert!(!http.client_config().headers.contains_key("accept"));
        assert_eq!(
            http.to_json()["custom_headers"]["accept"],
            "application/json"
        );
        let spec = ToolSpec {
            name: tool_name("my server", "echo"),
            server: None,
            description: String::new(),
            parameters: json!({}),
            read_only: false,
        };
        assert_eq!(plain_name("my server", &spec).as_deref(), Some("echo"));
    }
}
