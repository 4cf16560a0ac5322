//! One turn of the tool loop: call the model, store its message, run its
//! tool calls (concurrently, bounded), store each result as it completes,
//! and go again until a final answer, the step limit, cancellation or an
//! error. Every step is stored before it is published.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use toolwire_core::Incoming;
use toolwire_core::notification::{SYSTEM_PROMPT_ADDITION, USER_SOURCE};
use toolwire_core::{
    AgentEvent, Batch, ContentBlock, ConversationId, Decision, Gate, GatedCall, Message, MessageId,
    MessageStatus, PendingApproval, Priority, Progress, Role, RunId, StopReason, ToolCall,
    ToolCallId, Usage,
};
use toolwire_stream::{StreamEvent, XmlToolCallParser};

use crate::approval;
use crate::config::InterjectionMode;
use crate::engine::{Inner, TurnOptions, TurnOutcome, user_message};
use crate::notify::{InjectionMode, NOTIFICATION_TOOL};
use crate::provider::{ModelRequest, ToolFormat, xml_format};
use crate::tools::{ProgressHandle, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

/// Progress reports of a step's tools waiting to be stored: a tool that
/// reports faster than they are stored waits for room.
const PROGRESS_QUEUED: usize = 256;

/// How a turn begins.
pub(crate) enum Start {
    /// With a new user message (its parent set).
    User(Message),
    /// From an existing message (regeneration).
    From(MessageId),
    /// Going on after a pause: the answers to its waiting calls, then
    /// (optionally) a new user message.
    Resume {
        pending: PendingApproval,
        decisions: HashMap<ToolCallId, Decision>,
        then: Option<String>,
    },
    /// Ending a pause without going on: its calls are answered as not run
    /// and the turn stops as cancelled.
    Abandon {
        pending: PendingApproval,
        reason: String,
    },
}

/// Why the loop stops early.
struct Stop {
    reason: StopReason,
    error: Option<String>,
}

impl Stop {
    /// The engine stopped (SIGTERM or Ctrl-C) before the turn ended.
    fn shutdown() -> Self {
        Stop::new(
            StopReason::Interrupted,
            "interrupted by shutdown: toolwire stopped before the turn ended; \
             what was stored is kept, send a message to go on",
        )
    }

    fn paused() -> Self {
        Stop {
            reason: StopReason::RequiresApproval,
            error: None,
        }
    }
}

impl Stop {
    fn new(reason: StopReason, error: impl Into<String>) -> Self {
        Stop {
            reason,
            error: Some(error.into()),
        }
    }
}

impl From<toolwire_store::StoreError> for Stop {
    fn from(e: toolwire_store::StoreError) -> Self {
        Stop::new(StopReason::Error, format!("store: {e}"))
    }
}

struct Turn<'a> {
    inner: &'a Inner,
    conversation: ConversationId,
    run_id: RunId,
    cancel: CancellationToken,
    /// The newest stored node of this turn.
    leaf: MessageId,
    usage: Usage,
    cost: Option<f64>,
    /// Which of the conversation's turns this is (for scripted models).
    turn_index: Option<usize>,
    /// Model calls made before this run (a run that goes on after a pause
    /// continues the paused run's count).
    iterations_before: u32,
    options: TurnOptions,
    /// Told once the turn's first step is stored (or cannot be).
    begun: Option<oneshot::Sender<Result<(), String>>>,
}

pub(crate) async fn run(
    inner: &Inner,
    conversation: ConversationId,
    run_id: RunId,
    start: Start,
    cancel: CancellationToken,
    options: TurnOptions,
    begun: oneshot::Sender<Result<(), String>>,
) -> TurnOutcome {
    let mut turn = Turn {
        inner,
        conversation,
        run_id,
        cancel,
        leaf: MessageId::new(),
        usage: Usage::default(),
        cost: None,
        turn_index: None,
        iterations_before: 0,
        options,
        begun: Some(begun),
    };
    let result = turn.run(start).await;
    if let (Some(begun), Err(stop)) = (turn.begun.take(), &result) {
        let _ = begun.send(Err(stop
            .error
            .clone()
            .unwrap_or_else(|| stop.reason.as_str().to_owned())));
    }
    let (reason, error, final_message) = match result {
        Ok(final_message) => (StopReason::EndTurn, None, Some(final_message)),
        Err(stop) => (stop.reason, stop.error, None),
    };
    match (&error, reason) {
        (Some(e), StopReason::Error | StopReason::LlmApiError) => {
            tracing::warn!(%conversation, run = %run_id, reason = reason.as_str(), error = %e, "turn failed");
        }
        (Some(e), _) => {
            tracing::info!(%conversation, run = %run_id, reason = reason.as_str(), detail = %e, "turn stopped");
        }
        (None, _) => {}
    }
    if let Err(e) = inner
        .store
        .finish_run(run_id, reason, error.as_deref())
        .await
    {
        tracing::error!(run = %run_id, error = %e, "could not record the end of the turn");
    }
    let stopped = AgentEvent::Stopped {
        run_id,
        reason,
        error: error.clone(),
    };
    if let Err(e) = inner.bus.emit(conversation, stopped).await {
        tracing::error!(run = %run_id, error = %e, "could not publish the end of the turn");
    }
    TurnOutcome {
        run_id,
        conversation_id: conversation,
        reason,
        error,
        final_message,
        usage: turn.usage,
        cost: turn.cost,
    }
}

/// A call of the current step and how it is to be answered.
struct PendingCall {
    id: ToolCallId,
    name: String,
    arguments: Value,
    /// The call could not be parsed; answered with this error unrun.
    invalid: Option<String>,
    /// Answered without running (a denial, or the client's result).
    answer: Option<ToolOutput>,
}

impl PendingCall {
    fn from_gated(c: GatedCall) -> Self {
        PendingCall {
            id: c.call.id,
            name: c.call.name,
            arguments: c.call.arguments,
            invalid: c.invalid,
            answer: None,
        }
    }
}

impl Turn<'_> {
    async fn run(&mut self, start: Start) -> Result<Message, Stop> {
        self.inner
            .store
            .start_run(
                self.run_id,
                self.conversation,
                self.inner.instance.record().id,
            )
            .await?;
        let mut resumed = None;
        match start {
            Start::Resume {
                pending,
                decisions,
                then,
            } => {
                resumed = Some(self.resume(pending, decisions, then).await?);
                self.begin();
            }
            Start::Abandon { pending, reason } => {
                self.begin();
                self.abandon(pending, &reason).await?;
                return Err(Stop::new(StopReason::Cancelled, reason));
            }
            Start::User(mut user) => {
                self.leaf = user.id;
                // What waited since the last turn comes with its message.
                let (injected, batch) = self.take_notifications(&mut user).unzip();
                if user.content.is_empty() {
                    user.content.push(ContentBlock::Text {
                        text: "(woken by a notification)".into(),
                    });
                }
                let mut events = vec![AgentEvent::TurnStarted {
                    run_id: self.run_id,
                    conversation_id: self.conversation,
                    message: user.clone(),
                }];
                events.extend(injected);
                self.store_carrying(&user, events, batch).await?;
                self.begin();
            }
            Start::From(id) => {
                self.leaf = id;
                self.inner
                    .store
                    .set_active_leaf(self.conversation, id)
                    .await?;
                self.begin();
            }
        }
        if let Some((calls, then)) = resumed {
            let path = self.inner.store.path_to(self.leaf).await?;
            self.run_tools(self.iterations_before, calls, path).await?;
            // Stored even when the turn stops here: the client was told
            // its message was taken.
            if let Some(text) = then {
                let user = user_message(self.conversation, self.leaf, &text);
                let event = AgentEvent::UserInterjection {
                    run_id: self.run_id,
                    message: user.clone(),
                };
                self.inner.bus.store_message(&user, vec![event]).await?;
                self.leaf = user.id;
            }
            if self.stopped() {
                return Err(self.cancelled());
            }
        }
        let max_steps = self
            .options
            .max_steps
            .unwrap_or(self.inner.config.max_steps);
        for step in 1..=max_steps {
            let iteration = self.iterations_before + step;
            let (assistant, calls, path) = self.model_step(iteration).await?;
            if calls.is_empty() {
                return Ok(assistant);
            }
            if calls.iter().any(|c| c.gate.is_some()) {
                self.pause(assistant.id, iteration, calls).await?;
                return Err(Stop::paused());
            }
            let calls = calls.into_iter().map(PendingCall::from_gated).collect();
            self.run_tools(iteration, calls, path).await?;
            if self.stopped() {
                return Err(self.cancelled());
            }
        }
        Err(Stop::new(
            StopReason::MaxSteps,
            format!("stopped after {max_steps} model calls (max_steps)"),
        ))
    }

    /// Tells the front door that the turn's first step is stored.
    fn begin(&mut self) {
        if let Some(begun) = self.begun.take() {
            let _ = begun.send(Ok(()));
        }
    }

    /// Whether the turn is to stop at this step's end: cancelled by the
    /// user, or the engine is shutting down.
    fn stopped(&self) -> bool {
        self.cancel.is_cancelled() || self.inner.stopping.is_stopping()
    }

    /// Why a cancelled turn stopped.
    fn cancelled(&self) -> Stop {
        if self.inner.stopping.is_stopping() {
            Stop::shutdown()
        } else {
            Stop::new(StopReason::Cancelled, "cancelled by the user")
        }
    }

    /// The tools of this turn.
    fn tools(&self) -> &ToolRegistry {
        self.options.tools.as_ref().unwrap_or(&self.inner.tools)
    }

    /// What the model is told it can call: the turn's tools, and the
    /// client's (which win over a server tool of the same name).
    fn specs(&self) -> Vec<ToolSpec> {
        let client = &self.options.client_tools;
        let mut specs: Vec<ToolSpec> = self
            .tools()
            .specs()
            .into_iter()
            .filter(|s| !client.iter().any(|c| c.name == s.name))
            .collect();
        specs.extend(client.iter().cloned());
        specs
    }

    /// Why `name`'s calls wait, if they do.
    fn gate(&self, name: &str) -> Option<Gate> {
        if self.options.client_tools.iter().any(|c| c.name == name) {
            Some(Gate::Client)
        } else if self.options.require_approval.contains(name) {
            Some(Gate::Approval)
        } else {
            None
        }
    }

    /// Stores the pause, so that it outlives the process (the message was
    /// stored with its `approval_requested` event).
    async fn pause(
        &mut self,
        message_id: MessageId,
        iteration: u32,
        calls: Vec<GatedCall>,
    ) -> Result<(), Stop> {
        let pending = PendingApproval {
            conversation_id: self.conversation,
            run_id: self.run_id,
            message_id,
            iteration,
            calls,
            created_at: chrono::Utc::now(),
        };
        approval::save(self.inner.store.as_ref(), &pending).await?;
        Ok(())
    }

    /// Takes the pause (so that it is answered once) and turns the answers
    /// into the calls to run: approved and ungated calls run, the others
    /// are answered with the denial or the client's result.
    async fn resume(
        &mut self,
        pending: PendingApproval,
        mut decisions: HashMap<ToolCallId, Decision>,
        then: Option<String>,
    ) -> Result<(Vec<PendingCall>, Option<String>), Stop> {
        if !approval::take(self.inner.store.as_ref(), self.conversation).await? {
            return Err(Stop::new(
                StopReason::Error,
                "these tool calls were answered already",
            ));
        }
        self.leaf = pending.message_id;
        if then.is_none() {
            // The same turn goes on: a scripted model plays its next step.
            self.iterations_before = pending.iteration;
        }
        let order: Vec<(ToolCallId, Decision)> = pending
            .waiting()
            .filter_map(|c| {
                decisions
                    .get(&c.call.id)
                    .map(|d| (c.call.id.clone(), d.clone()))
            })
            .collect();
        approval::record(self.inner.store.as_ref(), pending.clone(), order.clone()).await?;
        self.emit(AgentEvent::ApprovalResolved {
            run_id: self.run_id,
            message_id: pending.message_id,
            decisions: order,
        })
        .await?;
        let calls = pending
            .calls
            .into_iter()
            .map(|c| {
                let decision = c.gate.and_then(|_| decisions.remove(&c.call.id));
                let mut call = PendingCall::from_gated(c);
                call.answer = match decision {
                    None | Some(Decision::Approve) => None,
                    Some(Decision::Deny { reason }) => {
                        Some(ToolOutput::error(Decision::denial_text(reason.as_deref())))
                    }
                    Some(Decision::Result { content, is_error }) => {
                        Some(ToolOutput { content, is_error })
                    }
                };
                call
            })
            .collect();
        Ok((calls, then))
    }

    /// Answers every call of the pause as not run.
    async fn abandon(&mut self, pending: PendingApproval, reason: &str) -> Result<(), Stop> {
        if !approval::take(self.inner.store.as_ref(), self.conversation).await? {
            return Ok(());
        }
        self.leaf = pending.message_id;
        let decisions: Vec<(ToolCallId, Decision)> = pending
            .waiting()
            .map(|c| {
                (
                    c.call.id.clone(),
                    Decision::Deny {
                        reason: Some(reason.to_owned()),
                    },
                )
            })
            .collect();
        approval::record(
            self.inner.store.as_ref(),
            pending.clone(),
            decisions.clone(),
        )
        .await?;
        self.emit(AgentEvent::ApprovalResolved {
            run_id: self.run_id,
            message_id: pending.message_id,
            decisions,
        })
        .await?;
        for call in pending.calls {
            let text = format!("Not run: {reason}");
            self.store_result(
                &call.call.id,
                Ok(ToolOutput::error(text)),
                Duration::ZERO,
                None,
            )
            .await?;
        }
        Ok(())
    }

    async fn emit(&self, event: AgentEvent) -> Result<(), Stop> {
        self.inner.bus.emit(self.conversation, event).await?;
        Ok(())
    }

    /// One model call: streams its events out (each batch that the
    /// provider has ready is stored in one transaction), then stores the
    /// message with what it leads to: its tool calls, or the final answer.
    /// Returns the message, its calls and the path ending with it.
    async fn model_step(
        &mut self,
        iteration: u32,
    ) -> Result<(Message, Vec<GatedCall>, Vec<Message>), Stop> {
        let mut path = self.inner.store.path_to(self.leaf).await?;
        if self.turn_index.is_none() {
            self.turn_index = Some(
                path.iter()
                    .filter(|m| m.role == Role::User)
                    .count()
                    .saturating_sub(1),
            );
        }
        let request = self.request(&path, iteration);
        let started = Instant::now();
        let stream = tokio::select! {
            s = self.inner.provider.stream(&request) => s.map_err(|e| Stop::new(StopReason::LlmApiError, e.to_string()))?,
            _ = self.cancel.cancelled() => return Err(self.cancelled()),
        };
        let mut step = StepState::new(self.inner.config.tool_format);
        let mut failure: Option<Stop> = None;
        // Named now, so that clients can tie the streamed pieces to the
        // message they become; announced with the first batch (no write
        // of its own).
        let message_id = MessageId::new();
        let mut step_started = Some(AgentEvent::StepStarted {
            run_id: self.run_id,
            message_id,
            iteration,
        });
        let mut batches = stream.ready_chunks(256);
        while failure.is_none() {
            let batch = tokio::select! {
                batch = batches.next() => batch,
                _ = self.cancel.cancelled() => {
                    failure = Some(self.cancelled());
                    break;
                }
            };
            let Some(batch) = batch else { break };
            let mut publish: Vec<AgentEvent> = step_started.take().into_iter().collect();
            for item in batch {
                match item {
                    Ok(event) => {
                        if let Err(over) = step.admit(&event, &self.inner.config) {
                            failure = Some(Stop::new(StopReason::LlmApiError, over));
                            break;
                        }
                        for e in step.accept(event) {
                            match self.translate(e) {
                                Ok(Some(agent_event)) => publish.push(agent_event),
                                Ok(None) => {}
                                Err(stop) => failure = failure.or(Some(stop)),
                            }
                        }
                    }
                    Err(e) => {
                        failure =
                            failure.or(Some(Stop::new(StopReason::LlmApiError, e.to_string())))
                    }
                }
                if failure.is_some() {
                    break;
                }
            }
            self.inner.bus.emit_all(self.conversation, publish).await?;
        }
        if failure.is_none() {
            let publish: Vec<AgentEvent> = step_started
                .take()
                .into_iter()
                .chain(
                    step.finish()
                        .into_iter()
                        .filter_map(|e| self.translate(e).ok().flatten()),
                )
                .collect();
            self.inner.bus.emit_all(self.conversation, publish).await?;
        }
        let model = self.inner.provider.model().to_owned();
        let mut message = Message::new(
            self.conversation,
            Some(self.leaf),
            Role::Assistant,
            step.content(failure.is_none()),
        );
        message.id = message_id;
        message.model = Some(model.clone());
        message.duration_ms = Some(started.elapsed().as_millis() as u64);
        if let Some(usage) = step.usage {
            message.usage = Some(usage);
            message.cost = self.inner.config.prices.cost(&model, &usage);
            self.usage += usage;
            if let Some(c) = message.cost {
                self.cost = Some(self.cost.unwrap_or(0.0) + c);
            }
        }
        if failure.is_some() {
            // Keep what was received; its calls are not run.
            message.status = MessageStatus::Interrupted;
        }
        let calls: Vec<GatedCall> = if failure.is_none() {
            step.calls()
                .into_iter()
                .map(|mut c| {
                    c.gate = c
                        .invalid
                        .is_none()
                        .then(|| self.gate(&c.call.name))
                        .flatten();
                    c
                })
                .collect()
        } else {
            Vec::new()
        };
        if !message.content.is_empty() || failure.is_none() {
            let run_id = self.run_id;
            let mut events = vec![AgentEvent::AssistantMessageCreated {
                run_id,
                message: message.clone(),
            }];
            if failure.is_none() {
                events.push(if calls.is_empty() {
                    AgentEvent::FinalResponse {
                        run_id,
                        message_id: message.id,
                        usage: self.usage,
                        cost: self.cost,
                    }
                } else if calls.iter().any(|c| c.gate.is_some()) {
                    AgentEvent::ApprovalRequested {
                        run_id,
                        message_id: message.id,
                        calls: calls.clone(),
                    }
                } else {
                    AgentEvent::ToolCallsGenerated {
                        run_id,
                        message_id: message.id,
                        calls: calls.iter().map(|c| c.call.clone()).collect(),
                    }
                });
            }
            self.inner.bus.store_message(&message, events).await?;
            self.leaf = message.id;
        }
        if let Some(stop) = failure {
            return Err(stop);
        }
        path.push(message.clone());
        Ok((message, calls, path))
    }

    fn request(&self, path: &[Message], iteration: u32) -> ModelRequest {
        let mut system = path.first().map(Message::text).unwrap_or_default();
        let rest = path.get(1..).unwrap_or_default();
        let mut tools = self.specs();
        let notifications = &self.inner.config.notifications;
        if notifications.enabled {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(SYSTEM_PROMPT_ADDITION);
            if notifications.mode == InjectionMode::SyntheticTool {
                tools.push(ToolSpec {
                    name: NOTIFICATION_TOOL.into(),
                    server: None,
                    description: "Delivers notifications to you. Never call this tool yourself: \
                                  toolwire calls it when something happens while you work."
                        .into(),
                    parameters: serde_json::json!({"type": "object", "properties": {}}),
                    read_only: true,
                });
            }
        }
        match self.inner.config.tool_format {
            ToolFormat::Native => ModelRequest {
                system,
                messages: rest.to_vec(),
                tools,
                turn: self.turn_index.unwrap_or(0),
                iteration,
            },
            ToolFormat::Xml => ModelRequest {
                system: format!("{system}\n\n{}", xml_format::tools_prompt(&tools)),
                messages: xml_format::as_text_protocol(rest),
                tools: Vec::new(),
                turn: self.turn_index.unwrap_or(0),
                iteration,
            },
        }
    }

    /// What a stream event means to clients: an event to publish, nothing
    /// (recorded by the step, published with the stored message), or the
    /// end of the step (a provider error).
    fn translate(&self, event: StreamEvent) -> Result<Option<AgentEvent>, Stop> {
        let run_id = self.run_id;
        let agent_event = match event {
            StreamEvent::TextDelta { text } => AgentEvent::TextDelta { run_id, text },
            StreamEvent::ReasoningDelta { text } => AgentEvent::ReasoningDelta { run_id, text },
            StreamEvent::ToolCallStarted {
                call_id,
                name,
                server,
            } => AgentEvent::ToolCallStarted {
                run_id,
                call_id: ToolCallId(call_id.to_string()),
                name,
                server,
            },
            StreamEvent::ArgumentsDelta { call_id, fragment } => AgentEvent::ArgumentsDelta {
                run_id,
                call_id: ToolCallId(call_id.to_string()),
                fragment,
            },
            StreamEvent::ArgumentField {
                call_id,
                key,
                value,
            } => AgentEvent::ArgumentField {
                run_id,
                call_id: ToolCallId(call_id.to_string()),
                key: key.to_string(),
                value,
            },
            StreamEvent::ProviderError { message } => {
                return Err(Stop::new(
                    StopReason::LlmApiError,
                    format!("the provider reported: {message}"),
                ));
            }
            StreamEvent::ParseError { message } => {
                tracing::warn!(conversation = %self.conversation, %message, "undecodable model output");
                return Ok(None);
            }
            StreamEvent::LimitExceeded { message } => {
                return Err(Stop::new(
                    StopReason::LlmApiError,
                    format!("the model's output went over a decoder limit: {message}"),
                ));
            }
            // Recorded by the step; published with the stored message.
            StreamEvent::ToolCallOpened { .. }
            | StreamEvent::ArgumentFieldDelta { .. }
            | StreamEvent::ToolCallReady { .. }
            | StreamEvent::ToolCallFailed { .. }
            | StreamEvent::Usage(_)
            | StreamEvent::Finished { .. } => return Ok(None),
        };
        Ok(Some(agent_event))
    }

    /// Runs the step's calls, at most `tool_concurrency` at once, storing
    /// each result as it completes. Interjections are taken when a tool
    /// completes; calls not yet started are then skipped.
    async fn run_tools(
        &mut self,
        iteration: u32,
        calls: Vec<PendingCall>,
        path: Vec<Message>,
    ) -> Result<(), Stop> {
        let path: Arc<[Message]> = path.into();
        let (progress_tx, mut progress_rx) =
            mpsc::channel::<(ToolCallId, Progress)>(PROGRESS_QUEUED);
        let mut queue: VecDeque<PendingCall> = calls.into();
        let mut running: JoinSet<(ToolCallId, Result<ToolOutput, ToolError>, Duration)> =
            JoinSet::new();
        // Which call each task runs, so that a task that panics or is
        // aborted still gets its call a result.
        let mut tasks: HashMap<tokio::task::Id, (ToolCallId, Instant)> = HashMap::new();
        // After a cancel, tools get this long to stop before they are aborted.
        let mut abort_at: Option<tokio::time::Instant> = None;
        // Interjections for a new user message; once any arrives, calls
        // not yet started are skipped.
        let mut interjected: Vec<String> = Vec::new();
        let mut skip_rest = false;
        let limit = self.inner.config.tool_concurrency.max(1);
        loop {
            let mut ready = Vec::new();
            while running.len() + ready.len() < limit && !skip_rest && !self.stopped() {
                let Some(mut call) = queue.pop_front() else {
                    break;
                };
                if let Some(answer) = call.answer.take() {
                    self.store_result(&call.id, Ok(answer), Duration::ZERO, None)
                        .await?;
                    continue;
                }
                if let Some(reason) = &call.invalid {
                    let output = ToolOutput::error(format!(
                        "Your call to `{}` could not be read: {reason}",
                        call.name
                    ));
                    self.store_result(&call.id, Ok(output), Duration::ZERO, None)
                        .await?;
                    continue;
                }
                if call.name == NOTIFICATION_TOOL {
                    let output = ToolOutput::error(format!(
                        "`{NOTIFICATION_TOOL}` only delivers notifications; do not call it."
                    ));
                    self.store_result(&call.id, Ok(output), Duration::ZERO, None)
                        .await?;
                    continue;
                }
                let Some(tool) = self.tools().get(&call.name) else {
                    let available: Vec<String> = self.specs().into_iter().map(|s| s.name).collect();
                    let output = ToolOutput::error(if available.is_empty() {
                        format!(
                            "There is no tool named `{}`, and no tools are available.",
                            call.name
                        )
                    } else {
                        format!(
                            "There is no tool named `{}`. Available tools: {}.",
                            call.name,
                            available.join(", ")
                        )
                    });
                    self.store_result(&call.id, Ok(output), Duration::ZERO, None)
                        .await?;
                    continue;
                };
                ready.push((call, tool));
            }
            // The round's starts are stored, in one transaction, before its
            // tools run.
            let starts = ready
                .iter()
                .map(|(call, _)| AgentEvent::ToolExecutionStarted {
                    run_id: self.run_id,
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                })
                .collect();
            self.inner.bus.emit_all(self.conversation, starts).await?;
            for (call, tool) in ready {
                let ctx = ToolContext {
                    conversation_id: self.conversation,
                    run_id: self.run_id,
                    call_id: call.id.clone(),
                    path: path.clone(),
                    iteration,
                    cancel: self.cancel.child_token(),
                    progress: ProgressHandle::new(call.id.clone(), progress_tx.clone()),
                    client_id: self.options.client_id.clone(),
                    notifier: self.inner.notifier.clone(),
                };
                let call_id = call.id.clone();
                let task = running.spawn(async move {
                    let started = Instant::now();
                    let result = tool.call(call.arguments, ctx).await;
                    (call.id, result, started.elapsed())
                });
                tasks.insert(task.id(), (call_id, Instant::now()));
            }
            if running.is_empty() {
                break;
            }
            if abort_at.is_none() && self.cancel.is_cancelled() {
                abort_at = Some(tokio::time::Instant::now() + self.inner.config.tool_cancel_grace);
            }
            tokio::select! {
                Some(first) = progress_rx.recv() => {
                    self.emit_progress(first, &mut progress_rx).await?;
                }
                _ = self.cancel.cancelled(), if abort_at.is_none() => {}
                _ = tokio::time::sleep_until(abort_at.unwrap_or_else(tokio::time::Instant::now)), if abort_at.is_some() => {
                    tracing::warn!(tools = running.len(), "tools ignored the cancellation; aborting them");
                    running.abort_all();
                    abort_at = Some(tokio::time::Instant::now() + Duration::from_secs(3600));
                }
                Some(joined) = running.join_next_with_id() => {
                    // What the tool reported before it returned comes
                    // before its result.
                    while let Ok(first) = progress_rx.try_recv() {
                        self.emit_progress(first, &mut progress_rx).await?;
                    }
                    let (call_id, result, took) = match joined {
                        Ok((id, done)) => {
                            tasks.remove(&id);
                            done
                        }
                        Err(e) => {
                            let Some((call_id, started)) = tasks.remove(&e.id()) else { continue };
                            let error = if e.is_panic() {
                                tracing::error!(call = %call_id, "a tool panicked");
                                ToolError::Failed("the tool crashed".into())
                            } else {
                                ToolError::Cancelled
                            };
                            (call_id, Err(error), started.elapsed())
                        }
                    };
                    let new = self.take_interjections();
                    skip_rest |= !new.is_empty();
                    let reminder = match self.inner.config.interjections {
                        InterjectionMode::Reminder if !new.is_empty() => Some(new.join("\n\n")),
                        _ => {
                            interjected.extend(new);
                            None
                        }
                    };
                    self.store_result(&call_id, result, took, reminder).await?;
                }
            }
        }
        // Calls never started: answered, so every call has a result.
        let skip_reason = if self.inner.stopping.is_stopping() {
            "Not run: toolwire was shutting down before this call started."
        } else if self.cancel.is_cancelled() {
            "Not run: the user cancelled the turn."
        } else {
            "Not run: the user interjected before this call started."
        };
        for call in queue {
            self.store_result(
                &call.id,
                Ok(ToolOutput::error(skip_reason)),
                Duration::ZERO,
                None,
            )
            .await?;
        }
        self.inject_synthetic().await?;
        if !interjected.is_empty() {
            let user = user_message(self.conversation, self.leaf, &interjected.join("\n\n"));
            let event = AgentEvent::UserInterjection {
                run_id: self.run_id,
                message: user.clone(),
            };
            self.inner.bus.store_message(&user, vec![event]).await?;
            self.leaf = user.id;
        }
        Ok(())
    }

    fn take_interjections(&self) -> Vec<String> {
        match self.inner.active.lock() {
            Ok(mut active) => active
                .get_mut(&self.conversation)
                .map(|t| t.interjections.drain(..).collect())
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Stores one result as a tool message under the newest node.
    async fn store_result(
        &mut self,
        call_id: &ToolCallId,
        result: Result<ToolOutput, ToolError>,
        took: Duration,
        reminder: Option<String>,
    ) -> Result<(), Stop> {
        let (content, is_error, error) = match result {
            Ok(out) => (out.content, out.is_error, None),
            Err(e) => {
                let text = format!("Error: {e}");
                (text.clone(), true, Some(e.to_string()))
            }
        };
        if let Some(reminder) = reminder {
            // Reminder-mode interjections travel as notifications.
            self.inner.notifications.push(
                &self.inner.config.notifications.queue,
                self.conversation,
                Incoming::text(USER_SOURCE, Priority::High, reminder),
            );
        }
        let mut message = Message::new(
            self.conversation,
            Some(self.leaf),
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: call_id.clone(),
                content,
                is_error,
            }],
        );
        message.duration_ms = Some(took.as_millis() as u64);
        if is_error {
            message.status = MessageStatus::Error;
        }
        let (injected, batch) = if self.inner.config.notifications.mode == InjectionMode::Augment {
            self.take_notifications(&mut message).unzip()
        } else {
            (None, None)
        };
        let (run_id, call_id, stored) = (self.run_id, call_id.clone(), message.clone());
        let event = match error {
            Some(error) => AgentEvent::ToolExecutionFailed {
                run_id,
                call_id,
                error,
                message: stored,
            },
            None => AgentEvent::ToolExecutionCompleted {
                run_id,
                call_id,
                message: stored,
            },
        };
        let mut events = vec![event];
        events.extend(injected);
        self.store_carrying(&message, events, batch).await?;
        self.leaf = message.id;
        Ok(())
    }

    /// Emits `first` and what else waits in `rx`, consecutive output of
    /// one call joined into one event: one store write per burst rather
    /// than per read of a chatty command.
    async fn emit_progress(
        &mut self,
        first: (ToolCallId, Progress),
        rx: &mut mpsc::Receiver<(ToolCallId, Progress)>,
    ) -> Result<(), Stop> {
        let mut waiting = vec![first];
        // At most a queue's worth: tools that keep reporting while these
        // are stored must not keep this batch growing.
        while waiting.len() < PROGRESS_QUEUED
            && let Ok(next) = rx.try_recv()
        {
            waiting.push(next);
        }
        let mut joined: Vec<(ToolCallId, Progress)> = Vec::with_capacity(waiting.len());
        for (call_id, progress) in waiting {
            if let (Some((last_id, Progress::Output { text: last })), Progress::Output { text }) =
                (joined.last_mut(), &progress)
                && *last_id == call_id
            {
                last.push_str(text);
                continue;
            }
            joined.push((call_id, progress));
        }
        for (call_id, progress) in joined {
            self.emit(AgentEvent::ToolExecutionProgress {
                run_id: self.run_id,
                call_id,
                progress,
            })
            .await?;
        }
        Ok(())
    }

    /// Drains the conversation's notifications onto `message` (as
    /// notification blocks); returns the event that announces them and the
    /// batch, to put back if `message` cannot be stored.
    fn take_notifications(&self, message: &mut Message) -> Option<(AgentEvent, Batch)> {
        if !self.inner.config.notifications.enabled {
            return None;
        }
        let batch = self.inner.notifications.drain(self.conversation)?;
        message.content.extend(batch.blocks());
        Some((self.injected(message.id, &batch), batch))
    }

    /// The event that announces `batch` on message `message_id`.
    fn injected(&self, message_id: MessageId, batch: &Batch) -> AgentEvent {
        AgentEvent::NotificationsInjected {
            run_id: self.run_id,
            message_id,
            notices: batch.notices.clone(),
            text: batch.format(),
        }
    }

    /// Stores `message` with `events`; the notifications `batch` it
    /// carries are then delivered. If storing fails, they wait again for
    /// the next message: taken from the queue is not delivered until
    /// stored.
    async fn store_carrying(
        &self,
        message: &Message,
        events: Vec<AgentEvent>,
        batch: Option<Batch>,
    ) -> Result<(), Stop> {
        let stored = self.inner.bus.store_message(message, events).await;
        if let Some(batch) = batch {
            match stored {
                Ok(()) => self
                    .inner
                    .notifications
                    .delivered(self.conversation, &batch),
                Err(_) => self.put_back(batch),
            }
        }
        Ok(stored?)
    }

    /// Puts back notifications taken for a message that was not stored.
    fn put_back(&self, batch: Batch) {
        let queue = &self.inner.config.notifications.queue;
        self.inner
            .notifications
            .restore(queue, self.conversation, batch);
    }

    /// In [`InjectionMode::SyntheticTool`], what waits after the step's
    /// results: a `_system_notification` call and its result.
    async fn inject_synthetic(&mut self) -> Result<(), Stop> {
        let settings = &self.inner.config.notifications;
        if !settings.enabled || settings.mode != InjectionMode::SyntheticTool {
            return Ok(());
        }
        let Some(batch) = self.inner.notifications.drain(self.conversation) else {
            return Ok(());
        };
        let call_id = ToolCallId(format!("notification_{}", MessageId::new().0.simple()));
        let call = Message::new(
            self.conversation,
            Some(self.leaf),
            Role::Assistant,
            vec![ContentBlock::ToolUse {
                id: call_id.clone(),
                server: None,
                name: NOTIFICATION_TOOL.into(),
                arguments: serde_json::json!({}),
            }],
        );
        // The call does not carry them yet: its result does.
        if let Err(e) = self.inner.bus.store_message(&call, Vec::new()).await {
            self.put_back(batch);
            return Err(e.into());
        }
        let mut content = vec![ContentBlock::ToolResult {
            tool_use_id: call_id,
            content: String::new(),
            is_error: false,
        }];
        content.extend(batch.blocks());
        let result = Message::new(self.conversation, Some(call.id), Role::Tool, content);
        let event = self.injected(result.id, &batch);
        self.store_carrying(&result, vec![event], Some(batch))
            .await?;
        self.leaf = result.id;
        Ok(())
    }
}

/// What one model call has produced so far.
struct StepState {
    xml: Option<XmlToolCallParser>,
    reasoning: String,
    text: String,
    /// Calls in the order they started.
    calls: Vec<StepCall>,
    usage: Option<Usage>,
    /// Bytes of text, reasoning and arguments admitted so far.
    output_bytes: usize,
    /// Stream events admitted so far.
    events: usize,
}

/// One call of the step, as far as the stream has told it.
struct StepCall {
    id: ToolCallId,
    name: String,
    /// Argument text received, kept for a call that never became ready.
    raw_arguments: String,
    /// Set when the provider closed the call with valid arguments.
    arguments: Option<Value>,
    /// Set when the call cannot be run.
    failure: Option<String>,
}

impl StepCall {
    fn new(id: &str, name: String) -> Self {
        StepCall {
            id: ToolCallId(id.to_owned()),
            name,
            raw_arguments: String::new(),
            arguments: None,
            failure: None,
        }
    }
}

impl StepState {
    fn new(format: ToolFormat) -> Self {
        StepState {
            xml: (format == ToolFormat::Xml).then(XmlToolCallParser::new),
            reasoning: String::new(),
            text: String::new(),
            calls: Vec::new(),
            usage: None,
            output_bytes: 0,
            events: 0,
        }
    }

    /// Counts `event` against the step's caps; an event that would go
    /// over one is refused (not recorded), so that what the step holds and
    /// stores stays under `max_step_output_bytes`.
    fn admit(&mut self, event: &StreamEvent, config: &crate::EngineConfig) -> Result<(), String> {
        let bytes = match event {
            StreamEvent::TextDelta { text } | StreamEvent::ReasoningDelta { text } => text.len(),
            StreamEvent::ArgumentsDelta { fragment, .. } => fragment.len(),
            _ => 0,
        };
        if self.output_bytes + bytes > config.max_step_output_bytes {
            return Err(format!(
                "the model's output went over {} bytes in one step (max_step_output_bytes); cut",
                config.max_step_output_bytes
            ));
        }
        if self.events >= config.max_step_events {
            return Err(format!(
                "the model's stream went over {} events in one step (max_step_events); cut",
                config.max_step_events
            ));
        }
        self.output_bytes += bytes;
        self.events += 1;
        Ok(())
    }

    /// Records `event`; returns the events to publish (with the XML
    /// format, text is parsed for calls first).
    fn accept(&mut self, event: StreamEvent) -> Vec<StreamEvent> {
        let events = match (&mut self.xml, event) {
            (Some(parser), StreamEvent::TextDelta { text }) => parser.feed(&text),
            (_, other) => vec![other],
        };
        for e in &events {
            self.record(e);
        }
        events
    }

    fn finish(&mut self) -> Vec<StreamEvent> {
        let events = self
            .xml
            .as_mut()
            .map(XmlToolCallParser::finish)
            .unwrap_or_default();
        for e in &events {
            self.record(e);
        }
        events
    }

    fn call(&mut self, id: &str) -> Option<&mut StepCall> {
        self.calls.iter_mut().find(|c| c.id.0 == id)
    }

    fn record(&mut self, event: &StreamEvent) {
        match event {
            StreamEvent::TextDelta { text } => self.text.push_str(text),
            StreamEvent::ReasoningDelta { text } => self.reasoning.push_str(text),
            StreamEvent::ToolCallStarted { call_id, name, .. } => {
                self.calls.push(StepCall::new(call_id, name.clone()));
            }
            StreamEvent::ArgumentsDelta { call_id, fragment } => {
                if let Some(c) = self.call(call_id) {
                    c.raw_arguments.push_str(fragment);
                }
            }
            StreamEvent::ToolCallReady {
                call_id, arguments, ..
            } => {
                if let Some(c) = self.call(call_id) {
                    c.arguments = Some(arguments.clone());
                }
            }
            StreamEvent::ToolCallFailed { call_id, reason } => match self.call(call_id) {
                Some(c) => c.failure = Some(reason.clone()),
                None => {
                    let mut c = StepCall::new(call_id, String::new());
                    c.failure = Some(reason.clone());
                    self.calls.push(c);
                }
            },
            StreamEvent::Usage(u) => {
                self.usage = Some(Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    cached_tokens: u.cached_tokens,
                });
            }
            _ => {}
        }
    }

    /// The message content: reasoning, text, then the tool calls (only
    /// when the step completed: a broken step's calls are not run).
    fn content(&self, complete: bool) -> Vec<ContentBlock> {
        let mut content = Vec::new();
        if !self.reasoning.is_empty() {
            content.push(ContentBlock::Reasoning {
                text: self.reasoning.clone(),
            });
        }
        if !self.text.is_empty() {
            content.push(ContentBlock::Text {
                text: self.text.clone(),
            });
        }
        if complete {
            for c in &self.calls {
                content.push(ContentBlock::ToolUse {
                    id: c.id.clone(),
                    server: None,
                    name: c.name.clone(),
                    arguments: c
                        .arguments
                        .clone()
                        .unwrap_or_else(|| Value::String(c.raw_arguments.clone())),
                });
            }
        }
        content
    }

    fn calls(&self) -> Vec<GatedCall> {
        self.calls
            .iter()
            .map(|c| GatedCall {
                call: ToolCall {
                    id: c.id.clone(),
                    server: None,
                    name: c.name.clone(),
                    arguments: c.arguments.clone().unwrap_or(Value::Null),
                },
                gate: None,
                invalid: match (&c.arguments, &c.failure) {
                    (_, Some(reason)) => Some(reason.clone()),
                    (None, None) => Some("the call was never completed".into()),
                    (Some(_), None) => None,
                },
            })
            .collect()
    }
}
