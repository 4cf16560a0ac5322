//! Letta's runs (`/v1/runs`): a run is one turn of the engine. The store
//! keeps the run (its conversation, stop reason, times) and its events;
//! this door keeps beside it, as a record, what Letta says of a run and
//! the engine does not know: its agent, whether it was started in the
//! background, how its stream was rendered (so that a resumed stream
//! renders the same messages under the same `seq_id`s) and where in the
//! conversation's event log it begins.
//!
//! A run's stream is read from the persisted event log with a cursor (as
//! the live view's `?after=N`), never from the request that started the
//! run: it can be read again, resumed after any `seq_id`, from any
//! request, while the run goes on or after it ended.

use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolwire_core::{AgentEvent, ConversationId, Message, MessageId, RunId, StopReason, Usage};
use toolwire_engine::{Follower, RunRecords};
use toolwire_store::RunRecord;

use crate::agents;
use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Query};
use crate::letta::page::{Order, PageQuery};
use crate::letta::render::{self, LiveRenderer, RunEnd};
use crate::state::AppState;

/// The kind of a run's record (id: the run's UUID).
pub const KIND: &str = "letta_run";
/// The latest run of an agent (id: the agent's id): its `last_stop_reason`.
const LAST_RUN: &str = "letta_last_run";
/// The `otid` a client gave a user message (id: the message's UUID).
const OTID: &str = "letta_otid";
/// Events read per query when a run's events are gathered.
const PAGE: u32 = 1_000;
/// How long a run stream waits in silence before it looks at the run's
/// record (a run cut by a crash has no `stopped` event).
const QUIET_CHECK: Duration = Duration::from_secs(2);

/// What this door keeps of a run it started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunDoc {
    pub run_id: RunId,
    pub agent_id: String,
    pub conversation_id: ConversationId,
    /// Started with `background: true` (Letta lists and filters by it).
    #[serde(default)]
    pub background: bool,
    /// Whether its stream carries token pieces (`stream_tokens`).
    #[serde(default)]
    pub stream_tokens: bool,
    /// The tools whose calls waited when it started (how its streamed
    /// calls were named).
    #[serde(default)]
    pub gated: Vec<String>,
    /// The conversation's last event before the run: its events follow.
    #[serde(default)]
    pub after_seq: u64,
    /// The calls of the paused step the run goes on with (an answer's
    /// run): their results are sent together once all are in.
    #[serde(default)]
    pub expect: Vec<String>,
    pub created_at: DateTime<Utc>,
}

/// What [`record`] stores of `doc`'s run, for the engine to store in
/// the transaction that begins the run (whichever id it is given).
pub fn run_records(doc: RunDoc) -> RunRecords {
    RunRecords::new(move |run_id| {
        let doc = RunDoc {
            run_id,
            ..doc.clone()
        };
        match serde_json::to_value(&doc) {
            Ok(body) => vec![
                (KIND.to_owned(), run_id.to_string(), body),
                (
                    LAST_RUN.to_owned(),
                    doc.agent_id.clone(),
                    json!({"run_id": run_id}),
                ),
            ],
            Err(e) => {
                tracing::error!(run = %run_id, error = %e, "a run's record cannot be made");
                Vec::new()
            }
        }
    })
}

/// Keeps the `otid` a client gave the user message run `run` starts with,
/// once `follower` (subscribed before the run started) sees it stored.
pub fn remember_otid(state: &AppState, mut follower: Follower, run: RunId, otid: String) {
    let state = state.clone();
    tokio::spawn(async move {
        let wait = async {
            loop {
                let Ok(Some(batch)) = follower.next().await else {
                    return None;
                };
                for stored in batch {
                    match stored.event {
                        AgentEvent::TurnStarted {
                            run_id, message, ..
                        } if run_id == run => return Some(message.id),
                        AgentEvent::Stopped { run_id, .. } if run_id == run => return None,
                        _ => {}
                    }
                }
            }
        };
        let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(30), wait).await else {
            return;
        };
        if let Err(e) = state
            .engine
            .put_record(OTID, &message.to_string(), &json!({"otid": otid}))
            .await
        {
            tracing::warn!(error = %e, "keeping a message's otid");
        }
    });
}

/// Gives the user messages of `page` the `otid`s their clients sent.
pub async fn client_otids(state: &AppState, page: &mut [Value]) -> ApiResult<()> {
    for item in page.iter_mut() {
        if item["message_type"] != "user_message" {
            continue;
        }
        let Some(id) = item["id"].as_str().and_then(|s| s.strip_prefix("message-")) else {
            continue;
        };
        if let Some(doc) = state.store().document(OTID, id).await?
            && let Some(otid) = doc.body.get("otid")
        {
            item["otid"] = otid.clone();
        }
    }
    Ok(())
}

/// A run id from a path (`run-<uuid>`, or a bare UUID): anything else is
/// no run.
pub fn parse_run_id(text: &str) -> ApiResult<RunId> {
    let uuid = text.strip_prefix("run-").unwrap_or(text);
    uuid.parse()
        .map_err(|_| ApiError::not_found("run", &text.chars().take(64).collect::<String>()))
}

async fn doc(state: &AppState, run: RunId) -> ApiResult<Option<RunDoc>> {
    Ok(state
        .store()
        .document(KIND, &run.to_string())
        .await?
        .and_then(|d| serde_json::from_value(d.body).ok()))
}

/// The latest run this door started in `conversation`.
pub async fn latest_in(state: &AppState, conversation: ConversationId) -> ApiResult<Option<RunId>> {
    Ok(state
        .store()
        .documents(KIND)
        .await?
        .into_iter()
        .filter_map(|d| serde_json::from_value::<RunDoc>(d.body).ok())
        .filter(|d| d.conversation_id == conversation)
        .max_by_key(|d| d.created_at)
        .map(|d| d.run_id))
}

/// Letta's status of a run.
fn status(record: &RunRecord) -> &'static str {
    match record.stop_reason {
        None => "running",
        Some(StopReason::Cancelled) => "cancelled",
        Some(StopReason::Error | StopReason::LlmApiError | StopReason::Interrupted) => "failed",
        Some(
            StopReason::EndTurn
            | StopReason::MaxSteps
            | StopReason::BudgetExceeded
            | StopReason::RequiresApproval,
        ) => "completed",
    }
}

/// Letta's `conversation_id` of a run: `conv-…` for a conversation made
/// through Letta's conversations API, none for an agent's own.
async fn letta_conversation(
    state: &AppState,
    agent_id: Option<&str>,
    conversation: ConversationId,
) -> Option<String> {
    let agent = agents::load(state, agent_id?).await.ok()?;
    (agent.conversation_id != conversation).then(|| format!("conv-{conversation}"))
}

/// A run as Letta's `Run`.
async fn run_json(state: &AppState, record: &RunRecord, doc: Option<&RunDoc>) -> ApiResult<Value> {
    let agent_id = match doc {
        Some(doc) => Some(doc.agent_id.clone()),
        None => agents::agent_of(state, record.conversation_id)
            .await?
            .map(|a| a.id),
    };
    let conversation = letta_conversation(state, agent_id.as_deref(), record.conversation_id).await;
    let duration = record.finished_at.map(|end| {
        (end - record.started_at)
            .num_nanoseconds()
            .unwrap_or_default()
            .max(0)
    });
    Ok(json!({
        "id": render::run_id(record.id),
        "agent_id": agent_id.unwrap_or_default(),
        "conversation_id": conversation,
        "background": doc.is_some_and(|d| d.background),
        "status": status(record),
        "stop_reason": record.stop_reason.map(render::stop_reason),
        "created_at": record.started_at,
        "completed_at": record.finished_at,
        "total_duration_ns": duration,
        "metadata": record.error.as_ref().map(|e| json!({"error": e})),
    }))
}

/// The run just started as Letta's `Run` (what `…/messages/async` answers).
pub async fn started_json(state: &AppState, doc: &RunDoc) -> ApiResult<Value> {
    let record = state.store().run(doc.run_id).await?;
    run_json(state, &record, Some(doc)).await
}

/// `last_stop_reason` of an agent: its latest run's, while none runs.
pub async fn last_stop_reason(state: &AppState, agent_id: &str) -> ApiResult<Option<&'static str>> {
    let Some(last) = state.store().document(LAST_RUN, agent_id).await? else {
        return Ok(None);
    };
    let Some(run) = last
        .body
        .get("run_id")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<RunId>().ok())
    else {
        return Ok(None);
    };
    Ok(stored_run(state, run)
        .await?
        .and_then(|record| record.stop_reason.map(render::stop_reason)))
}

/// The agent's open pause as Letta's `pending_approval`: the
/// `approval_request_message` of the calls that wait, or null.
pub async fn pending_approval(state: &AppState, conversation: ConversationId) -> ApiResult<Value> {
    let Some(pending) = state.engine.pending_approval(conversation).await? else {
        return Ok(Value::Null);
    };
    let message = state.store().message(pending.message_id).await?;
    let approvals = render::Approvals::new(Some(&pending), Vec::new());
    Ok(render::history(&message, &approvals)
        .into_iter()
        .find(|m| m["message_type"] == "approval_request_message")
        .map(|mut m| {
            m["run_id"] = json!(render::run_id(pending.run_id));
            m
        })
        .unwrap_or(Value::Null))
}

/// The run, its record and what this door kept of it; 404 in Letta's
/// shape for an unknown one.
async fn load(state: &AppState, text: &str) -> ApiResult<(RunRecord, Option<RunDoc>)> {
    let run = parse_run_id(text)?;
    let record = state.store().run(run).await?;
    let doc = doc(state, run).await?;
    Ok((record, doc))
}

/// Where the run's events begin in its conversation's log.
async fn after_seq(state: &AppState, record: &RunRecord, doc: Option<&RunDoc>) -> ApiResult<u64> {
    if let Some(doc) = doc {
        return Ok(doc.after_seq);
    }
    let first = state
        .live
        .index
        .run_start(&state.engine, record.conversation_id, record.id)
        .await?;
    Ok(first.map_or(0, |seq| seq.saturating_sub(1)))
}

/// The run's stored events, in order, up to its `stopped`.
async fn events(
    state: &AppState,
    record: &RunRecord,
    doc: Option<&RunDoc>,
) -> ApiResult<Vec<AgentEvent>> {
    let mut after = after_seq(state, record, doc).await?;
    let mut out = Vec::new();
    loop {
        let page = state
            .engine
            .events_since(record.conversation_id, after, PAGE)
            .await?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        after = last.seq;
        for stored in page {
            if stored.event.run_id() != record.id {
                continue;
            }
            let stop = matches!(stored.event, AgentEvent::Stopped { .. });
            out.push(stored.event);
            if stop {
                return Ok(out);
            }
        }
    }
}

/// The messages a run stored, in order (its user message first).
fn run_messages(events: &[AgentEvent]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    let mut seen: HashSet<MessageId> = HashSet::new();
    for event in events {
        let message = match event {
            AgentEvent::TurnStarted { message, .. }
                if message.role == toolwire_core::Role::User =>
            {
                message
            }
            AgentEvent::AssistantMessageCreated { message, .. }
            | AgentEvent::ToolExecutionCompleted { message, .. }
            | AgentEvent::ToolExecutionFailed { message, .. }
            | AgentEvent::UserInterjection { message, .. } => message,
            _ => continue,
        };
        if seen.insert(message.id) {
            out.push(message.clone());
        }
    }
    out
}

#[derive(Debug, Default, Deserialize)]
pub struct RunsQuery {
    agent_id: Option<String>,
    background: Option<bool>,
    stop_reason: Option<String>,
    conversation_id: Option<String>,
    active: Option<bool>,
    ascending: Option<bool>,
    #[serde(flatten)]
    page: PageQuery,
}

/// `GET /v1/runs`: the runs this door started, newest first by default;
/// filtered by agent (`agent_id`, or `agent_ids` repeated), `statuses`
/// (repeated), `background`, `stop_reason`, `conversation_id`, `active`.
pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<RunsQuery>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Vec<Value>>> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(raw.as_deref().unwrap_or("")).unwrap_or_default();
    let repeated = |key: &str| -> HashSet<String> {
        pairs
            .iter()
            .filter(|(k, _)| k == key || k == &format!("{key}[]"))
            .map(|(_, v)| v.clone())
            .collect()
    };
    let mut agent_ids = repeated("agent_ids");
    agent_ids.extend(query.agent_id.clone());
    let mut statuses = repeated("statuses");
    if query.active == Some(true) && statuses.is_empty() {
        statuses.extend(["created".to_owned(), "running".to_owned()]);
    }
    let conversation = query
        .conversation_id
        .as_deref()
        .map(|c| c.strip_prefix("conv-").unwrap_or(c).to_owned());
    // The records' own fields filter first; a run's stored record is read
    // only where a filter needs it (its status, its stop reason) and for
    // the runs the page shows, so a page costs what it shows, not every
    // run ever started.
    let by_record = !statuses.is_empty() || query.stop_reason.is_some();
    let mut runs = Vec::new();
    for stored in state.store().documents(KIND).await? {
        let Ok(doc) = serde_json::from_value::<RunDoc>(stored.body) else {
            continue;
        };
        if !agent_ids.is_empty() && !agent_ids.contains(&doc.agent_id) {
            continue;
        }
        if query.background.is_some_and(|b| b != doc.background) {
            continue;
        }
        if conversation
            .as_deref()
            .is_some_and(|c| c != doc.conversation_id.to_string())
        {
            continue;
        }
        let record = if by_record {
            let Some(record) = stored_run(&state, doc.run_id).await? else {
                continue;
            };
            if !statuses.is_empty() && !statuses.contains(status(&record)) {
                continue;
            }
            if let Some(want) = &query.stop_reason
                && record.stop_reason.map(render::stop_reason) != Some(want.as_str())
            {
                continue;
            }
            Some(record)
        } else {
            None
        };
        runs.push((render::run_id(doc.run_id), doc, record));
    }
    let default = if query.ascending == Some(true) {
        Order::Asc
    } else {
        Order::Desc
    };
    let page = query.page.page(runs, |(id, _, _)| id, default, 100)?;
    let mut shown = Vec::with_capacity(page.len());
    for (_, doc, record) in page {
        let record = match record {
            Some(record) => record,
            None => match stored_run(&state, doc.run_id).await? {
                Some(record) => record,
                None => continue,
            },
        };
        shown.push(run_json(&state, &record, Some(&doc)).await?);
    }
    Ok(Json(shown))
}

/// Run `id`'s stored record; `None` when the store has none.
async fn stored_run(state: &AppState, id: RunId) -> ApiResult<Option<RunRecord>> {
    match state.store().run(id).await {
        Ok(record) => Ok(Some(record)),
        Err(toolwire_store::StoreError::RunNotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `GET /v1/runs/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let (record, doc) = load(&state, &id).await?;
    Ok(Json(run_json(&state, &record, doc.as_ref()).await?))
}

/// `GET /v1/runs/{id}/messages`: what the run stored, as Letta messages,
/// oldest first by default.
pub async fn messages(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let (record, doc) = load(&state, &id).await?;
    let events = events(&state, &record, doc.as_ref()).await?;
    let conversation = record.conversation_id;
    let pending = state.engine.pending_approval(conversation).await?;
    let resolved = state.engine.resolved_approvals(conversation).await?;
    let approvals = render::Approvals::new(pending.as_ref(), resolved);
    let mut items = render::history_of(&run_messages(&events), &approvals);
    for item in &mut items {
        item["run_id"] = json!(render::run_id(record.id));
    }
    let mut page = query.page(
        items,
        |m| m.get("id").and_then(Value::as_str).unwrap_or(""),
        Order::Asc,
        100,
    )?;
    client_otids(&state, &mut page).await?;
    Ok(Json(page))
}

/// The run's usage: its final response's, else the sum of its steps'.
fn usage_of(events: &[AgentEvent]) -> (Usage, u32) {
    let mut sum = Usage::default();
    let mut steps = 0;
    let mut last = None;
    for event in events {
        match event {
            AgentEvent::AssistantMessageCreated { message, .. } => {
                steps += 1;
                if let Some(u) = message.usage {
                    sum.prompt_tokens += u.prompt_tokens;
                    sum.completion_tokens += u.completion_tokens;
                    sum.cached_tokens += u.cached_tokens;
                    sum.cache_write_tokens += u.cache_write_tokens;
                }
            }
            AgentEvent::FinalResponse { usage, .. } => last = Some(*usage),
            _ => {}
        }
    }
    (last.unwrap_or(sum), steps)
}

/// `GET /v1/runs/{id}/usage`.
pub async fn usage(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let (record, doc) = load(&state, &id).await?;
    let events = events(&state, &record, doc.as_ref()).await?;
    let (usage, _) = usage_of(&events);
    Ok(Json(json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "cache_read_tokens": usage.cached_tokens,
        "cache_creation_tokens": usage.cache_write_tokens,
    })))
}

/// `GET /v1/runs/{id}/steps`: one step per model call (the assistant
/// message it stored), newest first by default.
pub async fn steps(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let (record, doc) = load(&state, &id).await?;
    let events = events(&state, &record, doc.as_ref()).await?;
    let agent_id = match &doc {
        Some(doc) => Some(doc.agent_id.clone()),
        None => agents::agent_of(&state, record.conversation_id)
            .await?
            .map(|a| a.id),
    };
    let steps: Vec<Value> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::AssistantMessageCreated { message, .. } => Some(message),
            _ => None,
        })
        .map(|m| {
            let usage = m.usage.unwrap_or_default();
            json!({
                "id": render::step_id(m.id),
                "run_id": render::run_id(record.id),
                "agent_id": agent_id,
                "model": m.model,
                "status": if m.status == toolwire_core::MessageStatus::Complete { "success" } else { "failed" },
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "cached_input_tokens": usage.cached_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
                "messages": [],
            })
        })
        .collect();
    let page = query.page(
        steps,
        |s| s.get("id").and_then(Value::as_str).unwrap_or(""),
        Order::Desc,
        100,
    )?;
    Ok(Json(page))
}

/// The body (POST, as Letta's SDKs send it) or query (GET) of a run
/// stream.
#[derive(Debug, Default, Deserialize)]
pub struct StreamRequest {
    /// Resume after this `seq_id` (0 or none: from the start).
    starting_after: Option<u64>,
    include_pings: Option<bool>,
    /// Accepted for Letta's SDKs; the stream is pushed as it is stored.
    #[allow(dead_code)]
    poll_interval: Option<f64>,
    #[allow(dead_code)]
    batch_size: Option<u64>,
}

/// `POST /v1/runs/{id}/stream` (Letta's SDKs) and `GET` (a browser's
/// `EventSource`): the run's messages, each with its `seq_id`, from just
/// after `starting_after`, live until the run ends, then `[DONE]`.
pub async fn stream_post(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Body(req): Body<StreamRequest>,
) -> ApiResult<Response> {
    stream_response(state, &id, req).await
}

/// `GET /v1/runs/{id}/stream?starting_after=N`.
pub async fn stream_get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(req): Query<StreamRequest>,
) -> ApiResult<Response> {
    stream_response(state, &id, req).await
}

async fn stream_response(state: AppState, id: &str, req: StreamRequest) -> ApiResult<Response> {
    stream_of(state, parse_run_id(id)?, req).await
}

/// The stream of run `run` (see [`replay`]).
pub async fn stream_of(state: AppState, run: RunId, req: StreamRequest) -> ApiResult<Response> {
    let record = state.store().run(run).await?;
    let doc = doc(&state, run).await?;
    let ping = req
        .include_pings
        .unwrap_or(false)
        .then_some(state.settings.ping_interval);
    let rx = replay(
        &state,
        record,
        doc,
        req.starting_after.unwrap_or(0),
        None,
        ping,
    )
    .await?;
    Ok(sse(rx))
}

/// The SSE response of a run stream.
pub fn sse(rx: mpsc::Receiver<Value>) -> Response {
    Sse::new(sse_events(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

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

/// Renders run `record`'s events from the log (then live) as its stream:
/// every message numbered (`seq_id` 1, 2, …, the same each time the run
/// is read), those after `starting_after` sent to the receiver (only the
/// types in `include`, when given), until the run's stop reason and
/// usage. A run that has ended with nothing after `starting_after` gives
/// an empty stream.
pub async fn replay(
    state: &AppState,
    record: RunRecord,
    doc: Option<RunDoc>,
    starting_after: u64,
    include: Option<HashSet<String>>,
    ping: Option<Duration>,
) -> ApiResult<mpsc::Receiver<Value>> {
    let after = after_seq(state, &record, doc.as_ref()).await?;
    let (stream_tokens, gated) = match &doc {
        Some(doc) => (doc.stream_tokens, doc.gated.iter().cloned().collect()),
        None => (false, HashSet::new()),
    };
    let follower = state.engine.follow_after(record.conversation_id, after);
    let mut renderer = LiveRenderer::new(record.id, stream_tokens, gated);
    if let Some(doc) = &doc {
        renderer.expect_calls(doc.expect.iter().cloned());
    }
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(pump_log(
        state.clone(),
        record.id,
        follower,
        renderer,
        Numbered {
            tx,
            n: 0,
            starting_after,
            include,
        },
        ping,
    ));
    Ok(rx)
}

/// Numbers a run's messages and sends those asked for.
struct Numbered {
    tx: mpsc::Sender<Value>,
    n: u64,
    starting_after: u64,
    include: Option<HashSet<String>>,
}

impl Numbered {
    /// Sends `m` if it is past the cursor; false once the client left.
    async fn send(&mut self, mut m: Value) -> bool {
        self.n += 1;
        if self.n <= self.starting_after {
            return true;
        }
        let kind = m["message_type"].as_str().unwrap_or("");
        let wanted = matches!(kind, "stop_reason" | "usage_statistics" | "error_message")
            || self.include.as_ref().is_none_or(|i| i.contains(kind));
        if !wanted {
            return true;
        }
        m["seq_id"] = json!(self.n);
        self.tx.send(m).await.is_ok()
    }
}

async fn pump_log(
    state: AppState,
    run: RunId,
    mut follower: Follower,
    mut renderer: LiveRenderer,
    mut out: Numbered,
    ping: Option<Duration>,
) {
    let mut end: Option<RunEnd> = None;
    let mut ping_at = ping.map(|every| tokio::time::Instant::now() + every);
    let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
    'read: while end.is_none() {
        tokio::select! {
            next = follower.next() => {
                let batch = match next {
                    Ok(Some(batch)) => batch,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "reading a run's events");
                        end = Some(RunEnd {
                            reason: StopReason::Error,
                            error: Some(format!("the run's events could not be read: {e}")),
                        });
                        break;
                    }
                };
                for stored in batch {
                    let (messages, stop) = renderer.render(&stored.event);
                    for m in messages {
                        if !out.send(m).await {
                            return;
                        }
                    }
                    if stop.is_some() {
                        end = stop;
                        break 'read;
                    }
                }
            }
            _ = tokio::time::sleep(QUIET_CHECK) => {
                // Nothing for a while: a run that ended without its
                // `stopped` (cut by a crash) ends its stream here.
                match state.store().run(run).await {
                    Ok(record) if record.stop_reason.is_some() => {
                        // Its last events may still be on their way.
                        if let Ok(Ok(Some(batch))) = tokio::time::timeout(Duration::from_millis(200), follower.next()).await {
                            for stored in batch {
                                let (messages, stop) = renderer.render(&stored.event);
                                for m in messages {
                                    if !out.send(m).await {
                                        return;
                                    }
                                }
                                if stop.is_some() {
                                    end = stop;
                                    break 'read;
                                }
                            }
                            continue;
                        }
                        end = Some(RunEnd {
                            reason: record.stop_reason.unwrap_or(StopReason::Error),
                            error: record.error,
                        });
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "reading a run's record");
                    }
                }
            }
            _ = tokio::time::sleep_until(ping_at.unwrap_or(far)), if ping_at.is_some() => {
                let message = json!({
                    "message_type": "ping",
                    "id": format!("ping-{}", uuid::Uuid::now_v7()),
                    "date": Utc::now(),
                });
                // Pings are not numbered: they are not part of the run.
                if out.tx.send(message).await.is_err() {
                    return;
                }
                ping_at = ping.map(|every| tokio::time::Instant::now() + every);
            }
            _ = state.shutdown.cancelled() => return,
        }
    }
    let end = end.unwrap_or(RunEnd {
        reason: StopReason::Error,
        error: Some("the run's events ended early".into()),
    });
    for m in renderer.closing(&end, Usage::default()) {
        if !out.send(m).await {
            return;
        }
    }
}

/// `POST /v1/runs/{id}/cancel`: stops run `id`
/// if it is the one running in its conversation (a run that ended is left
/// as it ended).
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let (record, doc) = load(&state, &id).await?;
    let cancelled =
        record.stop_reason.is_none() && state.engine.cancel_run(record.conversation_id, record.id);
    let record = state.store().run(record.id).await?;
    let mut run = run_json(&state, &record, doc.as_ref()).await?;
    run["cancelled"] = json!(cancelled);
    Ok(Json(run))
}

/// The `/v1/runs` routes.
pub fn routes() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/runs", get(list))
        .route("/v1/runs/{id}", get(retrieve))
        .route("/v1/runs/{id}/messages", get(messages))
        .route("/v1/runs/{id}/usage", get(usage))
        .route("/v1/runs/{id}/steps", get(steps))
        .route("/v1/runs/{id}/stream", get(stream_get).post(stream_post))
        .route("/v1/runs/{id}/cancel", post(cancel))
}
