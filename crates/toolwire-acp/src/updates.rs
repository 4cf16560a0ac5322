//! A turn's events as `session/update` notifications. Tool calls go
//! through a [`ToolCallTracker`], so each `tool_call_update` carries only
//! what changed, coalesced and rate-limited per call; titles and locations
//! sharpen as the model writes the arguments; a command's output streams
//! as appended `_meta.terminal_output` (clients that advertise it) or as a
//! bounded, replaced tail, throttled further once a call has sent its
//! byte budget. `update_plan` calls are not shown as tool calls: each one
//! the tool accepts becomes a `plan` update (as codex-acp does).

use std::collections::HashMap;
use std::time::Instant;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentChunk, SessionId, SessionNotification, SessionUpdate,
};
use serde_json::{Map, Value, json};
use toolwire_core::{
    AgentEvent, ContentBlock, Location, Message, MessageId, Progress, ToolCall, ToolCallContent,
    ToolCallId, ToolCallPatch, ToolCallState, ToolCallStatus, ToolCallTracker, TrackerError,
    TrackerMetrics,
};

use crate::state::Session;
use crate::usage::Meter;
use crate::views::CallView;
use crate::{convert, notify, titles};
use toolwire_core::tool_events::{failure_text, result_text_with_images};
use toolwire_tools::builtin::UPDATE_PLAN;

/// What is known of one call beyond what the tracker keeps.
#[derive(Debug, Default)]
struct CallInfo {
    name: String,
    /// The argument fields complete so far.
    args: Map<String, Value>,
    /// The whole arguments, once the call is generated.
    arguments: Option<Value>,
    /// Output went out as appended terminal output.
    streamed: bool,
    /// `_meta.terminal_info` went out.
    terminal_shown: bool,
    /// The tool reported locations while it ran: the replay needs them
    /// kept.
    moved: bool,
}

impl CallInfo {
    /// An `update_plan` call: shown as a `plan`, not as a tool call.
    fn is_plan(&self) -> bool {
        self.name == UPDATE_PLAN
    }
}

pub(crate) struct Updates<'a> {
    session_id: SessionId,
    session: &'a Session,
    cx: &'a ConnectionTo<Client>,
    tracker: ToolCallTracker,
    calls: HashMap<ToolCallId, CallInfo>,
    /// The assistant message of each call, for its stored view.
    messages: HashMap<ToolCallId, MessageId>,
    /// What the calls' final updates left shown, to be stored.
    views: Vec<(MessageId, ToolCallId, CallView)>,
    /// Usage and cost, as the turn's steps report them.
    meter: Option<&'a mut Meter>,
    /// The model's text not sent yet (joined within the window).
    text: Option<WaitingText>,
}

/// Which of the model's streams a text chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Message,
    Thought,
}

impl Stream {
    fn chunk(self, text: &str) -> SessionUpdate {
        let chunk = ContentChunk::new(convert::text_block(text));
        match self {
            Stream::Message => SessionUpdate::AgentMessageChunk(chunk),
            Stream::Thought => SessionUpdate::AgentThoughtChunk(chunk),
        }
    }
}

#[derive(Debug)]
struct WaitingText {
    stream: Stream,
    text: String,
    since: Instant,
}

impl<'a> Updates<'a> {
    pub(crate) fn new(
        session_id: SessionId,
        session: &'a Session,
        cx: &'a ConnectionTo<Client>,
    ) -> Self {
        Updates {
            session_id,
            session,
            cx,
            tracker: ToolCallTracker::new(session.tracker.clone()),
            calls: HashMap::new(),
            messages: HashMap::new(),
            views: Vec::new(),
            meter: None,
            text: None,
        }
    }

    /// These updates, with a `usage_update` after each step `meter` counts.
    pub(crate) fn metered(mut self, meter: &'a mut Meter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// The final views of the calls that ended, taken.
    pub(crate) fn take_views(&mut self) -> Vec<(MessageId, ToolCallId, CallView)> {
        std::mem::take(&mut self.views)
    }

    pub(crate) fn metrics(&self) -> TrackerMetrics {
        *self.tracker.metrics()
    }

    fn send(&self, update: SessionUpdate) -> Result<(), agent_client_protocol::Error> {
        self.cx
            .send_notification(SessionNotification::new(self.session_id.clone(), update))
    }

    /// The tool call of the permission request about `call`: what the
    /// editor was not sent yet of it (its arguments' title and locations,
    /// its raw input, the diff `preview` it would make), with its title and
    /// kind (a dialog names the call). What the request carries counts as
    /// sent, so no update repeats it. `None` for a call not announced.
    pub(crate) fn asked_about(
        &mut self,
        call: &ToolCall,
        preview: Option<ToolCallContent>,
        now: Instant,
    ) -> Option<agent_client_protocol::v1::schema::ToolCallUpdate> {
        self.tracker.current(&call.id)?;
        let mut patch = self
            .described(&call.id, &call.arguments)
            .raw_input(call.arguments.clone());
        if let Some(preview) = preview {
            patch = patch.content(vec![preview]);
        }
        self.tracker.push(patch, now).ok()?;
        let mut unsent = match self.tracker.flush(&call.id, now) {
            Ok(Some(unsent)) => unsent,
            _ => ToolCallPatch::new(call.id.clone()),
        };
        let shown = self.tracker.last_sent(&call.id)?;
        unsent.title = Some(shown.title.clone());
        unsent.kind = Some(shown.kind);
        Some(convert::tool_call_update(&unsent))
    }

    pub(crate) fn event(&mut self, event: &AgentEvent) -> Result<(), agent_client_protocol::Error> {
        let now = Instant::now();
        match event {
            AgentEvent::TextDelta { text, .. } => {
                return self.text(Stream::Message, text, now);
            }
            AgentEvent::ReasoningDelta { text, .. } => {
                return self.text(Stream::Thought, text, now);
            }
            // Whatever else comes after the text waiting: it goes first.
            _ => self.flush_text()?,
        }
        match event {
            AgentEvent::ToolCallStarted { call_id, name, .. } => self.announce(call_id, name),
            AgentEvent::ArgumentField {
                call_id,
                key,
                value,
                ..
            } => {
                let Some(info) = self.calls.get_mut(call_id) else {
                    return Ok(());
                };
                info.args.insert(key.clone(), value.clone());
                if info.is_plan() {
                    return Ok(());
                }
                let args = Value::Object(info.args.clone());
                let patch = self.described(call_id, &args);
                self.patch(patch, now)
            }
            AgentEvent::AssistantMessageCreated { message, .. } => {
                for block in &message.content {
                    if let ContentBlock::ToolUse { id, .. } = block {
                        self.messages.insert(id.clone(), message.id);
                    }
                }
                match self.meter.as_mut().and_then(|m| m.step(message)) {
                    Some(usage) => self.send(SessionUpdate::UsageUpdate(usage)),
                    None => Ok(()),
                }
            }
            AgentEvent::ToolCallsGenerated {
                calls, message_id, ..
            } => {
                for call in calls {
                    self.messages.insert(call.id.clone(), *message_id);
                    self.announce(&call.id, &call.name)?;
                    if self.generated_plan(call) {
                        continue;
                    }
                    let patch = self
                        .described(&call.id, &call.arguments)
                        .raw_input(call.arguments.clone());
                    self.patch(patch, now)?;
                }
                Ok(())
            }
            AgentEvent::ApprovalRequested {
                calls, message_id, ..
            } => {
                for gated in calls {
                    let call = &gated.call;
                    self.messages.insert(call.id.clone(), *message_id);
                    self.announce(&call.id, &call.name)?;
                    if self.generated_plan(call) {
                        continue;
                    }
                    let patch = self
                        .described(&call.id, &call.arguments)
                        .raw_input(call.arguments.clone());
                    self.patch(patch, now)?;
                    // A call that is not asked about is shown now; the
                    // permission request of one that is carries what waits.
                    if gated.gate.is_none() {
                        self.flush(&call.id, now)?;
                    }
                }
                Ok(())
            }
            AgentEvent::ToolExecutionStarted { call_id, name, .. } => {
                self.announce(call_id, name)?;
                if self.is_plan(call_id) {
                    return Ok(());
                }
                self.patch(
                    ToolCallPatch::new(call_id.clone()).status(ToolCallStatus::InProgress),
                    now,
                )?;
                // Sent now, not merged into a quick call's completion:
                // every status change reaches the client.
                self.flush(call_id, now)
            }
            AgentEvent::ToolExecutionProgress {
                call_id, progress, ..
            } => match progress {
                Progress::Output { text } => self.output(call_id, text, now),
                Progress::Locations { locations } => {
                    // A place already shown with its line keeps it when the
                    // tool names the file alone: nothing changed to send.
                    let shown = self
                        .tracker
                        .current(call_id)
                        .map(|s| s.locations.clone())
                        .unwrap_or_default();
                    let locations: Vec<Location> = locations
                        .iter()
                        .map(|l| {
                            let path = titles::absolute(&self.session.cwd, &l.path);
                            let line = l.line.or_else(|| {
                                shown.iter().find(|s| s.path == path).and_then(|s| s.line)
                            });
                            Location { path, line }
                        })
                        .collect();
                    if locations != shown
                        && let Some(info) = self.calls.get_mut(call_id)
                    {
                        info.moved = true;
                    }
                    self.patch(
                        ToolCallPatch::new(call_id.clone()).locations(locations),
                        now,
                    )
                }
                // A command in the editor's terminal says so: the call
                // shows that terminal. Other status lines (an MCP server's
                // progress) show while the call has nothing else to show.
                Progress::Status { text } => match self.client_terminal(call_id) {
                    Some(terminal_id) => self.patch(
                        ToolCallPatch::new(call_id.clone())
                            .content(vec![ToolCallContent::Terminal { terminal_id }]),
                        now,
                    ),
                    None => {
                        let tracked = self.tracker.status_line(call_id, text, now);
                        self.send_tracked(tracked, None, "status line dropped")
                    }
                },
            },
            // The plan the tool accepted (one it refused is not shown: the
            // model is told and tries again).
            AgentEvent::ToolExecutionCompleted {
                call_id, message, ..
            } if self.is_plan(call_id) => {
                if result_is_error(message, call_id) {
                    return Ok(());
                }
                self.send_plan(call_id)
            }
            AgentEvent::ToolExecutionFailed { call_id, .. } if self.is_plan(call_id) => Ok(()),
            // A call that did not succeed (rejected, cancelled, or its tool
            // reported an error) is `failed` for the client.
            AgentEvent::ToolExecutionCompleted {
                call_id, message, ..
            } if result_is_error(message, call_id) => self.finish(
                call_id,
                ToolCallStatus::Failed,
                result_text_with_images(message, call_id),
                now,
            ),
            AgentEvent::ToolExecutionCompleted {
                call_id, message, ..
            } => self.finish(
                call_id,
                ToolCallStatus::Completed,
                result_text_with_images(message, call_id),
                now,
            ),
            AgentEvent::ToolExecutionFailed {
                call_id,
                error,
                message,
                ..
            } => self.finish(
                call_id,
                ToolCallStatus::Failed,
                failure_text(message, call_id, error),
                now,
            ),
            AgentEvent::NotificationsInjected { notices, .. } => {
                // After the result they ride on, as the model reads them.
                self.flush_all(now)?;
                self.send(SessionUpdate::AgentThoughtChunk(ContentChunk::new(
                    convert::text_block(&notify::thought_text(notices)),
                )))
            }
            _ => Ok(()),
        }
    }

    /// The editor terminal call `id` runs in, if any.
    fn client_terminal(&self, id: &ToolCallId) -> Option<String> {
        self.session.terminals.lock().ok()?.get(id).cloned()
    }

    fn is_plan(&self, id: &ToolCallId) -> bool {
        self.calls.get(id).is_some_and(CallInfo::is_plan)
    }

    /// Keeps the arguments of a generated `update_plan` call; true if
    /// `call` is one (and so is not shown as a tool call).
    fn generated_plan(&mut self, call: &ToolCall) -> bool {
        match self.calls.get_mut(&call.id) {
            Some(info) if info.is_plan() => {
                info.arguments = Some(call.arguments.clone());
                true
            }
            _ => false,
        }
    }

    /// The `plan` update of the `update_plan` call `id`, after the tool
    /// accepted it: its arguments are complete and valid, and the editor
    /// shows the plan the model was told it recorded. (Earlier, on
    /// `ToolCallsGenerated`, a refused or rejected plan would show.)
    fn send_plan(&mut self, id: &ToolCallId) -> Result<(), agent_client_protocol::Error> {
        // Whatever waits (other calls' updates) goes first, in order.
        self.flush_all(Instant::now())?;
        let Some(info) = self.calls.get(id) else {
            return Ok(());
        };
        let arguments = info
            .arguments
            .clone()
            .unwrap_or_else(|| Value::Object(info.args.clone()));
        match convert::plan(&arguments) {
            Some(plan) => self.send(SessionUpdate::Plan(plan)),
            None => Ok(()),
        }
    }

    /// A patch with the title, kind and locations `args` give.
    fn described(&self, id: &ToolCallId, args: &Value) -> ToolCallPatch {
        let name = self.calls.get(id).map(|c| c.name.as_str()).unwrap_or("");
        let d = titles::describe(name, args, &self.session.cwd);
        ToolCallPatch::new(id.clone())
            .title(d.title)
            .kind(d.kind)
            .locations(d.locations)
    }

    /// Sends the `tool_call` of a call not announced yet.
    fn announce(
        &mut self,
        id: &ToolCallId,
        name: &str,
    ) -> Result<(), agent_client_protocol::Error> {
        if self.calls.contains_key(id) {
            return Ok(());
        }
        self.calls.insert(
            id.clone(),
            CallInfo {
                name: name.to_owned(),
                ..CallInfo::default()
            },
        );
        if name == UPDATE_PLAN {
            return Ok(());
        }
        let d = titles::describe(name, &Value::Object(Map::new()), &self.session.cwd);
        let mut state = ToolCallState::new(id.clone(), d.title, d.kind);
        state.locations = d.locations;
        match self.tracker.announce(state) {
            Ok(state) => self.send(SessionUpdate::ToolCall(convert::tool_call(&state))),
            Err(e) => {
                tracing::debug!(error = %e, "tool call not announced");
                Ok(())
            }
        }
    }

    /// Records `patch`; sends what is due.
    fn patch(
        &mut self,
        patch: ToolCallPatch,
        now: Instant,
    ) -> Result<(), agent_client_protocol::Error> {
        let tracked = self.tracker.update(patch, now);
        self.send_tracked(tracked, None, "tool call update dropped")
    }

    /// Sends what the tracker gave out, if anything; a change it refused
    /// (an unknown call, a status going back) is one the editor must not
    /// see, so it is only logged.
    fn send_tracked(
        &mut self,
        tracked: Result<Option<ToolCallPatch>, TrackerError>,
        exit: Option<Value>,
        dropped: &str,
    ) -> Result<(), agent_client_protocol::Error> {
        match tracked {
            Ok(Some(patch)) => self.send_patch(patch, exit),
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, "{dropped}");
                Ok(())
            }
        }
    }

    /// A command's output, to the tracker (whose window, rate and per-call
    /// byte budget bound how often it goes out).
    fn output(
        &mut self,
        id: &ToolCallId,
        text: &str,
        now: Instant,
    ) -> Result<(), agent_client_protocol::Error> {
        if let Some(info) = self.calls.get_mut(id) {
            info.streamed |= self.tracker.config().appended_output;
        }
        let tracked = self.tracker.append_output(id, text, now);
        self.send_tracked(tracked, None, "output dropped")
    }

    /// The call's final status and result, sent at once.
    fn finish(
        &mut self,
        id: &ToolCallId,
        status: ToolCallStatus,
        result: String,
        now: Instant,
    ) -> Result<(), agent_client_protocol::Error> {
        let streamed = self.calls.get(id).is_some_and(|c| c.streamed);
        let diff = self.session.diffs.take(id);
        let mut patch = ToolCallPatch::new(id.clone()).status(status);
        let mut exit = None;
        if let Some(terminal_id) = self.client_terminal(id) {
            // The editor's terminal shows the output; the call keeps it.
            patch = patch.content(vec![ToolCallContent::Terminal { terminal_id }]);
            if let Ok(mut terminals) = self.session.terminals.lock() {
                terminals.remove(id);
            }
        } else if streamed {
            // The terminal already shows the output; its exit status ends it.
            let ended = terminal_exit(id, &result);
            if ended["exit_code"].is_null() && ended["signal"].is_null() {
                // Ended without an exit status (timed out, cancelled):
                // the reason shows under the terminal.
                let why = result.lines().rev().find(|l| !l.trim().is_empty());
                patch = patch.content(vec![
                    ToolCallContent::Terminal {
                        terminal_id: id.0.clone(),
                    },
                    ToolCallContent::text(why.unwrap_or(&result)),
                ]);
            }
            exit = Some(ended);
        } else {
            // An edit that ran shows the diff it made (as editors show an
            // agent's edits), its result under it; a failed one its error.
            // A diff the permission request showed stays shown: ACP
            // replaces content whole, so the result goes beside it, as the
            // raw output, rather than the diff a second time.
            let diff = diff.filter(|_| status == ToolCallStatus::Completed);
            let shown = self
                .tracker
                .last_sent(id)
                .is_some_and(|sent| diff.as_ref().is_some_and(|d| sent.content == [d.clone()]));
            if shown {
                patch = patch.raw_output(Value::String(result));
            } else {
                let mut content: Vec<ToolCallContent> = diff.into_iter().collect();
                content.push(ToolCallContent::text(result));
                patch = patch.content(content);
            }
        }
        let view = self.final_view(id, &patch);
        if let Err(e) = self.tracker.push(patch, now) {
            tracing::debug!(error = %e, "final update dropped");
            return Ok(());
        }
        if let (Some(view), Some(message)) = (view, self.messages.get(id)) {
            self.views.push((*message, id.clone(), view));
        }
        let tracked = self.tracker.flush(id, now);
        self.send_tracked(tracked, exit, "final update dropped")
    }

    /// What call `id` shows once `last` (its final patch) is applied, when
    /// a replay could not show it from the stored messages: a diff, or
    /// locations the tool reported.
    fn final_view(&self, id: &ToolCallId, last: &ToolCallPatch) -> Option<CallView> {
        let mut state = self.tracker.current(id)?.clone();
        last.apply_to(&mut state);
        let has_diff = state
            .content
            .iter()
            .any(|c| matches!(c, ToolCallContent::Diff { .. }));
        let moved = self.calls.get(id).is_some_and(|c| c.moved);
        if !has_diff && !moved {
            return None;
        }
        Some(CallView {
            content: has_diff.then(|| state.content.clone()),
            locations: moved.then(|| state.locations.clone()),
            raw_output: state.raw_output.clone().filter(|_| has_diff),
        })
    }

    /// Ends, as failed with `why`, the calls still open when the prompt
    /// ends: announced while the model wrote them and never run (a cancel,
    /// a turn that failed), they would otherwise show pending forever.
    pub(crate) fn end_open_calls(
        &mut self,
        why: &str,
        now: Instant,
    ) -> Result<(), agent_client_protocol::Error> {
        for id in self.tracker.unfinished() {
            self.finish(&id, ToolCallStatus::Failed, why.to_owned(), now)?;
        }
        Ok(())
    }

    fn flush(&mut self, id: &ToolCallId, now: Instant) -> Result<(), agent_client_protocol::Error> {
        match self.tracker.flush(id, now) {
            Ok(Some(patch)) => self.send_patch(patch, None),
            _ => Ok(()),
        }
    }

    /// Sends everything waiting (before text that must come after it, and
    /// at the end of the turn).
    pub(crate) fn flush_all(&mut self, now: Instant) -> Result<(), agent_client_protocol::Error> {
        self.flush_text()?;
        for patch in self.tracker.flush_all(now) {
            self.send_patch(patch, None)?;
        }
        Ok(())
    }

    /// Sends `text` as the agent's words, after everything waiting.
    pub(crate) fn say(
        &mut self,
        text: &str,
        now: Instant,
    ) -> Result<(), agent_client_protocol::Error> {
        self.flush_all(now)?;
        self.send(Stream::Message.chunk(text))
    }

    /// When something waiting becomes due.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let text = self
            .text
            .as_ref()
            .map(|t| t.since + self.tracker.config().window);
        match (self.tracker.next_deadline(), text) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Text of the model, joined with the text of the same kind that came
    /// within the coalescing window (a model streams a few characters at a
    /// time, and each chunk on its own costs a notification's envelope).
    fn text(
        &mut self,
        stream: Stream,
        text: &str,
        now: Instant,
    ) -> Result<(), agent_client_protocol::Error> {
        if !self.tracker.config().coalesce {
            return self.send(stream.chunk(text));
        }
        match &mut self.text {
            Some(waiting) if waiting.stream == stream => waiting.text.push_str(text),
            _ => {
                self.flush_text()?;
                // Tool call changes that came before the text go before it.
                for patch in self.tracker.flush_all(now) {
                    self.send_patch(patch, None)?;
                }
                self.text = Some(WaitingText {
                    stream,
                    text: text.to_owned(),
                    since: now,
                });
            }
        }
        Ok(())
    }

    fn flush_text(&mut self) -> Result<(), agent_client_protocol::Error> {
        match self.text.take() {
            Some(waiting) => self.send(waiting.stream.chunk(&waiting.text)),
            None => Ok(()),
        }
    }

    /// Sends what is due at `now`.
    pub(crate) fn tick(&mut self, now: Instant) -> Result<(), agent_client_protocol::Error> {
        if self
            .text
            .as_ref()
            .is_some_and(|t| t.since + self.tracker.config().window <= now)
        {
            self.flush_text()?;
        }
        for patch in self.tracker.due(now) {
            self.send_patch(patch, None)?;
        }
        Ok(())
    }

    fn send_patch(
        &mut self,
        patch: ToolCallPatch,
        exit: Option<Value>,
    ) -> Result<(), agent_client_protocol::Error> {
        let info = self.terminal_info(&patch);
        self.send(SessionUpdate::ToolCallUpdate(wire(&patch, info, exit)))
    }

    /// `_meta.terminal_info` for a call's first appended output, once: the
    /// terminal's id and the command's directory, so the client can open
    /// the terminal the output goes to.
    fn terminal_info(&mut self, patch: &ToolCallPatch) -> Option<Value> {
        let output = patch.terminal_output.as_ref()?;
        let call = self.calls.get_mut(&patch.id)?;
        if std::mem::replace(&mut call.terminal_shown, true) {
            return None;
        }
        let cwd = call
            .args
            .get("cwd")
            .or(call.arguments.as_ref().and_then(|a| a.get("cwd")))
            .and_then(Value::as_str)
            .map_or_else(
                || self.session.cwd.display().to_string(),
                |cwd| titles::absolute(&self.session.cwd, cwd),
            );
        Some(json!({"terminal_id": output.terminal_id, "cwd": cwd}))
    }
}

/// The `tool_call_update` of `patch`: the terminal a streamed command
/// shows, its appended output and its exit in `_meta` (the codex-acp /
/// claude-agent-acp names).
fn wire(
    patch: &ToolCallPatch,
    info: Option<Value>,
    exit: Option<Value>,
) -> agent_client_protocol::v1::schema::ToolCallUpdate {
    let mut update = convert::tool_call_update(patch);
    let mut meta = Map::new();
    if let Some(info) = info {
        meta.insert("terminal_info".into(), info);
    }
    if let Some(output) = &patch.terminal_output {
        meta.insert(
            "terminal_output".into(),
            json!({"terminal_id": output.terminal_id, "data": output.data}),
        );
    }
    if let Some(exit) = exit {
        meta.insert("terminal_exit".into(), exit);
    }
    if !meta.is_empty() {
        update.meta = Some(meta);
    }
    update
}

/// `_meta.terminal_exit` of a command whose result ends with run_command's
/// `[exit code: N]` or `[killed by signal S]`.
fn terminal_exit(id: &ToolCallId, result: &str) -> Value {
    let after = |marker: &str| -> Option<i64> {
        let start = result.rfind(marker)? + marker.len();
        let rest = &result[start..];
        let end = rest.find(']')?;
        rest[..end].trim().parse().ok()
    };
    json!({
        "terminal_id": id.0,
        "exit_code": after("[exit code:"),
        "signal": after("[killed by signal"),
    })
}

/// Whether the result of call `id` in `message` is an error.
fn result_is_error(message: &Message, id: &ToolCallId) -> bool {
    message.content.iter().any(|block| {
        matches!(block, ContentBlock::ToolResult { tool_use_id, is_error: true, .. } if tool_use_id == id)
    })
}

/// Adds `more` to `total`.
pub(crate) fn add_metrics(total: &mut TrackerMetrics, more: &TrackerMetrics) {
    total.announced += more.announced;
    total.announce_bytes += more.announce_bytes;
    total.updates_sent += more.updates_sent;
    total.coalesced += more.coalesced;
    total.suppressed += more.suppressed;
    total.patch_bytes += more.patch_bytes;
    total.complete_bytes += more.complete_bytes;
}

/// One line for the log.
pub fn session_metrics_line(m: &TrackerMetrics) -> String {
    format!(
        "tool calls: {} announced; updates: {} sent, {} coalesced, {} suppressed (no change); \
         {} bytes sent against {} as complete objects ({:.0}% saved)",
        m.announced,
        m.updates_sent,
        m.coalesced,
        m.suppressed,
        m.patch_bytes,
        m.complete_bytes,
        m.saved() * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_is_read_from_the_result() {
        let id = ToolCallId("c".into());
        assert_eq!(
            terminal_exit(&id, "out\n[exit code: 2]"),
            json!({"terminal_id": "c", "exit_code": 2, "signal": null})
        );
        assert_eq!(
            terminal_exit(&id, "[killed by signal 9]"),
            json!({"terminal_id": "c", "exit_code": null, "signal": 9})
        );
    }

    #[test]
    fn appended_output_goes_in_meta() {
        let mut patch = ToolCallPatch::new("c");
        patch.terminal_output = Some(toolwire_core::TerminalOutput {
            terminal_id: "c".into(),
            data: "hi\n".into(),
        });
        let json = serde_json::to_value(wire(&patch, None, None)).unwrap_or_default();
        assert_eq!(
            json,
            json!({"toolCallId": "c", "_meta": {"terminal_output": {"terminal_id": "c", "data": "hi\n"}}})
        );
    }
}
