//! `/v1/tools`: Python-source tools that clients define, and the built-in
//! and MCP tools of the engine, listed alongside as tools too.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolwire_tools::python::{PythonTool, PythonToolDef, ToolSchemaInfo, derive_schema};
use toolwire_tools::{ToolRegistry, ToolSpec};

use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::agents::refresh_users_of;
use crate::letta::ids::{check_id, new_id, stable_tool_id};
use crate::letta::page::{Order, PageQuery};
use crate::letta::schema;
use crate::state::AppState;

const KIND: &str = "tool";
/// The lock that keeps tool names unique.
const NAMES_LOCK: &str = "tool-names";

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
    fn engine_tool(spec: &ToolSpec) -> ToolRecord {
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

    pub fn is_custom(&self) -> bool {
        self.tool_type == "custom"
    }

    /// The JSON the API serves.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "json_schema": self.json_schema,
            "args_json_schema": self.json_schema.get("parameters"),
            "tags": self.tags,
            "default_requires_approval": self.default_requires_approval,
            "source_code": self.source_code,
            "source_type": self.source_type,
            "tool_type": self.tool_type,
            "return_char_limit": self.return_char_limit,
            "metadata_": self.metadata,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        })
    }

    fn from_body(body: Value) -> ApiResult<ToolRecord> {
        serde_json::from_value(body)
            .map_err(|e| ApiError::internal(format!("a stored tool is unreadable: {e}")))
    }
}

/// What `POST`/`PUT`/`PATCH /v1/tools` accept. Letta's other fields
/// (pip_requirements, npm_requirements …) are accepted and ignored:
/// toolwire runs tools with the Python it has.
#[derive(Debug, Default, Deserialize)]
pub struct ToolFields {
    source_code: Option<String>,
    name: Option<String>,
    description: Option<String>,
    json_schema: Option<Value>,
    args_json_schema: Option<Value>,
    tags: Option<Vec<String>>,
    default_requires_approval: Option<bool>,
    source_type: Option<String>,
    return_char_limit: Option<u64>,
    #[serde(alias = "metadata_")]
    metadata: Option<Value>,
}

/// Every tool: the engine's, then the stored ones, oldest first. A stored
/// record with an engine tool's id holds a client's changes to it.
pub async fn all_tools(state: &AppState) -> ApiResult<Vec<ToolRecord>> {
    let mut stored = Vec::new();
    for doc in state.store().documents(KIND).await? {
        stored.push(ToolRecord::from_body(doc.body)?);
    }
    let mut tools: Vec<ToolRecord> = state
        .engine
        .tools()
        .specs()
        .iter()
        .map(|spec| {
            let own = ToolRecord::engine_tool(spec);
            stored
                .iter()
                .find(|s| s.id == own.id)
                .cloned()
                .unwrap_or(own)
        })
        .collect();
    let engine_ids: Vec<String> = tools.iter().map(|t| t.id.clone()).collect();
    tools.extend(stored.into_iter().filter(|s| !engine_ids.contains(&s.id)));
    Ok(tools)
}

pub async fn find_tool(state: &AppState, id: &str) -> ApiResult<ToolRecord> {
    all_tools(state)
        .await?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| ApiError::not_found("tool", id))
}

/// The engine tools (and Python tools built from records) behind `tools`,
/// for one turn. Records whose tool is gone are skipped with a warning.
pub async fn registry(state: &AppState, tools: &[ToolRecord]) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    for record in tools {
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

/// The name of the last top-level function of `source` (Letta's rule for
/// a tool whose name is not given).
fn last_function(source: &str) -> Option<String> {
    source
        .lines()
        .filter_map(|l| {
            l.strip_prefix("def ")
                .or_else(|| l.strip_prefix("async def "))
        })
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .next_back()
}

/// A new record from `fields`, or `existing` changed by them; the schema
/// is derived from the source when the client gives none.
async fn build(
    state: &AppState,
    fields: ToolFields,
    existing: Option<ToolRecord>,
) -> ApiResult<ToolRecord> {
    if existing.as_ref().is_some_and(|e| !e.is_custom())
        && (fields.source_code.is_some() || fields.json_schema.is_some())
    {
        return Err(ApiError::bad_request(
            "a built-in or MCP tool's code and schema cannot be changed; \
             only its description, tags and default_requires_approval",
        ));
    }
    let now = Utc::now();
    let mut record = existing.unwrap_or_else(|| ToolRecord {
        id: new_id("tool"),
        name: String::new(),
        description: String::new(),
        json_schema: Value::Null,
        tags: Vec::new(),
        default_requires_approval: false,
        source_code: None,
        source_type: Some("python".into()),
        tool_type: "custom".into(),
        return_char_limit: None,
        metadata: None,
        created_at: now,
        updated_at: now,
    });
    record.updated_at = now;
    if let Some(source_type) = fields.source_type {
        if source_type != "python" {
            return Err(ApiError::bad_request(format!(
                "source_type `{source_type}` is not supported; toolwire runs python tools"
            )));
        }
        record.source_type = Some(source_type);
    }
    let code_changed = fields.source_code.is_some() || fields.json_schema.is_some();
    if let Some(code) = fields.source_code {
        record.source_code = Some(code);
    }
    if let Some(tags) = fields.tags {
        record.tags = tags;
    }
    if let Some(flag) = fields.default_requires_approval {
        record.default_requires_approval = flag;
    }
    if let Some(limit) = fields.return_char_limit {
        record.return_char_limit = Some(limit);
    }
    if let Some(metadata) = fields.metadata {
        record.metadata = Some(metadata);
    }
    if record.is_custom() && (code_changed || record.json_schema.is_null()) {
        let source = record
            .source_code
            .clone()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| ApiError::bad_request("source_code is required"))?;
        let given = fields.json_schema.or(fields
            .args_json_schema
            .map(|parameters| json!({"parameters": parameters})));
        let name = fields
            .name
            .clone()
            .or_else(|| given.as_ref()?.get("name")?.as_str().map(str::to_owned))
            .or_else(|| last_function(&source))
            .ok_or_else(|| {
                ApiError::bad_request("source_code defines no function (`def name(...)`)")
            })?;
        let info = match &given {
            Some(given) => schema::read(&name, given),
            None => derive_schema(&source, &name, &state.settings.python_sandbox).await,
        }
        .map_err(|e| ApiError::bad_request(format!("tool `{name}`: {e}")))?;
        record.name = name;
        record.json_schema = schema::to_json(&info);
        if record.description.is_empty() || fields.description.is_none() {
            record.description = info.description.clone();
        }
    }
    if let Some(description) = fields.description {
        record.description = description.clone();
        if let Value::Object(schema) = &mut record.json_schema {
            schema.insert("description".into(), Value::String(description));
        }
    }
    if let Some(name) = fields.name
        && name != record.name
    {
        return Err(ApiError::bad_request(format!(
            "the tool's name is its function's name (`{}`), not `{name}`",
            record.name
        )));
    }
    Ok(record)
}

/// Stores `record` unless another tool has its name.
async fn save(state: &AppState, record: &ToolRecord) -> ApiResult<()> {
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
    state.store().put_document(KIND, &record.id, &body).await?;
    refresh_users_of(state, &record.id).await
}

pub async fn create(
    State(state): State<AppState>,
    Body(fields): Body<ToolFields>,
) -> ApiResult<Json<Value>> {
    let _names = state.lock(NAMES_LOCK).await;
    let record = build(&state, fields, None).await?;
    save(&state, &record).await?;
    tracing::info!(tool = %record.name, id = %record.id, "tool created");
    Ok(Json(record.to_json()))
}

/// `PUT /v1/tools`: creates the tool, or updates the one of the same name.
pub async fn upsert(
    State(state): State<AppState>,
    Body(fields): Body<ToolFields>,
) -> ApiResult<Json<Value>> {
    let _names = state.lock(NAMES_LOCK).await;
    let name = fields
        .name
        .clone()
        .or_else(|| {
            fields
                .json_schema
                .as_ref()?
                .get("name")?
                .as_str()
                .map(str::to_owned)
        })
        .or_else(|| last_function(fields.source_code.as_deref()?))
        .ok_or_else(|| {
            ApiError::bad_request("source_code defines no function (`def name(...)`)")
        })?;
    let existing = all_tools(&state)
        .await?
        .into_iter()
        .find(|t| t.name == name);
    let record = match existing {
        Some(existing) => build(&state, fields, Some(existing)).await?,
        None => build(&state, fields, None).await?,
    };
    save(&state, &record).await?;
    Ok(Json(record.to_json()))
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    #[serde(flatten)]
    page: PageQuery,
    name: Option<String>,
    search: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let tools: Vec<ToolRecord> = all_tools(&state)
        .await?
        .into_iter()
        .filter(|t| query.name.as_ref().is_none_or(|n| &t.name == n))
        .filter(|t| {
            query
                .search
                .as_ref()
                .is_none_or(|s| t.name.to_lowercase().contains(&s.to_lowercase()))
        })
        .collect();
    let page = query.page.page(tools, |t| t.id.as_str(), Order::Asc, 50)?;
    Ok(Json(page.iter().map(ToolRecord::to_json).collect()))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    check_id("tool", &id)?;
    Ok(Json(find_tool(&state, &id).await?.to_json()))
}

pub async fn update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(fields): Body<ToolFields>,
) -> ApiResult<Json<Value>> {
    check_id("tool", &id)?;
    let _names = state.lock(NAMES_LOCK).await;
    let existing = find_tool(&state, &id).await?;
    let record = build(&state, fields, Some(existing)).await?;
    save(&state, &record).await?;
    Ok(Json(record.to_json()))
}

pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    check_id("tool", &id)?;
    let _names = state.lock(NAMES_LOCK).await;
    let record = find_tool(&state, &id).await?;
    if !record.is_custom() {
        return Err(ApiError::bad_request(format!(
            "`{}` is one of toolwire's own tools and cannot be deleted; \
             leave it out of an agent's tool_ids instead",
            record.name
        )));
    }
    state.store().delete_document(KIND, &id).await?;
    refresh_users_of(&state, &id).await?;
    Ok(Json(json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_top_level_function_names_the_tool() {
        let source = "import os\n\ndef helper(x):\n    def inner():\n        pass\n    return x\n\ndef roll_dice(sides: int) -> str:\n    return '4'\n";
        assert_eq!(last_function(source).as_deref(), Some("roll_dice"));
        assert_eq!(last_function("x = 1\n"), None);
    }
}
