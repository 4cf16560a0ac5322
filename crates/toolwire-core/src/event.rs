//! What the engine tells its clients, one event per happening. Protocol
//! neutral: front doors translate these into ACP, Letta or WebSocket
//! messages.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::{Decision, GatedCall};
use crate::ids::{ConversationId, MessageId, RunId, ToolCallId};
use crate::message::{Message, Usage};
use crate::notification::Notice;

/// Why a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model gave its final answer.
    EndTurn,
    /// The step limit (`max_steps`) was reached.
    MaxSteps,
    /// Cancelled by the user; running tools were cancelled.
    Cancelled,
    /// Something other than the model failed.
    Error,
    /// The model provider failed (HTTP error, broken stream).
    LlmApiError,
    /// The process stopped mid-turn; found on restart.
    Interrupted,
    /// Paused: tool calls wait for approval or for the client's result.
    RequiresApproval,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxSteps => "max_steps",
            StopReason::Cancelled => "cancelled",
            StopReason::Error => "error",
            StopReason::LlmApiError => "llm_api_error",
            StopReason::Interrupted => "interrupted",
            StopReason::RequiresApproval => "requires_approval",
        }
    }

    pub fn parse(s: &str) -> Option<StopReason> {
        Some(match s {
            "end_turn" => StopReason::EndTurn,
            "max_steps" => StopReason::MaxSteps,
            "cancelled" => StopReason::Cancelled,
            "error" => StopReason::Error,
            "llm_api_error" => StopReason::LlmApiError,
            "interrupted" => StopReason::Interrupted,
            "requires_approval" => StopReason::RequiresApproval,
            _ => return None,
        })
    }
}

/// A place a tool touches, for editors to show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// What a running tool reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Progress {
    /// A short human status ("Running cargo test…").
    Status { text: String },
    /// Output appended to what the tool has shown so far.
    Output { text: String },
    /// The places the tool works on.
    Locations { locations: Vec<Location> },
}

/// A tool call as the model wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: ToolCallId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    pub name: String,
    pub arguments: Value,
}

/// One happening in a conversation. Every event is stored before it is
/// published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    /// A turn began with this user message (already stored).
    TurnStarted {
        run_id: RunId,
        conversation_id: ConversationId,
        message: Message,
    },
    /// A model call begins; what it streams becomes message `message_id`.
    StepStarted {
        run_id: RunId,
        message_id: MessageId,
        /// 1 for the turn's first model call.
        iteration: u32,
    },
    /// Assistant prose as it streams.
    TextDelta { run_id: RunId, text: String },
    /// Assistant reasoning as it streams.
    ReasoningDelta { run_id: RunId, text: String },
    /// The model has written a tool call's name (early, from the stream).
    ToolCallStarted {
        run_id: RunId,
        call_id: ToolCallId,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<String>,
    },
    /// Raw argument text of a call still being written.
    ArgumentsDelta {
        run_id: RunId,
        call_id: ToolCallId,
        fragment: String,
    },
    /// A top-level argument whose value is complete.
    ArgumentField {
        run_id: RunId,
        call_id: ToolCallId,
        key: String,
        value: Value,
    },
    /// The model finished a message; it is stored.
    AssistantMessageCreated { run_id: RunId, message: Message },
    /// The calls of that message, about to run.
    ToolCallsGenerated {
        run_id: RunId,
        message_id: MessageId,
        calls: Vec<ToolCall>,
    },
    ToolExecutionStarted {
        run_id: RunId,
        call_id: ToolCallId,
        name: String,
    },
    ToolExecutionProgress {
        run_id: RunId,
        call_id: ToolCallId,
        progress: Progress,
    },
    /// The tool finished; its result is stored as `message`.
    ToolExecutionCompleted {
        run_id: RunId,
        call_id: ToolCallId,
        message: Message,
    },
    /// The tool failed; the error is stored as a result in `message`.
    ToolExecutionFailed {
        run_id: RunId,
        call_id: ToolCallId,
        error: String,
        message: Message,
    },
    /// The message's calls, some of which wait for answers (in place of
    /// `tool_calls_generated`); the turn stops with `requires_approval`
    /// next.
    ApprovalRequested {
        run_id: RunId,
        message_id: MessageId,
        calls: Vec<GatedCall>,
    },
    /// The waiting calls were answered (or the pause was cleared by a
    /// cancel: then every decision is a denial).
    ApprovalResolved {
        run_id: RunId,
        message_id: MessageId,
        decisions: Vec<(ToolCallId, Decision)>,
    },
    /// Notifications were delivered with message `message_id` (a tool
    /// result, or a user message that starts a turn); `text` is the block
    /// the model reads.
    NotificationsInjected {
        run_id: RunId,
        message_id: MessageId,
        notices: Vec<Notice>,
        text: String,
    },
    /// A user message sent while the turn ran.
    UserInterjection { run_id: RunId, message: Message },
    /// The final answer of the turn, with the turn's totals.
    FinalResponse {
        run_id: RunId,
        message_id: MessageId,
        usage: Usage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost: Option<f64>,
    },
    /// The turn ended.
    Stopped {
        run_id: RunId,
        reason: StopReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

impl AgentEvent {
    /// The run this event belongs to.
    pub fn run_id(&self) -> RunId {
        match self {
            AgentEvent::TurnStarted { run_id, .. }
            | AgentEvent::StepStarted { run_id, .. }
            | AgentEvent::TextDelta { run_id, .. }
            | AgentEvent::ReasoningDelta { run_id, .. }
            | AgentEvent::ToolCallStarted { run_id, .. }
            | AgentEvent::ArgumentsDelta { run_id, .. }
            | AgentEvent::ArgumentField { run_id, .. }
            | AgentEvent::AssistantMessageCreated { run_id, .. }
            | AgentEvent::ToolCallsGenerated { run_id, .. }
            | AgentEvent::ToolExecutionStarted { run_id, .. }
            | AgentEvent::ToolExecutionProgress { run_id, .. }
            | AgentEvent::ToolExecutionCompleted { run_id, .. }
            | AgentEvent::ToolExecutionFailed { run_id, .. }
            | AgentEvent::ApprovalRequested { run_id, .. }
            | AgentEvent::ApprovalResolved { run_id, .. }
            | AgentEvent::NotificationsInjected { run_id, .. }
            | AgentEvent::UserInterjection { run_id, .. }
            | AgentEvent::FinalResponse { run_id, .. }
            | AgentEvent::Stopped { run_id, .. } => *run_id,
        }
    }
}
