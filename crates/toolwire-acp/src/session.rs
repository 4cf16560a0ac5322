//! One `session/prompt`: a turn of the engine, its events sent to the
//! client as `session/update` notifications.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentChunk, PromptResponse, SessionId, SessionNotification, SessionUpdate,
};
use toolwire_core::{
    AgentEvent, ContentBlock, Message, Role, ToolCallContent, ToolCallId, ToolCallPatch,
    ToolCallState, ToolCallStatus, ToolCallTracker,
};
use toolwire_engine::{Engine, EngineError, TurnOptions};

use crate::{Session, convert, internal};

/// Runs the prompt's turn to its end and says how the prompt is answered.
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
    let options = TurnOptions {
        tools: Some(session.tools.clone()),
        ..TurnOptions::default()
    };
    let handle = engine
        .send_with(conversation, text, None, options)
        .await
        .map_err(|e| match e {
            EngineError::TurnInProgress(_) | EngineError::ApprovalPending { .. } => {
                crate::invalid_params(e.to_string())
            }
            e => internal(e),
        })?;
    let run_id = handle.run_id;
    let mut updates = Updates {
        session_id,
        cx,
        tracker: ToolCallTracker::default(),
    };
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
            updates.event(&stored.event)?;
        }
    }
    let outcome = handle.wait().await;
    if session.cancelled.load(Ordering::SeqCst) {
        return Ok(PromptResponse::new(
            agent_client_protocol::v1::schema::StopReason::Cancelled,
        ));
    }
    match convert::stop_reason(outcome.reason) {
        Some(reason) => Ok(PromptResponse::new(reason)),
        None => Err(internal(format!(
            "the turn stopped with {}: {}",
            outcome.reason.as_str(),
            outcome.error.unwrap_or_default()
        ))),
    }
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
