//! What the engine tells its clients, one event per happening. Protocol
//! neutral: front doors translate these into ACP, Letta or WebSocket
//! messages.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::{Decision, GatedCall};
use crate::ids::{ConversationId, MessageId, RunId, ToolCallId};
use crate::message::{Message, Usage};
use crate::notification::Notice;
use crate::tool_spec::ToolCall;

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
    /// A token or cost budget (of the turn, the conversation or the
    /// agent) was used up; the error names which.
    BudgetExceeded,
}

impl StopReason {
    /// The name it is stored and sent under.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxSteps => "max_steps",
            StopReason::Cancelled => "cancelled",
            StopReason::Error => "error",
            StopReason::LlmApiError => "llm_api_error",
            StopReason::Interrupted => "interrupted",
            StopReason::RequiresApproval => "requires_approval",
            StopReason::BudgetExceeded => "budget_exceeded",
        }
    }

    /// The reason named `s` (as [`StopReason::as_str`] gives), if any.
    pub fn parse(s: &str) -> Option<StopReason> {
        Some(match s {
            "end_turn" => StopReason::EndTurn,
            "max_steps" => StopReason::MaxSteps,
            "cancelled" => StopReason::Cancelled,
            "error" => StopReason::Error,
            "llm_api_error" => StopReason::LlmApiError,
            "interrupted" => StopReason::Interrupted,
            "requires_approval" => StopReason::RequiresApproval,
            "budget_exceeded" => StopReason::BudgetExceeded,
            _ => return None,
        })
    }
}

/// A place a tool touches, for editors to show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    /// The file's path.
    pub path: String,
    /// The line, counted from 1, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// What a running tool reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Progress {
    /// A short human status ("Running cargo test…").
    Status {
        /// The status.
        text: String,
    },
    /// Output appended to what the tool has shown so far.
    Output {
        /// The output, in order after what came before.
        text: String,
    },
    /// The places the tool works on.
    Locations {
        /// The places, most relevant first.
        locations: Vec<Location>,
    },
}

/// One happening in a conversation. Every event is stored before it is
/// published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    /// A turn began with this user message (already stored).
    TurnStarted {
        /// The turn this happened in.
        run_id: RunId,
        /// The conversation the turn runs in.
        conversation_id: ConversationId,
        /// The user message that started it.
        message: Message,
    },
    /// A model call begins; what it streams becomes message `message_id`.
    StepStarted {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored message it is about.
        message_id: MessageId,
        /// 1 for the turn's first model call.
        iteration: u32,
    },
    /// The model asked for step `message_id` was busy or out of reach
    /// (after its own retries, before its first byte); `to`, the next of
    /// its fallback models, is asked instead. Stored, so the step keeps
    /// why another model wrote it.
    ModelFallback {
        /// The turn this happened in.
        run_id: RunId,
        /// The step (the assistant message it becomes).
        message_id: MessageId,
        /// The registry name of the model that failed.
        from: String,
        /// The registry name of the model asked next.
        to: String,
        /// Why: `overloaded`, `rate_limited`, `server_error`,
        /// `unreachable` or `timeout`.
        reason: String,
        /// The failure as the provider reported it.
        error: String,
    },
    /// Assistant prose as it streams.
    TextDelta {
        /// The turn this happened in.
        run_id: RunId,
        /// The next piece of prose.
        text: String,
    },
    /// Assistant reasoning as it streams.
    ReasoningDelta {
        /// The turn this happened in.
        run_id: RunId,
        /// The next piece of reasoning.
        text: String,
    },
    /// The model has written a tool call's name (early, from the stream).
    ToolCallStarted {
        /// The turn this happened in.
        run_id: RunId,
        /// The tool call it is about.
        call_id: ToolCallId,
        /// The tool's name.
        name: String,
        /// The MCP server the tool belongs to, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<String>,
    },
    /// Raw argument text of a call still being written.
    ArgumentsDelta {
        /// The turn this happened in.
        run_id: RunId,
        /// The tool call it is about.
        call_id: ToolCallId,
        /// The next piece of the arguments' JSON source.
        fragment: String,
    },
    /// A top-level argument whose value is complete.
    ArgumentField {
        /// The turn this happened in.
        run_id: RunId,
        /// The tool call it is about.
        call_id: ToolCallId,
        /// The argument's name.
        key: String,
        /// Its complete value.
        value: Value,
    },
    /// The model finished a message; it is stored.
    AssistantMessageCreated {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored assistant message.
        message: Message,
    },
    /// The calls of that message, about to run.
    ToolCallsGenerated {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored message it is about.
        message_id: MessageId,
        /// The calls, in the order the model wrote them.
        calls: Vec<ToolCall>,
    },
    /// A tool call began to run.
    ToolExecutionStarted {
        /// The turn this happened in.
        run_id: RunId,
        /// The tool call it is about.
        call_id: ToolCallId,
        /// The tool's name.
        name: String,
    },
    /// A running tool reported progress.
    ToolExecutionProgress {
        /// The turn this happened in.
        run_id: RunId,
        /// The tool call it is about.
        call_id: ToolCallId,
        /// What the tool reported.
        progress: Progress,
    },
    /// The tool finished; its result is stored as `message`.
    ToolExecutionCompleted {
        /// The turn this happened in.
        run_id: RunId,
        /// The tool call it is about.
        call_id: ToolCallId,
        /// The stored result message.
        message: Message,
    },
    /// The tool failed; the error is stored as a result in `message`.
    ToolExecutionFailed {
        /// The turn this happened in.
        run_id: RunId,
        /// The tool call it is about.
        call_id: ToolCallId,
        /// What went wrong, as the model is told.
        error: String,
        /// The stored result message carrying the error.
        message: Message,
    },
    /// The message's calls, some of which wait for answers (in place of
    /// `tool_calls_generated`); the turn stops with `requires_approval`
    /// next.
    ApprovalRequested {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored message it is about.
        message_id: MessageId,
        /// Every call of the message, in order, with the gate of those that wait.
        calls: Vec<GatedCall>,
    },
    /// The waiting calls were answered (or the pause was cleared by a
    /// cancel: then every decision is a denial).
    ApprovalResolved {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored message it is about.
        message_id: MessageId,
        /// The answer given to each waiting call.
        decisions: Vec<(ToolCallId, Decision)>,
    },
    /// Notifications were delivered with message `message_id` (a tool
    /// result, or a user message that starts a turn); `text` is the block
    /// the model reads.
    NotificationsInjected {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored message it is about.
        message_id: MessageId,
        /// The notifications, one per line of the block.
        notices: Vec<Notice>,
        /// The block as the model reads it.
        text: String,
    },
    /// A user message sent while the turn ran.
    UserInterjection {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored user message.
        message: Message,
    },
    /// The final answer of the turn, with the turn's totals.
    FinalResponse {
        /// The turn this happened in.
        run_id: RunId,
        /// The stored message it is about.
        message_id: MessageId,
        /// Tokens of the whole turn.
        usage: Usage,
        /// The turn's cost in US dollars, when the model is priced.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost: Option<f64>,
    },
    /// The older part of the path was summarised: `message` is the
    /// stored compaction node (its content a
    /// [`ContentBlock::Compaction`](crate::ContentBlock::Compaction)).
    ContextCompacted {
        /// The turn (or on-demand compaction) this happened in.
        run_id: RunId,
        /// The stored compaction node.
        message: Message,
    },
    /// A budget is nearly used up (its `warn_at` share passed).
    BudgetWarning {
        /// The turn this happened in.
        run_id: RunId,
        /// Which budget: `turn`, `conversation` or `agent`.
        scope: String,
        /// What it limits: `tokens` or `cost`.
        measure: String,
        /// Used so far (tokens, or US dollars).
        used: f64,
        /// The limit.
        limit: f64,
    },
    /// The turn ended.
    Stopped {
        /// The turn this happened in.
        run_id: RunId,
        /// Why it ended.
        reason: StopReason,
        /// What went wrong, when the turn failed.
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
            | AgentEvent::ModelFallback { run_id, .. }
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
            | AgentEvent::ContextCompacted { run_id, .. }
            | AgentEvent::BudgetWarning { run_id, .. }
            | AgentEvent::Stopped { run_id, .. } => *run_id,
        }
    }
}
