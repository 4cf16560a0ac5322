//! `POST /v1/conversations/{id}/compact`: the page's "Compact" button.
//! Summarises the older part of the active branch into a compaction node
//! (`Engine::compact`); the node comes over the socket as it is stored
//! (`conv_update` with source `compaction`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::agents::owner::Owner;
use crate::error::ApiResult;
use crate::extract::Body;
use crate::live::conversations::{conversation_id, turn_error, with_model};
use crate::state::AppState;

#[derive(Debug, Default, Deserialize)]
pub struct CompactRequest {
    /// The model whose window and provider are used (a registry name).
    #[serde(default)]
    model: Option<String>,
}

/// 202 `{"run_id"}`: the compaction runs as a run of its own; its end
/// (`stop`, with the error when there was nothing to compact or the
/// summarising call failed) comes over the socket.
pub async fn compact(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<CompactRequest>,
) -> ApiResult<Response> {
    let id = conversation_id(&id)?;
    state.store().conversation(id).await?;
    let owner = Owner::lock(&state, id).await?;
    let options = with_model(&state, owner.options.clone(), req.model.as_deref())?;
    let handle = state
        .engine
        .compact(id, options)
        .await
        .map_err(turn_error)?;
    let run_id = handle.run_id;
    owner.watch(&state, handle);
    Ok((StatusCode::ACCEPTED, Json(json!({"run_id": run_id}))).into_response())
}
