//! The agent a conversation belongs to, if any, held while a turn starts
//! in it: a turn started from the live view runs with that agent's tools
//! and approval rules, exactly as one started by the Letta messages route,
//! and with the model chosen for the conversation (`models`).

use toolwire_core::{ConversationId, StopReason};
use toolwire_engine::{TurnHandle, TurnOptions};

use crate::agents::options::agent_options;
use crate::agents::{self, AgentRecord, approvals, models};
use crate::error::ApiResult;
use crate::state::AppState;

/// The turn options of `conversation` and what to lock while starting a
/// turn in it (the agent's lock, which the Letta routes take too).
pub struct Owner {
    pub agent: Option<AgentRecord>,
    pub options: TurnOptions,
    _lock: toolwire_engine::Held<String>,
}

impl Owner {
    /// Locks the conversation's owner and reads its turn options.
    pub async fn lock(state: &AppState, conversation: ConversationId) -> ApiResult<Owner> {
        let agent = agents::agent_of(state, conversation).await?;
        let key = match &agent {
            Some(agent) => agent.id.clone(),
            None => conversation.to_string(),
        };
        let lock = state.lock(&key).await;
        let options = turn_options(state, agent.as_ref(), conversation).await?;
        Ok(Owner {
            agent,
            options,
            _lock: lock,
        })
    }

    /// The options a turn started here in `conversation` would get, read
    /// without taking the lock (to show them, not to start a turn).
    pub async fn options(state: &AppState, conversation: ConversationId) -> ApiResult<TurnOptions> {
        let agent = agents::agent_of(state, conversation).await?;
        turn_options(state, agent.as_ref(), conversation).await
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

/// The turn options of `conversation`: its agent's, with the model chosen
/// for the conversation.
async fn turn_options(
    state: &AppState,
    agent: Option<&AgentRecord>,
    conversation: ConversationId,
) -> ApiResult<TurnOptions> {
    let mut options = match agent {
        Some(agent) => agent_options(state, agent).await?,
        None => TurnOptions::default(),
    };
    models::apply_chosen(state, conversation, &mut options).await?;
    Ok(options)
}
