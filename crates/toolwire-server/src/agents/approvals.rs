//! Per-agent approval timeouts: calls left waiting longer than the agent's
//! `approval_timeout_seconds` are denied with reason "timed out", and the
//! turn goes on. Deadlines come from the stored pause, so they hold across
//! restarts (armed again at start-up).

use std::time::Duration;

use toolwire_core::Decision;
use toolwire_engine::Responded;

use crate::agents::{self, options};
use crate::state::AppState;

/// Arms the timeout of `agent_id`'s pause, if it has both: a task that
/// denies the waiting calls at the deadline (and watches the next pause
/// when the turn pauses again).
pub fn arm_timeout(state: &AppState, agent_id: &str) {
    let (state, agent_id) = (state.clone(), agent_id.to_owned());
    tokio::spawn(async move {
        loop {
            match watch(&state, &agent_id).await {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(agent = %agent_id, error = %e, "could not expire a waiting approval");
                    break;
                }
            }
        }
    });
}

/// Waits for the deadline of the agent's pause and expires it; says
/// whether the turn paused again.
async fn watch(state: &AppState, agent_id: &str) -> Result<bool, crate::error::ApiError> {
    let agent = agents::load(state, agent_id).await?;
    let Some(seconds) = agent.approval_timeout_seconds else {
        return Ok(false);
    };
    let Some(pending) = state.engine.pending_approval(agent.conversation_id).await? else {
        return Ok(false);
    };
    // A timeout too long for a date (up to u64::MAX seconds are accepted)
    // never comes.
    let Some(deadline) = i64::try_from(seconds)
        .ok()
        .and_then(chrono::Duration::try_seconds)
        .and_then(|timeout| pending.created_at.checked_add_signed(timeout))
    else {
        return Ok(false);
    };
    let wait = (deadline - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO);
    tokio::time::sleep(wait).await;
    expire(state, agent_id, pending.message_id).await
}

/// Denies the waiting calls of the pause on `message_id`, if it still waits.
async fn expire(
    state: &AppState,
    agent_id: &str,
    message_id: toolwire_core::MessageId,
) -> Result<bool, crate::error::ApiError> {
    let _agent_lock = state.lock(agent_id).await;
    let agent = agents::load(state, agent_id).await?;
    let Some(pending) = state.engine.pending_approval(agent.conversation_id).await? else {
        return Ok(false);
    };
    if pending.message_id != message_id {
        return Ok(false);
    }
    let decisions = pending
        .waiting()
        .map(|c| {
            (
                c.call.id.clone(),
                Decision::Deny {
                    reason: Some("timed out".into()),
                },
            )
        })
        .collect();
    let options = options::agent_options(state, &agent).await?;
    tracing::info!(agent = %agent_id, "approval timed out; denying the waiting calls");
    match state
        .engine
        .respond(agent.conversation_id, decisions, None, options)
        .await?
    {
        Responded::Started(handle) => {
            drop(_agent_lock);
            let outcome = handle.wait().await;
            Ok(outcome.reason == toolwire_core::StopReason::RequiresApproval)
        }
        Responded::AlreadyApplied => Ok(false),
    }
}

/// Arms the timeouts of every agent with a pause (at start-up).
pub async fn arm_all(state: &AppState) {
    let Ok(docs) = state.store().documents(agents::KIND).await else {
        return;
    };
    for doc in docs {
        arm_timeout(state, &doc.id);
    }
}
