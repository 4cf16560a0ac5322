//! `/v1/agents`: an agent is a name, a system prompt, a model, its tools
//! and their approval rules, over one conversation of the engine (its
//! message history is that conversation's active branch).

use std::collections::{BTreeMap, HashSet};

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolwire_core::{ContentBlock, ConversationId};

use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::ids::{check_id, new_id};
use crate::letta::messages::refresh_options;
use crate::letta::page::{Order, PageQuery};
use crate::letta::tools::{ToolRecord, all_tools};
use crate::state::AppState;

const KIND: &str = "agent";

/// An agent as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub model: Option<String>,
    pub tool_ids: Vec<String>,
    /// Letta's tool rules, kept as given; `requires_approval` rules are
    /// the ones toolwire acts on.
    pub tool_rules: Vec<Value>,
    pub tags: Vec<String>,
    pub metadata: Option<Value>,
    /// Memory blocks, kept and served (not compiled into the prompt).
    pub memory_blocks: Vec<Value>,
    pub conversation_id: ConversationId,
    /// Per-tool approval set with `PATCH …/tools/approval/{tool_name}`;
    /// wins over rules and the tool's default.
    #[serde(default)]
    pub approvals: BTreeMap<String, bool>,
    /// Waiting calls are denied ("timed out") after this many seconds.
    #[serde(default)]
    pub approval_timeout_seconds: Option<u64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl AgentRecord {
    /// Whether a call of `tool` waits for approval.
    pub fn requires_approval(&self, tool: &ToolRecord) -> bool {
        if let Some(flag) = self.approvals.get(&tool.name) {
            return *flag;
        }
        let by_rule = self.tool_rules.iter().any(|rule| {
            rule.get("type").and_then(Value::as_str) == Some("requires_approval")
                && rule.get("tool_name").and_then(Value::as_str) == Some(tool.name.as_str())
        });
        by_rule || tool.default_requires_approval
    }

    /// The agent's tools (those still defined), in `tool_ids` order.
    pub fn tools<'a>(&self, all: &'a [ToolRecord]) -> Vec<&'a ToolRecord> {
        self.tool_ids
            .iter()
            .filter_map(|id| all.iter().find(|t| &t.id == id))
            .collect()
    }

    /// Names of this agent's tools that wait for approval.
    pub fn approval_set(&self, all: &[ToolRecord]) -> HashSet<String> {
        self.tools(all)
            .into_iter()
            .filter(|t| self.requires_approval(t))
            .map(|t| t.name.clone())
            .collect()
    }
}

/// What `POST`/`PATCH /v1/agents` accept. Letta has many more fields;
/// the ones toolwire has no use for are accepted and ignored.
#[derive(Debug, Default, Deserialize)]
pub struct AgentFields {
    name: Option<String>,
    system: Option<String>,
    description: Option<String>,
    model: Option<String>,
    tool_ids: Option<Vec<String>>,
    /// Tool names, as Letta also accepts.
    tools: Option<Vec<String>>,
    tool_rules: Option<Vec<Value>>,
    include_base_tools: Option<bool>,
    tags: Option<Vec<String>>,
    metadata: Option<Value>,
    memory_blocks: Option<Vec<Value>>,
    approval_timeout_seconds: Option<u64>,
}

pub async fn load(state: &AppState, id: &str) -> ApiResult<AgentRecord> {
    check_id(KIND, id)?;
    let doc = state
        .store()
        .document(KIND, id)
        .await?
        .ok_or_else(|| ApiError::not_found("agent", id))?;
    serde_json::from_value(doc.body)
        .map_err(|e| ApiError::internal(format!("agent {id} is unreadable: {e}")))
}

/// The documents that say which agent owns a conversation (id: the
/// conversation's), so that finding a conversation's agent does not read
/// every agent. An agent's conversation never changes.
const BY_CONVERSATION: &str = "agent_by_conversation";

/// The id of the agent that owns `conversation`, if one does.
pub(crate) async fn owner_id(
    state: &AppState,
    conversation: ConversationId,
) -> ApiResult<Option<String>> {
    let Some(doc) = state
        .store()
        .document(BY_CONVERSATION, &conversation.to_string())
        .await?
    else {
        return Ok(None);
    };
    Ok(doc
        .body
        .get("agent_id")
        .and_then(Value::as_str)
        .map(str::to_owned))
}

async fn index_owner(state: &AppState, agent: &AgentRecord) -> ApiResult<()> {
    state
        .store()
        .put_document(
            BY_CONVERSATION,
            &agent.conversation_id.to_string(),
            &json!({"agent_id": agent.id}),
        )
        .await?;
    Ok(())
}

/// Writes the owner documents of agents stored without one (by a version
/// before them, or by a process that stopped between the two writes of a
/// create). Run at start-up, before requests are served.
pub(crate) async fn index_owners(state: &AppState) -> ApiResult<()> {
    let indexed: HashSet<String> = state
        .store()
        .documents(BY_CONVERSATION)
        .await?
        .into_iter()
        .map(|doc| doc.id)
        .collect();
    for doc in state.store().documents(KIND).await? {
        // An unreadable agent is refused by every route already.
        let Ok(agent) = serde_json::from_value::<AgentRecord>(doc.body) else {
            continue;
        };
        if !indexed.contains(&agent.conversation_id.to_string()) {
            index_owner(state, &agent).await?;
        }
    }
    Ok(())
}

async fn store(state: &AppState, agent: &AgentRecord) -> ApiResult<()> {
    let body = serde_json::to_value(agent)
        .map_err(|e| ApiError::internal(format!("an agent cannot be stored: {e}")))?;
    state.store().put_document(KIND, &agent.id, &body).await?;
    Ok(())
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

/// The agent's JSON (Letta's `AgentState`).
pub async fn agent_json(state: &AppState, agent: &AgentRecord) -> ApiResult<Value> {
    let all = all_tools(state).await?;
    let conversation = state.store().conversation(agent.conversation_id).await?;
    let system = state.store().message(conversation.root_id).await?.text();
    let model = agent
        .model
        .clone()
        .unwrap_or_else(|| state.engine.model().to_owned());
    let tools: Vec<Value> = agent
        .tools(&all)
        .into_iter()
        .map(ToolRecord::to_json)
        .collect();
    Ok(json!({
        "id": agent.id,
        "name": agent.name,
        "description": agent.description,
        "system": system,
        "agent_type": "letta_v1_agent",
        "model": model,
        "llm_config": {
            "model": model,
            "model_endpoint_type": "openai",
            "context_window": 128000,
        },
        "embedding_config": null,
        "tools": tools,
        "tool_ids": agent.tool_ids,
        "tool_rules": agent.tool_rules,
        "tags": agent.tags,
        "metadata": agent.metadata,
        "memory": {"blocks": agent.memory_blocks},
        "blocks": agent.memory_blocks,
        "sources": [],
        "message_ids": [],
        "conversation_id": agent.conversation_id,
        "approvals": agent.approvals,
        "approval_timeout_seconds": agent.approval_timeout_seconds,
        "created_at": agent.created_at,
        "updated_at": agent.updated_at,
    }))
}

pub async fn create(
    State(state): State<AppState>,
    Body(fields): Body<AgentFields>,
) -> ApiResult<Json<Value>> {
    let all = all_tools(&state).await?;
    let mut tool_ids = resolve_tools(&fields, &all)?.unwrap_or_default();
    if fields.include_base_tools.unwrap_or(true) {
        // toolwire's base tools are its built-in ones (files, search,
        // commands) and the configured MCP servers' tools.
        for tool in all.iter().filter(|t| !t.is_custom()) {
            if !tool_ids.contains(&tool.id) {
                tool_ids.push(tool.id.clone());
            }
        }
    }
    let id = new_id(KIND);
    let name = fields
        .name
        .unwrap_or_else(|| format!("agent-{}", &id[id.len() - 8..]));
    let system = fields
        .system
        .unwrap_or_else(|| state.engine.config().system_prompt.clone());
    let conversation = state
        .store()
        .create_conversation(&system, Some(&name))
        .await?;
    let now = Utc::now();
    let agent = AgentRecord {
        id,
        name,
        description: fields.description,
        model: fields.model,
        tool_ids,
        tool_rules: fields.tool_rules.unwrap_or_default(),
        tags: fields.tags.unwrap_or_default(),
        metadata: fields.metadata,
        memory_blocks: fields.memory_blocks.unwrap_or_default(),
        conversation_id: conversation.id,
        approvals: BTreeMap::new(),
        approval_timeout_seconds: fields.approval_timeout_seconds,
        created_at: now,
        updated_at: now,
    };
    store(&state, &agent).await?;
    index_owner(&state, &agent).await?;
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

/// Tells the engine the tools and approvals of every agent that has tool
/// `tool_id`, after the tool changed (its code, its default approval) or
/// went: see [`refresh_options`].
pub(crate) async fn refresh_users_of(state: &AppState, tool_id: &str) -> ApiResult<()> {
    for doc in state.store().documents(KIND).await? {
        let agent: AgentRecord = serde_json::from_value(doc.body)
            .map_err(|e| ApiError::internal(format!("agent {} is unreadable: {e}", doc.id)))?;
        if agent.tool_ids.iter().any(|id| id == tool_id) {
            refresh_options(state, &agent).await?;
        }
    }
    Ok(())
}

pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let mut agents = Vec::new();
    for doc in state.store().documents(KIND).await? {
        let agent: AgentRecord = serde_json::from_value(doc.body)
            .map_err(|e| ApiError::internal(format!("agent {} is unreadable: {e}", doc.id)))?;
        if query.name.as_ref().is_some_and(|n| &agent.name != n) {
            continue;
        }
        if query.tags.as_ref().is_some_and(|t| !agent.tags.contains(t)) {
            continue;
        }
        agents.push(agent);
    }
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
    let _agent_lock = state.lock(&id).await;
    let mut agent = load(&state, &id).await?;
    let all = all_tools(&state).await?;
    if let Some(ids) = resolve_tools(&fields, &all)? {
        agent.tool_ids = ids;
    }
    if let Some(system) = &fields.system {
        set_system(&state, agent.conversation_id, system).await?;
    }
    if let Some(name) = fields.name {
        agent.name = name;
    }
    if let Some(d) = fields.description {
        agent.description = Some(d);
    }
    if let Some(m) = fields.model {
        agent.model = Some(m);
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
    if let Some(b) = fields.memory_blocks {
        agent.memory_blocks = b;
    }
    if let Some(t) = fields.approval_timeout_seconds {
        agent.approval_timeout_seconds = Some(t);
    }
    agent.updated_at = Utc::now();
    store(&state, &agent).await?;
    refresh_options(&state, &agent).await?;
    Ok(Json(agent_json(&state, &agent).await?))
}

/// Rewrites the conversation's root: the system prompt the model sees on
/// every branch.
async fn set_system(state: &AppState, conversation: ConversationId, system: &str) -> ApiResult<()> {
    let root_id = state.store().conversation(conversation).await?.root_id;
    let mut root = state.store().message(root_id).await?;
    root.content = if system.is_empty() {
        Vec::new()
    } else {
        vec![ContentBlock::Text {
            text: system.to_owned(),
        }]
    };
    state.store().update(&root).await?;
    Ok(())
}

pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let _agent_lock = state.lock(&id).await;
    let agent = load(&state, &id).await?;
    state.engine.cancel(agent.conversation_id);
    state
        .engine
        .forget_conversation_options(agent.conversation_id);
    // The conversation stays: stored messages are never deleted.
    state.store().delete_document(KIND, &id).await?;
    state
        .store()
        .delete_document(BY_CONVERSATION, &agent.conversation_id.to_string())
        .await?;
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
    store(&state, &agent).await?;
    refresh_options(&state, &agent).await?;
    Ok(Json(agent_json(&state, &agent).await?))
}
