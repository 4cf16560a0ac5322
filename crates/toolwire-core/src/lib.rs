//! # toolwire-core
//!
//! **Owns** toolwire's domain: ids ([`ids`]), messages and content blocks
//! ([`message`]), image references and what an image is ([`image`]), the conversation tree and its rules ([`tree`]), agent
//! events ([`event`]), paused tool calls ([`approval`]), the notification
//! queue and block ([`notification`]), tool-call state and the patches
//! that update it ([`tool_call`]), what agent events mean for tool calls
//! ([`tool_events`], shared by every front door), what a model is told
//! about a tool ([`tool_spec`]), model pricing ([`pricing`]) and the
//! redaction of secrets from URLs shown in errors ([`redact`]).
//!
//! **Invariants.** Pure: no I/O, no async, no wire-format names (no ACP,
//! Letta or provider JSON). Every message but a conversation's root has a
//! parent in the same conversation; edits and regenerations add siblings
//! and never remove or rewrite a message.
//!
//! **Entry points.** [`Message`], [`ContentBlock`], [`ConversationTree`],
//! [`AgentEvent`], [`StopReason`], [`ToolCallTracker`], [`PriceTable`].

// The domain types are the vocabulary of every crate above: each says what it is for.
#![warn(missing_docs)]

pub mod approval;
pub mod event;
pub mod ids;
pub mod image;
pub mod message;
pub mod notification;
pub mod pricing;
pub mod redact;
pub mod tool_call;
pub mod tool_events;
pub mod tool_spec;
pub mod tree;

pub use approval::{Decision, Gate, GatedCall, PendingApproval, ResolvedApproval};
pub use event::{AgentEvent, Location, Progress, StopReason};
pub use ids::{AgentId, ConversationId, InstanceId, InvalidId, MessageId, RunId, ToolCallId};
pub use image::{BlobRef, ImageError, MAX_IMAGE_BYTES};
pub use message::{
    ContentBlock, Message, MessageStatus, NOT_RUN_AFTER_STOP, Priority, Role, Usage,
};
pub use notification::{
    Batch, FileChange, Incoming, Notice, NotificationQueue, NotifyConfig, format_block,
    is_reserved_source,
};
pub use pricing::{Price, PriceTable};
pub use tool_call::{
    OUTPUT_LIMIT, OutputTail, TerminalOutput, ToolCallContent, ToolCallPatch, ToolCallState,
    ToolCallStatus, ToolCallTracker, ToolKind, TrackerConfig, TrackerError, TrackerMetrics,
};
pub use tool_events::{ToolCallChange, kind_of};
pub use tool_spec::{ToolCall, ToolSpec};
pub use tree::{Conversation, ConversationTree, ForkOrigin, TreeError};
