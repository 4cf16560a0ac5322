//! The agent a conversation belongs to, if any: a turn started from the
//! live view runs with that agent's tools and approval rules, exactly as
//! one started by the Letta messages route.

use toolwire_core::{ConversationId, StopReason};
use toolwire_engine::{TurnHandle, TurnOptions};

use crate::error::ApiResult;
use crate::letta::agents::{self, AgentRecord};
use crate::letta::{approvals, messages};
use crate::state::AppState;

/// Every agent, by conversation.
pub async fn agents(state: &AppState) -> ApiResult<Vec<AgentRecord>> {
    let docs = state.store().documents("agent").await?;
    Ok(docs
        .into_iter()
        // A document that does not read as an agent is not one: the Letta
        // routes refuse it too; the live view lists its conversation bare.
        .filter_map(|doc| serde_json::from_value(doc.body).ok())
        .collect())
}

/// The agent of `conversation`, if one owns it (found through its owner
/// document, not by reading every agent).
pub async fn agent_of(
    state: &AppState,
    conversation: ConversationId,
) -> ApiResult<Option<AgentRecord>> {
    let Some(id) = agents::owner_id(state, conversation).await? else {
        return Ok(None);
    };
    match agents::load(state, &id).await {
        Ok(agent) if agent.conversation_id == conversation => Ok(Some(agent)),
        // Deleted meanwhile (its owner document goes second), or a stale
        // document: no agent owns the conversation.
        Ok(_) => Ok(None),
        Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => Ok(None),
        Err(e) => Err(e),
    }
}

/// Before the engine starts or goes on with a turn on its own in
/// `conversation` (an interjection, the end of a pause): tells it the
/// options of the conversation's agent as they are now, if one owns it.
pub async fn refresh(state: &AppState, conversation: ConversationId) -> ApiResult<()> {
    if let Some(agent) = agent_of(state, conversation).await? {
        messages::refresh_options(state, &agent).await?;
    }
    Ok(())
}

/// The turn options of `conversation` and what to lock while starting a
/// turn in it (the agent's lock, which the Letta routes take too).
pub struct Owner {
    pub agent: Option<AgentRecord>,
    pub options: TurnOptions,
    _lock: tokio::sync::OwnedMutexGuard<()>,
}

impl Owner {
    /// Locks the conversation's owner and reads its turn options.
    pub async fn lock(state: &AppState, conversation: ConversationId) -> ApiResult<Owner> {
        let agent = agent_of(state, conversation).await?;
        let key = match &agent {
            Some(agent) => agent.id.clone(),
            None => conversation.to_string(),
        };
        let lock = state.lock(&key).await;
        let options = match &agent {
            Some(agent) => messages::agent_options(state, agent).await?,
            None => TurnOptions::default(),
        };
        Ok(Owner {
            agent,
            options,
            _lock: lock,
        })
    }

    /// Watches a started turn: should it pause for approval, the agent's
    /// approval timeout is armed (as the Letta messages route does).
    pub fn watch(&self, state: &AppState, handle: TurnHandle) {
        let Some(agent) = &self.agent else {
            return;
        };
        let (state, agent_id) = (state.clone(), agent.id.clone());
        tokio::spawn(async move {
            if handle.wait().await.reason == StopReason::RequiresApproval {
                approvals::arm_timeout(&state, &agent_id);
            }
        });
    }
}
