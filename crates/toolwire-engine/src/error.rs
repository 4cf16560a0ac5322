//! What the engine could not do: the one error type of its API, shared by
//! the engine and its followers.

use toolwire_core::{ConversationId, MessageId, ToolCallId, TreeError};
use toolwire_store::StoreError;

/// What the engine could not do.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("a turn is already running in conversation {0}; interject or cancel it")]
    TurnInProgress(ConversationId),
    /// The engine is stopping (the process got SIGTERM or Ctrl-C): nothing
    /// was stored; the same request can be sent again once it is back.
    #[error("toolwire is shutting down and starts no new turn; send it again once it is back")]
    ShuttingDown,
    /// The turn's first step (its user message, or the answers it goes on
    /// from) could not be stored, so nothing was started.
    #[error("the turn could not start: {0}")]
    NotStarted(String),
    #[error(
        "conversation {conversation} waits for answers to the tool calls of message {message_id}; \
         answer them (or cancel) first"
    )]
    ApprovalPending {
        conversation: ConversationId,
        message_id: MessageId,
    },
    /// An image a front door was given is refused (too large, or not an
    /// image toolwire accepts): nothing was stored.
    #[error(transparent)]
    Image(#[from] toolwire_core::ImageError),
    /// A turn named a model the registry does not have.
    #[error("no model named `{0}` is configured")]
    UnknownModel(String),
    #[error("conversation {0} has no tool calls waiting for an answer")]
    NothingPending(ConversationId),
    /// An approval for a call whose result must come from the client: the
    /// server cannot run it.
    #[error(
        "tool call `{}` is a client tool: the client runs it and sends its result \
         (or denies it); it cannot be approved to run on the server",
        .0.0
    )]
    ClientToolApproved(ToolCallId),
    #[error("{}", mismatch_message(expected, received))]
    ApprovalMismatch {
        /// Every waiting call: each needs exactly one answer.
        expected: Vec<ToolCallId>,
        /// The calls answered, in the order given.
        received: Vec<ToolCallId>,
    },
}

fn mismatch_message(expected: &[ToolCallId], received: &[ToolCallId]) -> String {
    let unexpected: Vec<ToolCallId> = received
        .iter()
        .filter(|r| !expected.contains(r))
        .cloned()
        .collect();
    let list = |ids: &[ToolCallId]| {
        ids.iter()
            .map(|i| i.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "every waiting tool call needs an answer; expected answers for: {}",
        list(expected)
    );
    if !unexpected.is_empty() {
        text.push_str(&format!("; these calls do not wait: {}", list(&unexpected)));
    }
    text
}
