//! The one event enum every decoder produces.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

/// A tool call's id: the provider's, or `xml_call_N` for XML calls. Shared,
/// because every event of a call carries it.
pub type CallId = Arc<str>;

/// What a decoder learned from the bytes it was fed, in input order.
///
/// Events are emitted in byte order: an event fires in the `feed` call that
/// delivers the byte that makes it certain, and never later. Fragment events
/// (`TextDelta`, `ReasoningDelta`, `ArgumentsDelta`, `ArgumentFieldDelta`)
/// are coalesced per `feed` call, so different chunkings of the same input
/// give the same events once adjacent fragments are concatenated.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// Assistant prose.
    TextDelta {
        /// The text, in order after the previous delta.
        text: String,
    },
    /// Reasoning ("thinking") text, kept apart from the answer.
    ReasoningDelta {
        /// The text, in order after the previous delta.
        text: String,
    },
    /// XML only: `<tool_call>` has been seen; name not known yet.
    ToolCallOpened {
        /// The id given to the call (XML calls carry none).
        call_id: CallId,
    },
    /// The tool's name is complete.
    ToolCallStarted {
        /// The call this belongs to (the provider's id, or one made up).
        call_id: CallId,
        /// The tool's name as the model wrote it.
        name: String,
        /// The MCP server the tool belongs to, when the provider says.
        #[serde(skip_serializing_if = "Option::is_none")]
        server: Option<String>,
    },
    /// Raw argument text (JSON source) as it streams.
    ArgumentsDelta {
        /// The call this belongs to (the provider's id, or one made up).
        call_id: CallId,
        /// The next piece of the arguments' JSON source.
        fragment: String,
    },
    /// Decoded characters appended to a top-level string field that is
    /// still streaming.
    ArgumentFieldDelta {
        /// The call this belongs to (the provider's id, or one made up).
        call_id: CallId,
        /// The field's name.
        key: Arc<str>,
        /// Decoded characters to append to the field's value.
        fragment: String,
    },
    /// A top-level field of the arguments object whose value is complete.
    ArgumentField {
        /// The call this belongs to (the provider's id, or one made up).
        call_id: CallId,
        /// The field's name.
        key: Arc<str>,
        /// Its complete value.
        value: Value,
    },
    /// The call is closed by the provider and its arguments are a valid
    /// JSON object (or, for free-form custom tools, a JSON string).
    ToolCallReady {
        /// The call this belongs to (the provider's id, or one made up).
        call_id: CallId,
        /// The tool's name.
        name: String,
        /// The MCP server the tool belongs to, when the provider says.
        #[serde(skip_serializing_if = "Option::is_none")]
        server: Option<String>,
        /// The whole arguments: an object (a string for custom tools).
        arguments: Value,
    },
    /// The call cannot be run; `reason` says why.
    ToolCallFailed {
        /// The call this belongs to (the provider's id, or one made up).
        call_id: CallId,
        /// Why it cannot run, for the model and the user.
        reason: String,
    },
    /// Token counts reported by the provider.
    Usage(Usage),
    /// The provider says the message is over.
    Finished {
        /// Why the model stopped.
        reason: FinishReason,
    },
    /// The provider reported an error inside the stream.
    ProviderError {
        /// The provider's error, as it said it.
        message: String,
    },
    /// Input that could not be decoded; decoding goes on after it.
    ParseError {
        /// What could not be decoded, and where.
        message: String,
    },
    /// Input went over one of the decoder's limits (an SSE line or event,
    /// a JSON body) and was dropped: what follows cannot be trusted to
    /// be whole, so the caller should end the model call with `message`.
    LimitExceeded {
        /// Which limit, and by how much.
        message: String,
    },
}

impl StreamEvent {
    /// The prose of a `TextDelta`, so text can be gathered with
    /// `events.iter().filter_map(StreamEvent::text)`.
    pub fn text(&self) -> Option<&str> {
        match self {
            StreamEvent::TextDelta { text } => Some(text),
            _ => None,
        }
    }

    /// The `type` tag this event carries when serialized.
    pub fn kind(&self) -> &'static str {
        match self {
            StreamEvent::TextDelta { .. } => "text_delta",
            StreamEvent::ReasoningDelta { .. } => "reasoning_delta",
            StreamEvent::ToolCallOpened { .. } => "tool_call_opened",
            StreamEvent::ToolCallStarted { .. } => "tool_call_started",
            StreamEvent::ArgumentsDelta { .. } => "arguments_delta",
            StreamEvent::ArgumentFieldDelta { .. } => "argument_field_delta",
            StreamEvent::ArgumentField { .. } => "argument_field",
            StreamEvent::ToolCallReady { .. } => "tool_call_ready",
            StreamEvent::ToolCallFailed { .. } => "tool_call_failed",
            StreamEvent::Usage(_) => "usage",
            StreamEvent::Finished { .. } => "finished",
            StreamEvent::ProviderError { .. } => "provider_error",
            StreamEvent::ParseError { .. } => "parse_error",
            StreamEvent::LimitExceeded { .. } => "limit_exceeded",
        }
    }
}

/// Token counts. Providers name these differently; the decoders map them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Every token of the request, those read from and written to the
    /// provider's cache included (OpenAI's count; Anthropic's decoder adds
    /// its cache reads and writes to its `input_tokens`).
    pub prompt_tokens: u64,
    /// Tokens the model wrote (reasoning included).
    pub completion_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    pub cached_tokens: u64,
    /// Prompt tokens written to the provider's cache (Anthropic's
    /// `cache_creation_input_tokens`; OpenAI reports none).
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Completion tokens spent on reasoning, where reported.
    pub reasoning_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end of the answer.
    EndTurn,
    /// The model stopped to have tools run.
    ToolUse,
    /// Cut off by the output token limit.
    MaxTokens,
    /// A stop sequence matched.
    StopSequence,
    /// Withheld by the provider's content filter.
    ContentFilter,
    /// The stream ended cleanly (`[DONE]`) without naming a reason.
    Unspecified,
    /// A reason this crate does not know, verbatim.
    Other(String),
}
