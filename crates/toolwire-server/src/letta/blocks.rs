//! Memory blocks as Letta serves them: `/v1/blocks` (create, list, count,
//! get, change, delete, the agents that have a block) and an agent's
//! core memory (`/v1/agents/{id}/core-memory…`: its blocks by label,
//! attach and detach by id), plus attaching and detaching an agent's
//! tools. Blocks are records of [`crate::agents::blocks`]; a change to a
//! block is seen by every agent that has it at its next model step.

use axum::Json;
use axum::extract::{Path, State};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::agents::blocks::{self, BlockCreate, BlockRecord, BlockUpdate};
use crate::agents::ids::check_id;
use crate::agents::options::refresh_options;
use crate::agents::tools::{ToolRecord, all_tools, find_tool};
use crate::agents::{self, AgentRecord, load};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::agents::agent_json;
use crate::letta::block_view::block_json;
use crate::letta::page::{Order, PageQuery};
use crate::letta::tools::tool_json;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    Body(fields): Body<BlockCreate>,
) -> ApiResult<Json<Value>> {
    let block = BlockRecord::create(fields)?;
    blocks::save(&state.engine, &block).await?;
    Ok(Json(block_json(&block)))
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    #[serde(flatten)]
    page: PageQuery,
    label: Option<String>,
    /// A template's name.
    name: Option<String>,
    templates_only: Option<String>,
    label_search: Option<String>,
    value_search: Option<String>,
    description_search: Option<String>,
    project_id: Option<String>,
    /// One tag (a block with it matches).
    tags: Option<String>,
}

fn contains(haystack: Option<&str>, needle: &Option<String>) -> bool {
    needle
        .as_ref()
        .is_none_or(|n| haystack.is_some_and(|h| h.to_lowercase().contains(&n.to_lowercase())))
}

async fn listed(state: &AppState, query: &ListQuery) -> ApiResult<Vec<BlockRecord>> {
    let templates_only = query.templates_only.as_deref() == Some("true");
    Ok(blocks::all(&state.engine)
        .await?
        .into_iter()
        .filter(|b| query.label.as_ref().is_none_or(|l| &b.label == l))
        .filter(|b| {
            query
                .name
                .as_ref()
                .is_none_or(|n| b.template_name.as_ref() == Some(n))
        })
        .filter(|b| !templates_only || b.is_template)
        .filter(|b| contains(Some(&b.label), &query.label_search))
        .filter(|b| contains(Some(&b.value), &query.value_search))
        .filter(|b| contains(b.description.as_deref(), &query.description_search))
        .filter(|b| {
            query
                .project_id
                .as_ref()
                .is_none_or(|p| b.project_id.as_ref() == Some(p))
        })
        .filter(|b| query.tags.as_ref().is_none_or(|t| b.tags.contains(t)))
        .collect())
}

pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let all = listed(&state, &query).await?;
    let page = query.page.page(all, |b| b.id.as_str(), Order::Asc, 50)?;
    Ok(Json(page.iter().map(block_json).collect()))
}

pub async fn count(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<usize>> {
    Ok(Json(listed(&state, &query).await?.len()))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(block_json(&blocks::load(&state.engine, &id).await?)))
}

/// Changes block `id` (under its lock), stores it, and returns it.
async fn change(state: &AppState, id: &str, fields: BlockUpdate) -> ApiResult<BlockRecord> {
    let _block = state.lock(&blocks::lock_key(id)).await;
    let block = blocks::load(&state.engine, id).await?.updated(fields)?;
    blocks::save(&state.engine, &block).await?;
    Ok(block)
}

pub async fn update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(fields): Body<BlockUpdate>,
) -> ApiResult<Json<Value>> {
    check_id(blocks::KIND, &id)?;
    Ok(Json(block_json(&change(&state, &id, fields).await?)))
}

/// Deletes block `id`; it leaves the agents that had it.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let _block = state.lock(&blocks::lock_key(&id)).await;
    blocks::load(&state.engine, &id).await?;
    for agent in agents::all(&state).await? {
        if agent.block_ids.contains(&id) {
            let _agent_lock = state.lock(&agent.id).await;
            let mut agent = load(&state, &agent.id).await?;
            agent.block_ids.retain(|b| b != &id);
            agent.updated_at = Utc::now();
            agents::save(&state, &agent).await?;
        }
    }
    blocks::delete(&state.engine, &id).await?;
    Ok(Json(json!({})))
}

/// `GET /v1/blocks/{id}/agents`: the agents that have the block.
pub async fn agents_of(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(page): Query<PageQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    blocks::load(&state.engine, &id).await?;
    let having: Vec<AgentRecord> = agents::all(&state)
        .await?
        .into_iter()
        .filter(|a| a.block_ids.contains(&id))
        .collect();
    let page = page.page(having, |a| a.id.as_str(), Order::Asc, 50)?;
    let mut out = Vec::with_capacity(page.len());
    for agent in &page {
        out.push(agent_json(&state, agent).await?);
    }
    Ok(Json(out))
}

/// The agent's block labelled `label`.
async fn by_label(state: &AppState, agent: &AgentRecord, label: &str) -> ApiResult<BlockRecord> {
    blocks::of_ids(&state.engine, &agent.block_ids)
        .await?
        .into_iter()
        .find(|b| b.label == label)
        .ok_or_else(|| {
            ApiError::not_found("block labelled", label).with("agent_id", agent.id.clone())
        })
}

/// `GET /v1/agents/{id}/core-memory`: Letta's `Memory` of the agent.
pub async fn core_memory(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let agent = load(&state, &id).await?;
    let blocks: Vec<Value> = blocks::of_ids(&state.engine, &agent.block_ids)
        .await?
        .iter()
        .map(block_json)
        .collect();
    Ok(Json(json!({
        "blocks": blocks,
        "file_blocks": [],
        "agent_type": "letta_v1_agent",
        "git_enabled": false,
        "prompt_template": "",
    })))
}

pub async fn agent_blocks(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(page): Query<PageQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let agent = load(&state, &id).await?;
    let all = blocks::of_ids(&state.engine, &agent.block_ids).await?;
    // The agent's order (its prompt's) is the list's: no sort by id.
    let page = page.page(all, |b| b.id.as_str(), Order::Asc, 50)?;
    Ok(Json(page.iter().map(block_json).collect()))
}

pub async fn agent_block(
    State(state): State<AppState>,
    Path((id, label)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let agent = load(&state, &id).await?;
    Ok(Json(block_json(&by_label(&state, &agent, &label).await?)))
}

pub async fn update_agent_block(
    State(state): State<AppState>,
    Path((id, label)): Path<(String, String)>,
    Body(fields): Body<BlockUpdate>,
) -> ApiResult<Json<Value>> {
    let agent = load(&state, &id).await?;
    let block = by_label(&state, &agent, &label).await?;
    if let Some(new) = &fields.label
        && new != &label
        && blocks::of_ids(&state.engine, &agent.block_ids)
            .await?
            .iter()
            .any(|b| &b.label == new)
    {
        return Err(duplicate_label(new));
    }
    Ok(Json(block_json(&change(&state, &block.id, fields).await?)))
}

fn duplicate_label(label: &str) -> ApiError {
    ApiError::conflict(
        "DUPLICATE_BLOCK_LABEL",
        format!("the agent has a block labelled `{label}` already"),
    )
}

/// Runs `edit` on agent `id` under its lock, stores it, tells the engine,
/// and returns its JSON.
async fn edit_agent(
    state: &AppState,
    id: &str,
    edit: impl AsyncFnOnce(&mut AgentRecord) -> ApiResult<()>,
) -> ApiResult<Json<Value>> {
    let _agent_lock = state.lock(id).await;
    let mut agent = load(state, id).await?;
    edit(&mut agent).await?;
    agent.updated_at = Utc::now();
    agents::save(state, &agent).await?;
    refresh_options(state, &agent).await?;
    Ok(Json(agent_json(state, &agent).await?))
}

pub async fn attach_block(
    State(state): State<AppState>,
    Path((id, block_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let engine = state.engine.clone();
    edit_agent(&state, &id, async |agent| {
        let block = blocks::load(&engine, &block_id).await?;
        if agent.block_ids.contains(&block_id) {
            return Ok(());
        }
        if blocks::of_ids(&engine, &agent.block_ids)
            .await?
            .iter()
            .any(|b| b.label == block.label)
        {
            return Err(duplicate_label(&block.label));
        }
        agent.block_ids.push(block_id.clone());
        Ok(())
    })
    .await
}

pub async fn detach_block(
    State(state): State<AppState>,
    Path((id, block_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    edit_agent(&state, &id, async |agent| {
        check_id(blocks::KIND, &block_id)?;
        if !agent.block_ids.contains(&block_id) {
            return Err(ApiError::not_found("block of this agent", &block_id));
        }
        agent.block_ids.retain(|b| b != &block_id);
        Ok(())
    })
    .await
}

/// `GET /v1/agents/{id}/tools`.
pub async fn agent_tools(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(page): Query<PageQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let agent = load(&state, &id).await?;
    let all = all_tools(&state).await?;
    let tools: Vec<ToolRecord> = agent.tools(&all).into_iter().cloned().collect();
    let page = page.page(tools, |t| t.id.as_str(), Order::Asc, 50)?;
    Ok(Json(page.iter().map(tool_json).collect()))
}

pub async fn attach_tool(
    State(state): State<AppState>,
    Path((id, tool_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_id("tool", &tool_id)?;
    let tool = find_tool(&state, &tool_id).await?;
    edit_agent(&state, &id, async |agent| {
        if !agent.tool_ids.contains(&tool.id) {
            agent.tool_ids.push(tool.id.clone());
        }
        Ok(())
    })
    .await
}

pub async fn detach_tool(
    State(state): State<AppState>,
    Path((id, tool_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    edit_agent(&state, &id, async |agent| {
        check_id("tool", &tool_id)?;
        if !agent.tool_ids.contains(&tool_id) {
            return Err(ApiError::not_found("tool of this agent", &tool_id));
        }
        agent.tool_ids.retain(|t| t != &tool_id);
        Ok(())
    })
    .await
}

/// The routes of blocks, an agent's core memory and its tools' attachment.
pub fn routes() -> axum::Router<AppState> {
    use axum::routing::{get, patch};
    axum::Router::new()
        .route("/v1/blocks", get(list).post(create))
        .route("/v1/blocks/count", get(count))
        .route(
            "/v1/blocks/{id}",
            get(retrieve).patch(update).delete(delete),
        )
        .route("/v1/blocks/{id}/agents", get(agents_of))
        .route("/v1/agents/{id}/core-memory", get(core_memory))
        .route("/v1/agents/{id}/core-memory/blocks", get(agent_blocks))
        .route(
            "/v1/agents/{id}/core-memory/blocks/{label}",
            get(agent_block).patch(update_agent_block),
        )
        .route(
            "/v1/agents/{id}/core-memory/blocks/attach/{block_id}",
            patch(attach_block),
        )
        .route(
            "/v1/agents/{id}/core-memory/blocks/detach/{block_id}",
            patch(detach_block),
        )
        .route("/v1/agents/{id}/tools", get(agent_tools))
        .route("/v1/agents/{id}/tools/attach/{tool_id}", patch(attach_tool))
        .route("/v1/agents/{id}/tools/detach/{tool_id}", patch(detach_tool))
        .route("/v1/agents/{id}/context", get(super::context::retrieve))
}
