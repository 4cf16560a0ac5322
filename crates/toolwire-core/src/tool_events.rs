//! From agent events to tool-call changes: what each event means for the
//! calls a client shows, as input for a [`ToolCallTracker`].
//!
//! Every front door that shows tool calls (ACP, the live view) feeds the
//! same events to its tracker; keeping the mapping here means they agree
//! on when a call is pending, running or done, and on what its result
//! shows.
//!
//! [`ToolCallTracker`]: crate::ToolCallTracker

use crate::event::{AgentEvent, Progress};
use crate::ids::ToolCallId;
use crate::message::{ContentBlock, Message};
use crate::tool_call::{ToolCallContent, ToolCallPatch, ToolCallStatus, ToolKind};

/// One change to a call, in the order an event implies them.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCallChange {
    /// The call exists (its name has streamed in). Announcing a call the
    /// tracker already knows is to be skipped, not refused: several events
    /// name the same call.
    Announce { id: ToolCallId, name: String },
    /// Fields that change (boxed: a patch is large, the others small).
    Patch(Box<ToolCallPatch>),
    /// Output the running tool appended.
    Output { id: ToolCallId, text: String },
}

impl ToolCallChange {
    pub fn patch(patch: ToolCallPatch) -> Self {
        ToolCallChange::Patch(Box::new(patch))
    }
}

/// What a built-in tool does, from its name; `Other` for the rest.
pub fn kind_of(name: &str) -> ToolKind {
    match name {
        "read_file" => ToolKind::Read,
        "write_file" | "apply_diff" => ToolKind::Edit,
        "search" => ToolKind::Search,
        "run_command" => ToolKind::Execute,
        _ => ToolKind::Other,
    }
}

/// The result text of call `id` in its result message.
pub fn result_text(message: &Message, id: &ToolCallId) -> String {
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

/// The tool-call changes `event` carries (none for most events).
pub fn changes(event: &AgentEvent) -> Vec<ToolCallChange> {
    let announce = |id: &ToolCallId, name: &str| ToolCallChange::Announce {
        id: id.clone(),
        name: name.to_owned(),
    };
    match event {
        AgentEvent::ToolCallStarted { call_id, name, .. } => vec![announce(call_id, name)],
        AgentEvent::ToolCallsGenerated { calls, .. } => calls
            .iter()
            .flat_map(|call| {
                [
                    announce(&call.id, &call.name),
                    ToolCallChange::patch(
                        ToolCallPatch::new(call.id.clone()).raw_input(call.arguments.clone()),
                    ),
                ]
            })
            .collect(),
        AgentEvent::ApprovalRequested { calls, .. } => calls
            .iter()
            .flat_map(|gated| {
                let call = &gated.call;
                [
                    announce(&call.id, &call.name),
                    ToolCallChange::patch(
                        ToolCallPatch::new(call.id.clone()).raw_input(call.arguments.clone()),
                    ),
                ]
            })
            .collect(),
        AgentEvent::ToolExecutionStarted { call_id, name, .. } => vec![
            announce(call_id, name),
            ToolCallChange::patch(
                ToolCallPatch::new(call_id.clone()).status(ToolCallStatus::InProgress),
            ),
        ],
        AgentEvent::ToolExecutionProgress {
            call_id, progress, ..
        } => match progress {
            Progress::Output { text } => vec![ToolCallChange::Output {
                id: call_id.clone(),
                text: text.clone(),
            }],
            Progress::Locations { locations } => vec![ToolCallChange::patch(
                ToolCallPatch::new(call_id.clone()).locations(locations.clone()),
            )],
            // A passing status line is the tool's, not the call's state.
            Progress::Status { .. } => Vec::new(),
        },
        AgentEvent::ToolExecutionCompleted {
            call_id, message, ..
        } => vec![ToolCallChange::patch(
            ToolCallPatch::new(call_id.clone())
                .status(ToolCallStatus::Completed)
                .content(vec![ToolCallContent::text(result_text(message, call_id))]),
        )],
        AgentEvent::ToolExecutionFailed {
            call_id,
            error,
            message,
            ..
        } => {
            let text = result_text(message, call_id);
            // A failure stored no text of its own: the error says it.
            let text = if text.is_empty() { error.clone() } else { text };
            vec![ToolCallChange::patch(
                ToolCallPatch::new(call_id.clone())
                    .status(ToolCallStatus::Failed)
                    .content(vec![ToolCallContent::text(text)]),
            )]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ToolCall;
    use crate::ids::{ConversationId, MessageId, RunId};
    use crate::message::Role;
    use serde_json::json;

    #[test]
    fn kinds_follow_the_builtin_names() {
        assert_eq!(kind_of("read_file"), ToolKind::Read);
        assert_eq!(kind_of("apply_diff"), ToolKind::Edit);
        assert_eq!(kind_of("run_command"), ToolKind::Execute);
        assert_eq!(kind_of("list_dir"), ToolKind::Other);
    }

    #[test]
    fn a_call_is_announced_given_arguments_run_and_finished() {
        let run_id = RunId::new();
        let id = ToolCallId("c1".into());
        let generated = AgentEvent::ToolCallsGenerated {
            run_id,
            message_id: MessageId::new(),
            calls: vec![ToolCall {
                id: id.clone(),
                server: None,
                name: "read_file".into(),
                arguments: json!({"path": "a"}),
            }],
        };
        assert_eq!(
            changes(&generated),
            vec![
                ToolCallChange::Announce {
                    id: id.clone(),
                    name: "read_file".into()
                },
                ToolCallChange::patch(
                    ToolCallPatch::new(id.clone()).raw_input(json!({"path": "a"}))
                ),
            ]
        );
        let message = Message::new(
            ConversationId::new(),
            None,
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: id.clone(),
                content: String::new(),
                is_error: true,
            }],
        );
        let failed = AgentEvent::ToolExecutionFailed {
            run_id,
            call_id: id.clone(),
            error: "boom".into(),
            message,
        };
        assert_eq!(
            changes(&failed),
            vec![ToolCallChange::patch(
                ToolCallPatch::new(id)
                    .status(ToolCallStatus::Failed)
                    .content(vec![ToolCallContent::text("boom")])
            )]
        );
    }
}
