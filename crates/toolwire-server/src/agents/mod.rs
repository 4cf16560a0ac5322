//! Agents as records, wire-neutral: what an agent is (a name, a model,
//! its tools and their approval rules, over one conversation of the
//! engine), how it is stored (through the engine's records), and the turn
//! options derived from it ([`options`]). The Letta API (`letta::*`) and
//! the live view (`live::*`) both render from here; neither depends on
//! the other.

pub mod approvals;
pub mod blocks;
pub mod budget;
pub mod ids;
pub mod mcp;
pub mod memory;
pub mod models;
pub mod options;
pub mod owner;
pub mod registry;
pub mod schema;
pub mod tools;

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolwire_core::ConversationId;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use ids::check_id;
use tools::ToolRecord;

/// The kind of an agent's record.
pub const KIND: &str = "agent";

/// An agent as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    /// The model as the client named it (a Letta handle, a registry name
    /// or a model id); see [`models`].
    pub model: Option<String>,
    /// Letta's `model_settings`, kept as given and served back.
    #[serde(default)]
    pub model_settings: Option<Value>,
    pub tool_ids: Vec<String>,
    /// Letta's tool rules, kept as given; `requires_approval` rules are
    /// the ones toolwire acts on.
    pub tool_rules: Vec<Value>,
    pub tags: Vec<String>,
    pub metadata: Option<Value>,
    /// The agent's memory blocks (records of kind `block`, shared by id),
    /// in the order they are compiled into its prompt.
    #[serde(default)]
    pub block_ids: Vec<String>,
    /// Blocks as versions before block records kept them (in the agent);
    /// made into records at start-up ([`upgrade_blocks`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_blocks: Vec<Value>,
    /// Letta's embedding handle, kept as given and served back (toolwire
    /// embeds nothing).
    #[serde(default)]
    pub embedding: Option<String>,
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

/// Agent `id`; not found unless it is one.
pub async fn load(state: &AppState, id: &str) -> ApiResult<AgentRecord> {
    load_from(&state.engine, id).await
}

/// Agent `id` from `engine`'s store (for what holds the engine, not the
/// server's state: a memory tool, a turn's prompt).
pub async fn load_from(engine: &toolwire_engine::Engine, id: &str) -> ApiResult<AgentRecord> {
    check_id(KIND, id)?;
    let doc = engine
        .store()
        .document(KIND, id)
        .await?
        .ok_or_else(|| ApiError::not_found("agent", id))?;
    serde_json::from_value(doc.body)
        .map_err(|e| ApiError::internal(format!("agent {id} is unreadable: {e}")))
}

/// Every agent; an unreadable record is an error.
pub async fn all(state: &AppState) -> ApiResult<Vec<AgentRecord>> {
    let mut agents = Vec::new();
    for doc in state.store().documents(KIND).await? {
        let agent: AgentRecord = serde_json::from_value(doc.body)
            .map_err(|e| ApiError::internal(format!("agent {} is unreadable: {e}", doc.id)))?;
        agents.push(agent);
    }
    Ok(agents)
}

/// Every agent that reads as one.
pub async fn readable(state: &AppState) -> ApiResult<Vec<AgentRecord>> {
    let docs = state.store().documents(KIND).await?;
    Ok(docs
        .into_iter()
        // A document that does not read as an agent is not one: the Letta
        // routes refuse it too; the live view lists its conversation bare.
        .filter_map(|doc| serde_json::from_value(doc.body).ok())
        .collect())
}

/// Stores `agent`, in place of its earlier version.
pub async fn save(state: &AppState, agent: &AgentRecord) -> ApiResult<()> {
    save_to(&state.engine, agent).await
}

/// Stores `agent` through `engine`.
pub async fn save_to(engine: &toolwire_engine::Engine, agent: &AgentRecord) -> ApiResult<()> {
    let body = serde_json::to_value(agent)
        .map_err(|e| ApiError::internal(format!("an agent cannot be stored: {e}")))?;
    engine.put_record(KIND, &agent.id, &body).await?;
    Ok(())
}

/// Makes block records of the blocks agents stored by earlier versions
/// kept in themselves (`memory_blocks`), and attaches them. Run at
/// start-up, before requests are served.
pub(crate) async fn upgrade_blocks(state: &AppState) -> ApiResult<()> {
    for mut agent in readable(state).await? {
        if agent.memory_blocks.is_empty() {
            continue;
        }
        let mut made = Vec::new();
        for mut value in std::mem::take(&mut agent.memory_blocks) {
            // Kept as given then: a metadata that is not an object goes.
            if let Value::Object(map) = &mut value
                && map.get("metadata").is_some_and(|m| !m.is_object())
            {
                map.remove("metadata");
            }
            let mut fields: blocks::BlockCreate = serde_json::from_value(value).map_err(|e| {
                ApiError::internal(format!("agent {}: a block is unreadable: {e}", agent.id))
            })?;
            // Kept before limits were checked: the limit grows to fit.
            let length = blocks::chars(fields.value.as_deref().unwrap_or(""));
            fields.limit = Some(fields.limit.unwrap_or(blocks::DEFAULT_LIMIT).max(length));
            if fields.label.as_deref().is_none_or(str::is_empty) {
                fields.label = Some(format!("block_{}", made.len() + 1));
            }
            made.push(blocks::BlockRecord::create(fields)?);
        }
        blocks::save_all(&state.engine, &made).await?;
        agent.block_ids.extend(made.iter().map(|b| b.id.clone()));
        save(state, &agent).await?;
        tracing::info!(agent = %agent.id, blocks = made.len(), "memory blocks made into records");
    }
    Ok(())
}

/// Stores a new agent and the record of which conversation it owns.
pub async fn create(state: &AppState, agent: &AgentRecord) -> ApiResult<()> {
    save(state, agent).await?;
    index_owner(state, agent).await
}

/// Removes `agent`'s records (its conversation stays: stored messages are
/// never deleted).
pub async fn delete(state: &AppState, agent: &AgentRecord) -> ApiResult<()> {
    state.engine.delete_record(KIND, &agent.id).await?;
    state
        .engine
        .delete_record(BY_CONVERSATION, &agent.conversation_id.to_string())
        .await?;
    Ok(())
}

/// The documents that say which agent owns a conversation (id: the
/// conversation's), so that finding a conversation's agent does not read
/// every agent. An agent's conversation never changes.
const BY_CONVERSATION: &str = "agent_by_conversation";

/// The id of the agent that owns `conversation`, if one does, and
/// whether it is one of the agent's further conversations (Letta's
/// conversations API) rather than its own.
async fn owner_id(
    state: &AppState,
    conversation: ConversationId,
) -> ApiResult<Option<(String, bool)>> {
    let Some(doc) = state
        .store()
        .document(BY_CONVERSATION, &conversation.to_string())
        .await?
    else {
        return Ok(None);
    };
    let further = doc.body.get("further").and_then(Value::as_bool) == Some(true);
    Ok(doc
        .body
        .get("agent_id")
        .and_then(Value::as_str)
        .map(|id| (id.to_owned(), further)))
}

/// Records `conversation` as one more of `agent`'s (Letta's
/// conversations API): its turns run with the agent's options.
pub async fn add_conversation(
    state: &AppState,
    agent: &AgentRecord,
    conversation: ConversationId,
) -> ApiResult<()> {
    state
        .engine
        .put_record(
            BY_CONVERSATION,
            &conversation.to_string(),
            &json!({"agent_id": agent.id, "further": true}),
        )
        .await?;
    Ok(())
}

/// The conversations of `agent` made through Letta's conversations API
/// (its own not included), oldest first.
pub async fn further_conversations(
    state: &AppState,
    agent_id: Option<&str>,
) -> ApiResult<Vec<(ConversationId, String)>> {
    Ok(state
        .store()
        .documents(BY_CONVERSATION)
        .await?
        .into_iter()
        .filter(|doc| doc.body.get("further").and_then(Value::as_bool) == Some(true))
        .filter_map(|doc| {
            let owner = doc.body.get("agent_id")?.as_str()?.to_owned();
            let id = doc.id.parse().ok()?;
            agent_id.is_none_or(|a| a == owner).then_some((id, owner))
        })
        .collect())
}

/// The agent of `conversation`, if one owns it (found through its owner
/// document, not by reading every agent).
pub async fn agent_of(
    state: &AppState,
    conversation: ConversationId,
) -> ApiResult<Option<AgentRecord>> {
    let Some((id, further)) = owner_id(state, conversation).await? else {
        return Ok(None);
    };
    match load(state, &id).await {
        Ok(agent) if further || agent.conversation_id == conversation => Ok(Some(agent)),
        // Deleted meanwhile (its owner document goes second), or a stale
        // document: no agent owns the conversation.
        Ok(_) => Ok(None),
        Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => Ok(None),
        Err(e) => Err(e),
    }
}

async fn index_owner(state: &AppState, agent: &AgentRecord) -> ApiResult<()> {
    state
        .engine
        .put_record(
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
