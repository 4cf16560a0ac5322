//! From agent events to tool-call changes: what each event means for the
//! calls a client shows, as input for a [`ToolCallTracker`].
//!
//! Every front door that shows tool calls (ACP, the live view) feeds the
//! same events to its tracker; keeping the mapping here means they agree
//! on when a call is pending, running or done, and on what its result
//! shows.
//!
//! [`ToolCallTracker`]: crate::ToolCallTracker

use serde_json::{Map, Value};

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
    Announce {
        /// The call.
        id: ToolCallId,
        /// The tool's name.
        name: String,
    },
    /// Fields that change (boxed: a patch is large, the others small).
    Patch(Box<ToolCallPatch>),
    /// Output the running tool appended.
    Output {
        /// The call.
        id: ToolCallId,
        /// The output, in order after what came before.
        text: String,
    },
    /// A passing status line of the running tool (an MCP server's
    /// progress, say): shown while the call has nothing else to show
    /// ([`ToolCallTracker::status_line`]).
    ///
    /// [`ToolCallTracker::status_line`]: crate::ToolCallTracker::status_line
    StatusLine {
        /// The call.
        id: ToolCallId,
        /// The status line.
        text: String,
    },
    /// A top-level argument of a call still streaming is complete: the
    /// call's `raw_input` grows by it. Only the consumer knows the fields
    /// so far (its tracker's current state), so it builds the patch with
    /// [`ToolCallChange::grown_input`].
    ArgumentField {
        /// The call.
        id: ToolCallId,
        /// The argument's name.
        key: String,
        /// Its complete value.
        value: Value,
    },
}

impl ToolCallChange {
    /// A [`ToolCallChange::Patch`] of `patch`.
    pub fn patch(patch: ToolCallPatch) -> Self {
        ToolCallChange::Patch(Box::new(patch))
    }

    /// `current` raw input with `key` set to `value`: an object of the
    /// fields complete so far. A current input that is not an object
    /// (none yet, or a call whose arguments were not an object) starts
    /// over, since fields can only be shown as an object's.
    pub fn grown_input(current: Option<&Value>, key: &str, value: &Value) -> Value {
        let mut fields = match current {
            Some(Value::Object(fields)) => fields.clone(),
            _ => Map::new(),
        };
        fields.insert(key.to_owned(), value.clone());
        Value::Object(fields)
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

/// [`result_text`], then a line naming each image the result returned:
/// for a door that shows results as text only (ACP's editors, a
/// terminal).
pub fn result_text_with_images(message: &Message, id: &ToolCallId) -> String {
    let mut text = result_text(message, id);
    for block in &message.content {
        if let ContentBlock::ToolResult {
            tool_use_id,
            images,
            ..
        } = block
            && tool_use_id == id
        {
            for image in images {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&image.mention());
            }
        }
    }
    text
}

/// What a failed call shows: its stored result, or the error when the
/// failure stored no text of its own.
pub fn failure_text(message: &Message, id: &ToolCallId, error: &str) -> String {
    let text = result_text(message, id);
    if text.is_empty() {
        error.to_owned()
    } else {
        text
    }
}

/// The tool-call changes `event` carries (none for most events).
pub fn changes(event: &AgentEvent) -> Vec<ToolCallChange> {
    let announce = |id: &ToolCallId, name: &str| ToolCallChange::Announce {
        id: id.clone(),
        name: name.to_owned(),
    };
    match event {
        AgentEvent::ToolCallStarted { call_id, name, .. } => vec![announce(call_id, name)],
        AgentEvent::ArgumentField {
            call_id,
            key,
            value,
            ..
        } => vec![ToolCallChange::ArgumentField {
            id: call_id.clone(),
            key: key.clone(),
            value: value.clone(),
        }],
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
            Progress::Status { text } => vec![ToolCallChange::StatusLine {
                id: call_id.clone(),
                text: text.clone(),
            }],
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
            vec![ToolCallChange::patch(
                ToolCallPatch::new(call_id.clone())
                    .status(ToolCallStatus::Failed)
                    .content(vec![ToolCallContent::text(failure_text(
                        message, call_id, error,
                    ))]),
            )]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ConversationId, MessageId, RunId};
    use crate::message::Role;
    use crate::tool_spec::ToolCall;
    use serde_json::json;

    #[test]
    fn kinds_follow_the_builtin_names() {
        assert_eq!(kind_of("read_file"), ToolKind::Read);
        assert_eq!(kind_of("apply_diff"), ToolKind::Edit);
        assert_eq!(kind_of("run_command"), ToolKind::Execute);
        assert_eq!(kind_of("list_dir"), ToolKind::Other);
    }

    #[test]
    fn argument_fields_grow_the_raw_input() {
        let id = ToolCallId("c1".into());
        let field = AgentEvent::ArgumentField {
            run_id: RunId::new(),
            call_id: id.clone(),
            key: "path".into(),
            value: json!("a.txt"),
        };
        assert_eq!(
            changes(&field),
            vec![ToolCallChange::ArgumentField {
                id,
                key: "path".into(),
                value: json!("a.txt"),
            }]
        );
        let first = ToolCallChange::grown_input(None, "path", &json!("a.txt"));
        assert_eq!(first, json!({"path": "a.txt"}));
        let second = ToolCallChange::grown_input(Some(&first), "lines", &json!([1, 2]));
        assert_eq!(second, json!({"path": "a.txt", "lines": [1, 2]}));
        // A field seen twice (a provider repeating itself) keeps the last.
        let again = ToolCallChange::grown_input(Some(&second), "path", &json!("b.txt"));
        assert_eq!(again, json!({"path": "b.txt", "lines": [1, 2]}));
        // Input that was not an object starts over.
        let over = ToolCallChange::grown_input(Some(&json!("raw")), "path", &json!("a"));
        assert_eq!(over, json!({"path": "a"}));
    }

    #[test]
    fn grown_input_then_the_complete_input_is_one_change_for_the_tracker() {
        use crate::tool_call::{ToolCallState, ToolCallTracker, TrackerConfig};
        let id = ToolCallId("c1".into());
        let now = std::time::Instant::now();
        let mut tracker = ToolCallTracker::new(TrackerConfig {
            coalesce: false,
            ..TrackerConfig::default()
        });
        tracker
            .announce(ToolCallState::new(id.clone(), "read_file", ToolKind::Read))
            .unwrap();
        let mut sent = Vec::new();
        for (key, value) in [("path", json!("a")), ("limit", json!(3))] {
            let current = tracker.current(&id).and_then(|s| s.raw_input.as_ref());
            let input = ToolCallChange::grown_input(current, key, &value);
            let patch = ToolCallPatch::new(id.clone()).raw_input(input);
            sent.push(tracker.update(patch, now).unwrap().unwrap().raw_input);
        }
        assert_eq!(
            sent,
            [
                Some(json!({"path": "a"})),
                Some(json!({"path": "a", "limit": 3}))
            ]
        );
        // The complete arguments, once generated, change nothing more.
        let complete = ToolCallPatch::new(id.clone()).raw_input(json!({"path": "a", "limit": 3}));
        assert_eq!(tracker.update(complete, now).unwrap(), None);
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
                images: Vec::new(),
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
