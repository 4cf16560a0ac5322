//! `/v1/conversations`: list and create conversations, read their trees
//! and messages, and act on them (send, edit, regenerate, fork, move the
//! active leaf). Turns start here and run on; their events come over the
//! conversation's socket.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{AgentEvent, ContentBlock, ConversationId, Message, MessageId, RunId};
use toolwire_engine::{EngineError, Follower, TurnHandle, TurnOptions};

use crate::agents::{self, models, owner::Owner};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::live::tree;
use crate::state::AppState;

/// How long a started turn may take to store its user message.
const STORE_WAIT: Duration = Duration::from_secs(10);

/// A conversation id from a path: anything else is no conversation.
pub fn conversation_id(text: &str) -> ApiResult<ConversationId> {
    // Letta's conversations API writes the same ids as `conv-<uuid>`.
    text.strip_prefix("conv-")
        .unwrap_or(text)
        .parse()
        .map_err(|_| ApiError::not_found("conversation", &clip_id(text)))
}

/// A message id from a path.
fn path_message_id(text: &str) -> ApiResult<MessageId> {
    text.parse()
        .map_err(|_| ApiError::not_found("message", &clip_id(text)))
}

/// A message id from a body: a malformed one is a bad request.
fn body_message_id(field: &str, text: &str) -> ApiResult<MessageId> {
    text.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "{field} `{}` is not a message id (a UUID)",
            clip_id(text)
        ))
    })
}

/// At most 64 characters of a hostile id go back in a message.
fn clip_id(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The conversation's turn, refused while one runs.
pub(crate) fn turn_error(e: EngineError) -> ApiError {
    match e {
        EngineError::TurnInProgress(_) => ApiError::conflict(
            "TURN_IN_PROGRESS",
            "a turn is running in this conversation: interject over its socket, or cancel it",
        ),
        other => other.into(),
    }
}

/// Message `id` of conversation `conversation` (404 if it is another's).
async fn message_of(
    state: &AppState,
    conversation: ConversationId,
    id: MessageId,
) -> ApiResult<Message> {
    // The conversation first: an unknown one is the 404 to give.
    state.store().conversation(conversation).await?;
    let message = state.store().message(id).await?;
    if message.conversation_id != conversation {
        return Err(ApiError::not_found("message", &id.to_string()));
    }
    Ok(message)
}

/// `GET /v1/conversations`: newest first.
pub async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let summaries = state.store().list_conversations().await?;
    let agents = agents::readable(&state).await?;
    let conversations: Vec<Value> = summaries
        .iter()
        .map(|s| {
            let c = &s.conversation;
            tree::summary(c, agents.iter().find(|a| a.conversation_id == c.id))
        })
        .collect();
    Ok(Json(json!({"conversations": conversations})))
}

#[derive(Debug, Default, Deserialize)]
pub struct CreateRequest {
    title: Option<String>,
}

/// `POST /v1/conversations`.
pub async fn create(
    State(state): State<AppState>,
    Body(req): Body<CreateRequest>,
) -> ApiResult<Response> {
    let conversation = state
        .engine
        .create_conversation(req.title.as_deref())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(tree::summary(&conversation, None)),
    )
        .into_response())
}

/// `GET /v1/conversations/{id}/tree`.
pub async fn tree(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let id = conversation_id(&id)?;
    state.store().conversation(id).await?;
    let last = state.live.index.last_seq(&state.engine, id).await?;
    Ok(Json(tree::tree(&state, id, last).await?))
}

/// `GET /v1/conversations/{id}/messages/{mid}`.
pub async fn message(
    State(state): State<AppState>,
    Path((id, mid)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let id = conversation_id(&id)?;
    let mid = path_message_id(&mid)?;
    let message = message_of(&state, id, mid).await?;
    Ok(Json(tree::message_view(&state, &message).await?))
}

/// Messages one batch may ask for.
pub const MAX_BATCH: usize = 200;

#[derive(Debug, Deserialize)]
pub struct BatchQuery {
    ids: String,
}

/// `GET /v1/conversations/{id}/messages?ids=A,B,…`: up to [`MAX_BATCH`]
/// messages whole, in the order asked (what the page draws of a long
/// conversation, in one request rather than one per message).
pub async fn messages(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<BatchQuery>,
) -> ApiResult<Json<Value>> {
    let id = conversation_id(&id)?;
    let ids = query
        .ids
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|text| {
            text.parse::<MessageId>().map_err(|_| {
                ApiError::bad_request(format!(
                    "ids: `{}` is not a message id (a UUID)",
                    clip_id(text)
                ))
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    if ids.is_empty() || ids.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "ids: give 1 to {MAX_BATCH} message ids, comma-separated (got {})",
            ids.len()
        )));
    }
    state.store().conversation(id).await?;
    match tree::message_views(&state, id, &ids).await? {
        Ok(views) => Ok(Json(json!({"messages": views}))),
        Err(missing) => Err(ApiError::not_found("message", &missing.to_string())),
    }
}

/// Unknown fields are refused, so a misspelt `text` is named (422) rather
/// than read as an empty message.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    /// May be empty when `images` are given.
    #[serde(default)]
    text: String,
    #[serde(default)]
    parent_id: Option<String>,
    /// The model of this turn only (a registry name).
    #[serde(default)]
    model: Option<String>,
    /// Images after the text, each stored once by its hash.
    #[serde(default)]
    images: Vec<SentImage>,
}

/// An image in a sent message: base64 `data`, and the type the client
/// says it is (checked against the bytes).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentImage {
    data: String,
    #[serde(default)]
    media_type: Option<String>,
}

/// `options` with the model a request names for its turn.
pub(crate) fn with_model(
    state: &AppState,
    mut options: TurnOptions,
    model: Option<&str>,
) -> ApiResult<TurnOptions> {
    if let Some(name) = model {
        options.model = Some(models::known(state, name)?);
    }
    Ok(options)
}

/// Refuses text with nothing in it.
fn check_text(text: &str) -> ApiResult<()> {
    if text.trim().is_empty() {
        return Err(ApiError::bad_request("text is empty"));
    }
    Ok(())
}

/// The id of the user message run `run_id` stored first (its
/// `turn_started`), read from `follower`, subscribed before the turn
/// started.
async fn stored_message(mut follower: Follower, run_id: RunId) -> ApiResult<MessageId> {
    let wait = async {
        loop {
            let Some(batch) = follower.next().await? else {
                return Err(ApiError::internal("the engine stopped"));
            };
            for stored in batch {
                match stored.event {
                    AgentEvent::TurnStarted {
                        run_id: r, message, ..
                    } if r == run_id => return Ok(message.id),
                    AgentEvent::Stopped {
                        run_id: r, error, ..
                    } if r == run_id => {
                        return Err(ApiError::internal(format!(
                            "the turn ended before its message was stored: {}",
                            error.unwrap_or_default()
                        )));
                    }
                    _ => {}
                }
            }
        }
    };
    tokio::time::timeout(STORE_WAIT, wait)
        .await
        .map_err(|_| ApiError::internal("the turn did not store its message in time"))?
}

/// 202 with the run and its user message. The owner (and the agent's
/// lock with it) is released once the turn is started and watched, before
/// waiting for the message: the wait must not hold up the agent's other
/// requests.
async fn accepted(
    state: &AppState,
    owner: Owner,
    follower: Follower,
    handle: TurnHandle,
) -> ApiResult<Response> {
    let run_id = handle.run_id;
    owner.watch(state, handle);
    drop(owner);
    let message_id = stored_message(follower, run_id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"run_id": run_id, "message_id": message_id})),
    )
        .into_response())
}

/// `POST /v1/conversations/{id}/messages`: a user message under
/// `parent_id` (the active leaf by default), and a turn from it.
pub async fn send(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<SendRequest>,
) -> ApiResult<Response> {
    let id = conversation_id(&id)?;
    if req.images.is_empty() {
        check_text(&req.text)?;
    }
    let parent = match &req.parent_id {
        Some(p) => {
            let parent = body_message_id("parent_id", p)?;
            Some(message_of(&state, id, parent).await?.id)
        }
        None => {
            state.store().conversation(id).await?;
            None
        }
    };
    // Stored before the turn is asked for: a refused image stops the
    // request with nothing sent.
    let mut content = Vec::with_capacity(req.images.len() + 1);
    if !req.text.trim().is_empty() {
        content.push(ContentBlock::Text {
            text: req.text.clone(),
        });
    }
    for (i, image) in req.images.iter().enumerate() {
        let at = format!("images[{i}]");
        let bytes = crate::images::decode(&image.data, &at)?;
        content.push(crate::images::store(&state, &bytes, image.media_type.as_deref(), &at).await?);
    }
    let owner = Owner::lock(&state, id).await?;
    let options = with_model(&state, owner.options.clone(), req.model.as_deref())?;
    let follower = state.engine.follow(id);
    let handle = state
        .engine
        .send_content_with(id, content, parent, options)
        .await
        .map_err(turn_error)?;
    accepted(&state, owner, follower, handle).await
}

#[derive(Debug, Deserialize)]
pub struct EditRequest {
    text: String,
    /// The model of this turn only (a registry name).
    #[serde(default)]
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct RegenerateRequest {
    /// Answer with this model (a registry name): a sibling written by
    /// another model.
    #[serde(default)]
    model: Option<String>,
}

/// `POST /v1/conversations/{id}/messages/{mid}/edit`: a new sibling of
/// user message `mid` with `text`, and a turn from it.
pub async fn edit(
    State(state): State<AppState>,
    Path((id, mid)): Path<(String, String)>,
    Body(req): Body<EditRequest>,
) -> ApiResult<Response> {
    let id = conversation_id(&id)?;
    let mid = path_message_id(&mid)?;
    check_text(&req.text)?;
    message_of(&state, id, mid).await?;
    let owner = Owner::lock(&state, id).await?;
    let options = with_model(&state, owner.options.clone(), req.model.as_deref())?;
    let follower = state.engine.follow(id);
    let handle = state
        .engine
        .edit_with(mid, &req.text, options)
        .await
        .map_err(turn_error)?;
    accepted(&state, owner, follower, handle).await
}

/// `POST /v1/conversations/{id}/messages/{mid}/regenerate`: a new answer
/// in place of assistant message `mid`, by the model the body names if
/// it names one.
pub async fn regenerate(
    State(state): State<AppState>,
    Path((id, mid)): Path<(String, String)>,
    Body(req): Body<RegenerateRequest>,
) -> ApiResult<Response> {
    let id = conversation_id(&id)?;
    let mid = path_message_id(&mid)?;
    message_of(&state, id, mid).await?;
    let owner = Owner::lock(&state, id).await?;
    let options = with_model(&state, owner.options.clone(), req.model.as_deref())?;
    let handle = state
        .engine
        .regenerate_with(mid, options)
        .await
        .map_err(turn_error)?;
    let run_id = handle.run_id;
    owner.watch(&state, handle);
    Ok((StatusCode::ACCEPTED, Json(json!({"run_id": run_id}))).into_response())
}

#[derive(Debug, Deserialize)]
pub struct MessageRef {
    message_id: String,
}

/// `POST /v1/conversations/{id}/fork`: a new conversation holding the
/// path to `message_id`.
pub async fn fork(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<MessageRef>,
) -> ApiResult<Response> {
    let id = conversation_id(&id)?;
    let mid = body_message_id("message_id", &req.message_id)?;
    message_of(&state, id, mid).await?;
    let forked = state.engine.fork(mid).await.map_err(turn_error)?;
    Ok((StatusCode::CREATED, Json(tree::summary(&forked, None))).into_response())
}

/// `PUT /v1/conversations/{id}/active_leaf`: the branch to go on from.
pub async fn set_active_leaf(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<MessageRef>,
) -> ApiResult<Json<Value>> {
    let id = conversation_id(&id)?;
    let mid = body_message_id("message_id", &req.message_id)?;
    message_of(&state, id, mid).await?;
    let _owner = Owner::lock(&state, id).await?;
    // Refused while a turn runs (the engine's rule, `Engine::set_active_leaf`).
    state
        .engine
        .set_active_leaf(id, mid)
        .await
        .map_err(turn_error)?;
    let last = state.live.index.last_seq(&state.engine, id).await?;
    Ok(Json(tree::tree(&state, id, last).await?))
}

#[derive(Debug, Deserialize)]
pub struct ModelChoice {
    /// A registry name, or `null` for the agent's model or the default.
    model: Option<String>,
}

/// The conversation's model: the one its turns use, the one chosen for it
/// (if any), and the models there are.
async fn model_view(state: &AppState, id: ConversationId) -> ApiResult<Value> {
    let chosen = models::chosen(state, id).await?;
    let owner_model = Owner::options(state, id).await?.model;
    let registry = state.engine.models();
    let effective = owner_model.unwrap_or_else(|| registry.default_entry().info.name.clone());
    Ok(json!({
        "model": effective,
        "chosen": chosen,
        "default": registry.default_entry().info.name,
        "models": registry.iter().map(models::describe).collect::<Vec<_>>(),
    }))
}

/// `GET /v1/conversations/{id}/model`.
pub async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let id = conversation_id(&id)?;
    state.store().conversation(id).await?;
    Ok(Json(model_view(&state, id).await?))
}

/// `PUT /v1/conversations/{id}/model`: the model the conversation's next
/// turns use (those started here; a Letta agent's own routes keep its
/// model).
pub async fn set_model(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<ModelChoice>,
) -> ApiResult<Json<Value>> {
    let id = conversation_id(&id)?;
    state.store().conversation(id).await?;
    models::choose(&state, id, req.model.as_deref()).await?;
    Ok(Json(model_view(&state, id).await?))
}
