//! One `session/prompt`: a turn of the engine, its events sent to the
//! client as `session/update` notifications.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    self as acp, ContentChunk, PermissionOption, PermissionOptionKind, PromptResponse,
    RequestPermissionOutcome, RequestPermissionRequest, SessionId, SessionNotification,
    SessionUpdate,
};
use toolwire_core::{
    AgentEvent, ContentBlock, ConversationId, Decision, GatedCall, Message, Role, StopReason,
    ToolCall, ToolCallContent, ToolCallId, ToolCallPatch, ToolCallState, ToolCallStatus,
    ToolCallTracker,
};
use toolwire_engine::{Engine, EngineError, Responded, TurnOptions};

use crate::{Session, convert, internal};

/// The kind of the store documents that keep a session's "always"
/// answers (id: the conversation id).
const PERMISSIONS_KIND: &str = "acp_permissions";

/// A session's "always" answers, per tool name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Permissions {
    /// Tools that run without asking.
    pub allow: BTreeSet<String>,
    /// Tools whose calls are rejected without asking.
    pub reject: BTreeSet<String>,
}

impl Permissions {
    /// The stored answers of `conversation` (none if there are none or
    /// they cannot be read).
    pub(crate) async fn load(engine: &Engine, conversation: ConversationId) -> Self {
        match engine
            .store()
            .document(PERMISSIONS_KIND, &conversation.to_string())
            .await
        {
            Ok(Some(doc)) => {
                let names = |key: &str| -> BTreeSet<String> {
                    doc.body
                        .get(key)
                        .and_then(|v| v.as_array())
                        .map(|items| {
                            items
                                .iter()
                                .filter_map(|v| v.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                Permissions {
                    allow: names("allow"),
                    reject: names("reject"),
                }
            }
            Ok(None) => Permissions::default(),
            Err(e) => {
                tracing::warn!(error = %e, "reading stored ACP permissions");
                Permissions::default()
            }
        }
    }

    async fn save(&self, engine: &Engine, conversation: ConversationId) {
        let body = serde_json::json!({"allow": self.allow, "reject": self.reject});
        if let Err(e) = engine
            .store()
            .put_document(PERMISSIONS_KIND, &conversation.to_string(), &body)
            .await
        {
            tracing::warn!(error = %e, "storing ACP permissions");
        }
    }
}

const ALLOW_ONCE: &str = "allow_once";
const ALLOW_ALWAYS: &str = "allow_always";
const REJECT_ONCE: &str = "reject_once";
const REJECT_ALWAYS: &str = "reject_always";

/// The options of every permission request.
fn permission_options() -> Vec<PermissionOption> {
    vec![
        PermissionOption::new(ALLOW_ONCE, "Allow once", PermissionOptionKind::AllowOnce),
        PermissionOption::new(
            ALLOW_ALWAYS,
            "Always allow",
            PermissionOptionKind::AllowAlways,
        ),
        PermissionOption::new(REJECT_ONCE, "Reject", PermissionOptionKind::RejectOnce),
        PermissionOption::new(
            REJECT_ALWAYS,
            "Always reject",
            PermissionOptionKind::RejectAlways,
        ),
    ]
}

/// The tools of `session` whose calls wait for the user: those that are not
/// read-only, less those the session always allows.
fn require_approval(session: &Session) -> HashSet<String> {
    let allowed = session
        .permissions
        .lock()
        .map(|p| p.allow.clone())
        .unwrap_or_default();
    session
        .tools
        .specs()
        .into_iter()
        .filter(|spec| !spec.read_only && !allowed.contains(&spec.name))
        .map(|spec| spec.name)
        .collect()
}

/// Runs the prompt's turn to its end and says how the prompt is answered.
/// A turn that pauses for approval asks the client about each waiting
/// call and goes on with the answers, as often as it pauses.
pub(crate) async fn run_prompt(
    engine: &Engine,
    session: &Session,
    session_id: SessionId,
    text: &str,
    cx: &ConnectionTo<Client>,
) -> Result<PromptResponse, agent_client_protocol::Error> {
    let conversation = session.conversation;
    // Follow before the turn starts, so that nothing is missed.
    let mut follower = engine.follow(conversation);
    let options = || TurnOptions {
        tools: Some(session.tools.clone()),
        require_approval: require_approval(session),
        ..TurnOptions::default()
    };
    let mut handle = engine
        .send_with(conversation, text, None, options())
        .await
        .map_err(|e| match e {
            EngineError::TurnInProgress(_) | EngineError::ApprovalPending { .. } => {
                crate::invalid_params(e.to_string())
            }
            e => internal(e),
        })?;
    let mut updates = Updates {
        session_id: session_id.clone(),
        cx,
        tracker: ToolCallTracker::default(),
    };
    loop {
        let run_id = handle.run_id;
        let mut gated: Option<Vec<GatedCall>> = None;
        'events: loop {
            let batch = match follower.next().await {
                Ok(Some(batch)) => batch,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "following the turn's events");
                    break;
                }
            };
            for stored in batch {
                if stored.event.run_id() != run_id {
                    continue;
                }
                if matches!(stored.event, AgentEvent::Stopped { .. }) {
                    break 'events;
                }
                if let AgentEvent::ApprovalRequested { calls, .. } = &stored.event {
                    gated = Some(calls.clone());
                }
                updates.event(&stored.event)?;
            }
        }
        let outcome = handle.wait().await;
        let cancelled = || session.cancelled.load(Ordering::SeqCst);
        if outcome.reason == StopReason::RequiresApproval && !cancelled() {
            let calls = match gated {
                Some(calls) => calls,
                None => engine
                    .pending_approval(conversation)
                    .await
                    .map_err(internal)?
                    .map(|p| p.calls)
                    .unwrap_or_default(),
            };
            let decisions = match ask(engine, session, &session_id, cx, &calls).await {
                Ok(decisions) => decisions,
                Err(e) => {
                    // The editor could not be asked: the conversation must
                    // not stay paused, or every later prompt is refused.
                    if let Ok(Some(abandoned)) = engine
                        .abandon_pending(conversation, "the editor could not be asked")
                        .await
                    {
                        abandoned.wait().await;
                    }
                    return Err(e);
                }
            };
            if !cancelled() {
                match engine
                    .respond(conversation, decisions, None, options())
                    .await
                    .map_err(internal)?
                {
                    Responded::Started(next) => {
                        handle = next;
                        continue;
                    }
                    Responded::AlreadyApplied => {
                        return Ok(PromptResponse::new(acp::StopReason::EndTurn));
                    }
                }
            }
        }
        if cancelled() {
            if outcome.reason == StopReason::RequiresApproval {
                match engine.abandon_pending(conversation, "cancelled").await {
                    Ok(Some(abandoned)) => {
                        abandoned.wait().await;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "abandoning the paused turn"),
                }
            }
            return Ok(PromptResponse::new(acp::StopReason::Cancelled));
        }
        return match convert::stop_reason(outcome.reason) {
            Some(reason) => Ok(PromptResponse::new(reason)),
            None => Err(internal(format!(
                "the turn stopped with {}: {}",
                outcome.reason.as_str(),
                outcome.error.unwrap_or_default()
            ))),
        };
    }
}

/// The answers to the waiting calls among `calls`, in order: a tool the
/// session always rejects is rejected at once, the others are asked about
/// with `session/request_permission`. "Always" answers are remembered and
/// stored.
async fn ask(
    engine: &Engine,
    session: &Session,
    session_id: &SessionId,
    cx: &ConnectionTo<Client>,
    calls: &[GatedCall],
) -> Result<Vec<(ToolCallId, Decision)>, agent_client_protocol::Error> {
    let mut decisions = Vec::new();
    for gated in calls.iter().filter(|c| c.gate.is_some()) {
        let call = &gated.call;
        let always_rejected = session
            .permissions
            .lock()
            .map(|p| p.reject.contains(&call.name))
            .unwrap_or(false);
        if always_rejected {
            decisions.push((call.id.clone(), rejected()));
            continue;
        }
        if session.cancelled.load(Ordering::SeqCst) {
            decisions.push((call.id.clone(), cancelled_decision()));
            continue;
        }
        let request = RequestPermissionRequest::new(
            session_id.clone(),
            permission_tool_call(session, call).await,
            permission_options(),
        );
        let response = cx.send_request(request).block_task().await?;
        let decision = match response.outcome {
            RequestPermissionOutcome::Selected(selected) => {
                let option = selected.option_id.0.as_ref();
                let remember = |f: &dyn Fn(&mut Permissions)| {
                    let mut changed = None;
                    if let Ok(mut p) = session.permissions.lock() {
                        f(&mut p);
                        changed = Some(p.clone());
                    }
                    changed
                };
                let (decision, changed) = match option {
                    ALLOW_ONCE => (Decision::Approve, None),
                    ALLOW_ALWAYS => (
                        Decision::Approve,
                        remember(&|p| {
                            p.reject.remove(&call.name);
                            p.allow.insert(call.name.clone());
                        }),
                    ),
                    REJECT_ALWAYS => (
                        rejected(),
                        remember(&|p| {
                            p.allow.remove(&call.name);
                            p.reject.insert(call.name.clone());
                        }),
                    ),
                    _ => (rejected(), None),
                };
                if let Some(permissions) = changed {
                    permissions.save(engine, session.conversation).await;
                }
                decision
            }
            _ => cancelled_decision(),
        };
        decisions.push((call.id.clone(), decision));
    }
    Ok(decisions)
}

fn rejected() -> Decision {
    Decision::Deny {
        reason: Some("the user rejected it".into()),
    }
}

fn cancelled_decision() -> Decision {
    Decision::Deny {
        reason: Some("cancelled".into()),
    }
}

/// The tool call a permission request is about: title, kind, raw input
/// and, for `write_file`, the diff it would make.
async fn permission_tool_call(session: &Session, call: &ToolCall) -> acp::ToolCallUpdate {
    let mut state = ToolCallState::new(call.id.clone(), &call.name, convert::kind_of(&call.name));
    state.raw_input = Some(call.arguments.clone());
    if call.name == "write_file" {
        let path = call.arguments.get("path").and_then(|v| v.as_str());
        let new_text = call.arguments.get("content").and_then(|v| v.as_str());
        if let (Some(path), Some(new_text)) = (path, new_text) {
            let old_text = tokio::fs::read_to_string(session.cwd.join(path)).await.ok();
            state.content = vec![ToolCallContent::Diff {
                path: path.to_owned(),
                old_text,
                new_text: new_text.to_owned(),
            }];
        }
    }
    acp::ToolCallUpdate::from(convert::tool_call(&state))
}

/// Sends a turn's events as `session/update` notifications.
struct Updates<'a> {
    session_id: SessionId,
    cx: &'a ConnectionTo<Client>,
    tracker: ToolCallTracker,
}

impl Updates<'_> {
    fn send(&self, update: SessionUpdate) -> Result<(), agent_client_protocol::Error> {
        self.cx
            .send_notification(SessionNotification::new(self.session_id.clone(), update))
    }

    fn event(&mut self, event: &AgentEvent) -> Result<(), agent_client_protocol::Error> {
        match event {
            AgentEvent::TextDelta { text, .. } => self.send(SessionUpdate::AgentMessageChunk(
                ContentChunk::new(convert::text_block(text)),
            )),
            AgentEvent::ReasoningDelta { text, .. } => self.send(SessionUpdate::AgentThoughtChunk(
                ContentChunk::new(convert::text_block(text)),
            )),
            AgentEvent::ToolCallStarted { call_id, name, .. } => self.announce(call_id, name),
            AgentEvent::ToolCallsGenerated { calls, .. } => {
                for call in calls {
                    self.announce(&call.id, &call.name)?;
                    let patch =
                        ToolCallPatch::new(call.id.clone()).raw_input(call.arguments.clone());
                    self.patch(patch)?;
                }
                Ok(())
            }
            AgentEvent::ApprovalRequested { calls, .. } => {
                for gated in calls {
                    let call = &gated.call;
                    self.announce(&call.id, &call.name)?;
                    let patch =
                        ToolCallPatch::new(call.id.clone()).raw_input(call.arguments.clone());
                    self.patch(patch)?;
                }
                Ok(())
            }
            AgentEvent::ToolExecutionStarted { call_id, name, .. } => {
                self.announce(call_id, name)?;
                self.patch(ToolCallPatch::new(call_id.clone()).status(ToolCallStatus::InProgress))
            }
            AgentEvent::ToolExecutionCompleted {
                call_id, message, ..
            } => {
                let text = result_text(message, call_id);
                self.patch(
                    ToolCallPatch::new(call_id.clone())
                        .status(ToolCallStatus::Completed)
                        .content(vec![ToolCallContent::text(text)]),
                )
            }
            AgentEvent::ToolExecutionFailed {
                call_id,
                error,
                message,
                ..
            } => {
                let text = result_text(message, call_id);
                let text = if text.is_empty() { error.clone() } else { text };
                self.patch(
                    ToolCallPatch::new(call_id.clone())
                        .status(ToolCallStatus::Failed)
                        .content(vec![ToolCallContent::text(text)]),
                )
            }
            _ => Ok(()),
        }
    }

    /// Sends the `tool_call` of a call not announced yet.
    fn announce(
        &mut self,
        id: &ToolCallId,
        name: &str,
    ) -> Result<(), agent_client_protocol::Error> {
        if self.tracker.last_sent(id).is_some() || self.tracker.finished(id).is_some() {
            return Ok(());
        }
        let state = ToolCallState::new(id.clone(), name, convert::kind_of(name));
        match self.tracker.announce(state) {
            Ok(state) => self.send(SessionUpdate::ToolCall(convert::tool_call(&state))),
            Err(e) => {
                tracing::debug!(error = %e, "tool call not announced");
                Ok(())
            }
        }
    }

    /// Sends what `patch` changes, if anything.
    fn patch(&mut self, patch: ToolCallPatch) -> Result<(), agent_client_protocol::Error> {
        match self.tracker.update(patch, Instant::now()) {
            Ok(Some(patch)) if !patch.is_empty() => self.send(SessionUpdate::ToolCallUpdate(
                convert::tool_call_update(&patch),
            )),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, "tool call update dropped");
                Ok(())
            }
        }
    }
}

/// The result text of call `id` in its result message.
fn result_text(message: &Message, id: &ToolCallId) -> String {
    message
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                ..
            } if tool_use_id == id => Some(content.as_str()),
            _ => None,
        })
        .collect()
}

/// The session updates that show `messages` (a conversation's active
/// branch) again, for `session/load`: user and agent text, reasoning, and
/// each tool call once with its final status and result.
pub(crate) fn replay(messages: &[Message]) -> Vec<SessionUpdate> {
    let mut results: HashMap<&ToolCallId, (&str, bool)> = HashMap::new();
    for message in messages {
        for block in &message.content {
            if let ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } = block
            {
                results.insert(tool_use_id, (content.as_str(), *is_error));
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
                (Role::Assistant, ContentBlock::Text { text }) => {
                    updates.push(SessionUpdate::AgentMessageChunk(chunk(text)));
                }
                (Role::Assistant, ContentBlock::Reasoning { text }) => {
                    updates.push(SessionUpdate::AgentThoughtChunk(chunk(text)));
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
                    let mut state = ToolCallState::new(id.clone(), name, convert::kind_of(name));
                    state.raw_input = Some(arguments.clone());
                    if let Some((text, is_error)) = results.get(id) {
                        state.status = if *is_error {
                            ToolCallStatus::Failed
                        } else {
                            ToolCallStatus::Completed
                        };
                        state.content = vec![ToolCallContent::text(*text)];
                    }
                    updates.push(SessionUpdate::ToolCall(convert::tool_call(&state)));
                }
                _ => {}
            }
        }
    }
    updates
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
                }],
            ),
        ];
        let json = serde_json::to_value(replay(&branch)).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!([
                {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hi"}},
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Reading."}},
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": "c1",
                    "title": "read_file",
                    "kind": "read",
                    "status": "failed",
                    "content": [{"type": "content", "content": {"type": "text", "text": "no such file"}}],
                    "rawInput": {"path": "a"}
                }
            ])
        );
    }
}
