//! Running a step's tool calls: gates and pauses, the calls run
//! concurrently (bounded), progress, interjections and cancellation.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use toolwire_core::{
    AgentEvent, Decision, Gate, GatedCall, Message, MessageId, PendingApproval, Progress,
    StopReason, ToolCallId,
};
use toolwire_tools::{ProgressHandle, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

use super::assemble::user_message;
use super::{Stop, Turn};
use crate::approval;
use crate::config::InterjectionMode;
use crate::notify::NOTIFICATION_TOOL;

/// Progress reports of a step's tools waiting to be stored: a tool that
/// reports faster than they are stored waits for room.
const PROGRESS_QUEUED: usize = 256;

/// A call of the current step and how it is to be answered.
pub(super) struct PendingCall {
    id: ToolCallId,
    name: String,
    arguments: Value,
    /// The call could not be parsed; answered with this error unrun.
    invalid: Option<String>,
    /// Answered without running (a denial, or the client's result).
    answer: Option<ToolOutput>,
}

impl PendingCall {
    pub(super) fn from_gated(c: GatedCall) -> Self {
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
    /// The tools of this turn.
    pub(super) fn tools(&self) -> &ToolRegistry {
        self.options.tools.as_ref().unwrap_or(self.cx.tools)
    }

    /// What the model is told it can call: the turn's tools, and the
    /// client's (which win over a server tool of the same name).
    pub(super) fn specs(&self) -> Vec<Arc<ToolSpec>> {
        let client = &self.options.client_tools;
        let mut specs = self.tools().specs();
        if !client.is_empty() {
            specs.retain(|s| !client.iter().any(|c| c.name == s.name));
            specs.extend(client.iter().cloned().map(Arc::new));
        }
        specs
    }

    /// Why `name`'s calls wait, if they do.
    pub(super) fn gate(&self, name: &str) -> Option<Gate> {
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
    pub(super) async fn pause(
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
        approval::save(self.cx.store, &pending).await?;
        Ok(())
    }

    /// Takes the pause (so that it is answered once) and turns the answers
    /// into the calls to run: approved and ungated calls run, the others
    /// are answered with the denial or the client's result.
    pub(super) async fn resume(
        &mut self,
        pending: PendingApproval,
        mut decisions: HashMap<ToolCallId, Decision>,
        then: Option<String>,
    ) -> Result<(Vec<PendingCall>, Option<String>), Stop> {
        if !approval::take(self.cx.store, self.conversation).await? {
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
        approval::record(self.cx.store, pending.clone(), order.clone()).await?;
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
                    Some(Decision::Result { content, is_error }) => Some(ToolOutput {
                        content,
                        is_error,
                        images: Vec::new(),
                    }),
                };
                call
            })
            .collect();
        Ok((calls, then))
    }

    /// Answers every call of the pause as not run.
    pub(super) async fn abandon(
        &mut self,
        pending: PendingApproval,
        reason: &str,
    ) -> Result<(), Stop> {
        if !approval::take(self.cx.store, self.conversation).await? {
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
        approval::record(self.cx.store, pending.clone(), decisions.clone()).await?;
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

    /// Runs the step's calls, at most `tool_concurrency` at once, storing
    /// each result as it completes. Interjections are taken when a tool
    /// completes; calls not yet started are then skipped.
    pub(super) async fn run_tools(
        &mut self,
        iteration: u32,
        calls: Vec<PendingCall>,
    ) -> Result<(), Stop> {
        // Made when the first tool runs.
        let mut shared: Option<Arc<[Message]>> = None;
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
        let limit = self.cx.config.tool_concurrency.max(1);
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
                    let available: Vec<String> =
                        self.specs().iter().map(|s| s.name.clone()).collect();
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
            self.cx.bus.emit_all(self.conversation, starts).await?;
            if shared.is_none() && !ready.is_empty() {
                shared = Some(self.tools_path().await?);
            }
            let path = shared.clone().unwrap_or_else(|| Arc::from(Vec::new()));
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
                    notifier: self.cx.notifier.clone(),
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
                abort_at = Some(tokio::time::Instant::now() + self.cx.config.tool_cancel_grace);
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
                    let reminder = match self.cx.config.interjections {
                        InterjectionMode::Reminder if !new.is_empty() => Some(new.join("\n\n")),
                        _ => {
                            interjected.extend(new);
                            None
                        }
                    };
                    let reminded = reminder.is_some();
                    self.store_result(&call_id, result, took, reminder).await?;
                    if reminded {
                        self.interjections_stored().await;
                    }
                }
            }
        }
        // Calls never started: answered, so every call has a result.
        let skip_reason = if self.cx.stopping.is_stopping() {
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
            self.cx.bus.store_message(&user, vec![event]).await?;
            self.on_path(&user);
            self.interjections_stored().await;
        }
        Ok(())
    }

    /// Taken words are stored on a message: the store's copy of what
    /// waits follows (kept until then, should the process die).
    async fn interjections_stored(&self) {
        let (active, conversation) = (self.cx.active, self.conversation);
        self.cx
            .interjections
            .keep_or_warn(conversation, || super::queued(active, conversation))
            .await;
    }

    pub(super) fn take_interjections(&self) -> Vec<String> {
        match self.cx.active.lock() {
            Ok(mut active) => active
                .get_mut(&self.conversation)
                .map(|t| t.interjections.drain(..).collect())
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Emits `first` and what else waits in `rx`, consecutive output of
    /// one call joined into one event: one store write per burst rather
    /// than per read of a chatty command.
    pub(super) async fn emit_progress(
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
}
