//! toolwire's messages and events as Letta messages: the JSON objects,
//! discriminated by `message_type`, that Letta's list endpoint, responses
//! and streams carry. The only place that knows their shape.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use toolwire_core::{
    AgentEvent, BlobRef, ContentBlock, Decision, GatedCall, Message, MessageId, PendingApproval,
    ResolvedApproval, Role, RunId, StopReason, ToolCall, ToolCallId, Usage, format_block,
};

use crate::agents::ids::message_id;

/// Letta's name for a stop reason.
pub fn stop_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "end_turn",
        // Letta has no budget stop reason: a limit on the loop is the
        // nearest (the run's error names the budget).
        StopReason::MaxSteps | StopReason::BudgetExceeded => "max_steps",
        StopReason::Cancelled => "cancelled",
        StopReason::LlmApiError => "llm_api_error",
        StopReason::RequiresApproval => "requires_approval",
        StopReason::Error | StopReason::Interrupted => "error",
    }
}

pub fn run_id(id: RunId) -> String {
    format!("run-{}", id.0)
}

/// Letta's `otid` of the `index`th Letta message rendered from stored
/// message `id`: the id's UUID with its last 7 bits set to the index, as
/// Letta's server derives them (its clients check the suffix).
pub fn otid(id: MessageId, index: usize) -> String {
    let bits = (id.0.as_u128() & !0x7f) | (index as u128 & 0x7f);
    uuid::Uuid::from_u128(bits).to_string()
}

/// The date of what a live event renders: that of the message it belongs
/// to (its id's time), so that a replay, on any instance, renders the same.
fn date_of(id: MessageId) -> DateTime<Utc> {
    id.made_at().unwrap_or_else(Utc::now)
}

fn base(kind: &str, id: MessageId, date: DateTime<Utc>, run: Option<RunId>) -> Value {
    // What the model wrote names its step (`/v1/runs/{id}/steps`: the
    // model that wrote it, its usage): stored message `id` is one step.
    let written = matches!(
        kind,
        "reasoning_message"
            | "assistant_message"
            | "tool_call_message"
            | "approval_request_message"
    );
    json!({
        "id": message_id(id),
        "date": date,
        "message_type": kind,
        "run_id": run.map(run_id),
        "step_id": written.then(|| step_id(id)),
    })
}

/// Letta's id of the step that wrote stored message `id`.
pub fn step_id(id: MessageId) -> String {
    format!("step-{id}")
}

fn with(mut value: Value, fields: Value) -> Value {
    if let (Value::Object(v), Value::Object(f)) = (&mut value, fields) {
        v.extend(f);
    }
    value
}

fn arguments_text(arguments: &Value) -> String {
    match arguments {
        // A call whose arguments never parsed keeps their raw text.
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

fn tool_call_json(call: &ToolCall) -> Value {
    json!({
        "tool_call_id": call.id.0,
        "name": call.name,
        "arguments": arguments_text(&call.arguments),
    })
}

/// A `tool_call_message`, or an `approval_request_message` for calls that
/// wait, over `calls` (all of one kind) of message `id`.
fn calls_message(
    kind: &str,
    id: MessageId,
    date: DateTime<Utc>,
    run: Option<RunId>,
    calls: &[&ToolCall],
) -> Option<Value> {
    let first = calls.first()?;
    let all: Vec<Value> = calls.iter().map(|c| tool_call_json(c)).collect();
    Some(with(
        base(kind, id, date, run),
        json!({"tool_call": tool_call_json(first), "tool_calls": all}),
    ))
}

/// What the history needs to know of a conversation's pauses.
#[derive(Debug, Default)]
pub struct Approvals {
    /// The calls of the open pause.
    waiting: HashSet<String>,
    /// Answered pauses, by their message.
    resolved: HashMap<MessageId, ResolvedApproval>,
}

impl Approvals {
    pub fn new(pending: Option<&PendingApproval>, resolved: Vec<ResolvedApproval>) -> Self {
        Approvals {
            waiting: pending
                .map(|p| p.waiting().map(|c| c.call.id.0.clone()).collect())
                .unwrap_or_default(),
            resolved: resolved
                .into_iter()
                .map(|r| (r.pending.message_id, r))
                .collect(),
        }
    }
}

/// The id of the answers to the calls of message `id`: Letta stores them
/// as a message of their own, after the request, so that a history read
/// `after` the request starts with them.
fn approval_response_id(id: MessageId) -> MessageId {
    MessageId(uuid::Uuid::new_v5(&id.0, b"approval_response"))
}

/// Letta's `approval_response_message` for answers to message `id`.
fn approval_response(
    id: MessageId,
    date: DateTime<Utc>,
    run: Option<RunId>,
    decisions: &[(ToolCallId, Decision)],
) -> Value {
    let approvals: Vec<Value> = decisions
        .iter()
        .map(|(call, d)| match d {
            Decision::Approve => {
                json!({"type": "approval", "tool_call_id": call.0, "approve": true})
            }
            Decision::Deny { reason } => json!({
                "type": "approval", "tool_call_id": call.0,
                "approve": false, "reason": reason,
            }),
            Decision::Result { content, is_error } => json!({
                "type": "tool", "tool_call_id": call.0, "tool_return": content,
                "status": if *is_error { "error" } else { "success" },
            }),
        })
        .collect();
    // Letta's older single-answer fields: the first answer's, its call as
    // the request's id.
    let first = approvals.first();
    let mut value = with(
        base("approval_response_message", id, date, run),
        json!({
            "approvals": approvals,
            "approval_request_id": first.and_then(|a| a.get("tool_call_id")),
            "approve": first.and_then(|a| a.get("approve")),
            "reason": first.and_then(|a| a.get("reason")),
        }),
    );
    let own = approval_response_id(id);
    value["id"] = json!(message_id(own));
    value["otid"] = json!(otid(own, 0));
    value
}

/// The Letta messages of stored message `m`. Calls that waited (or wait)
/// for an answer become an `approval_request_message`, followed by the
/// answers once given.
pub fn history(m: &Message, approvals: &Approvals) -> Vec<Value> {
    let (id, date) = (m.id, m.created_at);
    let mut out = Vec::new();
    match m.role {
        // A compaction node shows its summary, as the model reads it.
        Role::System => out.push(with(
            base("system_message", id, date, None),
            json!({"content": m.compaction().map_or_else(
                || m.text(),
                |(summary, _)| format!("{}\n\n{summary}", toolwire_engine::context::SUMMARY_INTRO),
            )}),
        )),
        Role::User => {
            let text = with_mentions(m.text(), m.images());
            if !text.is_empty() {
                out.push(with(
                    base("user_message", id, date, None),
                    json!({"content": text}),
                ));
            }
        }
        Role::Assistant => {
            for block in &m.content {
                match block {
                    ContentBlock::Reasoning { text } => out.push(with(
                        base("reasoning_message", id, date, None),
                        json!({"reasoning": text, "source": "reasoner_model"}),
                    )),
                    ContentBlock::Text { text } => out.push(with(
                        base("assistant_message", id, date, None),
                        json!({"content": text}),
                    )),
                    _ => {}
                }
            }
            let resolved = approvals.resolved.get(&m.id);
            let gated = |id: &str| match resolved {
                Some(r) => r.pending.waiting().any(|c| c.call.id.0 == id),
                None => approvals.waiting.contains(id),
            };
            let mut run_now = Vec::new();
            let mut wait = Vec::new();
            let owned: Vec<ToolCall> = m
                .tool_uses()
                .map(|(id, server, name, arguments)| ToolCall {
                    id: id.clone(),
                    server: server.map(str::to_owned),
                    name: name.to_owned(),
                    arguments: arguments.clone(),
                })
                .collect();
            for call in &owned {
                if gated(&call.id.0) {
                    wait.push(call);
                } else {
                    run_now.push(call);
                }
            }
            out.extend(calls_message("tool_call_message", id, date, None, &run_now));
            out.extend(calls_message(
                "approval_request_message",
                id,
                date,
                None,
                &wait,
            ));
            if let Some(r) = resolved {
                out.push(approval_response(id, r.resolved_at, None, &r.decisions));
            }
        }
        Role::Tool => {
            out.extend(tool_returns(m, None));
        }
    }
    // Notifications delivered with this message: Letta shows them as a
    // system message.
    if let Some(block) = format_block(&m.content) {
        out.push(with(
            base("system_message", id, date, None),
            json!({"content": block}),
        ));
    }
    for (i, item) in out.iter_mut().enumerate() {
        if item.get("otid").is_none() {
            item["otid"] = json!(otid(id, i));
        }
    }
    out
}

/// The Letta messages of a branch (oldest first): each message's
/// [`history`], with the results of one step's calls (consecutive tool
/// messages) as one `tool_return_message` carrying them all in
/// `tool_returns`, as Letta's server shows a step's parallel results.
pub fn history_of<'a>(
    path: impl IntoIterator<Item = &'a Message>,
    approvals: &Approvals,
) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut open_group: Option<usize> = None;
    // The calls of the last message that made some, in its order.
    let mut order: Vec<String> = Vec::new();
    for m in path {
        let items = history(m, approvals);
        if m.role != Role::Tool {
            if let Some(at) = open_group.take() {
                in_call_order(&mut out[at], &order);
            }
            if m.tool_uses().next().is_some() {
                order = m.tool_uses().map(|(id, ..)| id.0.clone()).collect();
            }
            out.extend(items);
            continue;
        }
        for item in items {
            let is_return = item["message_type"] == "tool_return_message";
            match open_group {
                Some(at) if is_return => merge_returns(&mut out[at], &item),
                _ => {
                    if let Some(at) = open_group {
                        in_call_order(&mut out[at], &order);
                    }
                    out.push(item);
                    open_group = is_return.then(|| out.len() - 1);
                }
            }
        }
    }
    if let Some(at) = open_group {
        in_call_order(&mut out[at], &order);
    }
    out
}

/// The group's `tool_returns` in the order of the calls (`order`; others
/// after them, as they came), and its own `tool_call_id`, `tool_return`
/// and `status` the first one's: Letta's server runs a step's calls at
/// once and keeps their results in the calls' order.
fn in_call_order(group: &mut Value, order: &[String]) {
    let Some(list) = group["tool_returns"].as_array_mut() else {
        return;
    };
    let at = |r: &Value| {
        let id = r["tool_call_id"].as_str().unwrap_or("");
        order.iter().position(|o| o == id).unwrap_or(usize::MAX)
    };
    list.sort_by_key(at);
    let Some(first) = list.first().cloned() else {
        return;
    };
    for key in ["tool_call_id", "tool_return", "status"] {
        group[key] = first[key].clone();
    }
}

/// Adds the `tool_returns` of `more` to the group `into`.
fn merge_returns(into: &mut Value, more: &Value) {
    let extra = more["tool_returns"].as_array().cloned().unwrap_or_default();
    if let Some(list) = into["tool_returns"].as_array_mut() {
        list.extend(extra);
    }
}

/// `text` with a line naming each image (Letta's messages here carry
/// text; the image itself is at `/v1/blobs/{sha256}`).
fn with_mentions<'a>(mut text: String, images: impl Iterator<Item = &'a BlobRef>) -> String {
    for image in images {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&image.mention());
    }
    text
}

/// The `tool_return_message`s of a tool message.
fn tool_returns(m: &Message, run: Option<RunId>) -> Vec<Value> {
    m.content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
                images,
            } => Some(tool_return(
                m.id,
                m.created_at,
                run,
                &tool_use_id.0,
                &with_mentions(content.clone(), images.iter()),
                *is_error,
            )),
            _ => None,
        })
        .collect()
}

fn tool_return(
    id: MessageId,
    date: DateTime<Utc>,
    run: Option<RunId>,
    call_id: &str,
    content: &str,
    is_error: bool,
) -> Value {
    let status = if is_error { "error" } else { "success" };
    with(
        base("tool_return_message", id, date, run),
        json!({
            "tool_call_id": call_id,
            "tool_return": content,
            "status": status,
            "stdout": null,
            "stderr": null,
            "tool_returns": [{
                "tool_call_id": call_id,
                "tool_return": content,
                "status": status,
                "type": "tool",
            }],
        }),
    )
}

/// Turns one run's events into Letta messages as they come: whole
/// messages per step, or with `stream_tokens` the pieces as they stream
/// (each piece carries the id of the message it becomes).
pub struct LiveRenderer {
    run: RunId,
    stream_tokens: bool,
    /// Names of the tools whose calls wait (to name a streamed call's
    /// message type the moment its name is known).
    gated: HashSet<String>,
    /// The message the current step writes.
    step_message: Option<MessageId>,
    /// Streamed calls: their message type.
    call_kinds: HashMap<String, &'static str>,
    /// The step message's Letta parts so far, by kind: their otid index.
    parts: HashMap<String, usize>,
    /// The step's tool results not sent yet: sent as one message once
    /// every call of the step has its result (or at the next event that
    /// is not a call's, when the step's calls are not known).
    returns: Option<Value>,
    /// The step's calls still without a result.
    expected: HashSet<String>,
    /// The step's calls in the model's order: the order of the results
    /// in their message.
    order: Vec<String>,
    steps: u32,
    usage: Usage,
    /// The usage of the run's stored model calls, summed: what a run that
    /// ends without a final response (cancelled, failed) used.
    steps_usage: Usage,
}

/// What a run came to, once its `stopped` event is rendered.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub reason: StopReason,
    pub error: Option<String>,
}

impl LiveRenderer {
    pub fn new(run: RunId, stream_tokens: bool, gated: HashSet<String>) -> Self {
        LiveRenderer {
            run,
            stream_tokens,
            gated,
            step_message: None,
            call_kinds: HashMap::new(),
            parts: HashMap::new(),
            returns: None,
            expected: HashSet::new(),
            order: Vec::new(),
            steps: 0,
            usage: Usage::default(),
            steps_usage: Usage::default(),
        }
    }

    /// The calls whose results come first in this run (those of the
    /// paused step it goes on with): their results are sent as one
    /// message as soon as all are in.
    pub fn expect_calls(&mut self, calls: impl IntoIterator<Item = String>) {
        for call in calls {
            self.expected.insert(call.clone());
            self.order.push(call);
        }
    }

    /// The step's results not sent yet, as one message in the calls'
    /// order.
    fn take_returns(&mut self) -> Option<Value> {
        let mut group = self.returns.take()?;
        in_call_order(&mut group, &self.order);
        Some(group)
    }

    fn now_base(&mut self, kind: &str, id: MessageId) -> Value {
        let mut value = base(kind, id, date_of(id), Some(self.run));
        value["otid"] = json!(otid(id, self.part(kind)));
        value
    }

    /// The otid index of the step message's part `kind`.
    fn part(&mut self, kind: &str) -> usize {
        let next = self.parts.len();
        *self.parts.entry(kind.to_owned()).or_insert(next)
    }

    /// `value` (a part of the step message `id`) with its otid.
    fn with_otid(&mut self, mut value: Value, id: MessageId) -> Value {
        let kind = value["message_type"].as_str().unwrap_or("").to_owned();
        value["otid"] = json!(otid(id, self.part(&kind)));
        value
    }

    /// The Letta messages for `event` (none for most), and the run's end
    /// when `event` is its `stopped`.
    pub fn render(&mut self, event: &AgentEvent) -> (Vec<Value>, Option<RunEnd>) {
        if event.run_id() != self.run {
            return (Vec::new(), None);
        }
        let mut out = Vec::new();
        let run = Some(self.run);
        let of_a_call = matches!(
            event,
            AgentEvent::ToolExecutionStarted { .. }
                | AgentEvent::ToolExecutionProgress { .. }
                | AgentEvent::ToolExecutionCompleted { .. }
                | AgentEvent::ToolExecutionFailed { .. }
        );
        if !of_a_call {
            out.extend(self.take_returns());
        }
        match event {
            AgentEvent::ToolCallsGenerated { calls, .. } => {
                self.order = calls.iter().map(|c| c.id.0.clone()).collect();
                self.expected = self.order.iter().cloned().collect();
            }
            AgentEvent::ApprovalRequested { calls, .. } => {
                self.order = calls.iter().map(|c| c.call.id.0.clone()).collect();
                self.expected = self.order.iter().cloned().collect();
            }
            _ => {}
        }
        if let AgentEvent::AssistantMessageCreated { message, .. } = event
            && let Some(u) = message.usage
        {
            self.steps_usage.prompt_tokens += u.prompt_tokens;
            self.steps_usage.completion_tokens += u.completion_tokens;
            self.steps_usage.cached_tokens += u.cached_tokens;
            self.steps_usage.cache_write_tokens += u.cache_write_tokens;
        }
        match event {
            AgentEvent::StepStarted { message_id, .. } => {
                self.step_message = Some(*message_id);
                self.parts.clear();
                self.steps += 1;
            }
            AgentEvent::ReasoningDelta { text, .. } if self.stream_tokens => {
                if let Some(id) = self.step_message {
                    out.push(with(
                        self.now_base("reasoning_message", id),
                        json!({"reasoning": text, "source": "reasoner_model"}),
                    ));
                }
            }
            AgentEvent::TextDelta { text, .. } if self.stream_tokens => {
                if let Some(id) = self.step_message {
                    out.push(with(
                        self.now_base("assistant_message", id),
                        json!({"content": text}),
                    ));
                }
            }
            AgentEvent::ToolCallStarted { call_id, name, .. } if self.stream_tokens => {
                let kind = if self.gated.contains(name) {
                    "approval_request_message"
                } else {
                    "tool_call_message"
                };
                self.call_kinds.insert(call_id.0.clone(), kind);
                if let Some(id) = self.step_message {
                    let delta = json!({"tool_call_id": call_id.0, "name": name, "arguments": ""});
                    out.push(with(
                        self.now_base(kind, id),
                        json!({"tool_call": delta, "tool_calls": delta}),
                    ));
                }
            }
            AgentEvent::ArgumentsDelta {
                call_id, fragment, ..
            } if self.stream_tokens => {
                let kind = self
                    .call_kinds
                    .get(&call_id.0)
                    .copied()
                    .unwrap_or("tool_call_message");
                if let Some(id) = self.step_message {
                    let delta = json!({"tool_call_id": call_id.0, "arguments": fragment});
                    out.push(with(
                        self.now_base(kind, id),
                        json!({"tool_call": delta, "tool_calls": delta}),
                    ));
                }
            }
            AgentEvent::AssistantMessageCreated { message, .. } if !self.stream_tokens => {
                // Prose and reasoning; the calls follow with the next event.
                let mut text_only = message.clone();
                text_only
                    .content
                    .retain(|b| !matches!(b, ContentBlock::ToolUse { .. }));
                for mut m in history(&text_only, &Approvals::default()) {
                    m["run_id"] = json!(run_id(self.run));
                    out.push(self.with_otid(m, message.id));
                }
            }
            AgentEvent::ToolCallsGenerated {
                message_id, calls, ..
            } if !self.stream_tokens => {
                let refs: Vec<&ToolCall> = calls.iter().collect();
                if let Some(m) = calls_message(
                    "tool_call_message",
                    *message_id,
                    date_of(*message_id),
                    run,
                    &refs,
                ) {
                    out.push(self.with_otid(m, *message_id));
                }
            }
            AgentEvent::ApprovalRequested {
                message_id, calls, ..
            } if !self.stream_tokens => {
                let of = |gated: bool| -> Vec<&ToolCall> {
                    calls
                        .iter()
                        .filter(|c: &&GatedCall| c.gate.is_some() == gated)
                        .map(|c| &c.call)
                        .collect()
                };
                for kind in ["tool_call_message", "approval_request_message"] {
                    let calls = of(kind == "approval_request_message");
                    if let Some(m) =
                        calls_message(kind, *message_id, date_of(*message_id), run, &calls)
                    {
                        out.push(self.with_otid(m, *message_id));
                    }
                }
            }
            AgentEvent::ToolExecutionCompleted {
                message, call_id, ..
            }
            | AgentEvent::ToolExecutionFailed {
                message, call_id, ..
            } => {
                for mut m in tool_returns(message, run) {
                    m["otid"] = json!(otid(message.id, 0));
                    match &mut self.returns {
                        Some(group) => merge_returns(group, &m),
                        None => self.returns = Some(m),
                    }
                }
                // The step's last result: the group goes now.
                if self.expected.remove(&call_id.0) && self.expected.is_empty() {
                    out.extend(self.take_returns());
                }
            }
            AgentEvent::NotificationsInjected {
                message_id, text, ..
            } => out.push(with(
                self.now_base("system_message", *message_id),
                json!({"content": text}),
            )),
            AgentEvent::FinalResponse { usage, .. } => self.usage = *usage,
            AgentEvent::Stopped { reason, error, .. } => {
                return (
                    out,
                    Some(RunEnd {
                        reason: *reason,
                        error: error.clone(),
                    }),
                );
            }
            _ => {}
        }
        (out, None)
    }

    /// The closing messages of a run: an error (if it failed), the stop
    /// reason, the usage.
    pub fn closing(&self, end: &RunEnd, usage: Usage) -> Vec<Value> {
        let usage = if usage != Usage::default() {
            usage
        } else if self.usage != Usage::default() {
            self.usage
        } else {
            self.steps_usage
        };
        let mut out = Vec::new();
        if let (
            Some(error),
            StopReason::Error
            | StopReason::LlmApiError
            | StopReason::Interrupted
            | StopReason::BudgetExceeded,
        ) = (&end.error, end.reason)
        {
            out.push(json!({
                "message_type": "error_message",
                // Letta's stop reasons have no `interrupted` nor a budget;
                // the error says it (a turn cut by a shutdown or a crash,
                // the budget used up).
                "error_type": match end.reason {
                    StopReason::Interrupted => "interrupted",
                    StopReason::BudgetExceeded => "budget_exceeded",
                    other => stop_reason(other),
                },
                "message": error,
                "detail": error,
                "run_id": run_id(self.run),
            }));
        }
        out.push(json!({
            "message_type": "stop_reason",
            "stop_reason": stop_reason(end.reason),
        }));
        out.push(json!({
            "message_type": "usage_statistics",
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "cached_input_tokens": usage.cached_tokens,
            // Letta's field for Anthropic's cache writes.
            "cache_write_tokens": usage.cache_write_tokens,
            "step_count": self.steps,
            "run_ids": [run_id(self.run)],
        }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_statistics_carry_cache_reads_and_writes() {
        let renderer = LiveRenderer::new(RunId::new(), false, HashSet::new());
        let end = RunEnd {
            reason: StopReason::EndTurn,
            error: None,
        };
        let usage = Usage {
            prompt_tokens: 5000,
            completion_tokens: 40,
            cached_tokens: 4000,
            cache_write_tokens: 900,
        };
        let closing = renderer.closing(&end, usage);
        let stats = closing
            .iter()
            .find(|m| m["message_type"] == "usage_statistics")
            .unwrap();
        assert_eq!(stats["prompt_tokens"], 5000);
        assert_eq!(stats["total_tokens"], 5040);
        assert_eq!(stats["cached_input_tokens"], 4000);
        assert_eq!(stats["cache_write_tokens"], 900);
    }
}
