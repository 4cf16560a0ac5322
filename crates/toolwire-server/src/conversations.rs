//! `/v1/conversations`: one resource for both doors. A conversation is a
//! toolwire conversation tree; Letta's conversations API and the live
//! view's share its paths, and where their requests differ the shape
//! decides which door answers:
//!
//! - `GET /v1/conversations`: Letta's list (an array) when the query has
//!   any of Letta's parameters (`agent_id`, `limit`, `after`, `before`,
//!   `order`, `order_by`, `summary_search`, `archive_status`), else the
//!   live view's (`{"conversations": […]}`);
//! - `POST /v1/conversations`: Letta's create with `?agent_id=`, else the
//!   live view's (`{"title"}`, 201);
//! - `GET /v1/conversations/{id}/messages`: the live view's batch with
//!   `?ids=`, else Letta's list;
//! - `POST /v1/conversations/{id}/messages`: Letta's for a body with
//!   `messages` or `input`, else the live view's (`text`, …).
//!
//! This module only dispatches; each door keeps its own handlers.

use axum::Json;
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::conversations as letta;
use crate::letta::runs::StreamRequest;
use crate::live::conversations as live;
use crate::state::AppState;

/// Query parameters only Letta's list sends.
const LETTA_LIST_KEYS: [&str; 8] = [
    "agent_id",
    "limit",
    "after",
    "before",
    "order",
    "order_by",
    "summary_search",
    "archive_status",
];

/// The shared routes (the live view's others stay in `live`).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/conversations", get(list).post(create))
        .route("/v1/conversations/{id}", get(retrieve))
        .route("/v1/conversations/{id}/messages", get(messages).post(send))
        .route("/v1/conversations/{id}/stream", post(stream))
        .route("/v1/conversations/{id}/cancel", post(cancel))
}

fn pairs(raw: Option<&str>) -> ApiResult<Vec<(String, String)>> {
    serde_urlencoded::from_str(raw.unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("the query is not valid: {e}")))
}

fn query<T: DeserializeOwned>(raw: Option<&str>) -> ApiResult<T> {
    serde_urlencoded::from_str(raw.unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("the query is not valid: {e}")))
}

/// A body read as the door's request type, with the extractor's errors.
fn body<T: DeserializeOwned>(value: Value) -> ApiResult<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "INVALID_BODY",
            format!("the request body is not valid: {path}: {}", e.into_inner()),
        )
    })
}

#[derive(Debug, Default, Deserialize)]
struct AgentQuery {
    agent_id: Option<String>,
}

async fn list(State(state): State<AppState>, RawQuery(raw): RawQuery) -> ApiResult<Response> {
    let letta_shape = pairs(raw.as_deref())?
        .iter()
        .any(|(k, _)| LETTA_LIST_KEYS.contains(&k.as_str()));
    if letta_shape {
        let q: letta::ListQuery = query(raw.as_deref())?;
        return Ok(letta::list(&state, q).await?.into_response());
    }
    Ok(live::list(State(state)).await?.into_response())
}

async fn create(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
    Body(value): Body<Value>,
) -> ApiResult<Response> {
    let q: AgentQuery = query(raw.as_deref())?;
    match q.agent_id {
        Some(agent) => Ok(letta::create(&state, &agent, body(value)?)
            .await?
            .into_response()),
        None => live::create(State(state), Body(body(value)?)).await,
    }
}

async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<AgentQuery>,
) -> ApiResult<Json<Value>> {
    letta::retrieve(&state, &id, q.agent_id.as_deref()).await
}

async fn messages(
    State(state): State<AppState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    if pairs(raw.as_deref())?.iter().any(|(k, _)| k == "ids") {
        let q: live::BatchQuery = query(raw.as_deref())?;
        return Ok(live::messages(State(state), Path(id), Query(q))
            .await?
            .into_response());
    }
    let q: letta::ListQuery = query(raw.as_deref())?;
    Ok(letta::messages(&state, &id, q.agent_id.as_deref(), &q.page)
        .await?
        .into_response())
}

async fn send(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<AgentQuery>,
    Body(value): Body<Value>,
) -> ApiResult<Response> {
    // Letta's body has `messages` or `input`; anything else is the live
    // view's (`text`, `parent_id`, `model`, …), whose errors name its fields.
    if value.get("messages").is_none() && value.get("input").is_none() {
        return live::send(State(state), Path(id), Body(body(value)?)).await;
    }
    letta::send(state, &id, q.agent_id.as_deref(), body(value)?).await
}

async fn stream(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<AgentQuery>,
    Body(req): Body<StreamRequest>,
) -> ApiResult<Response> {
    letta::stream(state, &id, q.agent_id.as_deref(), req).await
}

async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<AgentQuery>,
) -> ApiResult<Json<Value>> {
    letta::cancel(&state, &id, q.agent_id.as_deref()).await
}
