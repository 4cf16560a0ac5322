//! `/v1/agents`: an agent (`crate::agents`) as Letta serves it; its
//! system prompt is its conversation's root, its message history that
//! conversation's active branch.

use std::collections::{BTreeMap, HashSet};

use axum::Json;
use axum::extract::{Path, State};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_engine::EngineError;
use toolwire_providers::ModelInfo;

use crate::agents::blocks::{self, BlockCreate, BlockRecord};
use crate::agents::ids::new_id;
use crate::agents::mcp;
use crate::agents::memory::MemoryOp;
use crate::agents::options::refresh_options;
use crate::agents::tools::MEMORY_TOOL_TYPE;
use crate::agents::tools::{ToolRecord, all_tools};
use crate::agents::{self, AgentRecord, KIND, load, models};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::block_view::block_json;
use crate::letta::page::{Order, PageQuery};
use crate::letta::tools::tool_json;
use crate::state::AppState;

/// What `POST`/`PATCH /v1/agents` accept. Letta has many more fields;
/// the ones toolwire has no use for are accepted and ignored.
#[derive(Debug, Default, Deserialize)]
pub struct AgentFields {
    name: Option<String>,
    system: Option<String>,
    description: Option<String>,
    /// A Letta handle (`openai/gpt-4o-mini`), a registry name or a model
    /// id.
    model: Option<String>,
    /// Letta's model settings (`provider_type`, `max_output_tokens` …):
    /// kept and served back. An object, as Letta's schema has it.
    model_settings: Option<serde_json::Map<String, Value>>,
    /// Letta's deprecated form: its `handle`, else its `model`, names the
    /// model when `model` does not.
    llm_config: Option<Value>,
    tool_ids: Option<Vec<String>>,
    /// Tool names, as Letta also accepts.
    tools: Option<Vec<String>>,
    tool_rules: Option<Vec<Value>>,
    include_base_tools: Option<bool>,
    tags: Option<Vec<String>>,
    metadata: Option<Value>,
    /// New blocks for the agent (Letta's `CreateBlock`s).
    memory_blocks: Option<Vec<BlockCreate>>,
    /// Existing blocks to attach (shared with the agents that have them).
    block_ids: Option<Vec<String>>,
    /// Letta's embedding handle: kept and served back.
    embedding: Option<String>,
    /// Letta's deprecated form of `embedding`: its `handle`, else its
    /// `embedding_model`.
    embedding_config: Option<Value>,
    approval_timeout_seconds: Option<u64>,
}

impl AgentFields {
    fn embedding(&self) -> Option<String> {
        self.embedding.clone().or_else(|| {
            let config = self.embedding_config.as_ref()?;
            ["handle", "embedding_model"]
                .into_iter()
                .find_map(|key| config.get(key)?.as_str().map(str::to_owned))
        })
    }

    /// The model the client named, checked against the registry (Letta's
    /// 404 for a handle that names none).
    fn model(&self, state: &AppState) -> ApiResult<Option<String>> {
        let given = self.model.clone().or_else(|| {
            let config = self.llm_config.as_ref()?;
            ["handle", "model"]
                .into_iter()
                .find_map(|key| config.get(key)?.as_str().map(str::to_owned))
        });
        if let Some(handle) = &given {
            models::resolve_handle(state.engine.models(), handle)?;
        }
        Ok(given)
    }
}

/// The tool ids `fields` names (ids and names), each checked to exist.
fn resolve_tools(fields: &AgentFields, all: &[ToolRecord]) -> ApiResult<Option<Vec<String>>> {
    if fields.tool_ids.is_none() && fields.tools.is_none() {
        return Ok(None);
    }
    let mut ids = Vec::new();
    for id in fields.tool_ids.iter().flatten() {
        if !all.iter().any(|t| &t.id == id) {
            return Err(ApiError::not_found("tool", id));
        }
        ids.push(id.clone());
    }
    for name in fields.tools.iter().flatten() {
        let tool = all
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| ApiError::not_found("tool named", name))?;
        ids.push(tool.id.clone());
    }
    let mut seen = HashSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    Ok(Some(ids))
}

/// Whether `include_base_tools` gives an agent `tool`: toolwire's
/// built-in tools, the config file's MCP servers' tools, and Letta's
/// default memory tools (`memory_insert`, `memory_replace`).
fn is_base_tool(tool: &ToolRecord) -> bool {
    if tool.tool_type == MEMORY_TOOL_TYPE {
        return MemoryOp::DEFAULT.iter().any(|op| op.name() == tool.name);
    }
    !tool.is_custom() && mcp::server_of(tool).is_none()
}

/// The agent's JSON (Letta's `AgentState`).
pub async fn agent_json(state: &AppState, agent: &AgentRecord) -> ApiResult<Value> {
    let all = all_tools(state).await?;
    let conversation = state.store().conversation(agent.conversation_id).await?;
    let system = state.store().message(conversation.root_id).await?.text();
    let entry = models::of_agent(state.engine.models(), agent.model.as_deref());
    let info = &entry.info;
    let tools: Vec<Value> = agent.tools(&all).into_iter().map(tool_json).collect();
    let last_stop_reason = super::runs::last_stop_reason(state, &agent.id).await?;
    let pending_approval = super::runs::pending_approval(state, agent.conversation_id).await?;
    let model_settings = agent
        .model_settings
        .clone()
        .unwrap_or_else(|| default_model_settings(info));
    let blocks: Vec<Value> = blocks::of_ids(&state.engine, &agent.block_ids)
        .await?
        .iter()
        .map(block_json)
        .collect();
    Ok(json!({
        "id": agent.id,
        "name": agent.name,
        "description": agent.description,
        "system": system,
        "agent_type": "letta_v1_agent",
        "model": agent.model.clone().unwrap_or_else(|| info.handle()),
        "model_settings": model_settings,
        "llm_config": llm_config(info),
        "embedding": agent.embedding,
        "embedding_config": agent.embedding.as_ref().map(|handle| embedding_config(handle)),
        "tools": tools,
        "tool_ids": agent.tool_ids,
        "tool_rules": agent.tool_rules,
        "tags": agent.tags,
        "metadata": agent.metadata,
        "memory": {
            "blocks": blocks,
            "file_blocks": [],
            "agent_type": "letta_v1_agent",
            "git_enabled": false,
            "prompt_template": "",
        },
        "blocks": blocks,
        "sources": [],
        "message_ids": [],
        "conversation_id": agent.conversation_id,
        "approvals": agent.approvals,
        "approval_timeout_seconds": agent.approval_timeout_seconds,
        "last_stop_reason": last_stop_reason,
        "pending_approval": pending_approval,
        "created_at": agent.created_at,
        "updated_at": agent.updated_at,
    }))
}

/// Letta's `model_settings` of an agent created without them: what its
/// server reports for an OpenAI model (Letta's agents test expects these
/// values), or an Anthropic one.
fn default_model_settings(info: &ModelInfo) -> Value {
    let max_output = info.max_output.map_or(DEFAULT_MAX_OUTPUT, u64::from);
    match endpoint_type(&info.provider) {
        "anthropic" => json!({
            "provider_type": "anthropic",
            "max_output_tokens": max_output,
            "parallel_tool_calls": true,
            "temperature": 1.0,
            "response_format": null,
        }),
        endpoint => json!({
            "provider_type": endpoint,
            "max_output_tokens": max_output,
            "parallel_tool_calls": true,
            "strict": false,
            "temperature": 1.0,
            "reasoning": {"reasoning_effort": "minimal"},
            "response_format": null,
        }),
    }
}

/// Letta's default `max_output_tokens` where the configuration gives none.
const DEFAULT_MAX_OUTPUT: u64 = 16_384;

/// Letta's `EmbeddingConfig` of handle `provider/model` (toolwire keeps it
/// only to serve it back).
fn embedding_config(handle: &str) -> Value {
    let (provider, model) = handle.split_once('/').unwrap_or(("openai", handle));
    json!({
        "handle": handle,
        "embedding_endpoint_type": provider,
        "embedding_model": model,
        "embedding_dim": 1536,
        "embedding_chunk_size": 300,
    })
}

/// Letta's `model_endpoint_type` / `provider_type` for a provider kind:
/// the scripted provider speaks OpenAI's format.
pub fn endpoint_type(provider: &str) -> &'static str {
    match provider {
        "anthropic" => "anthropic",
        _ => "openai",
    }
}

/// The context window Letta's schemas require where the configuration
/// gives none (what Letta itself assumes for OpenAI's models).
const UNKNOWN_CONTEXT_WINDOW: u64 = 128_000;

/// A model as Letta's `LLMConfig` describes it.
pub fn llm_config(info: &ModelInfo) -> Value {
    let window = info.context_window.unwrap_or(UNKNOWN_CONTEXT_WINDOW);
    json!({
        "handle": info.handle(),
        "model": info.model,
        "display_name": info.name,
        "model_endpoint_type": endpoint_type(&info.provider),
        "provider_name": info.provider,
        "context_window": window,
        "max_tokens": info.max_output,
        "enable_reasoner": info.capabilities.reasoning,
        "parallel_tool_calls": false,
    })
}

pub async fn create(
    State(state): State<AppState>,
    Body(fields): Body<AgentFields>,
) -> ApiResult<Json<Value>> {
    let model = fields.model(&state)?;
    let all = all_tools(&state).await?;
    let mut tool_ids = resolve_tools(&fields, &all)?.unwrap_or_default();
    if fields.include_base_tools.unwrap_or(true) {
        // toolwire's base tools are its built-in ones (files, search,
        // commands), the configured MCP servers' tools and Letta's
        // default memory tools.
        for tool in all.iter().filter(|t| is_base_tool(t)) {
            if !tool_ids.contains(&tool.id) {
                tool_ids.push(tool.id.clone());
            }
        }
    }
    let embedding = fields.embedding();
    let id = new_id(KIND);
    let name = fields
        .name
        .unwrap_or_else(|| format!("agent-{}", &id[id.len() - 8..]));
    let system = fields
        .system
        .unwrap_or_else(|| state.engine.config().system_prompt.clone());
    let mut new_blocks = Vec::new();
    for fields in fields.memory_blocks.clone().unwrap_or_default() {
        new_blocks.push(BlockRecord::create(fields)?);
    }
    let mut block_ids = Vec::new();
    for id in fields.block_ids.iter().flatten() {
        blocks::load(&state.engine, id).await?;
        block_ids.push(id.clone());
    }
    let conversation = state
        .engine
        .create_conversation_with(&system, Some(&name))
        .await?;
    blocks::save_all(&state.engine, &new_blocks).await?;
    // Letta's order: the blocks attached by id, then the new ones.
    block_ids.extend(new_blocks.iter().map(|b| b.id.clone()));
    let now = Utc::now();
    let agent = AgentRecord {
        id,
        name,
        description: fields.description,
        model,
        model_settings: fields.model_settings.map(Value::Object),
        tool_ids,
        tool_rules: fields.tool_rules.unwrap_or_default(),
        tags: fields.tags.unwrap_or_default(),
        metadata: fields.metadata,
        block_ids,
        memory_blocks: Vec::new(),
        embedding,
        conversation_id: conversation.id,
        approvals: BTreeMap::new(),
        approval_timeout_seconds: fields.approval_timeout_seconds,
        created_at: now,
        updated_at: now,
    };
    agents::create(&state, &agent).await?;
    refresh_options(&state, &agent).await?;
    tracing::info!(agent = %agent.id, name = %agent.name, conversation = %agent.conversation_id, "agent created");
    Ok(Json(agent_json(&state, &agent).await?))
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    #[serde(flatten)]
    page: PageQuery,
    name: Option<String>,
    tags: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let agents: Vec<AgentRecord> = agents::all(&state)
        .await?
        .into_iter()
        .filter(|a| query.name.as_ref().is_none_or(|n| &a.name == n))
        .filter(|a| query.tags.as_ref().is_none_or(|t| a.tags.contains(t)))
        .collect();
    let page = query.page.page(agents, |a| a.id.as_str(), Order::Asc, 50)?;
    let mut out = Vec::with_capacity(page.len());
    for agent in &page {
        out.push(agent_json(&state, agent).await?);
    }
    Ok(Json(out))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let agent = load(&state, &id).await?;
    Ok(Json(agent_json(&state, &agent).await?))
}

pub async fn update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(fields): Body<AgentFields>,
) -> ApiResult<Json<Value>> {
    let model = fields.model(&state)?;
    let embedding = fields.embedding();
    let _agent_lock = state.lock(&id).await;
    let mut agent = load(&state, &id).await?;
    let all = all_tools(&state).await?;
    if let Some(ids) = &fields.block_ids {
        for id in ids {
            blocks::load(&state.engine, id).await?;
        }
    }
    let given_blocks = match &fields.memory_blocks {
        Some(list) => Some(
            list.iter()
                .cloned()
                .map(BlockRecord::create)
                .collect::<ApiResult<Vec<_>>>()?,
        ),
        None => None,
    };
    if let Some(ids) = resolve_tools(&fields, &all)? {
        agent.tool_ids = ids;
    }
    if let Some(system) = &fields.system {
        state
            .engine
            .set_system_prompt(agent.conversation_id, system)
            .await
            .map_err(busy_prompt)?;
    }
    if let Some(name) = fields.name {
        agent.name = name;
    }
    if let Some(d) = fields.description {
        agent.description = Some(d);
    }
    if let Some(m) = model {
        agent.model = Some(m);
    }
    if let Some(m) = fields.model_settings {
        agent.model_settings = Some(Value::Object(m));
    }
    if let Some(r) = fields.tool_rules {
        agent.tool_rules = r;
    }
    if let Some(t) = fields.tags {
        agent.tags = t;
    }
    if let Some(m) = fields.metadata {
        agent.metadata = Some(m);
    }
    if let Some(ids) = fields.block_ids.clone() {
        agent.block_ids = ids;
    }
    if let Some(given) = given_blocks {
        // Letta's update takes `block_ids`; toolwire also takes
        // `memory_blocks` there, as the agent's blocks from now on: a
        // label the agent has gets the value given, a new one a block.
        let current = blocks::of_ids(&state.engine, &agent.block_ids).await?;
        let mut ids = Vec::new();
        for new in given {
            match current.iter().find(|b| b.label == new.label) {
                Some(old) => {
                    let _block = state.lock(&blocks::lock_key(&old.id)).await;
                    let changed = blocks::load(&state.engine, &old.id).await?.updated(
                        blocks::BlockUpdate {
                            value: Some(new.value.clone()),
                            limit: Some(new.limit),
                            ..Default::default()
                        },
                    )?;
                    blocks::save(&state.engine, &changed).await?;
                    ids.push(changed.id);
                }
                None => {
                    blocks::save(&state.engine, &new).await?;
                    ids.push(new.id);
                }
            }
        }
        agent.block_ids = ids;
    }
    if let Some(e) = embedding {
        agent.embedding = Some(e);
    }
    if let Some(t) = fields.approval_timeout_seconds {
        agent.approval_timeout_seconds = Some(t);
    }
    agent.updated_at = Utc::now();
    agents::save(&state, &agent).await?;
    refresh_options(&state, &agent).await?;
    Ok(Json(agent_json(&state, &agent).await?))
}

/// A running turn keeps the prompt it began with: the edit is refused
/// (before anything of the request is stored) rather than changing it
/// between two of its steps.
fn busy_prompt(e: EngineError) -> ApiError {
    match e {
        EngineError::TurnInProgress(_) => ApiError::conflict(
            "CONVERSATION_BUSY",
            "Cannot change the system prompt: a request is being processed for this \
             agent's conversation. Wait for it to finish, or cancel it.",
        ),
        other => other.into(),
    }
}

pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let _agent_lock = state.lock(&id).await;
    let agent = load(&state, &id).await?;
    state.engine.cancel_anywhere(agent.conversation_id).await?;
    state
        .engine
        .forget_conversation_options(agent.conversation_id);
    agents::delete(&state, &agent).await?;
    tracing::info!(agent = %id, "agent deleted");
    Ok(Json(json!({})))
}

#[derive(Debug, Default, Deserialize)]
pub struct ApprovalQuery {
    requires_approval: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ApprovalBody {
    requires_approval: Option<bool>,
    body_requires_approval: Option<bool>,
}

/// `PATCH /v1/agents/{id}/tools/approval/{tool_name}`: whether this
/// agent's calls of the tool wait for approval (in the body, or the query).
pub async fn set_approval(
    State(state): State<AppState>,
    Path((id, tool_name)): Path<(String, String)>,
    Query(query): Query<ApprovalQuery>,
    Body(body): Body<ApprovalBody>,
) -> ApiResult<Json<Value>> {
    let flag = body
        .requires_approval
        .or(body.body_requires_approval)
        .or(query.requires_approval)
        .ok_or_else(|| ApiError::bad_request("requires_approval (true or false) is required"))?;
    let _agent_lock = state.lock(&id).await;
    let mut agent = load(&state, &id).await?;
    let all = all_tools(&state).await?;
    if !agent.tools(&all).iter().any(|t| t.name == tool_name) {
        return Err(ApiError::not_found("tool of this agent", &tool_name));
    }
    agent.approvals.insert(tool_name, flag);
    agent.updated_at = Utc::now();
    agents::save(&state, &agent).await?;
    refresh_options(&state, &agent).await?;
    Ok(Json(agent_json(&state, &agent).await?))
}
