//! Tools as records: Python-source tools that clients define (stored),
//! and the engine's built-in and MCP tools as records too (stored only
//! once a client changes them); the registry a turn gets from them.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolwire_tools::python::ToolSchemaInfo;

use super::schema;
use toolwire_tools::ToolSpec;

use crate::agents::ids::stable_tool_id;
use crate::agents::memory::MemoryOp;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The kind of a tool's record.
pub const KIND: &str = "tool";

/// The record, among the tools' (so that it is written in the same
/// transaction as any change to them), whose body changes with every
/// change to the stored tools: see [`stored_tools`]. Not a tool id (those
/// are `tool-UUID`): no route reaches it.
const VERSION_ID: &str = "catalog-version";

/// The stored tool records as last read, with the version record read
/// before them (kept in the server's state, `tools_memo::Versioned`), so
/// that a message reads one small record rather than every tool while
/// none changed. Every change to the stored tools (on any instance: they
/// all write through [`write`]) writes a new version in its transaction,
/// so a version read equal to the kept one means the kept tools are what
/// the store holds (they were read after that version).
async fn stored_tools(state: &AppState) -> ApiResult<Arc<Vec<ToolRecord>>> {
    let version = state
        .store()
        .document(KIND, VERSION_ID)
        .await?
        .map(|doc| doc.body);
    if let Some(tools) = state.stored_tools.get::<Vec<ToolRecord>>(&version) {
        return Ok(tools);
    }
    let stored = Arc::new(records_of(state.store().documents(KIND).await?)?);
    state.stored_tools.set(version, Arc::clone(&stored));
    Ok(stored)
}

/// Stores (`Some` body) or removes (`None`) tool records, with a new
/// version of the stored tools, all in one transaction: the only way the
/// server writes tools.
pub async fn write(state: &AppState, mut changes: Vec<(String, Option<Value>)>) -> ApiResult<()> {
    let version = serde_json::json!({ "version": uuid::Uuid::now_v7().to_string() });
    changes.push((VERSION_ID.to_owned(), Some(version)));
    state.engine.write_records(KIND, &changes).await?;
    Ok(())
}

/// The stored tool records of `docs` (documents of [`KIND`]).
pub fn records_of(docs: Vec<toolwire_store::Document>) -> ApiResult<Vec<ToolRecord>> {
    docs.into_iter()
        .filter(|doc| doc.id != VERSION_ID)
        .map(|doc| ToolRecord::from_body(doc.body))
        .collect()
}

/// The `tool_type` of Letta's memory tools (Letta's `ToolType`).
pub const MEMORY_TOOL_TYPE: &str = "letta_memory_core";

/// A tool as stored and served.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolRecord {
    pub id: String,
    pub name: String,
    pub description: String,
    /// `{name, description, parameters}` as Letta keeps it.
    pub json_schema: Value,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub default_requires_approval: bool,
    #[serde(default)]
    pub source_code: Option<String>,
    #[serde(default)]
    pub source_type: Option<String>,
    /// `custom` (Python source), `letta_builtin` (toolwire's built-in
    /// tools) or `external_mcp`: values of Letta's `ToolType`.
    pub tool_type: String,
    #[serde(default)]
    pub return_char_limit: Option<u64>,
    #[serde(default)]
    pub metadata: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl ToolRecord {
    /// The engine's own tool `spec` as a record (not stored unless a client
    /// changes it).
    pub(crate) fn engine_tool(spec: &ToolSpec) -> ToolRecord {
        let epoch = DateTime::<Utc>::UNIX_EPOCH;
        ToolRecord {
            id: stable_tool_id(&spec.name),
            name: spec.name.clone(),
            description: spec.description.clone(),
            json_schema: schema::to_json(&ToolSchemaInfo {
                name: spec.name.clone(),
                description: spec.description.clone(),
                parameters: spec.parameters.clone(),
            }),
            tags: Vec::new(),
            default_requires_approval: false,
            source_code: None,
            source_type: None,
            tool_type: if spec.server.is_some() {
                "external_mcp".into()
            } else {
                // Letta's name for tools the server itself provides.
                "letta_builtin".into()
            },
            return_char_limit: None,
            metadata: None,
            created_at: epoch,
            updated_at: epoch,
        }
    }

    /// One of Letta's memory tools as a record (not stored unless a
    /// client changes it).
    pub(crate) fn memory_tool(op: MemoryOp) -> ToolRecord {
        let mut record = ToolRecord::engine_tool(op.spec());
        record.tool_type = MEMORY_TOOL_TYPE.into();
        record
    }

    pub fn is_custom(&self) -> bool {
        self.tool_type == "custom"
    }

    pub(crate) fn from_body(body: Value) -> ApiResult<ToolRecord> {
        serde_json::from_value(body)
            .map_err(|e| ApiError::internal(format!("a stored tool is unreadable: {e}")))
    }
}

/// Every tool, borrowed from what one read gives: the engine's (their
/// records made once per set of engine tools, see [`ToolsMemo`]), each in
/// its stored version where a client changed it, then the other stored
/// ones, oldest first.
///
/// [`ToolsMemo`]: crate::tools_memo::ToolsMemo
pub struct Catalog {
    engine: Arc<Vec<ToolRecord>>,
    stored: Arc<Vec<ToolRecord>>,
}

impl Catalog {
    /// The stored tools as they are now (they may change on any
    /// instance: see [`stored_tools`]), over the engine's.
    pub async fn read(state: &AppState) -> ApiResult<Catalog> {
        let stored = stored_tools(state).await?;
        let engine = state
            .tools_memo
            .get(state.engine.tools().current(), |tools| {
                tools
                    .iter()
                    .map(|tool| ToolRecord::engine_tool(tool.spec()))
                    .chain(MemoryOp::ALL.into_iter().map(ToolRecord::memory_tool))
                    .collect::<Vec<_>>()
            });
        Ok(Catalog { engine, stored })
    }

    /// Every tool, in [`all_tools`]' order. A stored record with an
    /// engine tool's id holds a client's changes to it.
    pub fn all(&self) -> Vec<&ToolRecord> {
        let mut all: Vec<&ToolRecord> = self
            .engine
            .iter()
            .map(|own| self.stored.iter().find(|s| s.id == own.id).unwrap_or(own))
            .collect();
        all.extend(
            self.stored
                .iter()
                .filter(|s| !self.engine.iter().any(|own| own.id == s.id)),
        );
        all
    }
}

/// Every tool: the engine's, then the stored ones, oldest first. A stored
/// record with an engine tool's id holds a client's changes to it.
pub async fn all_tools(state: &AppState) -> ApiResult<Vec<ToolRecord>> {
    Ok(Catalog::read(state)
        .await?
        .all()
        .into_iter()
        .cloned()
        .collect())
}

pub async fn find_tool(state: &AppState, id: &str) -> ApiResult<ToolRecord> {
    all_tools(state)
        .await?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| ApiError::not_found("tool", id))
}

/// Stores `record` unless another tool has its name.
pub async fn save(state: &AppState, record: &ToolRecord) -> ApiResult<()> {
    if let Some(other) = all_tools(state)
        .await?
        .into_iter()
        .find(|t| t.name == record.name && t.id != record.id)
    {
        return Err(ApiError::conflict(
            "TOOL_NAME_TAKEN",
            format!(
                "a tool named `{}` exists already ({})",
                record.name, other.id
            ),
        ));
    }
    let body = serde_json::to_value(record)
        .map_err(|e| ApiError::internal(format!("a tool cannot be stored: {e}")))?;
    write(state, vec![(record.id.clone(), Some(body))]).await
}

/// Removes client tool `record`.
pub async fn delete(state: &AppState, record: &ToolRecord) -> ApiResult<()> {
    write(state, vec![(record.id.clone(), None)]).await
}
