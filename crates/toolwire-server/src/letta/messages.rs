//! `/v1/agents/{id}/messages`: the history (the active branch), sending
//! (JSON, or SSE as it happens), approval answers and client tool results,
//! and cancel.

use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolwire_core::{ContentBlock, ConversationId, Decision, ToolCallId};
use toolwire_engine::{Follower, Responded, TurnHandle, TurnOptions};
use toolwire_tools::ToolSpec;

use crate::agents::memory::AgentMemory;
use crate::agents::options::{agent_options, refresh_options};
use crate::agents::{self, AgentRecord, approvals};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::page::PageQuery;
use crate::letta::render::{self, LiveRenderer, RunEnd};
use crate::letta::runs;
use crate::state::AppState;

/// A tool the client runs, declared per request.
#[derive(Debug, Clone, Deserialize)]
pub struct ClientTool {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

/// The body of `POST …/messages` and `…/messages/stream`.
#[derive(Debug, Default, Deserialize)]
pub struct MessageRequest {
    messages: Option<Vec<Value>>,
    input: Option<Value>,
    max_steps: Option<u32>,
    client_tools: Option<Vec<ClientTool>>,
    include_return_message_types: Option<Vec<String>>,
    stream_tokens: Option<bool>,
    include_pings: Option<bool>,
    /// On `POST …/messages`: answer as an SSE stream.
    pub(crate) streaming: Option<bool>,
    /// Streaming: the run goes on whatever happens to this request, its
    /// stream read from the stored events (each message with its
    /// `seq_id`), resumable with `GET|POST /v1/runs/{id}/stream`.
    background: Option<bool>,
}

/// What a request asks for, read from its messages.
#[derive(Debug, Default)]
struct Asked {
    text: Vec<String>,
    /// Images of the user's messages (decoded, not yet checked): bytes
    /// and the media type the client named.
    images: Vec<(Vec<u8>, String)>,
    decisions: Vec<(ToolCallId, Decision)>,
    /// Legacy approval: one answer for every waiting call.
    approve_all: Option<(bool, Option<String>)>,
    /// The `otid` the client gave its (first) user message.
    otid: Option<String>,
}

/// The images of a content value: its `image` parts, each with a base64
/// source (Letta's `ImageContent`), decoded. Other sources are refused:
/// toolwire fetches no URL for a client.
fn content_images(content: &Value, at: usize) -> Result<Vec<(Vec<u8>, String)>, ApiError> {
    let Value::Array(parts) = content else {
        return Ok(Vec::new());
    };
    let mut images = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        // Letta's SDKs may leave out the `type`s they default.
        let kind = part.get("type").and_then(Value::as_str);
        if kind != Some("image") && !(kind.is_none() && part.get("source").is_some()) {
            continue;
        }
        let source = part.get("source").unwrap_or(&Value::Null);
        let kind = match source.get("type").and_then(Value::as_str) {
            Some(kind) => kind,
            None if source.get("url").is_some() => "url",
            None => "base64",
        };
        // A `letta` source carries its data too; toolwire keeps no file ids.
        let has_data = source.get("data").is_some_and(Value::is_string);
        if !(kind == "base64" || (kind == "letta" && has_data)) {
            return Err(ApiError::bad_request(format!(
                "messages[{at}].content[{j}]: an image's source must be \
                 {{\"type\": \"base64\", \"media_type\": …, \"data\": …}}, not `{kind}` \
                 (toolwire fetches no URL and keeps no file ids)"
            )));
        }
        let media_type = source
            .get("media_type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let data = source.get("data").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_request(format!(
                "messages[{at}].content[{j}]: an image needs its base64 `data`"
            ))
        })?;
        let bytes = crate::images::decode(data, &format!("messages[{at}].content[{j}]"))?;
        images.push((bytes, media_type));
    }
    Ok(images)
}

/// The text of a content value: a string, or a list of parts whose text
/// parts count.
fn content_text(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")),
        other => Err(ApiError::bad_request(format!(
            "message content must be a string or a list of parts, not {other}"
        ))),
    }
}

fn tool_return_decision(item: &Value) -> Result<(ToolCallId, Decision), ApiError> {
    let id = item
        .get("tool_call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("a tool return needs its tool_call_id"))?;
    let content = match item.get("tool_return") {
        Some(v) => content_text(v)?,
        None => String::new(),
    };
    let is_error = item.get("status").and_then(Value::as_str) == Some("error");
    Ok((
        ToolCallId(id.to_owned()),
        Decision::Result { content, is_error },
    ))
}

fn read_request(req: &MessageRequest) -> Result<Asked, ApiError> {
    let mut asked = Asked::default();
    match &req.input {
        None => {}
        Some(Value::String(s)) => asked.text.push(s.clone()),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("tool_return") => {
                        for r in part
                            .get("tool_returns")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            asked.decisions.push(tool_return_decision(r)?);
                        }
                    }
                    _ => asked
                        .text
                        .push(content_text(&Value::Array(vec![part.clone()]))?),
                }
            }
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "input must be a string or a list of parts, not {other}"
            )));
        }
    }
    for (i, m) in req.messages.iter().flatten().enumerate() {
        match m.get("type").and_then(Value::as_str) {
            Some("approval") => {
                let approvals = m.get("approvals").and_then(Value::as_array);
                for a in approvals.into_iter().flatten() {
                    match a.get("type").and_then(Value::as_str) {
                        Some("tool") => asked.decisions.push(tool_return_decision(a)?),
                        _ => {
                            let id =
                                a.get("tool_call_id")
                                    .and_then(Value::as_str)
                                    .ok_or_else(|| {
                                        ApiError::bad_request(format!(
                                            "messages[{i}]: an approval needs its tool_call_id"
                                        ))
                                    })?;
                            let approve = a.get("approve").and_then(Value::as_bool).ok_or_else(
                                || ApiError::bad_request(format!("messages[{i}]: approval of {id} needs `approve` (true or false)")),
                            )?;
                            let reason = a.get("reason").and_then(Value::as_str).map(str::to_owned);
                            asked.decisions.push((
                                ToolCallId(id.to_owned()),
                                if approve {
                                    Decision::Approve
                                } else {
                                    Decision::Deny { reason }
                                },
                            ));
                        }
                    }
                }
                if approvals.is_none_or(|a| a.is_empty())
                    && let Some(approve) = m.get("approve").and_then(Value::as_bool)
                {
                    let reason = m.get("reason").and_then(Value::as_str).map(str::to_owned);
                    asked.approve_all = Some((approve, reason));
                }
            }
            Some("tool_return") => {
                for r in m
                    .get("tool_returns")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    asked.decisions.push(tool_return_decision(r)?);
                }
            }
            Some(other) if other != "message" => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}]: unknown message type `{other}` \
                     (send a message, an `approval` or a `tool_return`)"
                )));
            }
            _ => {
                let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
                if !matches!(role, "user" | "system") {
                    return Err(ApiError::bad_request(format!(
                        "messages[{i}]: role `{role}` cannot be sent; send user messages"
                    )));
                }
                let content = m.get("content").ok_or_else(|| {
                    ApiError::bad_request(format!("messages[{i}]: content is required"))
                })?;
                asked.text.push(content_text(content)?);
                asked.images.extend(content_images(content, i)?);
                if asked.otid.is_none() {
                    asked.otid = m.get("otid").and_then(Value::as_str).map(str::to_owned);
                }
            }
        }
    }
    asked.text.retain(|t| !t.trim().is_empty());
    Ok(asked)
}

/// The turn options of `agent` for this request.
async fn options(
    state: &AppState,
    agent: &AgentRecord,
    req: &MessageRequest,
) -> ApiResult<TurnOptions> {
    let client_tools = req
        .client_tools
        .iter()
        .flatten()
        .map(|c| ToolSpec {
            name: c.name.clone(),
            server: None,
            description: c.description.clone().unwrap_or_default(),
            parameters: c
                .parameters
                .clone()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            read_only: false,
        })
        .collect();
    Ok(TurnOptions {
        max_steps: req.max_steps,
        client_tools,
        // The agent was just read: the first step's prompt is made from it.
        system_prompt: Some(AgentMemory::just_read(&state.engine, agent)),
        ..agent_options(state, agent).await?
    })
}

/// A started (or already answered) run, with what renders it.
pub(crate) struct Started {
    handle: Option<TurnHandle>,
    follower: Follower,
    renderer: Option<LiveRenderer>,
    include: Option<HashSet<String>>,
    /// What the runs' API keeps of the run.
    doc: Option<runs::RunDoc>,
}

/// Starts what the request asks: answers to waiting calls (the turn goes
/// on), else a new user message. Errors come back before any byte of the
/// response, with their HTTP status.
async fn start(
    state: &AppState,
    agent_id: &str,
    conversation: Option<ConversationId>,
    req: &MessageRequest,
) -> ApiResult<Started> {
    let _agent_lock = state.lock(agent_id).await;
    let agent = agents::load(state, agent_id).await?;
    let conversation = conversation.unwrap_or(agent.conversation_id);
    let mut asked = read_request(req)?;
    let after_seq = state
        .live
        .index
        .last_seq(&state.engine, conversation)
        .await?;
    let mut options = options(state, &agent, req).await?;
    let mut gated: HashSet<String> = options.require_approval.clone();
    gated.extend(options.client_tools.iter().map(|c| c.name.clone()));
    let stream_tokens = req.stream_tokens.unwrap_or(false);
    // What the runs' API keeps of the run (its id once it has one),
    // stored by the engine with the run's beginning.
    let mut doc = runs::RunDoc {
        run_id: toolwire_core::RunId::new(),
        agent_id: agent.id.clone(),
        conversation_id: conversation,
        background: req.background.unwrap_or(false),
        stream_tokens,
        gated: gated.iter().cloned().collect(),
        after_seq,
        expect: Vec::new(),
        created_at: chrono::Utc::now(),
    };
    // Subscribed before the turn starts, so that nothing is missed.
    let follower = state.engine.follow(conversation);
    let otid_follower = asked
        .otid
        .is_some()
        .then(|| state.engine.follow(conversation));
    if let Some((approve, reason)) = asked.approve_all.take() {
        let pending = state
            .engine
            .pending_approval(conversation)
            .await?
            .ok_or(toolwire_engine::EngineError::NothingPending(conversation))?;
        for call in pending.waiting() {
            let decision = if approve {
                Decision::Approve
            } else {
                Decision::Deny {
                    reason: reason.clone(),
                }
            };
            asked.decisions.push((call.call.id.clone(), decision));
        }
    }
    let then = (!asked.text.is_empty()).then(|| asked.text.join("\n\n"));
    if !asked.images.is_empty() && !asked.decisions.is_empty() {
        return Err(ApiError::bad_request(
            "images come in a user message of their own, not with approvals or tool returns",
        ));
    }
    // Each image stored (once, by hash) through the engine before the
    // message that refers to it; a refused one stops the request here.
    let mut images = Vec::with_capacity(asked.images.len());
    for (i, (bytes, declared)) in asked.images.iter().enumerate() {
        let declared = (!declared.is_empty()).then_some(declared.as_str());
        let at = format!("image {}", i + 1);
        images.push(crate::images::store(state, bytes, declared, &at).await?);
    }
    let mut expect: Vec<String> = Vec::new();
    options.run_records = Some(runs::run_records(doc.clone()));
    let handle = if !images.is_empty() {
        let mut content = Vec::with_capacity(images.len() + 1);
        if let Some(text) = then {
            content.push(ContentBlock::Text { text });
        }
        content.extend(images);
        Some(
            state
                .engine
                .send_content_with(conversation, content, None, options)
                .await?,
        )
    } else if !asked.decisions.is_empty() {
        // The paused step's calls: their results come first.
        expect = state
            .engine
            .pending_approval(conversation)
            .await?
            .map(|p| p.calls.iter().map(|c| c.call.id.0.clone()).collect())
            .unwrap_or_default();
        doc.expect.clone_from(&expect);
        options.run_records = Some(runs::run_records(doc.clone()));
        let answered: Vec<ToolCallId> = asked.decisions.iter().map(|(id, _)| id.clone()).collect();
        let retry = (then.clone(), options.clone(), answered);
        match state
            .engine
            .respond(conversation, asked.decisions, then, options)
            .await?
        {
            Responded::Started(handle) => Some(handle),
            Responded::AlreadyApplied => keep_alive(state, conversation, retry).await?,
        }
    } else if let Some(text) = then {
        Some(
            state
                .engine
                .send_with(conversation, &text, None, options)
                .await?,
        )
    } else {
        return Err(ApiError::bad_request(
            "nothing to send: give `messages` (or `input`) with a user message or an approval",
        ));
    };
    let doc = match &handle {
        Some(h) => {
            // Stored with the run's beginning (`runs::run_records`).
            doc.run_id = h.run_id;
            if let (Some(otid), Some(follower)) = (asked.otid.take(), otid_follower) {
                runs::remember_otid(state, follower, h.run_id, otid);
            }
            Some(doc)
        }
        None => None,
    };
    let renderer = handle.as_ref().map(|h| {
        let mut renderer = LiveRenderer::new(h.run_id, stream_tokens, gated);
        renderer.expect_calls(expect);
        renderer
    });
    Ok(Started {
        doc,
        handle,
        follower,
        renderer,
        include: req
            .include_return_message_types
            .as_ref()
            .map(|t| t.iter().cloned().collect()),
    })
}

/// What a turn is asked to go on with when an answer that was applied
/// already comes again after its turn stopped short (Letta's text).
const KEEP_ALIVE: &str = "<system-alert>Automated keep-alive ping. Ignore this message and \
                          continue from where you stopped.</system-alert>";

/// Answers applied before, sent again: if the turn that applied them
/// stopped before the model answered their results (it was cancelled or
/// cut), a turn goes on from them, with the request's own message or a
/// keep-alive one, as Letta's server does; otherwise nothing runs. So too
/// after a compaction left nothing but the system prompt and the summary
/// in context, when the latest results on the path are these answers
/// (Letta's idempotency check after a summary: its full history's latest
/// tool message).
async fn keep_alive(
    state: &AppState,
    conversation: ConversationId,
    (then, options, answered): (Option<String>, TurnOptions, Vec<ToolCallId>),
) -> ApiResult<Option<TurnHandle>> {
    let leaf = state.store().conversation(conversation).await?.active_leaf;
    let path = state.store().path_to(leaf).await?;
    let goes_on = match path.last() {
        Some(last) if last.role == toolwire_core::Role::Tool => true,
        Some(last) if last.compaction().is_some() => {
            let view = toolwire_engine::context::view::compacted(&path);
            let results = path
                .iter()
                .rev()
                .find(|m| m.role == toolwire_core::Role::Tool)
                .map(|m| {
                    m.content
                        .iter()
                        .filter_map(|b| match b {
                            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            view.messages.len() <= 2 && answered.iter().all(|id| results.contains(&id))
        }
        _ => false,
    };
    if !goes_on {
        return Ok(None);
    }
    let text = then.unwrap_or_else(|| KEEP_ALIVE.to_owned());
    Ok(Some(
        state
            .engine
            .send_with(conversation, &text, None, options)
            .await?,
    ))
}

/// Runs the started run to its end, sending each Letta message to `tx`
/// (which may close early: the run goes on without a listener). Pings go
/// out every `ping` while nothing else does.
async fn pump(
    state: AppState,
    agent_id: String,
    started: Started,
    tx: mpsc::Sender<Value>,
    ping: Option<Duration>,
) {
    let Started {
        handle,
        mut follower,
        renderer,
        include,
        doc: _,
    } = started;
    let (Some(handle), Some(mut renderer)) = (handle, renderer) else {
        // The same answers were applied before: nothing runs.
        let stop = render::stop_reason(toolwire_core::StopReason::EndTurn);
        let _ = tx
            .send(json!({"message_type": "stop_reason", "stop_reason": stop}))
            .await;
        return;
    };
    let wanted = |m: &Value| {
        let kind = m.get("message_type").and_then(Value::as_str).unwrap_or("");
        matches!(
            kind,
            "stop_reason" | "usage_statistics" | "error_message" | "ping"
        ) || include.as_ref().is_none_or(|i| i.contains(kind))
    };
    let mut end: Option<RunEnd> = None;
    // The turn itself is watched too: should its last events never arrive
    // (the store failed), the response still ends.
    let mut turn = tokio::spawn(handle.wait());
    let mut outcome: Option<toolwire_engine::TurnOutcome> = None;
    let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let mut give_up_at = far;
    let mut ping_at = ping.map(|every| tokio::time::Instant::now() + every);
    while end.is_none() {
        tokio::select! {
            next = follower.next() => {
                let batch = match next {
                    Ok(Some(batch)) => batch,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "lost the run's events");
                        end = Some(RunEnd {
                            reason: toolwire_core::StopReason::Error,
                            error: Some(format!("the run's events could not be read: {e}")),
                        });
                        break;
                    }
                };
                for stored in batch {
                    let (messages, stop) = renderer.render(&stored.event);
                    for m in messages.into_iter().filter(|m| wanted(m)) {
                        // A closed channel: the client left; the run goes on.
                        let _ = tx.send(m).await;
                    }
                    if stop.is_some() {
                        end = stop;
                        break;
                    }
                }
                ping_at = ping.map(|every| tokio::time::Instant::now() + every);
            }
            joined = &mut turn, if outcome.is_none() => {
                outcome = Some(match joined {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        end = Some(RunEnd {
                            reason: toolwire_core::StopReason::Error,
                            error: Some(format!("the turn failed: {e}")),
                        });
                        break;
                    }
                });
                // Its stored events are in the log by now; a moment more
                // for them to come through, then the outcome says it.
                give_up_at = tokio::time::Instant::now() + Duration::from_secs(2);
            }
            _ = tokio::time::sleep_until(give_up_at) => break,
            _ = tokio::time::sleep_until(ping_at.unwrap_or(far)), if ping_at.is_some() => {
                let message = json!({
                    "message_type": "ping",
                    "id": format!("ping-{}", uuid::Uuid::now_v7()),
                    "date": chrono::Utc::now(),
                });
                if tx.send(message).await.is_err() {
                    return;
                }
                ping_at = ping.map(|every| tokio::time::Instant::now() + every);
            }
            _ = state.shutdown.cancelled() => {
                end = Some(RunEnd {
                    reason: toolwire_core::StopReason::Interrupted,
                    error: Some(
                        "interrupted by shutdown: the server stopped before the turn ended \
                         (its run finishes as interrupted)"
                            .into(),
                    ),
                });
                break;
            }
        }
    }
    let outcome = match outcome {
        Some(outcome) => outcome,
        None if state.shutdown.is_cancelled() => {
            for m in renderer.closing(
                end.as_ref().unwrap_or(&RunEnd {
                    reason: toolwire_core::StopReason::Error,
                    error: None,
                }),
                toolwire_core::Usage::default(),
            ) {
                let _ = tx.send(m).await;
            }
            return;
        }
        None => match turn.await {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::error!(error = %e, "the turn task failed");
                return;
            }
        },
    };
    let end = end.unwrap_or(RunEnd {
        reason: outcome.reason,
        error: outcome.error.clone(),
    });
    if end.reason == toolwire_core::StopReason::RequiresApproval {
        approvals::arm_timeout(&state, &agent_id);
    }
    for m in renderer.closing(&end, outcome.usage) {
        let _ = tx.send(m).await;
    }
}

/// `POST /v1/agents/{id}/messages`.
pub async fn create(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<MessageRequest>,
) -> ApiResult<Response> {
    if req.streaming.unwrap_or(false) {
        return stream_response(state, id, None, req).await;
    }
    respond_json(state, id, None, req).await
}

/// The JSON answer of a send: the run's messages, its stop reason and
/// usage, once it ends.
pub(crate) async fn respond_json(
    state: AppState,
    id: String,
    conversation: Option<ConversationId>,
    req: MessageRequest,
) -> ApiResult<Response> {
    let started = start(&state, &id, conversation, &req).await?;
    let (tx, mut rx) = mpsc::channel(1024);
    let pump = tokio::spawn(pump(state, id, started, tx, None));
    let mut messages = Vec::new();
    let mut stop = json!({"message_type": "stop_reason", "stop_reason": "end_turn"});
    let mut usage = json!({"message_type": "usage_statistics"});
    while let Some(m) = rx.recv().await {
        match m.get("message_type").and_then(Value::as_str) {
            Some("stop_reason") => stop = m,
            Some("usage_statistics") => usage = m,
            _ => messages.push(m),
        }
    }
    if let Err(e) = pump.await {
        return Err(ApiError::internal(format!(
            "the run's response failed: {e}"
        )));
    }
    Ok(Json(json!({"messages": messages, "stop_reason": stop, "usage": usage})).into_response())
}

/// `POST /v1/agents/{id}/messages/stream`.
pub async fn stream(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<MessageRequest>,
) -> ApiResult<Response> {
    stream_response(state, id, None, req).await
}

/// `POST /v1/agents/{id}/messages/async`: starts the run and answers at
/// once with it (Letta's `Run`); the run goes on without the request.
pub async fn create_async(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<MessageRequest>,
) -> ApiResult<Json<Value>> {
    let started = start(&state, &id, None, &req).await?;
    let Some(doc) = started.doc.clone() else {
        return Err(ApiError::conflict(
            "ALREADY_APPLIED",
            "these answers were applied before: no run started",
        ));
    };
    // Nobody listens: the pump only does what a run's end asks (arming an
    // approval timeout).
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    tokio::spawn(pump(state.clone(), id, started, tx, None));
    Ok(Json(runs::started_json(&state, &doc).await?))
}

pub(crate) async fn stream_response(
    state: AppState,
    id: String,
    conversation: Option<ConversationId>,
    req: MessageRequest,
) -> ApiResult<Response> {
    let started = start(&state, &id, conversation, &req).await?;
    let ping = req
        .include_pings
        .unwrap_or(false)
        .then_some(state.settings.ping_interval);
    if req.background.unwrap_or(false)
        && let Some(doc) = started.doc.clone()
    {
        // The stream is read from the stored events, as any later resume
        // reads it; the run's end is watched apart from it.
        let record = state.store().run(doc.run_id).await?;
        let include = started.include.clone();
        let rx = runs::replay(&state, record, Some(doc), 0, include, ping).await?;
        let (tx, dropped) = mpsc::channel(1);
        drop(dropped);
        tokio::spawn(pump(state, id, started, tx, None));
        return Ok(runs::sse(rx));
    }
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(pump(state, id, started, tx, ping));
    Ok(Sse::new(sse_events(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Each message as one `data:` event, then `[DONE]`.
fn sse_events(rx: mpsc::Receiver<Value>) -> impl Stream<Item = Result<Event, Infallible>> {
    let messages = futures::stream::unfold(rx, |mut rx| async move {
        let m = rx.recv().await?;
        Some((Ok(Event::default().data(m.to_string())), rx))
    });
    futures::StreamExt::chain(
        messages,
        futures::stream::once(async { Ok(Event::default().data("[DONE]")) }),
    )
}

/// `GET /v1/agents/{id}/messages`: the active branch as Letta's server
/// lists it (see [`PageQuery::history_page`]).
pub async fn list(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let agent = agents::load(&state, &id).await?;
    Ok(Json(
        history_page(&state, agent.conversation_id, &query).await?,
    ))
}

/// A page of `conversation`'s active branch in Letta's messages, user
/// messages with the `otid` their client gave.
pub(crate) async fn history_page(
    state: &AppState,
    conversation: toolwire_core::ConversationId,
    query: &PageQuery,
) -> ApiResult<Vec<Value>> {
    let leaf = state.store().conversation(conversation).await?.active_leaf;
    let path = state.store().path_to(leaf).await?;
    let pending = state.engine.pending_approval(conversation).await?;
    let resolved = state.engine.resolved_approvals(conversation).await?;
    let approvals = render::Approvals::new(pending.as_ref(), resolved);
    let all = render::history_of(&path, &approvals);
    let mut page = query.history_page(
        all,
        |m| m.get("id").and_then(Value::as_str).unwrap_or(""),
        100,
    )?;
    runs::client_otids(state, &mut page).await?;
    Ok(page)
}

#[derive(Debug, Default, Deserialize)]
pub struct CancelRequest {
    #[serde(default)]
    run_ids: Option<Vec<String>>,
}

/// `POST /v1/agents/{id}/messages/cancel`: stops the running turn, and
/// ends a pause (its calls answered as not run), so that an agent never
/// stays stuck.
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(body): Body<CancelRequest>,
) -> ApiResult<Json<Value>> {
    let agent = agents::load(&state, &id).await?;
    if let Some(run_ids) = body.run_ids.filter(|ids| !ids.is_empty()) {
        // Those runs only (each in its own conversation), if they run.
        let mut cancelled = Vec::new();
        for text in &run_ids {
            let run = runs::parse_run_id(text)?;
            let record = state.store().run(run).await?;
            if state.engine.cancel_run(record.conversation_id, run) {
                cancelled.push(render::run_id(run));
            }
        }
        tracing::info!(agent = %id, ?cancelled, "cancel runs");
        return Ok(Json(json!({
            "status": if cancelled.is_empty() { "nothing_to_cancel" } else { "cancelled" },
            "cancelled_run": !cancelled.is_empty(),
            "cancelled_runs": cancelled,
            "cleared_approval": false,
        })));
    }
    let conversation = agent.conversation_id;
    // Abandoning the pause starts a turn of the engine's own (a late
    // interjection may follow it): with the agent's options as they are now.
    refresh_options(&state, &agent).await?;
    let running = state.engine.cancel_anywhere(conversation).await?;
    let cleared = match state
        .engine
        .abandon_pending(conversation, "the user cancelled")
        .await
    {
        Ok(Some(handle)) => {
            handle.wait().await;
            true
        }
        Ok(None) => false,
        // A turn is running: the cancel above stops it.
        Err(toolwire_engine::EngineError::TurnInProgress(_)) => false,
        Err(e) => return Err(e.into()),
    };
    tracing::info!(agent = %id, running, cleared, "cancel");
    Ok(Json(json!({
        "status": if running || cleared { "cancelled" } else { "nothing_to_cancel" },
        "cancelled_run": running,
        "cleared_approval": cleared,
    })))
}
