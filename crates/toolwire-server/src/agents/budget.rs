//! What an agent has spent, for the engine's agent budget
//! (`[budgets] agent_max_tokens`, `agent_max_cost`): every stored
//! message's usage and cost in the agent's conversations (its own and
//! those of Letta's conversations API), read when one
//! of its turns starts, only when an agent budget is set.

use toolwire_engine::context::Spent;

use crate::agents::AgentRecord;
use crate::error::ApiResult;
use crate::state::AppState;

/// The agent's spend so far; `None` when no agent budget is set.
pub async fn agent_spent(state: &AppState, agent: &AgentRecord) -> ApiResult<Option<Spent>> {
    if !state.engine.config().budgets.agent.is_set() {
        return Ok(None);
    }
    let mut conversations = vec![agent.conversation_id];
    conversations.extend(
        crate::agents::further_conversations(state, Some(&agent.id))
            .await?
            .into_iter()
            .map(|(id, _)| id),
    );
    let mut spent = Spent::default();
    for conversation in conversations {
        for m in state.store().messages(conversation).await? {
            spent.tokens += m.usage.map_or(0, |u| u.total());
            spent.cost += m.cost.unwrap_or(0.0);
        }
    }
    Ok(Some(spent))
}
