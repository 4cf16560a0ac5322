//! A turn's tools from an agent's tool records: the engine's own, Python
//! tools built from their source, and the tools of the MCP servers added
//! through the API (started here, bounded, so that the first step sees
//! them).

use std::collections::{BTreeMap, HashSet};

use toolwire_tools::ToolRegistry;
use toolwire_tools::python::{PythonTool, PythonToolDef};

use super::schema;
use crate::agents::mcp;
use crate::agents::tools::{MEMORY_TOOL_TYPE, ToolRecord};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The engine tools (and Python tools built from records) behind `tools`,
/// for one turn. Records whose tool is gone are skipped with a warning.
pub async fn registry(state: &AppState, tools: &[&ToolRecord]) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    let mut from_servers: BTreeMap<&str, HashSet<String>> = BTreeMap::new();
    for &record in tools {
        if record.tool_type == MEMORY_TOOL_TYPE {
            // Bound to an agent: see `options::agent_options`.
            continue;
        }
        if let Some(server) = mcp::server_of(record) {
            from_servers
                .entry(server)
                .or_default()
                .insert(record.name.clone());
            continue;
        }
        if record.is_custom() {
            match python_tool(state, record).await {
                Ok(tool) => registry.register(std::sync::Arc::new(tool)),
                Err(e) => tracing::warn!(tool = %record.name, error = %e.message, "tool left out"),
            }
        } else if let Some(tool) = state.engine.tools().get(&record.name) {
            registry.register(tool.clone());
        } else {
            tracing::warn!(tool = %record.name, "tool is no longer available; left out");
        }
    }
    for (id, names) in from_servers {
        match mcp::load(state, id).await {
            Ok(server) => {
                let handle = mcp::handle(state, &server);
                if !handle.is_running().await {
                    // Started here (bounded) so that a turn's first step
                    // sees the tools; a server that cannot start costs
                    // its tools only.
                    if let Err(e) = mcp::sync_tools(state, &server).await {
                        tracing::warn!(error = %e.message, "MCP tools left out");
                    }
                }
                registry.register_source(std::sync::Arc::new(mcp::AttachedTools::new(
                    handle,
                    &server.server_name,
                    names,
                )));
            }
            Err(e) => tracing::warn!(server = id, error = %e.message, "MCP tools left out"),
        }
    }
    registry
}

async fn python_tool(state: &AppState, record: &ToolRecord) -> ApiResult<PythonTool> {
    let given = schema::read(&record.name, &record.json_schema)
        .map_err(|e| ApiError::bad_request(format!("tool `{}`: {e}", record.name)))?;
    let def = PythonToolDef {
        name: record.name.clone(),
        description: record.description.clone(),
        source_code: record.source_code.clone().unwrap_or_default(),
        schema: Some(given),
    };
    PythonTool::new(
        def,
        state.settings.python.clone(),
        state.settings.python_sandbox.clone(),
    )
    .await
    .map_err(|e| ApiError::bad_request(format!("tool `{}`: {e}", record.name)))
}
