//! One `session/prompt`: a turn of the engine, its events sent to the
//! client as `session/update` notifications.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    self as acp, ContentChunk, PromptResponse, SessionId, SessionNotification, SessionUpdate,
};
use toolwire_core::tool_events::result_text_with_images;
use toolwire_core::{
    AgentEvent, ContentBlock, ConversationId, GatedCall, Message, OUTPUT_LIMIT, OutputTail, Role,
    RunId, StopReason, ToolCallContent, ToolCallId, ToolCallStatus,
};
use toolwire_engine::{Engine, EngineError, Responded};
use toolwire_tools::builtin::UPDATE_PLAN;

use crate::errors::{internal, invalid_params};
use crate::permissions::ask;
use crate::state::{AbortOnDrop, Session, Tally};
use crate::updates::{Updates, add_metrics};
use crate::usage::{self, Meter};
use crate::views::Views;
use crate::{convert, sessions, titles, views};
use toolwire_store::{Blob, StoredEvent};

/// How a prompt's turn starts.
pub(crate) enum Start {
    /// A user message of this content.
    Send(Vec<ContentBlock>),
    /// A turn the engine started itself (a waking notification), shown
    /// from the event after its start (`after`, its store sequence).
    Woken { run: RunId, after: u64 },
}

/// The turn a prompt follows: one it started (its handle says how it
/// ended), or one the engine started (its `Stopped` event says), or one
/// the engine started that is already paused for answers nobody was asked
/// for.
enum Following {
    Handle(toolwire_engine::TurnHandle),
    Run(RunId),
    Paused(RunId),
}

impl Following {
    fn run_id(&self) -> RunId {
        match self {
            Following::Handle(handle) => handle.run_id,
            Following::Run(run) | Following::Paused(run) => *run,
        }
    }

    /// How the turn ended: `stopped` is its `Stopped` event, if seen.
    async fn ended(
        self,
        stopped: Option<(StopReason, Option<String>)>,
    ) -> (StopReason, Option<String>) {
        match (self, stopped) {
            (Following::Handle(handle), _) => {
                let outcome = handle.wait().await;
                (outcome.reason, outcome.error)
            }
            (Following::Run(_) | Following::Paused(_), Some(stopped)) => stopped,
            (Following::Run(run) | Following::Paused(run), None) => (
                StopReason::Error,
                Some(format!("the events of turn {run} ended before it did")),
            ),
        }
    }
}

/// What sending a prompt's message came to.
enum Sent {
    /// The turn it started, to follow.
    Turn(Following),
    /// No turn: the prompt is answered so (cancelled while a turn the
    /// engine started itself was shown first).
    Answered(PromptResponse),
}

/// How often a prompt that found a turn the engine started itself sends
/// again after following it (another may start right after it).
const SEND_ATTEMPTS: usize = 4;

/// Runs the prompt's turn to its end and says how the prompt is answered.
/// A turn that pauses for approval asks the client about each waiting
/// call and goes on with the answers, as often as it pauses. The first
/// prompt of a session titles it (`text`, its words).
pub(crate) async fn run_prompt(
    engine: &Engine,
    session: &Session,
    session_id: SessionId,
    start: Start,
    text: &str,
    cx: &ConnectionTo<Client>,
) -> Result<PromptResponse, agent_client_protocol::Error> {
    let conversation = session.conversation;
    // Follow before the turn starts, so that nothing is missed.
    let mut follower = match &start {
        Start::Woken { after, .. } => engine.follow_after(conversation, *after),
        _ => engine.follow(conversation),
    };
    let mut tally = tally(engine, session).await;
    if !tally.titled
        && let Some(title) = sessions::title_of(text)
    {
        cx.send_notification(SessionNotification::new(
            session_id.clone(),
            SessionUpdate::SessionInfoUpdate(acp::SessionInfoUpdate::new().title(title)),
        ))?;
        tally.titled = true;
        set_tally(session, tally);
    }
    // The follower runs in its own task and hands batches over a channel,
    // so that waiting for the next batch can race the coalescing timer
    // without losing events (an mpsc receive can be abandoned safely). The
    // channel is bounded: while the editor reads slowly the follower waits,
    // falls behind the live events and catches up from the store, instead
    // of batches piling up here.
    let (batches_tx, mut batches) = tokio::sync::mpsc::channel(FOLLOW_BATCHES);
    let forward = tokio::spawn(async move {
        loop {
            match follower.next().await {
                Ok(Some(batch)) => {
                    if batches_tx.send(batch).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "following the turn's events");
                    return;
                }
            }
        }
    });
    let _stop_forwarding = AbortOnDrop(forward);
    let mut meter = Meter::new(engine, session.model().as_deref(), tally.spent);
    let mut updates = Updates::new(session_id.clone(), session, cx).metered(&mut meter);
    let mut showing = Showing {
        engine,
        session,
        session_id: &session_id,
        cx,
        updates: &mut updates,
        batches: &mut batches,
        unread: None,
    };
    let started = match start {
        Start::Woken { run, .. } => Ok(Sent::Turn(Following::Run(run))),
        Start::Send(content) => showing.send(content).await,
    };
    let result = match started {
        Ok(Sent::Answered(answered)) => Ok(answered),
        Ok(Sent::Turn(following)) => {
            // A cancel that came before the turn started found nothing to
            // stop.
            if session.cancelled.load(Ordering::SeqCst) {
                engine.cancel(conversation);
            }
            showing.drive(following).await
        }
        Err(e) => Err(e),
    };
    // Whatever waits goes out before the prompt is answered. A turn cut
    // short (cancelled, failed, out of steps) can leave calls announced
    // that never ran: they end as failed rather than pending forever. (A
    // turn that ended normally ran every call; one whose events were not
    // all followed would be misreported, so it is left alone.)
    let why = match &result {
        Ok(response) if response.stop_reason == acp::StopReason::EndTurn => None,
        Ok(response) if response.stop_reason == acp::StopReason::Cancelled => Some("cancelled"),
        _ => Some("the turn ended before this call finished"),
    };
    let now = Instant::now();
    let ended = match why {
        Some(why) => updates.end_open_calls(why, now),
        None => Ok(()),
    };
    let flushed = ended.and_then(|()| updates.flush_all(now));
    // Diffs of edits no final update took (a turn the engine started
    // itself, calls not followed to their end) are not kept.
    session.diffs.clear();
    if let Ok(mut total) = session.metrics.lock() {
        add_metrics(&mut total, &updates.metrics());
    }
    tracing::debug!(session = %session_id.0, "{}", crate::updates::session_metrics_line(&updates.metrics()));
    let views = updates.take_views();
    drop(updates);
    views::save(engine, conversation, views).await;
    set_tally(
        session,
        Tally {
            spent: meter.spent(),
            ..tally
        },
    );
    flushed?;
    result.map(|response| response.usage(meter.turn_usage()))
}

/// What the session's history says, read once while it is open.
async fn tally(engine: &Engine, session: &Session) -> Tally {
    if let Some(tally) = session.tally.lock().ok().and_then(|t| *t) {
        return tally;
    }
    let store = engine.store();
    let history = match store.conversation(session.conversation).await {
        Ok(c) => store.path_to(c.active_leaf).await,
        Err(e) => Err(e),
    };
    match history {
        Ok(history) => Tally {
            spent: usage::Spent::of(&history),
            titled: usage::has_user_message(&history),
        },
        Err(e) => {
            tracing::warn!(session = %session.conversation, error = %e, "reading the session's history for its usage");
            Tally {
                spent: usage::Spent::default(),
                titled: true,
            }
        }
    }
}

fn set_tally(session: &Session, tally: Tally) {
    if let Ok(mut t) = session.tally.lock() {
        *t = Some(tally);
    }
}

type Batches = tokio::sync::mpsc::Receiver<Vec<StoredEvent>>;

/// Batches of events waiting for the editor: enough to ride out a pause in
/// its reading; beyond it, the store holds them.
const FOLLOW_BATCHES: usize = 64;

/// A prompt's turns as they are shown: the engine and the session, the
/// editor, the updates it is sent and the events read for it.
struct Showing<'a, 'u> {
    engine: &'a Engine,
    session: &'a Session,
    session_id: &'a SessionId,
    cx: &'a ConnectionTo<Client>,
    updates: &'a mut Updates<'u>,
    batches: &'a mut Batches,
    /// Events read and not shown yet: the rest of a batch in which the
    /// turn to follow next started.
    unread: Option<Vec<StoredEvent>>,
}

impl Showing<'_, '_> {
    /// The next batch of events, the coalescing timer served while it
    /// waits; `None` once the events end.
    async fn next_batch(
        &mut self,
    ) -> Result<Option<Vec<StoredEvent>>, agent_client_protocol::Error> {
        if let Some(unread) = self.unread.take() {
            return Ok(Some(unread));
        }
        loop {
            let deadline = self.updates.next_deadline();
            tokio::select! {
                batch = self.batches.recv() => return Ok(batch),
                () = sleep_until(deadline) => self.updates.tick(Instant::now())?,
            }
        }
    }

    /// The next batch of events for `following`. A turn the engine
    /// started may have sent its `Stopped` before this prompt followed the
    /// conversation (found running just as it ended): once the store has
    /// it ended and nothing came for two polls, its end is taken from
    /// there.
    async fn next_for(
        &mut self,
        following: &Following,
    ) -> Result<Next, agent_client_protocol::Error> {
        let run = match following {
            Following::Handle(_) => {
                return Ok(self.next_batch().await?.map_or(Next::Over, Next::Batch));
            }
            Following::Paused(_) => return Ok(Next::Ended(StopReason::RequiresApproval, None)),
            Following::Run(run) => run,
        };
        let engine = self.engine;
        let mut ended_polls = 0;
        loop {
            tokio::select! {
                batch = self.next_batch() => {
                    return Ok(batch?.map_or(Next::Over, Next::Batch));
                }
                () = tokio::time::sleep(RUN_POLL) => {
                    match engine.store().run(*run).await {
                        Ok(record) => {
                            if let Some(reason) = record.stop_reason {
                                ended_polls += 1;
                                if ended_polls == 2 {
                                    return Ok(Next::Ended(reason, record.error));
                                }
                            }
                        }
                        Err(e) => tracing::debug!(%run, error = %e, "reading a followed run"),
                    }
                }
            }
        }
    }

    /// Notes that the prompt went past `stored` (the woken-turn follower
    /// leaves it alone).
    fn went_past(&self, stored: &StoredEvent) {
        self.session
            .shown_through
            .fetch_max(stored.seq, Ordering::SeqCst);
    }

    /// The turn loop of [`run_prompt`]: events to updates, pauses to
    /// permission requests, to the turn's end.
    async fn drive(
        &mut self,
        mut following: Following,
    ) -> Result<PromptResponse, agent_client_protocol::Error> {
        let Showing {
            engine,
            session,
            session_id,
            cx,
            ..
        } = *self;
        let conversation = session.conversation;
        loop {
            let run_id = following.run_id();
            let mut gated: Option<Vec<GatedCall>> = None;
            let mut stopped = None;
            'events: loop {
                let batch = match self.next_for(&following).await? {
                    Next::Batch(batch) => batch,
                    Next::Ended(reason, error) => {
                        stopped = Some((reason, error));
                        break 'events;
                    }
                    Next::Over => break 'events,
                };
                let mut events = batch.into_iter();
                while let Some(stored) = events.next() {
                    self.went_past(&stored);
                    if stored.event.run_id() != run_id {
                        continue;
                    }
                    if let AgentEvent::Stopped { reason, error, .. } = &stored.event {
                        stopped = Some((*reason, error.clone()));
                        // What came after it (the next turn's start) is
                        // read next.
                        let rest: Vec<_> = events.collect();
                        if !rest.is_empty() {
                            self.unread = Some(rest);
                        }
                        break 'events;
                    }
                    if let AgentEvent::ApprovalRequested { calls, .. } = &stored.event {
                        gated = Some(calls.clone());
                    }
                    self.updates.event(&stored.event)?;
                }
            }
            let engine_turn = !matches!(following, Following::Handle(_));
            let (reason, error) = following.ended(stopped).await;
            if engine_turn {
                // Its end is known from its events: the engine may still
                // be handing the conversation to the turn late words start.
                settle(engine, conversation, run_id).await;
            }
            let cancelled = || session.cancelled.load(Ordering::SeqCst);
            if reason == StopReason::RequiresApproval && !cancelled() {
                // Still waiting for answers: a pause answered or ended
                // meanwhile (a cancel while another prompt asked) is not
                // asked about again.
                let calls = match engine
                    .pending_approval(conversation)
                    .await
                    .map_err(internal)?
                {
                    Some(pending) if pending.run_id == run_id => gated.unwrap_or(pending.calls),
                    _ => return Ok(PromptResponse::new(acp::StopReason::EndTurn)),
                };
                let decisions =
                    match ask(engine, session, session_id, cx, &calls, self.updates).await {
                        Ok(decisions) => decisions,
                        Err(e) => {
                            // The editor could not be asked: the conversation must
                            // not stay paused, or every later prompt is refused.
                            abandon_pending(engine, conversation, "the editor could not be asked")
                                .await;
                            return Err(e);
                        }
                    };
                if !cancelled() {
                    match engine
                        .respond(conversation, decisions, None, session.turn_options())
                        .await
                        .map_err(internal)?
                    {
                        Responded::Started(next) => {
                            following = Following::Handle(next);
                            hand_over_late_words(engine, session).await;
                            continue;
                        }
                        Responded::AlreadyApplied => {
                            return Ok(PromptResponse::new(acp::StopReason::EndTurn));
                        }
                    }
                }
            }
            if cancelled() {
                if reason == StopReason::RequiresApproval {
                    abandon_pending(engine, conversation, "cancelled").await;
                }
                // Words that came before the cancel start nothing.
                session.interjected.store(0, Ordering::SeqCst);
                return Ok(PromptResponse::new(acp::StopReason::Cancelled));
            }
            // Words interjected too late for this turn start the next one
            // (however it ended, unless cancelled): the prompt shows it as
            // its own (asking about its calls), so its editor sees the
            // answer, and is answered as that turn ends. A failure of
            // this turn is shown as the prompt's words first.
            if reason != StopReason::Cancelled
                && session.interjected.swap(0, Ordering::SeqCst) > 0
                && let Some(next) = self.handover(run_id).await?
            {
                let now = Instant::now();
                if reason != StopReason::EndTurn {
                    self.updates
                        .end_open_calls("the turn ended before this call finished", now)?;
                }
                // A failure (the reasons that answer a prompt with an
                // error).
                if convert::stop_reason(reason).is_none() {
                    let failed = format!("The turn failed: {}\n\n", error.unwrap_or_default());
                    self.updates.say(&failed, now)?;
                }
                following = Following::Run(next);
                continue;
            }
            return match convert::stop_reason(reason) {
                Some(reason) => Ok(PromptResponse::new(reason)),
                None => Err(internal(format!(
                    "the turn stopped with {}: {}",
                    reason.as_str(),
                    error.unwrap_or_default()
                ))),
            };
        }
    }

    /// Sends the prompt's user message and returns the turn it starts, or how
    /// the prompt is answered without one. A turn the engine started itself
    /// (a waking notification that came just before) is shown to its end
    /// first, asked about as the prompt's own would be; then the message goes.
    async fn send(
        &mut self,
        content: Vec<ContentBlock>,
    ) -> Result<Sent, agent_client_protocol::Error> {
        let (engine, conversation) = (self.engine, self.session.conversation);
        let mut attempts = 0;
        loop {
            // A turn the engine started that paused for answers while
            // prompts waited for the session (so nobody was asked): asked
            // about now, and followed to its end.
            if let Ok(Some(paused)) = engine.pending_approval(conversation).await
                && engine.started_itself(paused.run_id)
                && attempts < SEND_ATTEMPTS
            {
                attempts += 1;
                tracing::info!(%conversation, "a turn the engine started itself waits for answers: asked before the prompt's");
                let shown = self.drive(Following::Paused(paused.run_id)).await?;
                if shown.stop_reason == acp::StopReason::Cancelled {
                    return Ok(Sent::Answered(shown));
                }
            }
            // A turn paused for answers no prompt is asking for (one whose
            // editor went away while asking) would refuse this prompt: its
            // calls are not run, and the model is told.
            abandon_pending(
                engine,
                conversation,
                "no one answered: a new prompt came first",
            )
            .await;
            let error = match engine
                .send_content_with(
                    conversation,
                    content.clone(),
                    None,
                    self.session.turn_options(),
                )
                .await
            {
                Ok(handle) => return Ok(Sent::Turn(Following::Handle(handle))),
                Err(e) => e,
            };
            match error {
                EngineError::TurnInProgress(_) if attempts < SEND_ATTEMPTS => {
                    attempts += 1;
                    match engine.running_run(conversation) {
                        Some(run) => {
                            tracing::info!(%conversation, "a turn the engine started itself runs: shown before the prompt's");
                            let shown = self.drive(Following::Run(run)).await?;
                            if shown.stop_reason == acp::StopReason::Cancelled {
                                return Ok(Sent::Answered(shown));
                            }
                        }
                        // Run by another instance, or just ended.
                        None => tokio::time::sleep(SEND_RETRY).await,
                    }
                }
                e @ (EngineError::TurnInProgress(_) | EngineError::ApprovalPending { .. }) => {
                    return Err(invalid_params(e.to_string()));
                }
                e => return Err(internal(e)),
            }
        }
    }

    /// The turn that words interjected too late for turn `ended` started,
    /// its events from its start left for [`drive`](Self::drive) to show;
    /// `None` when no such turn comes (the engine is idle) or the events
    /// end.
    async fn handover(
        &mut self,
        ended: RunId,
    ) -> Result<Option<RunId>, agent_client_protocol::Error> {
        let (engine, session) = (self.engine, self.session);
        loop {
            let batch = tokio::select! {
                batch = self.next_batch() => batch?,
                () = tokio::time::sleep(HANDOVER_POLL) => {
                    if engine.is_running(session.conversation) {
                        continue;
                    }
                    return Ok(None);
                }
            };
            let Some(mut batch) = batch else {
                return Ok(None);
            };
            let start = batch.iter().position(|stored| {
                stored.event.run_id() != ended
                    && matches!(stored.event, AgentEvent::TurnStarted { .. })
            });
            if let Some(start) = start {
                let run = batch[start].event.run_id();
                self.unread = Some(batch.split_off(start));
                return Ok(Some(run));
            }
            if let Some(last) = batch.last() {
                self.went_past(last);
            }
        }
    }
}

/// Waits (a moment at most) until the engine no longer runs `run` in
/// `conversation`: past its `Stopped`, it hands the conversation to the
/// turn words too late for it start, and a prompt that looked for that
/// turn before would miss it. (A turn followed by its handle is waited
/// for through it.)
async fn settle(engine: &Engine, conversation: ConversationId, run: RunId) {
    for _ in 0..SETTLE_POLLS {
        if engine.running_run(conversation) != Some(run) {
            return;
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
    tracing::debug!(%conversation, %run, "a turn past its end still runs");
}

const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(10);
const SETTLE_POLLS: usize = 200;

/// What a prompt reads next of the turn it follows.
enum Next {
    Batch(Vec<StoredEvent>),
    /// The turn's end, from the store.
    Ended(StopReason, Option<String>),
    /// The events ended.
    Over,
}

/// How often a prompt following a turn the engine started looks in the
/// store whether it ended, while no event comes.
const RUN_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a prompt waits to send again when another instance runs the
/// conversation's turn.
const SEND_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Gives the turn that just went on after a permission answer the words
/// interjected while it waited (read after the calls it runs, as a user
/// message); words it was too late for start the next turn, which the
/// prompt follows as for any late interjection. Words the engine refuses
/// stay kept: their own prompt runs them once this one ends.
async fn hand_over_late_words(engine: &Engine, session: &Session) {
    for (ticket, words) in session.late_words.take_all() {
        match engine.interject(session.conversation, &words).await {
            Ok(_) => {
                session.interjected.fetch_add(1, Ordering::SeqCst);
            }
            // Kept: their prompt runs them on its own once this one ends.
            Err(e) => {
                tracing::warn!(conversation = %session.conversation, error = %e, "interjected words not handed over");
                session.late_words.put_back(ticket, words);
            }
        }
    }
}

/// How often a prompt waiting for the turn its interjection starts looks
/// whether the engine still runs one.
const HANDOVER_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Ends the conversation's paused turn, if one waits for answers: its
/// calls are recorded as not run, with `why`, and the conversation takes
/// prompts again.
pub(crate) async fn abandon_pending(engine: &Engine, conversation: ConversationId, why: &str) {
    match engine.abandon_pending(conversation, why).await {
        Ok(Some(abandoned)) => {
            tracing::info!(%conversation, why, "calls waiting for an answer were not run");
            abandoned.wait().await;
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(%conversation, error = %e, "ending the paused turn"),
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The session updates that show `messages` (a conversation's active
/// branch) again, for `session/load`: user and agent text, reasoning,
/// each tool call once with its final status and result, and each plan
/// `update_plan` recorded (as a `plan`, in its place).
///
/// What the calls' last live updates showed (`views`: an edit's diff, the
/// locations a tool reported) replays as it was; the user's images
/// (`images`, their bytes by SHA-256) replay as images.
pub(crate) fn replay(
    messages: &[Message],
    cwd: &Path,
    views: &Views,
    images: &HashMap<String, Blob>,
) -> Vec<SessionUpdate> {
    let mut results: HashMap<&ToolCallId, (String, bool)> = HashMap::new();
    for message in messages {
        for block in &message.content {
            if let ContentBlock::ToolResult {
                tool_use_id,
                is_error,
                ..
            } = block
            {
                // The text, and a line naming each image it returned.
                let text = result_text_with_images(message, tool_use_id);
                results.insert(tool_use_id, (text, *is_error));
            }
        }
    }
    let mut updates = Vec::new();
    for message in messages {
        for block in &message.content {
            let chunk = |text: &str| ContentChunk::new(convert::text_block(text));
            match (message.role, block) {
                (Role::User, ContentBlock::Text { text }) => {
                    updates.push(SessionUpdate::UserMessageChunk(chunk(text)));
                }
                (Role::User, ContentBlock::Image(image)) => {
                    let block = match images.get(&image.sha256) {
                        Some(blob) => crate::prompt::image_block(&blob.media_type, &blob.bytes),
                        None => convert::text_block(&image.mention()),
                    };
                    updates.push(SessionUpdate::UserMessageChunk(ContentChunk::new(block)));
                }
                (Role::Assistant, ContentBlock::Text { text }) => {
                    updates.push(SessionUpdate::AgentMessageChunk(chunk(text)));
                }
                (Role::Assistant, ContentBlock::Reasoning { text }) => {
                    updates.push(SessionUpdate::AgentThoughtChunk(chunk(text)));
                }
                // As during the prompt: an accepted plan, no tool call.
                (
                    Role::Assistant,
                    ContentBlock::ToolUse {
                        id,
                        name,
                        arguments,
                        ..
                    },
                ) if name == UPDATE_PLAN => {
                    if let (Some((_, false)), Some(plan)) =
                        (results.get(id), convert::plan(arguments))
                    {
                        updates.push(SessionUpdate::Plan(plan));
                    }
                }
                (
                    Role::Assistant,
                    ContentBlock::ToolUse {
                        id,
                        name,
                        arguments,
                        ..
                    },
                ) => {
                    let mut state = titles::described_state(id, name, arguments, cwd);
                    state.raw_input = Some(arguments.clone());
                    if let Some((text, is_error)) = results.get(id) {
                        state.status = if *is_error {
                            ToolCallStatus::Failed
                        } else {
                            ToolCallStatus::Completed
                        };
                        state.content = vec![ToolCallContent::text(replayed_result(text))];
                    }
                    if let Some(view) = views.get(&(message.id, id.clone())) {
                        if let Some(content) = &view.content {
                            state.content = content.clone();
                            state.raw_output = view.raw_output.clone();
                        }
                        if let Some(locations) = &view.locations {
                            state.locations = locations.clone();
                        }
                    }
                    updates.push(SessionUpdate::ToolCall(convert::tool_call(&state)));
                }
                _ => {}
            }
        }
    }
    updates
}

/// The bytes of the user's images on `branch` (one read per image; one
/// that cannot be read replays as its mention).
pub(crate) async fn replay_images(
    store: &dyn toolwire_store::StoreRead,
    branch: &[Message],
) -> HashMap<String, Blob> {
    let mut images = HashMap::new();
    let refs = branch
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            ContentBlock::Image(image) => Some(image.clone()),
            _ => None,
        })
        .collect::<Vec<_>>();
    for image in refs {
        if images.contains_key(&image.sha256) {
            continue;
        }
        match store.blob(&image.sha256).await {
            Ok(Some(blob)) => {
                images.insert(image.sha256.clone(), blob);
            }
            Ok(None) => tracing::warn!(sha256 = %image.sha256, "a replayed image is not stored"),
            Err(e) => {
                tracing::warn!(sha256 = %image.sha256, error = %e, "reading a replayed image")
            }
        }
    }
    images
}

/// A result as a replay shows it: at most its last [`OUTPUT_LIMIT`]
/// bytes, as a running command's output is shown, so a long history of
/// large results (256 KiB file reads) does not flood the editor at load.
fn replayed_result(text: &str) -> String {
    let mut tail = OutputTail::default();
    tail.push(text, OUTPUT_LIMIT);
    tail.render(OUTPUT_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwire_core::ConversationId;

    #[test]
    fn replay_shows_each_call_once_with_its_result() {
        let c = ConversationId::new();
        let call = ToolCallId("c1".into());
        let branch = vec![
            Message::new(
                c,
                None,
                Role::System,
                vec![ContentBlock::Text { text: "sys".into() }],
            ),
            Message::new(
                c,
                None,
                Role::User,
                vec![ContentBlock::Text { text: "hi".into() }],
            ),
            Message::new(
                c,
                None,
                Role::Assistant,
                vec![
                    ContentBlock::Text {
                        text: "Reading.".into(),
                    },
                    ContentBlock::ToolUse {
                        id: call.clone(),
                        server: None,
                        name: "read_file".into(),
                        arguments: serde_json::json!({"path": "a"}),
                    },
                ],
            ),
            Message::new(
                c,
                None,
                Role::Tool,
                vec![ContentBlock::ToolResult {
                    tool_use_id: call,
                    content: "no such file".into(),
                    is_error: true,
                    images: Vec::new(),
                }],
            ),
        ];
        let json = serde_json::to_value(replay(
            &branch,
            Path::new("/w"),
            &Views::new(),
            &HashMap::new(),
        ))
        .unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!([
                {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hi"}},
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Reading."}},
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": "c1",
                    "title": "Read a",
                    "kind": "read",
                    "status": "failed",
                    "content": [{"type": "content", "content": {"type": "text", "text": "no such file"}}],
                    "locations": [{"path": "/w/a", "line": 1}],
                    "rawInput": {"path": "a"}
                }
            ])
        );
    }

    #[test]
    fn a_large_result_is_replayed_as_its_tail() {
        let small = "line\n".repeat(10);
        assert_eq!(replayed_result(&small), small);
        let large: String = (0..40_000).map(|i| format!("line {i}\n")).collect();
        let shown = replayed_result(&large);
        let (head, tail) = shown.split_once('\n').unwrap_or_default();
        assert!(head.contains("bytes truncated"), "{head}");
        assert!(tail.len() <= OUTPUT_LIMIT);
        assert!(tail.starts_with("line ") && large.ends_with(tail));
    }

    #[test]
    fn replay_shows_accepted_plans_and_no_plan_tool_call() {
        let c = ConversationId::new();
        let plan_call = |id: &str, plan: serde_json::Value| ContentBlock::ToolUse {
            id: ToolCallId(id.into()),
            server: None,
            name: "update_plan".into(),
            arguments: serde_json::json!({ "plan": plan }),
        };
        let result = |id: &str, is_error: bool| ContentBlock::ToolResult {
            tool_use_id: ToolCallId(id.into()),
            content: "r".into(),
            is_error,
            images: Vec::new(),
        };
        let branch = vec![
            Message::new(
                c,
                None,
                Role::Assistant,
                vec![
                    plan_call(
                        "p1",
                        serde_json::json!([{"step": "a", "status": "in_progress"}]),
                    ),
                    plan_call(
                        "p2",
                        serde_json::json!([{"step": "b", "status": "pending"}]),
                    ),
                ],
            ),
            Message::new(
                c,
                None,
                Role::Tool,
                vec![result("p1", false), result("p2", true)],
            ),
        ];
        let json = serde_json::to_value(replay(
            &branch,
            Path::new("/w"),
            &Views::new(),
            &HashMap::new(),
        ))
        .unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!([{
                "sessionUpdate": "plan",
                "entries": [{"content": "a", "priority": "medium", "status": "in_progress"}]
            }])
        );
    }
}
