//! Letta's conversations API over toolwire's conversation trees: a Letta
//! conversation (`conv-<uuid>`) is a toolwire conversation whose owner
//! record names its agent, one of several an agent may have beside its
//! own. Its turns run with the agent's options, through the engine like
//! every other turn; the tree, fork, active-leaf and socket routes of the
//! live view serve it too. The shared paths are dispatched by shape in
//! `crate::conversations`.

use axum::Json;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{Conversation, ConversationId};

use crate::agents::{self, AgentRecord};
use crate::error::{ApiError, ApiResult};
use crate::letta::messages::{self, MessageRequest};
use crate::letta::page::{Order, PageQuery};
use crate::letta::runs;
use crate::state::AppState;

/// A conversation id as Letta writes it (`conv-<uuid>`) or toolwire (a
/// bare UUID); anything else is no conversation.
pub fn parse(text: &str) -> ApiResult<ConversationId> {
    let uuid = text.strip_prefix("conv-").unwrap_or(text);
    uuid.parse().map_err(|_| {
        ApiError::not_found("conversation", &text.chars().take(64).collect::<String>())
    })
}

/// The conversation a path names: `default` with `?agent_id=` is the
/// agent's own (Letta's "agent-direct" mode).
pub async fn resolve(
    state: &AppState,
    text: &str,
    agent_id: Option<&str>,
) -> ApiResult<ConversationId> {
    if text == "default"
        && let Some(agent) = agent_id
    {
        return Ok(agents::load(state, agent).await?.conversation_id);
    }
    let id = parse(text)?;
    state.store().conversation(id).await?;
    Ok(id)
}

/// The conversation as Letta's `Conversation`.
async fn conversation_json(
    state: &AppState,
    conversation: &Conversation,
    agent_id: Option<&str>,
) -> ApiResult<Value> {
    let leaf = state.store().message(conversation.active_leaf).await?;
    let last_message_at =
        (conversation.active_leaf != conversation.root_id).then_some(leaf.created_at);
    Ok(json!({
        "id": format!("conv-{}", conversation.id),
        "agent_id": agent_id.unwrap_or_default(),
        "summary": conversation.title,
        "archived": false,
        "created_at": conversation.created_at,
        "updated_at": last_message_at.unwrap_or(conversation.created_at),
        "last_message_at": last_message_at,
        "in_context_message_ids": [],
    }))
}

/// The agent that owns `conversation`: Letta's routes need one.
async fn owner(state: &AppState, conversation: ConversationId) -> ApiResult<AgentRecord> {
    agents::agent_of(state, conversation).await?.ok_or_else(|| {
        ApiError::bad_request(format!(
            "conversation conv-{conversation} belongs to no agent: send to it with \
             {{\"text\": …}} (the live view's shape), or create one with \
             POST /v1/conversations?agent_id=…"
        ))
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct CreateRequest {
    summary: Option<String>,
}

/// `POST /v1/conversations?agent_id=…`: one more conversation of the
/// agent, starting from its system prompt.
pub async fn create(
    state: &AppState,
    agent_id: &str,
    req: CreateRequest,
) -> ApiResult<Json<Value>> {
    let agent = agents::load(state, agent_id).await?;
    let own = state.store().conversation(agent.conversation_id).await?;
    let system = state.store().message(own.root_id).await?.text();
    let conversation = state
        .engine
        .create_conversation_with(&system, req.summary.as_deref())
        .await?;
    agents::add_conversation(state, &agent, conversation.id).await?;
    tracing::info!(agent = %agent.id, conversation = %conversation.id, "conversation created");
    Ok(Json(
        conversation_json(state, &conversation, Some(&agent.id)).await?,
    ))
}

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    pub agent_id: Option<String>,
    #[serde(flatten)]
    pub page: PageQuery,
}

/// `GET /v1/conversations?agent_id=…` (Letta's list): the agent's
/// conversations made through this API (or every agent's), newest first
/// by default.
pub async fn list(state: &AppState, query: ListQuery) -> ApiResult<Json<Vec<Value>>> {
    let mut items = Vec::new();
    for (id, agent) in agents::further_conversations(state, query.agent_id.as_deref()).await? {
        let conversation = match state.store().conversation(id).await {
            Ok(c) => c,
            Err(toolwire_store::StoreError::ConversationNotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        items.push(conversation_json(state, &conversation, Some(&agent)).await?);
    }
    // Oldest first, by creation.
    items.sort_by(|a, b| a["created_at"].as_str().cmp(&b["created_at"].as_str()));
    let page = query.page.page(
        items,
        |c| c.get("id").and_then(Value::as_str).unwrap_or(""),
        Order::Desc,
        50,
    )?;
    Ok(Json(page))
}

/// `GET /v1/conversations/{id}`.
pub async fn retrieve(
    state: &AppState,
    id: &str,
    agent_id: Option<&str>,
) -> ApiResult<Json<Value>> {
    let id = resolve(state, id, agent_id).await?;
    let conversation = state.store().conversation(id).await?;
    let agent = agents::agent_of(state, id).await?;
    Ok(Json(
        conversation_json(state, &conversation, agent.as_ref().map(|a| a.id.as_str())).await?,
    ))
}

/// `GET /v1/conversations/{id}/messages` (without `ids`): its active
/// branch as Letta's messages, paged as the agent's history is.
pub async fn messages(
    state: &AppState,
    id: &str,
    agent_id: Option<&str>,
    query: &PageQuery,
) -> ApiResult<Json<Vec<Value>>> {
    let id = resolve(state, id, agent_id).await?;
    Ok(Json(messages::history_page(state, id, query).await?))
}

/// `POST /v1/conversations/{id}/messages` in Letta's shape: a turn of the
/// owning agent in this conversation, streamed (SSE) unless
/// `streaming: false`.
pub async fn send(
    state: AppState,
    id: &str,
    agent_id: Option<&str>,
    req: MessageRequest,
) -> ApiResult<Response> {
    let conversation = resolve(&state, id, agent_id).await?;
    let agent = owner(&state, conversation).await?;
    if req.streaming.unwrap_or(true) {
        messages::stream_response(state, agent.id, Some(conversation), req).await
    } else {
        messages::respond_json(state, agent.id, Some(conversation), req).await
    }
}

/// `POST /v1/conversations/{id}/stream`: the stream of the conversation's
/// latest run, resumed after `starting_after`.
pub async fn stream(
    state: AppState,
    id: &str,
    agent_id: Option<&str>,
    req: runs::StreamRequest,
) -> ApiResult<Response> {
    let conversation = resolve(&state, id, agent_id).await?;
    let Some(run) = runs::latest_in(&state, conversation).await? else {
        return Err(ApiError::not_found(
            "run of conversation",
            &format!("conv-{conversation}"),
        ));
    };
    runs::stream_of(state, run, req).await
}

/// `POST /v1/conversations/{id}/cancel`: stops the turn running in it.
pub async fn cancel(state: &AppState, id: &str, agent_id: Option<&str>) -> ApiResult<Json<Value>> {
    let conversation = resolve(state, id, agent_id).await?;
    let running = state.engine.cancel(conversation);
    Ok(Json(json!({
        "status": if running { "cancelled" } else { "nothing_to_cancel" },
        "cancelled_run": running,
    })))
}
