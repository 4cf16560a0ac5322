//! `POST /v1/agents/{id}/summarize`: Letta's "summarize the agent's
//! conversation" (its SDK's `agents.messages.compact`) — here a
//! compaction node on the agent's conversation (`Engine::compact`, or
//! `Engine::compact_all` for Letta's `mode: all`): the older messages stay
//! stored, later requests send their summary. Answers once the node is
//! stored, with Letta's `CompactionResponse` (`summary`,
//! `num_messages_before`, `num_messages_after`: the messages a request
//! sends, the system prompt and a summary counted) and what the node
//! covers.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{ContentBlock, ConversationId, StopReason};
use toolwire_engine::context::view;

use crate::agents::{self, options::agent_options};
use crate::error::{ApiError, ApiResult};
use crate::extract::Body;
use crate::state::AppState;

/// Letta's body; `max_message_length` (how many messages to keep) is
/// accepted and not used: what stays verbatim is the `keep_recent`
/// share of the window, or nothing with `compaction_settings.mode` `all`.
#[derive(Debug, Default, Deserialize)]
pub struct SummarizeRequest {
    #[serde(default, rename = "max_message_length")]
    _max_message_length: Option<u64>,
    #[serde(default)]
    compaction_settings: Option<CompactionSettings>,
}

/// Letta's `CompactionSettings`: only `mode` is read; its model, prompt
/// and the rest are accepted and not used (the summary model is
/// `context.summary_model`).
#[derive(Debug, Default, Deserialize)]
struct CompactionSettings {
    #[serde(default)]
    mode: Option<Mode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    All,
    SlidingWindow,
    SelfCompactAll,
    SelfCompactSlidingWindow,
}

/// What a request of the conversation sends now: its messages (the root
/// and a summary counted) and the summary in effect, if any.
async fn in_context(
    state: &AppState,
    conversation: ConversationId,
) -> ApiResult<(usize, Option<String>)> {
    let leaf = state.store().conversation(conversation).await?.active_leaf;
    let path = state.store().path_to(leaf).await?;
    let view = view::compacted(&path);
    let summary = view
        .compaction
        .as_ref()
        .and_then(|n| n.compaction().map(|(s, _)| s.to_owned()));
    Ok((view.messages.len(), summary))
}

pub async fn summarize(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(request): Body<SummarizeRequest>,
) -> ApiResult<Json<Value>> {
    let agent = agents::load(&state, &id).await?;
    let conversation = agent.conversation_id;
    let (before, summary) = in_context(&state, conversation).await?;
    // Only the system prompt (and an earlier summary): Letta answers with
    // what is there, nothing compacted.
    let root_and_summary = 1 + usize::from(summary.is_some());
    if before <= root_and_summary {
        return Ok(Json(json!({
            "summary": summary.unwrap_or_default(),
            "num_messages_before": before,
            "num_messages_after": before,
        })));
    }
    let all = matches!(
        request.compaction_settings.and_then(|s| s.mode),
        Some(Mode::All | Mode::SelfCompactAll)
    );
    let options = agent_options(&state, &agent).await?;
    let handle = if all {
        state.engine.compact_all(conversation, options).await?
    } else {
        state.engine.compact(conversation, options).await?
    };
    let outcome = handle.wait().await;
    match outcome.reason {
        StopReason::EndTurn => {
            let node = outcome
                .final_message
                .ok_or_else(|| ApiError::internal("the compaction stored no node"))?;
            let Some(ContentBlock::Compaction {
                summary,
                covered,
                tokens_before,
                tokens_after,
                ..
            }) = node.content.first()
            else {
                return Err(ApiError::internal("the compaction stored no node"));
            };
            let (after, _) = in_context(&state, conversation).await?;
            Ok(Json(json!({
                "summary": summary,
                "num_messages_before": before,
                "num_messages_after": after,
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
        // Letta's answer when a compaction would not reduce the messages.
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "NOTHING_TO_SUMMARIZE",
            format!(
                "Summarization failed to reduce the number of messages: {}. Use \
                 `compaction_settings.mode` `all` to summarise every message.",
                outcome
                    .error
                    .unwrap_or_else(|| outcome.reason.as_str().to_owned())
            ),
        )),
    }
}
