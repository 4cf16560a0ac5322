//! `/v1/mcp-servers`: MCP servers added through the API (stdio and
//! streamable HTTP; SSE kept but not spoken), their tools listed, run
//! and attachable to agents. Records and connections are
//! [`crate::agents::mcp`]'s.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_tools::ToolContext;

use crate::agents::ids::check_id;
use crate::agents::mcp::{self, McpServerRecord, ServerConfig};
use crate::agents::options::refresh_users_of;
use crate::error::{ApiError, ApiResult};
use crate::extract::Body;
use crate::letta::tools::tool_json;
use crate::state::AppState;

/// Letta's `CreateMCPServerRequest` / `UpdateMCPServerRequest`.
#[derive(Debug, Default, Deserialize)]
pub struct ServerFields {
    server_name: Option<String>,
    config: Option<ServerConfig>,
}

/// The lock of the servers' names.
const NAMES_LOCK: &str = "mcp-server-names";

async fn check_name(state: &AppState, name: &str, id: Option<&str>) -> ApiResult<()> {
    if let Some(other) = mcp::all(state)
        .await?
        .into_iter()
        .find(|s| s.server_name == name && Some(s.id.as_str()) != id)
    {
        return Err(ApiError::conflict(
            "MCP_SERVER_NAME_TAKEN",
            format!("an MCP server named `{name}` exists already ({})", other.id),
        ));
    }
    Ok(())
}

pub async fn create(
    State(state): State<AppState>,
    Body(fields): Body<ServerFields>,
) -> ApiResult<Json<Value>> {
    let name = fields
        .server_name
        .ok_or_else(|| ApiError::bad_request("server_name is required"))?;
    let config = fields
        .config
        .ok_or_else(|| ApiError::bad_request("config is required"))?;
    let record = McpServerRecord::create(name, config)?;
    let _names = state.lock(NAMES_LOCK).await;
    check_name(&state, &record.server_name, None).await?;
    mcp::save(&state, &record).await?;
    tracing::info!(server = %record.server_name, id = %record.id, "MCP server added");
    Ok(Json(record.to_json()))
}

pub async fn list(State(state): State<AppState>) -> ApiResult<Json<Vec<Value>>> {
    Ok(Json(
        mcp::all(&state)
            .await?
            .iter()
            .map(McpServerRecord::to_json)
            .collect(),
    ))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(mcp::load(&state, &id).await?.to_json()))
}

pub async fn update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(fields): Body<ServerFields>,
) -> ApiResult<Json<Value>> {
    let _names = state.lock(NAMES_LOCK).await;
    let mut record = mcp::load(&state, &id).await?;
    if let Some(name) = fields.server_name {
        check_name(&state, &name, Some(&id)).await?;
        record.server_name = name;
    }
    record.apply(fields.config.unwrap_or_default())?;
    mcp::save(&state, &record).await?;
    // The next use starts the server as it is now configured.
    state.live.mcp.forget(&id).await;
    Ok(Json(record.to_json()))
}

pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let _names = state.lock(NAMES_LOCK).await;
    let record = mcp::load(&state, &id).await?;
    let tools = mcp::stored_tools(&state, &id).await?;
    mcp::delete(&state, &record).await?;
    for tool in tools {
        refresh_users_of(&state, &tool.id).await?;
    }
    tracing::info!(server = %record.server_name, id = %record.id, "MCP server removed");
    Ok(Json(json!({})))
}

/// `GET /v1/mcp-servers/{id}/tools`: starts the server if it is not
/// running and lists its tools (stored as tool records, attachable by
/// id); 424 saying why if it cannot start.
pub async fn tools(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<Value>>> {
    let record = mcp::load(&state, &id).await?;
    let tools = mcp::sync_tools(&state, &record).await?;
    Ok(Json(tools.iter().map(tool_json).collect()))
}

/// `PATCH /v1/mcp-servers/{id}/refresh`: reads the server's tool list
/// again (restarting it as configured).
pub async fn refresh(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let record = mcp::load(&state, &id).await?;
    state.live.mcp.forget(&id).await;
    let tools = mcp::sync_tools(&state, &record).await?;
    Ok(Json(json!({
        "tools": tools.iter().map(tool_json).collect::<Vec<_>>(),
    })))
}

async fn server_tool(
    state: &AppState,
    id: &str,
    tool_id: &str,
) -> ApiResult<(McpServerRecord, crate::agents::tools::ToolRecord)> {
    let record = mcp::load(state, id).await?;
    check_id("tool", tool_id)?;
    let stored = mcp::stored_tools(state, id).await?;
    let tool = match stored.into_iter().find(|t| t.id == tool_id) {
        Some(tool) => tool,
        None => mcp::sync_tools(state, &record)
            .await?
            .into_iter()
            .find(|t| t.id == tool_id)
            .ok_or_else(|| ApiError::not_found("tool of this MCP server", tool_id))?,
    };
    Ok((record, tool))
}

pub async fn tool(
    State(state): State<AppState>,
    Path((id, tool_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let (_, tool) = server_tool(&state, &id, &tool_id).await?;
    Ok(Json(tool_json(&tool)))
}

#[derive(Debug, Default, Deserialize)]
pub struct RunFields {
    #[serde(default)]
    args: Option<serde_json::Map<String, Value>>,
}

/// `POST /v1/mcp-servers/{id}/tools/{tool_id}/run`: runs the tool once,
/// outside any agent (Letta's `ToolExecutionResult`).
pub async fn run(
    State(state): State<AppState>,
    Path((id, tool_id)): Path<(String, String)>,
    Body(fields): Body<RunFields>,
) -> ApiResult<Json<Value>> {
    let (record, tool) = server_tool(&state, &id, &tool_id).await?;
    let runnable = mcp::tool(&state, &record, &tool.name).await?;
    let arguments = Value::Object(fields.args.unwrap_or_default());
    let call_id = format!("call-{}", uuid::Uuid::now_v7());
    let (status, output, stderr) = match runnable
        .call(arguments, ToolContext::detached(call_id))
        .await
    {
        Ok(out) if out.is_error => ("error", out.content.clone(), vec![out.content]),
        Ok(out) => ("success", out.content, Vec::new()),
        Err(e) => ("error", e.to_string(), vec![e.to_string()]),
    };
    Ok(Json(json!({
        "status": status,
        "func_return": output,
        "stdout": [],
        "stderr": stderr,
        "agent_state": null,
        "sandbox_config_fingerprint": null,
    })))
}

/// The routes of `/v1/mcp-servers`.
pub fn routes() -> axum::Router<AppState> {
    use axum::routing::{get, patch, post};
    axum::Router::new()
        .route("/v1/mcp-servers", get(list).post(create))
        .route(
            "/v1/mcp-servers/{id}",
            get(retrieve).patch(update).delete(delete),
        )
        .route("/v1/mcp-servers/{id}/tools", get(tools))
        .route("/v1/mcp-servers/{id}/tools/{tool_id}", get(tool))
        .route("/v1/mcp-servers/{id}/tools/{tool_id}/run", post(run))
        .route("/v1/mcp-servers/{id}/refresh", patch(refresh))
}
