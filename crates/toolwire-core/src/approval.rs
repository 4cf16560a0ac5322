//! Tool calls that wait: for a person's yes or no, or for the client that
//! owns the tool to run it. A step with such calls pauses the turn; the
//! pause is stored, so it survives a restart, and the turn goes on when
//! every waiting call has an answer.

use serde::{Deserialize, Serialize};

use crate::ids::{ConversationId, MessageId, RunId, ToolCallId};
use crate::tool_spec::ToolCall;

/// Why a call does not run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Runs on the server once approved.
    Approval,
    /// The client runs it and sends back the result.
    Client,
}

/// A call of a paused step. Calls without a gate need no answer: they run
/// with the answered ones when the turn goes on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatedCall {
    /// The call as the model wrote it.
    pub call: ToolCall,
    /// What it waits for; `None`: it needs no answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<Gate>,
    /// Why the call cannot run (its arguments could not be read); it is
    /// answered with this error and never waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
}

/// A turn paused for answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// The conversation it belongs to.
    pub conversation_id: ConversationId,
    /// The run that paused.
    pub run_id: RunId,
    /// The assistant message whose calls wait.
    pub message_id: MessageId,
    /// Which model call of its turn made that message (1-based).
    #[serde(default)]
    pub iteration: u32,
    /// Every call of that message, in order.
    pub calls: Vec<GatedCall>,
    /// When it was created.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl PendingApproval {
    /// The calls that need an answer, in order.
    pub fn waiting(&self) -> impl Iterator<Item = &GatedCall> {
        self.calls.iter().filter(|c| c.gate.is_some())
    }

    /// The ids of the calls that need an answer, in order.
    pub fn waiting_ids(&self) -> Vec<ToolCallId> {
        self.waiting().map(|c| c.call.id.clone()).collect()
    }
}

/// The answer to one waiting call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Run it on the server.
    Approve,
    /// Do not run it; the model is told why.
    Deny {
        /// Why, for the model (optional).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The client ran it: this is its result.
    Result {
        /// The result's text, as the model reads it.
        content: String,
        /// Whether the tool failed (the content is then its error).
        is_error: bool,
    },
}

impl Decision {
    /// What the model is told about a denied call.
    pub fn denial_text(reason: Option<&str>) -> String {
        match reason {
            Some(r) if !r.trim().is_empty() => {
                format!("Error: request to call tool denied. User reason: {r}")
            }
            _ => "Error: request to call tool denied.".to_owned(),
        }
    }
}

/// A pause and how it was answered, kept for the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedApproval {
    /// The pause that was answered.
    pub pending: PendingApproval,
    /// One per waiting call, in the calls' order.
    pub decisions: Vec<(ToolCallId, Decision)>,
    /// When it was answered.
    pub resolved_at: chrono::DateTime<chrono::Utc>,
}
