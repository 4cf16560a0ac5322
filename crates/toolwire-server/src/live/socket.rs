//! `GET /v1/conversations/{id}/ws`: a conversation's events as they are
//! stored, and a person's control of its turn (interject, approve, deny,
//! cancel).
//!
//! Without `after`, the socket opens with a snapshot as of event L (the
//! tree, and the running turn replayed from its first event to L) and
//! goes on from L; with `after=N` it sends every event after N, from the
//! store then live. Either way the engine's follower does the joining: it
//! subscribes before it reads the store, and drops live events it already
//! read, so nothing comes twice and nothing is missed.

use std::time::Instant;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{ConversationId, Decision, ToolCallId};
use toolwire_engine::{EngineError, Follower, Interjection, Responded};
use toolwire_store::StoredEvent;

use crate::agents::options;
use crate::agents::owner::Owner;
use crate::error::{ApiError, ApiResult};
use crate::extract::Query;
use crate::live::conversations::conversation_id;
use crate::live::frames::{self, Renderer};
use crate::live::tree;
use crate::state::AppState;

/// Largest client frame accepted: client frames are short commands.
const MAX_CLIENT_FRAME: usize = 1024 * 1024;

#[derive(Debug, Default, Deserialize)]
pub struct SocketQuery {
    after: Option<u64>,
}

/// A frame from the client.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ClientFrame {
    Interject {
        text: String,
    },
    Approve {
        tool_call_id: String,
    },
    Deny {
        tool_call_id: String,
        #[serde(default)]
        reason: Option<String>,
    },
    Cancel,
}

impl ClientFrame {
    fn name(&self) -> &'static str {
        match self {
            ClientFrame::Interject { .. } => "interject",
            ClientFrame::Approve { .. } => "approve",
            ClientFrame::Deny { .. } => "deny",
            ClientFrame::Cancel => "cancel",
        }
    }
}

/// The upgrade. An unknown conversation is a 404 before any upgrade.
pub async fn upgrade(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<SocketQuery>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let id = conversation_id(&id)?;
    state.store().conversation(id).await?;
    let ws = ws.map_err(|e| {
        ApiError::new(
            e.status(),
            "NOT_A_WEBSOCKET",
            format!("this route speaks WebSocket: {}", e.body_text()),
        )
    })?;
    Ok(ws
        .max_message_size(MAX_CLIENT_FRAME)
        .on_upgrade(move |socket| async move {
            if let Err(e) = run(state, id, query.after, socket).await {
                tracing::debug!(conversation = %id, error = %e, "live socket closed");
            }
        }))
}

/// Why a socket ended early.
#[derive(Debug, thiserror::Error)]
enum SocketError {
    #[error("the client went away: {0}")]
    Gone(#[from] axum::Error),
    #[error("{0}")]
    Api(ApiError),
}

impl From<ApiError> for SocketError {
    fn from(e: ApiError) -> Self {
        SocketError::Api(e)
    }
}

impl From<EngineError> for SocketError {
    fn from(e: EngineError) -> Self {
        SocketError::Api(e.into())
    }
}

/// The stored events of the run going on at event `seq` up to it, if one
/// was (nothing after a `stop`).
async fn turn_before(
    state: &AppState,
    conversation: ConversationId,
    seq: u64,
) -> ApiResult<Vec<StoredEvent>> {
    if seq == 0 {
        return Ok(Vec::new());
    }
    let at = state.engine.events_since(conversation, seq - 1, 1).await?;
    let Some(at) = at.into_iter().next().filter(|e| e.seq == seq) else {
        return Ok(Vec::new());
    };
    if matches!(at.event, toolwire_core::AgentEvent::Stopped { .. }) {
        return Ok(Vec::new());
    }
    let run_id = at.event.run_id();
    let Some(first) = state
        .live
        .index
        .run_start(&state.engine, conversation, run_id)
        .await?
    else {
        return Ok(Vec::new());
    };
    let count = u32::try_from(seq - first + 1).unwrap_or(u32::MAX);
    let events = state
        .engine
        .events_since(conversation, first - 1, count)
        .await?;
    Ok(events
        .into_iter()
        .filter(|e| e.seq <= seq && e.event.run_id() == run_id)
        .collect())
}

/// The renderer, the follower and the opening frames of a socket.
async fn open(
    state: &AppState,
    conversation: ConversationId,
    after: Option<u64>,
) -> ApiResult<(Renderer, Follower, Vec<Value>)> {
    let mut renderer = Renderer::default();
    match after {
        Some(n) => {
            renderer.prime(&turn_before(state, conversation, n).await?);
            let resync = renderer.resume(n);
            Ok((renderer, state.engine.follow_after(conversation, n), resync))
        }
        None => {
            // The seq first, then the tree: the tree may hold nodes of
            // events after it (sent again, as updates of nodes the page
            // has), but never misses one the socket will not send.
            let last = state
                .live
                .index
                .last_seq(&state.engine, conversation)
                .await?;
            let tree = tree::tree(state, conversation, last).await?;
            renderer.prime(&turn_before(state, conversation, last).await?);
            let turn = match renderer.turn_state() {
                Some(turn) => Some(turn),
                None => state
                    .engine
                    .pending_approval(conversation)
                    .await?
                    .map(|p| frames::paused_state(&p)),
            };
            let snapshot = json!({"type": "snapshot", "seq": last, "tree": tree, "turn": turn});
            Ok((
                renderer,
                state.engine.follow_after(conversation, last),
                vec![snapshot],
            ))
        }
    }
}

async fn send(
    tx: &mut futures::stream::SplitSink<WebSocket, WsMessage>,
    frame: &Value,
) -> Result<(), SocketError> {
    tx.send(WsMessage::Text(frame.to_string().into())).await?;
    Ok(())
}

async fn run(
    state: AppState,
    conversation: ConversationId,
    after: Option<u64>,
    socket: WebSocket,
) -> Result<(), SocketError> {
    let (mut tx, mut rx) = socket.split();
    let (mut renderer, mut follower, opening) = match open(&state, conversation, after).await {
        Ok(opened) => opened,
        Err(e) => {
            send(&mut tx, &json!({"type": "error", "message": e.message})).await?;
            return Err(e.into());
        }
    };
    for frame in &opening {
        send(&mut tx, frame).await?;
    }
    loop {
        let deadline = renderer.next_deadline().map(tokio::time::Instant::from_std);
        tokio::select! {
            next = follower.next() => {
                let batch = match next {
                    Ok(Some(batch)) => batch,
                    Ok(None) => break,
                    Err(e) => {
                        // Said before closing, so that the client knows to
                        // reconnect with `after` rather than wait.
                        let message = format!("the conversation's events could not be read: {e}");
                        send(&mut tx, &json!({"type": "error", "message": message})).await?;
                        return Err(e.into());
                    }
                };
                for stored in &batch {
                    for frame in renderer.event(stored, Instant::now()) {
                        send(&mut tx, &frame).await?;
                    }
                }
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                for frame in renderer.due(Instant::now()) {
                    send(&mut tx, &frame).await?;
                }
            }
            incoming = rx.next() => {
                let text = match incoming {
                    Some(Ok(WsMessage::Text(text))) => text,
                    Some(Ok(WsMessage::Binary(_))) => {
                        send(&mut tx, &json!({"type": "error", "message": "frames are JSON text, not binary"})).await?;
                        continue;
                    }
                    Some(Ok(WsMessage::Close(_))) | None => break,
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e.into()),
                };
                let reply = client_frame(&state, conversation, text.as_str()).await;
                send(&mut tx, &reply).await?;
            }
            _ = state.shutdown.cancelled() => break,
        }
    }
    let _ = tx.close().await;
    Ok(())
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Acts on a client frame; the answer is an `ack` or an `error`.
async fn client_frame(state: &AppState, conversation: ConversationId, text: &str) -> Value {
    let frame: ClientFrame = match serde_json::from_str(text) {
        Ok(frame) => frame,
        Err(e) => {
            let kind = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned));
            let mut error = json!({"type": "error", "message": format!("not a client frame: {e}")});
            if let Some(kind) = kind {
                error["for"] = json!(kind);
            }
            return error;
        }
    };
    let name = frame.name();
    match act(state, conversation, frame).await {
        Ok(()) => json!({"type": "ack", "for": name}),
        Err(e) => json!({"type": "error", "for": name, "message": e.message}),
    }
}

async fn act(state: &AppState, conversation: ConversationId, frame: ClientFrame) -> ApiResult<()> {
    match frame {
        ClientFrame::Interject { text } => interject(state, conversation, &text).await,
        ClientFrame::Approve { tool_call_id } => {
            decide(state, conversation, tool_call_id, Decision::Approve).await
        }
        ClientFrame::Deny {
            tool_call_id,
            reason,
        } => decide(state, conversation, tool_call_id, Decision::Deny { reason }).await,
        ClientFrame::Cancel => cancel(state, conversation).await,
    }
}

/// Queued into the running turn; with none running, a turn from the
/// active leaf with the conversation's options.
async fn interject(state: &AppState, conversation: ConversationId, text: &str) -> ApiResult<()> {
    if text.trim().is_empty() || text.contains('\0') {
        return Err(ApiError::bad_request(
            "text is empty or holds a NUL character",
        ));
    }
    // The interjection may start a turn of the engine's own: with the
    // agent's options as they are now.
    options::refresh(state, conversation).await?;
    if state.engine.is_running(conversation) {
        // Should the turn have ended meanwhile, this starts the next one
        // (with the options of the conversation's last turn: the engine
        // remembers them).
        state.engine.interject(conversation, text).await?;
        return Ok(());
    }
    let owner = Owner::lock(state, conversation).await?;
    match state
        .engine
        .send_with(conversation, text, None, owner.options.clone())
        .await
    {
        Ok(handle) => {
            owner.watch(state, handle);
            Ok(())
        }
        // A turn started in between: it takes the text.
        Err(EngineError::TurnInProgress(_)) => {
            match state.engine.interject(conversation, text).await? {
                Interjection::Queued => Ok(()),
                Interjection::Started(handle) => {
                    owner.watch(state, handle);
                    Ok(())
                }
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// One call's answer; once every waiting call has one, the turn goes on.
async fn decide(
    state: &AppState,
    conversation: ConversationId,
    tool_call_id: String,
    decision: Decision,
) -> ApiResult<()> {
    let owner = Owner::lock(state, conversation).await?;
    let pending = state
        .engine
        .pending_approval(conversation)
        .await?
        .ok_or(EngineError::NothingPending(conversation))?;
    let answers = state
        .live
        .decisions
        .record(&pending, ToolCallId(tool_call_id), decision)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let Some(answers) = answers else {
        return Ok(());
    };
    match state
        .engine
        .respond(conversation, answers.clone(), None, owner.options.clone())
        .await
    {
        Ok(Responded::Started(handle)) => owner.watch(state, handle),
        Ok(Responded::AlreadyApplied) => {}
        Err(e) => {
            state.live.decisions.restore(&pending, answers);
            return Err(e.into());
        }
    }
    Ok(())
}

/// Stops the running turn, and ends a pause (its calls answered as not
/// run), as the Letta cancel does.
async fn cancel(state: &AppState, conversation: ConversationId) -> ApiResult<()> {
    state.live.decisions.clear(conversation);
    // Ending the pause starts a turn of the engine's own: with the agent's
    // options as they are now.
    options::refresh(state, conversation).await?;
    let running = state.engine.cancel_anywhere(conversation).await?;
    match state
        .engine
        .abandon_pending(conversation, "the user cancelled")
        .await
    {
        Ok(_) => Ok(()),
        Err(EngineError::TurnInProgress(_)) => Ok(()),
        Err(e) if running => {
            tracing::debug!(error = %e, "cancelled the turn; the pause could not be read");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
