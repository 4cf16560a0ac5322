//! The turn options an agent gives its conversation's turns: its model,
//! its tools, and which of them wait for approval. Every turn of an agent's
//! conversation runs with them, whichever door starts it.

use toolwire_core::ConversationId;
use toolwire_engine::TurnOptions;

use crate::agents::memory::{AgentMemory, MemoryOp, MemoryTool};
use crate::agents::registry::registry;
use crate::agents::tools::{Catalog, MEMORY_TOOL_TYPE, ToolRecord};
use crate::agents::{self, AgentRecord, budget, models};
use crate::error::ApiResult;
use crate::state::AppState;

/// The turn options of `agent`: its model (by registry name), its tools,
/// and which of them wait for approval.
pub async fn agent_options(state: &AppState, agent: &AgentRecord) -> ApiResult<TurnOptions> {
    let catalog = Catalog::read(state).await?;
    let all = catalog.all();
    // The agent's tools (those still defined), in `tool_ids` order.
    let tools: Vec<&ToolRecord> = agent
        .tool_ids
        .iter()
        .filter_map(|id| all.iter().copied().find(|t| &t.id == id))
        .collect();
    let require_approval = tools
        .iter()
        .filter(|t| agent.requires_approval(t))
        .map(|t| t.name.clone())
        .collect();
    let model = models::of_agent(state.engine.models(), agent.model.as_deref());
    let mut registry = registry(state, &tools).await;
    // The memory tools edit this agent's blocks: one of each per agent.
    for tool in &tools {
        if let Some(op) =
            MemoryOp::by_name(&tool.name).filter(|_| tool.tool_type == MEMORY_TOOL_TYPE)
        {
            registry.register(MemoryTool::shared(
                op,
                &state.engine,
                state.locks(),
                &agent.id,
            ));
        }
    }
    Ok(TurnOptions {
        tools: Some(registry),
        require_approval,
        model: Some(model.info.name.clone()),
        response_format: response_format(agent),
        agent_spent: budget::agent_spent(state, agent).await?,
        system_prompt: Some(AgentMemory::new(&state.engine, &agent.id)),
        ..TurnOptions::default()
    })
}

/// The `response_format` of the agent's `model_settings` (Letta's
/// structured output), passed to the model; `text` is no format.
fn response_format(agent: &AgentRecord) -> Option<serde_json::Value> {
    let format = agent.model_settings.as_ref()?.get("response_format")?;
    match format.get("type").and_then(serde_json::Value::as_str) {
        Some("json_schema" | "json_object") => Some(format.clone()),
        _ => None,
    }
}

/// Tells the engine `agent`'s model, tools and approvals (after they changed),
/// so that the turns it starts itself (a wake) use them at once rather
/// than those of the agent's last request. What that request added (its
/// client tools, max_steps) is kept.
pub async fn refresh_options(state: &AppState, agent: &AgentRecord) -> ApiResult<()> {
    let fresh = agent_options(state, agent).await?;
    let conversation = agent.conversation_id;
    let remembered = state.engine.conversation_options(conversation);
    state.engine.set_conversation_options(
        conversation,
        TurnOptions {
            tools: fresh.tools,
            require_approval: fresh.require_approval,
            model: fresh.model,
            response_format: fresh.response_format,
            agent_spent: fresh.agent_spent,
            system_prompt: fresh.system_prompt,
            ..remembered
        },
    );
    Ok(())
}

/// Tells the engine the tools and approvals of every agent that has tool
/// `tool_id`, after the tool changed (its code, its default approval) or
/// went: see [`refresh_options`].
pub async fn refresh_users_of(state: &AppState, tool_id: &str) -> ApiResult<()> {
    for agent in agents::all(state).await? {
        if agent.tool_ids.iter().any(|id| id == tool_id) {
            refresh_options(state, &agent).await?;
        }
    }
    Ok(())
}

/// Before the engine starts or goes on with a turn on its own in
/// `conversation` (an interjection, the end of a pause): tells it the
/// options of the conversation's agent as they are now, if one owns it.
pub async fn refresh(state: &AppState, conversation: ConversationId) -> ApiResult<()> {
    if let Some(agent) = agents::agent_of(state, conversation).await? {
        refresh_options(state, &agent).await?;
    }
    Ok(())
}
