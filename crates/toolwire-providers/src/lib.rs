//! # toolwire-providers
//!
//! **Owns** the model providers: a request (the conversation path and the
//! tools) in, a stream of [`StreamEvent`]s out. HTTP providers speak
//! OpenAI chat completions ([`openai`]) or Anthropic messages
//! ([`anthropic`]) and decode with `toolwire-stream`; [`xml_format`]
//! writes tools into the prompt for models without tool calling; the
//! scripted provider ([`scripted`]) plays a script for tests and demos.
//! The HTTP client and its retry policy (`Retry-After`, backoff, time and
//! size limits) are shared by every HTTP provider.
//!
//! **Invariants.** Knows no front door and no store: a provider turns a
//! [`ModelRequest`] into wire JSON and a wire stream into events, nothing
//! else (the images a path refers to come resolved in the request, as
//! [`RequestImages`]; a model without vision, or an image whose bytes are
//! missing, gets a text placeholder naming it). A call is bounded in time and size whatever the server does
//! ([`StreamLimits`]); errors never carry an API key or a URL's secrets.
//! Every tool call sent to a model has a result (a path still missing one
//! gets [`toolwire_core::NOT_RUN_AFTER_STOP`]).
//!
//! [`Models`] is the registry of named models a deployment offers.
//!
//! **Entry points.** [`Provider`], [`ModelRequest`], [`Models`], [`OpenAiProvider`],
//! [`AnthropicProvider`], [`ScriptedProvider`], [`HttpSettings`].

pub mod anthropic;
mod history;
mod http;
mod images;
pub mod openai;
mod redact;
pub mod registry;
mod retry_after;
pub mod scripted;
pub mod xml_format;

use std::pin::Pin;

use async_trait::async_trait;
use futures::Stream;
use toolwire_core::Message;
use toolwire_stream::StreamEvent;

use toolwire_core::ToolSpec;

pub use anthropic::AnthropicProvider;
pub use http::{DEFAULT_MAX_TOKENS, HttpSettings, RetryPolicy, StreamLimits};
pub use images::RequestImages;
pub use openai::OpenAiProvider;
pub use registry::{Capabilities, ModelEntry, ModelInfo, Models, RegistryError};
pub use scripted::{Script, ScriptedProvider};

/// What the model is asked.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub system: String,
    /// The path after the root: user, assistant and tool messages.
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    /// Which turn of the conversation this is (0 for the first user
    /// message), and which model call of the turn (1-based).
    pub turn: usize,
    pub iteration: u32,
    /// The bytes of the images the path refers to, and whether the model
    /// sees them (each provider writes them in its own format, or a text
    /// placeholder in their place).
    pub images: RequestImages,
}

/// Why a model call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProviderError {
    #[error("cannot reach {url}: {message}")]
    Connect { url: String, message: String },
    #[error("{url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the stream broke after {received} bytes: {message}")]
    Broken { received: u64, message: String },
    #[error(
        "{url} sent no response within {secs} s (first_byte_timeout_secs): the model server stalled before its first byte"
    )]
    FirstByteTimeout { url: String, secs: f64 },
    #[error(
        "the model's stream stalled: nothing for {secs} s after {received} bytes (stream_idle_timeout_secs)"
    )]
    Stalled { received: u64, secs: f64 },
    #[error(
        "{url} answered 200 with a body that is not an event stream (content type {content_type}); it begins: {start}"
    )]
    NotAStream {
        url: String,
        content_type: String,
        start: String,
    },
    #[error("the model's response went over {limit} bytes; cut")]
    TooLarge { limit: u64 },
    #[error(
        "{url} answered HTTP {status} and asked to retry after {asked}, more than the {limit_secs} s toolwire waits (max_retry_after_secs)"
    )]
    RetryAfterTooLong {
        url: String,
        status: u16,
        asked: String,
        limit_secs: f64,
    },
    #[error("the provider reported an error: {0}")]
    Reported(String),
    #[error("missing API key: set the environment variable {0}")]
    MissingKey(String),
    #[error("script: {0}")]
    Script(String),
}

/// Events of one model call.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, ProviderError>> + Send>>;

/// A model behind some API.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The model name, for usage records and prices.
    fn model(&self) -> &str;
    /// Starts a call. Dropping the stream abandons it.
    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError>;
}

/// How tool calls are written by the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolFormat {
    /// The API's own tool calling.
    #[default]
    Native,
    /// Tools described in the system prompt; calls written as XML text.
    Xml,
}
