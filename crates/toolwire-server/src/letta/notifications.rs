//! `POST /v1/agents/{id}/notifications`: a client tells the agent about
//! something (a CI result, a diagnostic). It reaches the agent with the
//! next tool result, or starts a turn when its source wakes the agent.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{Incoming, Priority};
use toolwire_engine::Notified;

use crate::agents::{self, options::refresh_options};
use crate::error::{ApiError, ApiResult};
use crate::extract::Body;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
pub struct NotificationRequest {
    source: Option<String>,
    text: Option<String>,
    priority: Option<String>,
}

pub async fn create(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<NotificationRequest>,
) -> ApiResult<Json<Value>> {
    let agent = agents::load(&state, &id).await?;
    let text = req
        .text
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("text is required"))?;
    let source = req
        .source
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "client".to_owned());
    if toolwire_core::is_reserved_source(&source) {
        return Err(ApiError::bad_request(format!(
            "source `{}` is reserved (toolwire's own lines and the user's words)",
            source.trim()
        )));
    }
    let priority = match req.priority.as_deref() {
        None | Some("normal") => Priority::Normal,
        Some("low") => Priority::Low,
        Some("high") => Priority::High,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "priority must be low, normal or high, not `{other}`"
            )));
        }
    };
    // A waking source makes the engine start a turn on its own: it must
    // run with the agent's tools and approvals as they are now (and does
    // not run at all with none remembered).
    refresh_options(&state, &agent).await?;
    let notified = state
        .engine
        .notify(
            agent.conversation_id,
            Incoming::text(source, priority, text),
        )
        .await?;
    let status = match notified {
        Notified::Queued => "queued",
        Notified::Waking => "waking",
        Notified::Dropped => "dropped",
    };
    Ok(Json(json!({"status": status})))
}
