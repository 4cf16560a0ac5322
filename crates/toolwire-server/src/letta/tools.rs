//! `/v1/tools`: Python-source tools that clients define, and the built-in
//! and MCP tools of the engine, listed alongside as tools too.

use axum::Json;
use axum::extract::{Path, State};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_tools::python::derive_schema;

use crate::agents::ids::{check_id, new_id};
use crate::agents::options::refresh_users_of;
use crate::agents::schema;
use crate::agents::tools::{self as records, ToolRecord, all_tools, find_tool};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::page::{Order, PageQuery};
use crate::state::AppState;
/// The lock that keeps tool names unique.
const NAMES_LOCK: &str = "tool-names";

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

/// A tool's JSON (Letta's `Tool`).
pub fn tool_json(record: &ToolRecord) -> Value {
    json!({
        "id": record.id,
        "name": record.name,
        "description": record.description,
        "json_schema": record.json_schema,
        "args_json_schema": record.json_schema.get("parameters"),
        "tags": record.tags,
        "default_requires_approval": record.default_requires_approval,
        "source_code": record.source_code,
        "source_type": record.source_type,
        "tool_type": record.tool_type,
        "return_char_limit": record.return_char_limit,
        "metadata_": record.metadata,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    })
}

/// Stores `record` (unless another tool has its name); the agents that
/// have it get it in their next turns, and the engine's own.
async fn save(state: &AppState, record: &ToolRecord) -> ApiResult<()> {
    records::save(state, record).await?;
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
    Ok(Json(tool_json(&record)))
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
    Ok(Json(tool_json(&record)))
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
    Ok(Json(page.iter().map(tool_json).collect()))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    check_id("tool", &id)?;
    Ok(Json(tool_json(&find_tool(&state, &id).await?)))
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
    Ok(Json(tool_json(&record)))
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
    records::delete(&state, &record).await?;
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
