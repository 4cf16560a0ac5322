//! `POST /v1/agents/{id}/summarize`: Letta's "summarize the agent's
//! conversation" — here a compaction node on the agent's conversation
//! (`Engine::compact`): the older messages stay stored, later requests
//! send their summary. Answers once the node is stored, with what it
//! covers (Letta answers 204; its SDKs read no body).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{ContentBlock, StopReason};

use crate::agents::{self, options::agent_options};
use crate::error::{ApiError, ApiResult};
use crate::extract::Body;
use crate::state::AppState;

/// Letta's body; `max_message_length` (how many messages to keep) is
/// accepted and not used: what stays verbatim is the `keep_recent`
/// share of the window.
#[derive(Debug, Default, Deserialize)]
pub struct SummarizeRequest {
    #[serde(default, rename = "max_message_length")]
    _max_message_length: Option<u64>,
}

pub async fn summarize(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(_request): Body<SummarizeRequest>,
) -> ApiResult<Json<Value>> {
    let agent = agents::load(&state, &id).await?;
    let options = agent_options(&state, &agent).await?;
    let handle = state.engine.compact(agent.conversation_id, options).await?;
    let outcome = handle.wait().await;
    match outcome.reason {
        StopReason::EndTurn => {
            let node = outcome
                .final_message
                .ok_or_else(|| ApiError::internal("the compaction stored no node"))?;
            let Some(ContentBlock::Compaction {
                covered,
                tokens_before,
                tokens_after,
                ..
            }) = node.content.first()
            else {
                return Err(ApiError::internal("the compaction stored no node"));
            };
            Ok(Json(json!({
                "message_id": node.id,
                "covered": covered,
                "tokens_before": tokens_before,
                "tokens_after": tokens_after,
            })))
        }
        StopReason::LlmApiError => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "SUMMARIZE_FAILED",
            outcome.error.unwrap_or_default(),
        )),
        _ => Err(ApiError::conflict(
            "NOTHING_TO_SUMMARIZE",
            outcome
                .error
                .unwrap_or_else(|| outcome.reason.as_str().to_owned()),
        )),
    }
}
