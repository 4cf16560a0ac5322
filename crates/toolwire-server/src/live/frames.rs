//! From a conversation's stored events to the socket's frames
//! (`PROTOCOL.md`), and the running turn's state for a snapshot.
//!
//! Tool calls go through the core's [`ToolCallTracker`] with coalescing:
//! a `tool_update` carries only what changed. A status change is sent at
//! once (with whatever waited for the call), so every client sees each
//! call go pending → executing → completed whatever the timing; other
//! changes (streamed output, say) wait for the tracker's window. A
//! renderer fed a turn's earlier events silently ([`Renderer::prime`])
//! sends after that only what those events had not already said.

use std::time::Instant;

use serde_json::{Map, Value, json};
use toolwire_core::{
    AgentEvent, ContentBlock, Gate, GatedCall, Message, MessageId, OUTPUT_LIMIT, OutputTail,
    PendingApproval, Role, RunId, ToolCallChange, ToolCallId, ToolCallPatch, ToolCallState,
    ToolCallStatus, ToolCallTracker, TrackerConfig, kind_of, tool_events,
};
use toolwire_store::StoredEvent;

/// The text a turn woken by notifications gives its otherwise empty user
/// message (the engine's wording).
const WOKEN: &str = "(woken by a notification)";

/// What the running turn has shown of one call.
#[derive(Debug, Clone)]
struct Card {
    id: ToolCallId,
    name: String,
    message_id: Option<MessageId>,
    status: ToolCallStatus,
    /// The argument fields complete so far (all of them once generated).
    arguments: Map<String, Value>,
    /// The output's last [`OUTPUT_LIMIT`] bytes: a command may print
    /// gigabytes, and every socket keeps its own cards.
    output: OutputTail,
    result: Option<String>,
}

/// The live view's name of a call's status.
fn status_name(status: ToolCallStatus) -> &'static str {
    match status {
        ToolCallStatus::Pending => "pending",
        ToolCallStatus::InProgress => "executing",
        ToolCallStatus::Completed => "completed",
        ToolCallStatus::Failed => "failed",
    }
}

/// The fields of `patch`, as the live view names them.
fn patch_fields(patch: &ToolCallPatch) -> Value {
    let mut fields = Map::new();
    if let Some(title) = &patch.title {
        fields.insert("title".into(), json!(title));
    }
    if let Some(kind) = patch.kind {
        fields.insert("kind".into(), json!(kind));
    }
    if let Some(status) = patch.status {
        fields.insert("status".into(), json!(status_name(status)));
    }
    if let Some(content) = &patch.content {
        fields.insert("content".into(), json!(content));
    }
    if let Some(locations) = &patch.locations {
        fields.insert("locations".into(), json!(locations));
    }
    if let Some(raw) = &patch.raw_input {
        fields.insert("raw_input".into(), raw.clone());
    }
    if let Some(raw) = &patch.raw_output {
        fields.insert("raw_output".into(), raw.clone());
    }
    Value::Object(fields)
}

/// A conversation's events as frames, for one socket.
#[derive(Debug)]
pub struct Renderer {
    tracker: ToolCallTracker,
    run: Option<RunId>,
    /// The message the current model call is writing.
    step: Option<MessageId>,
    /// Assistant text streamed since the last stored message.
    text: String,
    cards: Vec<Card>,
    /// Calls waiting for an answer.
    waiting: Vec<Value>,
    /// The last event rendered: the seq of frames the tracker's timer
    /// sends, so that seqs never go down.
    last_seq: u64,
}

impl Default for Renderer {
    fn default() -> Self {
        Renderer {
            tracker: ToolCallTracker::new(TrackerConfig::coalescing()),
            run: None,
            step: None,
            text: String::new(),
            cards: Vec::new(),
            waiting: Vec::new(),
            last_seq: 0,
        }
    }
}

impl Renderer {
    /// Feeds `events` (a turn's earlier ones) without sending anything:
    /// what they said counts as sent.
    pub fn prime(&mut self, events: &[StoredEvent]) {
        let now = Instant::now();
        for event in events {
            let _ = self.event(event, now);
        }
        let _ = self.tracker.flush_all(now);
    }

    /// After [`Renderer::prime`] for a client resuming after a seq: a
    /// `tool_update` with the whole state of each call still running
    /// (marked `"resync": true`). The client's last socket may have been
    /// holding some of their changes back for coalescing when it closed,
    /// while frames of later events (the seq the client resumes after)
    /// went out; priming counts those changes as sent, so without this
    /// they would never reach the client. A finished call held nothing: a
    /// status change goes out at once with whatever waited.
    pub fn resume(&self, seq: u64) -> Vec<Value> {
        self.cards
            .iter()
            .filter_map(|card| self.tracker.current(&card.id))
            .filter(|state| !state.status.is_terminal())
            .map(|state| {
                let mut frame = self.tool_update(seq, &ToolCallPatch::complete(state));
                frame["resync"] = json!(true);
                frame
            })
            .collect()
    }

    /// When the tracker next has a coalesced patch to send.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.tracker.next_deadline()
    }

    /// Coalesced patches whose time has come.
    pub fn due(&mut self, now: Instant) -> Vec<Value> {
        let seq = self.last_seq;
        let patches = self.tracker.due(now);
        patches
            .into_iter()
            .map(|p| self.tool_update(seq, &p))
            .collect()
    }

    /// The frames of one stored event.
    pub fn event(&mut self, stored: &StoredEvent, now: Instant) -> Vec<Value> {
        let seq = stored.seq;
        self.last_seq = self.last_seq.max(seq);
        let event = &stored.event;
        let mut frames = Vec::new();
        let run_id = event.run_id();
        if self.run != Some(run_id) {
            self.start_run(run_id);
            frames.push(json!({"type": "turn_started", "seq": seq, "run_id": run_id}));
        }
        match event {
            AgentEvent::TurnStarted { message, .. } => {
                let woken = message.role == Role::User
                    && message
                        .content
                        .iter()
                        .any(|b| matches!(b, ContentBlock::Notification { .. }))
                    && message.text().trim() == WOKEN;
                let source = if woken { "notification" } else { "user" };
                frames.push(self.conv_update(seq, message, source));
            }
            AgentEvent::StepStarted { message_id, .. } => {
                self.step = Some(*message_id);
                self.text.clear();
            }
            AgentEvent::ModelFallback {
                run_id,
                message_id,
                from,
                to,
                reason,
                ..
            } => {
                frames.push(json!({"type": "model_fallback", "seq": seq, "run_id": run_id, "message_id": message_id, "from": from, "to": to, "reason": reason}));
            }
            AgentEvent::TextDelta { run_id, text } => {
                self.text.push_str(text);
                frames.push(json!({"type": "text_delta", "seq": seq, "run_id": run_id, "kind": "text", "text": text}));
            }
            AgentEvent::ReasoningDelta { run_id, text } => {
                frames.push(json!({"type": "text_delta", "seq": seq, "run_id": run_id, "kind": "reasoning", "text": text}));
            }
            AgentEvent::AssistantMessageCreated { message, .. } => {
                // Stored now: the tree shows it, the stream starts over.
                self.text.clear();
                for (id, _, name, _) in message.tool_uses() {
                    self.card(id, name).message_id = Some(message.id);
                }
                frames.push(self.conv_update(seq, message, "assistant"));
            }
            AgentEvent::ApprovalRequested {
                run_id,
                message_id,
                calls,
            } => {
                frames.extend(self.tool_changes(seq, event, now));
                for gated in calls {
                    self.card(&gated.call.id, &gated.call.name).message_id = Some(*message_id);
                }
                self.waiting = calls
                    .iter()
                    .filter(|c| c.gate.is_some())
                    .map(waiting_json)
                    .collect();
                frames.push(json!({"type": "approval_request", "seq": seq, "run_id": run_id, "tool_calls": self.waiting}));
            }
            AgentEvent::ApprovalResolved { .. } => self.waiting.clear(),
            AgentEvent::ToolExecutionCompleted { message, .. }
            | AgentEvent::ToolExecutionFailed { message, .. } => {
                frames.extend(self.tool_changes(seq, event, now));
                frames.push(self.conv_update(seq, message, "tool"));
            }
            AgentEvent::NotificationsInjected {
                message_id,
                notices,
                ..
            } => {
                frames.push(json!({"type": "notification", "seq": seq, "message_id": message_id, "notifications": notices}));
            }
            AgentEvent::UserInterjection { message, .. } => {
                frames.push(self.conv_update(seq, message, "interjection"));
            }
            AgentEvent::ContextCompacted { message, .. } => {
                frames.push(self.conv_update(seq, message, "compaction"));
            }
            AgentEvent::BudgetWarning {
                run_id,
                scope,
                measure,
                used,
                limit,
            } => {
                frames.push(json!({"type": "budget_warning", "seq": seq, "run_id": run_id, "scope": scope, "measure": measure, "used": used, "limit": limit}));
            }
            AgentEvent::Stopped {
                run_id,
                reason,
                error,
            } => {
                // What the tracker still holds goes out before the end.
                let held = self.tracker.flush_all(now);
                frames.extend(held.iter().map(|p| self.tool_update(seq, p)));
                frames.push(json!({"type": "stop", "seq": seq, "run_id": run_id, "reason": reason.as_str(), "error": error}));
                self.run = None;
            }
            _ => frames.extend(self.tool_changes(seq, event, now)),
        }
        frames
    }

    fn start_run(&mut self, run_id: RunId) {
        self.tracker = ToolCallTracker::new(TrackerConfig::coalescing());
        self.run = Some(run_id);
        self.step = None;
        self.text.clear();
        self.cards.clear();
        self.waiting.clear();
    }

    fn card_mut(&mut self, id: &ToolCallId) -> Option<&mut Card> {
        self.cards.iter_mut().find(|c| &c.id == id)
    }

    /// The card of call `id`, made if new.
    fn card(&mut self, id: &ToolCallId, name: &str) -> &mut Card {
        let at = match self.cards.iter().position(|c| &c.id == id) {
            Some(at) => at,
            None => {
                self.cards.push(Card {
                    id: id.clone(),
                    name: name.to_owned(),
                    message_id: self.step,
                    status: ToolCallStatus::Pending,
                    arguments: Map::new(),
                    output: OutputTail::default(),
                    result: None,
                });
                self.cards.len() - 1
            }
        };
        &mut self.cards[at]
    }

    /// The tool-call changes of `event`, through the tracker.
    fn tool_changes(&mut self, seq: u64, event: &AgentEvent, now: Instant) -> Vec<Value> {
        let mut frames = Vec::new();
        for change in tool_events::changes(event) {
            match change {
                ToolCallChange::Announce { id, name } => {
                    self.card(&id, &name);
                    let known = self.tracker.last_sent(&id).is_some()
                        || self.tracker.finished(&id).is_some();
                    if known {
                        continue;
                    }
                    let state = ToolCallState::new(id.clone(), name.clone(), kind_of(&name));
                    if let Ok(state) = self.tracker.announce(state) {
                        let patch = ToolCallPatch::complete(&state);
                        frames.push(self.tool_update(seq, &patch));
                    }
                }
                ToolCallChange::Patch(patch) => {
                    let patch = *patch;
                    let id = patch.id.clone();
                    if let Some(card) = self.card_mut(&id) {
                        if let Some(status) = patch.status {
                            card.status = status;
                        }
                        if let Some(Value::Object(args)) = &patch.raw_input {
                            card.arguments = args.clone();
                        }
                        if patch.status.is_some_and(ToolCallStatus::is_terminal) {
                            card.result = Some(
                                patch
                                    .content
                                    .iter()
                                    .flatten()
                                    .filter_map(|c| match c {
                                        toolwire_core::ToolCallContent::Text { text } => {
                                            Some(text.as_str())
                                        }
                                        _ => None,
                                    })
                                    .collect(),
                            );
                        }
                    }
                    let status_changed = patch.status.is_some();
                    // A refused change (a status going back, a call already
                    // finished) is one a client must not see.
                    if let Ok(Some(p)) = self.tracker.update(patch, now) {
                        frames.push(self.tool_update(seq, &p));
                    }
                    if status_changed && let Ok(Some(p)) = self.tracker.flush(&id, now) {
                        frames.push(self.tool_update(seq, &p));
                    }
                }
                ToolCallChange::ArgumentField { id, key, value } => {
                    if let Some(card) = self.card_mut(&id) {
                        card.arguments.insert(key.clone(), value.clone());
                    }
                    // Grown from what the client is to see, held changes
                    // included, so a coalesced field is not lost.
                    let current = self.tracker.current(&id).and_then(|s| s.raw_input.as_ref());
                    let input = ToolCallChange::grown_input(current, &key, &value);
                    let patch = ToolCallPatch::new(id).raw_input(input);
                    if let Ok(Some(p)) = self.tracker.update(patch, now) {
                        frames.push(self.tool_update(seq, &p));
                    }
                }
                ToolCallChange::Output { id, text } => {
                    if let Some(card) = self.card_mut(&id) {
                        card.output.push(&text, OUTPUT_LIMIT);
                    }
                    if let Ok(Some(p)) = self.tracker.append_output(&id, &text, now) {
                        frames.push(self.tool_update(seq, &p));
                    }
                }
                ToolCallChange::StatusLine { id, text } => {
                    if let Ok(Some(p)) = self.tracker.status_line(&id, &text, now) {
                        frames.push(self.tool_update(seq, &p));
                    }
                }
            }
        }
        frames
    }

    /// A `tool_update` frame of `patch`.
    fn tool_update(&self, seq: u64, patch: &ToolCallPatch) -> Value {
        let card = self.cards.iter().find(|c| c.id == patch.id);
        let status = self
            .tracker
            .last_sent(&patch.id)
            .map(|s| s.status)
            .or_else(|| self.tracker.finished(&patch.id))
            .unwrap_or(ToolCallStatus::Pending);
        let result = card
            .filter(|_| status.is_terminal())
            .and_then(|c| c.result.clone());
        let mut frame = json!({
            "type": "tool_update",
            "seq": seq,
            "tool_call_id": patch.id,
            "tool_name": card.map(|c| c.name.as_str()).unwrap_or_default(),
            "status": status_name(status),
            "patch": patch_fields(patch),
            "result": result,
        });
        if let Some(message_id) = card.and_then(|c| c.message_id) {
            frame["message_id"] = json!(message_id);
        }
        frame
    }

    /// A `conv_update` frame of stored `message`.
    fn conv_update(&self, seq: u64, message: &Message, source: &str) -> Value {
        let calls: Vec<Value> = message
            .tool_uses()
            .map(|(id, _, name, _)| {
                let status = self
                    .cards
                    .iter()
                    .find(|c| c.id == *id)
                    .map_or(ToolCallStatus::Pending, |c| c.status);
                json!({"tool_call_id": id, "tool_name": name, "status": status_name(status)})
            })
            .collect();
        let mut frame = json!({
            "type": "conv_update",
            "seq": seq,
            "message_id": message.id,
            "parent_id": message.parent_id,
            "role": message.role.as_str(),
            "content_blocks": message.content,
            "source": source,
            "token_usage": message.usage,
            "tool_calls": calls,
        });
        if let Some(model) = &message.model {
            frame["model"] = json!(model);
        }
        frame
    }

    /// `TurnState` of the running turn, if one is rendered.
    pub fn turn_state(&self) -> Option<Value> {
        let run_id = self.run?;
        Some(json!({
            "run_id": run_id,
            "text": self.text,
            "tool_calls": self.cards.iter().map(card_json).collect::<Vec<_>>(),
            "pending_approval": self.waiting,
        }))
    }
}

/// A call waiting for an answer. `client`: its result must come from the
/// client that owns the tool, so it cannot be approved here (only denied).
fn waiting_json(c: &GatedCall) -> Value {
    json!({
        "tool_call_id": c.call.id,
        "tool_name": c.call.name,
        "arguments": c.call.arguments,
        "client": c.gate == Some(Gate::Client),
    })
}

/// `ToolCard`.
fn card_json(card: &Card) -> Value {
    json!({
        "tool_call_id": card.id,
        "tool_name": card.name,
        "status": status_name(card.status),
        "arguments": card.arguments,
        "output": card.output.render(OUTPUT_LIMIT),
        "result": card.result,
    })
}

/// `TurnState` of a paused turn: its calls, the waiting ones to answer.
pub fn paused_state(pending: &PendingApproval) -> Value {
    let cards: Vec<Value> = pending
        .calls
        .iter()
        .map(|c| {
            json!({
                "tool_call_id": c.call.id,
                "tool_name": c.call.name,
                "status": "pending",
                "arguments": c.call.arguments,
                "output": "",
                "result": null,
            })
        })
        .collect();
    let waiting: Vec<Value> = pending.waiting().map(waiting_json).collect();
    json!({
        "run_id": pending.run_id,
        "text": "",
        "tool_calls": cards,
        "pending_approval": waiting,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use toolwire_core::Progress;

    /// A command printing far more than a card keeps: a client connecting
    /// mid-turn is shown the tail, after a line saying what was cut.
    #[test]
    fn a_card_keeps_the_tail_of_long_output() {
        let mut renderer = Renderer::default();
        let run_id = RunId::new();
        let call_id = ToolCallId("call_1".into());
        let now = Instant::now();
        let mut seq = 0;
        let mut feed = |renderer: &mut Renderer, event: AgentEvent| {
            seq += 1;
            renderer.event(&StoredEvent { seq, event }, now);
        };
        feed(
            &mut renderer,
            AgentEvent::ToolCallStarted {
                run_id,
                call_id: call_id.clone(),
                name: "run_command".into(),
                server: None,
            },
        );
        let line = "x".repeat(79) + "\n";
        for i in 0..5_000 {
            feed(
                &mut renderer,
                AgentEvent::ToolExecutionProgress {
                    run_id,
                    call_id: call_id.clone(),
                    progress: Progress::Output {
                        text: format!("{i:05} {line}"),
                    },
                },
            );
        }
        let state = renderer.turn_state().unwrap();
        let output = state["tool_calls"][0]["output"].as_str().unwrap();
        let printed = 5_000 * (6 + line.len());
        assert!(output.len() <= OUTPUT_LIMIT + 100, "{} bytes", output.len());
        assert!(output.len() >= OUTPUT_LIMIT - line.len() - 6);
        let (marker, tail) = output.split_once('\n').unwrap();
        let cut: usize = marker
            .trim_start_matches("… ")
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(cut + tail.len(), printed, "{marker}");
        assert!(tail.starts_with(|c: char| c.is_ascii_digit()));
        assert!(tail.ends_with(&format!("04999 {line}")));
    }

    /// A client resuming after the last seq its socket sent still gets the
    /// changes that socket was holding back for coalescing: the running
    /// call's whole state, once, before the later events' frames.
    #[test]
    fn a_resumed_renderer_resends_what_a_closed_one_held() {
        let run_id = RunId::new();
        let call_id = ToolCallId("call_1".into());
        let events: Vec<StoredEvent> = [
            AgentEvent::ToolCallStarted {
                run_id,
                call_id: call_id.clone(),
                name: "run_command".into(),
                server: None,
            },
            AgentEvent::ArgumentField {
                run_id,
                call_id: call_id.clone(),
                key: "command".into(),
                value: json!("make"),
            },
            AgentEvent::ToolExecutionStarted {
                run_id,
                call_id: call_id.clone(),
                name: "run_command".into(),
            },
            AgentEvent::ToolExecutionProgress {
                run_id,
                call_id: call_id.clone(),
                progress: Progress::Output {
                    text: "first line\n".into(),
                },
            },
            AgentEvent::ToolExecutionProgress {
                run_id,
                call_id: call_id.clone(),
                progress: Progress::Output {
                    text: "held line\n".into(),
                },
            },
            AgentEvent::ReasoningDelta {
                run_id,
                text: "meanwhile".into(),
            },
        ]
        .into_iter()
        .zip(1..)
        .map(|(event, seq)| StoredEvent { seq, event })
        .collect();
        // The closed socket: the second line waits for the tracker's
        // window when the reasoning's frame (seq 6) goes out.
        let mut closed = Renderer::default();
        let now = Instant::now();
        let sent: Vec<Value> = events.iter().flat_map(|e| closed.event(e, now)).collect();
        let last = sent.last().unwrap();
        assert_eq!(
            (last["type"].as_str(), last["seq"].as_u64()),
            (Some("text_delta"), Some(6))
        );
        assert!(
            !sent.iter().any(|f| f.to_string().contains("held line")),
            "{sent:#?}"
        );
        assert!(closed.next_deadline().is_some());

        let mut resumed = Renderer::default();
        resumed.prime(&events);
        let frames = resumed.resume(6);
        assert_eq!(frames.len(), 1, "{frames:#?}");
        let frame = &frames[0];
        assert_eq!(frame["resync"], true);
        assert_eq!(frame["seq"], 6);
        assert_eq!(frame["status"], "executing");
        assert_eq!(frame["patch"]["raw_input"], json!({"command": "make"}));
        assert!(
            frame["patch"]["content"].to_string().contains("held line"),
            "{frame:#}"
        );

        // Once the call has finished there is nothing to send again.
        let mut done = events;
        done.push(StoredEvent {
            seq: 7,
            event: AgentEvent::ToolExecutionFailed {
                run_id,
                call_id,
                error: "make: no rule".into(),
                message: Message::new(
                    toolwire_core::ConversationId::new(),
                    None,
                    Role::Tool,
                    Vec::new(),
                ),
            },
        });
        let mut finished = Renderer::default();
        finished.prime(&done);
        assert!(finished.resume(7).is_empty());
    }
}
