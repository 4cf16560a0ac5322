//! # toolwire-providers
//!
//! **Owns** the model providers: a request (the conversation path and the
//! tools) in, a stream of [`StreamEvent`]s out. HTTP providers speak
//! OpenAI chat completions ([`openai`]), OpenAI's Responses API
//! ([`openai_responses`]) or Anthropic messages ([`anthropic`], with
//! prompt-cache breakpoints: [`prompt_cache`]) and decode with
//! `toolwire-stream`; [`xml_format`]
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
//! [`OpenAiResponsesProvider`], [`AnthropicProvider`], [`ScriptedProvider`], [`HttpSettings`].

pub mod anthropic;
pub mod anthropic_wire;
mod history;
mod http;
mod images;
pub mod openai;
pub mod openai_responses;
pub mod prompt_cache;
pub mod registry;
mod retry_after;
pub mod scripted;
pub mod xml_format;

use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Stream;
use toolwire_core::Message;
use toolwire_stream::StreamEvent;

use toolwire_core::ToolSpec;

pub use anthropic::AnthropicProvider;
pub use http::{DEFAULT_MAX_TOKENS, HttpSettings, RetryPolicy, StreamLimits};
pub use images::RequestImages;
pub use openai::OpenAiProvider;
pub use openai_responses::OpenAiResponsesProvider;
pub use registry::{Capabilities, ModelEntry, ModelInfo, Models, RegistryError};
pub use scripted::{Script, ScriptedProvider};

/// What the model is asked.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub system: String,
    /// The path after the root: user, assistant and tool messages.
    pub messages: Vec<Message>,
    /// Shared with the tools that own them (see `Tool::spec` in
    /// toolwire-tools): a step's request copies no schema.
    pub tools: Vec<Arc<ToolSpec>>,
    /// Which turn of the conversation this is (0 for the first user
    /// message), and which model call of the turn (1-based).
    pub turn: usize,
    pub iteration: u32,
    /// The bytes of the images the path refers to, and whether the model
    /// sees them (each provider writes them in its own format, or a text
    /// placeholder in their place).
    pub images: RequestImages,
    /// How hard a reasoning model thinks (`None`: the provider's default);
    /// each provider writes it in its own field.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// The shape the answer must take, in OpenAI's `response_format`
    /// form (`{"type": "json_schema", "json_schema": {name, schema,
    /// strict}}` or `{"type": "json_object"}`); `None`: free text. Each
    /// provider writes it in its own wire format, where it has one.
    pub response_format: Option<serde_json::Value>,
}

/// How hard a reasoning model thinks before it answers: OpenAI's
/// `reasoning_effort` (Responses: `reasoning.effort`), Anthropic's
/// thinking budget ([`ReasoningEffort::thinking_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    pub const ALL: [ReasoningEffort; 3] = [
        ReasoningEffort::Low,
        ReasoningEffort::Medium,
        ReasoningEffort::High,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }

    pub fn parse(name: &str) -> Option<ReasoningEffort> {
        ReasoningEffort::ALL
            .into_iter()
            .find(|e| e.as_str() == name)
    }

    /// Anthropic's `thinking.budget_tokens` for this effort, kept under
    /// `max_tokens` (which it must be below); `None` when `max_tokens`
    /// leaves no room for the API's smallest budget (1,024).
    pub fn thinking_budget(self, max_tokens: u32) -> Option<u32> {
        const SMALLEST: u32 = 1024;
        let wanted = match self {
            ReasoningEffort::Low => SMALLEST,
            ReasoningEffort::Medium => 4096,
            ReasoningEffort::High => 16384,
        };
        let budget = wanted.min(max_tokens.saturating_sub(1));
        (budget >= SMALLEST).then_some(budget)
    }
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
    #[error("the request could not be written as JSON: {0}")]
    Encode(String),
}

impl ProviderError {
    /// Whether the model is busy or out of reach, rather than the request
    /// wrong: a rate limit (429, or a `Retry-After` too long to wait), an
    /// overload (529, or an `overloaded` error in the body), a server error
    /// (5xx), a server that cannot be reached or sent nothing before the
    /// first-byte timeout. Another model may answer such a call; a 400 or a
    /// stream that broke after it began is not this.
    pub fn is_overload_or_unavailable(&self) -> bool {
        match self {
            ProviderError::Connect { .. }
            | ProviderError::FirstByteTimeout { .. }
            | ProviderError::RetryAfterTooLong { .. } => true,
            ProviderError::Http { status, body, .. } => {
                *status == 429 || (500..=599).contains(status) || mentions_overload(body)
            }
            ProviderError::Reported(message) => mentions_overload(message),
            ProviderError::Broken { .. }
            | ProviderError::Stalled { .. }
            | ProviderError::NotAStream { .. }
            | ProviderError::TooLarge { .. }
            | ProviderError::MissingKey(_)
            | ProviderError::Script(_)
            | ProviderError::Encode(_) => false,
        }
    }

    /// A short name for why a call failed, for events and logs:
    /// `overloaded`, `rate_limited`, `server_error`, `unreachable`,
    /// `timeout`, else `error`.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::Http { status: 429, .. } | ProviderError::RetryAfterTooLong { .. } => {
                "rate_limited"
            }
            ProviderError::Http { status, body, .. }
                if *status == 529 || mentions_overload(body) =>
            {
                "overloaded"
            }
            ProviderError::Http { status, .. } if (500..=599).contains(status) => "server_error",
            ProviderError::Reported(message) if mentions_overload(message) => "overloaded",
            ProviderError::Connect { .. } => "unreachable",
            ProviderError::FirstByteTimeout { .. } => "timeout",
            _ => "error",
        }
    }
}

/// Anthropic's `overloaded_error` (also inside a 200's error event or a
/// proxy's body) and the plain word other servers use.
fn mentions_overload(text: &str) -> bool {
    text.to_ascii_lowercase().contains("overloaded")
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

#[cfg(test)]
mod reasoning_tests {
    use super::*;

    fn settings(max_tokens: u32) -> HttpSettings {
        HttpSettings {
            base_url: "http://127.0.0.1:1/v1".into(),
            api_key: None,
            retry: RetryPolicy::default(),
            headers: Vec::new(),
            limits: StreamLimits::default(),
            max_tokens,
        }
    }

    fn request(effort: Option<ReasoningEffort>) -> ModelRequest {
        ModelRequest {
            system: String::new(),
            messages: Vec::new(),
            tools: Vec::new(),
            turn: 0,
            iteration: 1,
            images: RequestImages::default(),
            reasoning_effort: effort,
            response_format: None,
        }
    }

    /// A body as JSON.
    fn json(bytes: Result<Vec<u8>, ProviderError>) -> serde_json::Value {
        let bytes = bytes.expect("the body encodes");
        serde_json::from_slice(&bytes).expect("the body is JSON")
    }

    #[test]
    fn each_provider_writes_the_effort_in_its_own_field_and_none_without_one() {
        let high = request(Some(ReasoningEffort::High));
        let none = request(None);
        let openai = OpenAiProvider::new(settings(DEFAULT_MAX_TOKENS), "o-test", true);
        assert_eq!(json(openai.body(&high))["reasoning_effort"], "high");
        assert!(json(openai.body(&none)).get("reasoning_effort").is_none());
        let responses = OpenAiResponsesProvider::new(settings(DEFAULT_MAX_TOKENS), "o4-mini", true);
        assert_eq!(
            json(responses.body(&high))["reasoning"],
            serde_json::json!({"effort": "high"})
        );
        assert!(json(responses.body(&none)).get("reasoning").is_none());
        let anthropic = AnthropicProvider::new(settings(32_000), "claude-test", true);
        assert_eq!(
            json(anthropic.body(&high))["thinking"],
            serde_json::json!({"type": "enabled", "budget_tokens": 16384})
        );
        assert!(json(anthropic.body(&none)).get("thinking").is_none());
        // The budget stays under max_tokens; no room for the smallest: none.
        let small = AnthropicProvider::new(settings(4096), "claude-test", true);
        assert_eq!(json(small.body(&high))["thinking"]["budget_tokens"], 4095);
        let tiny = AnthropicProvider::new(settings(1024), "claude-test", true);
        assert!(json(tiny.body(&high)).get("thinking").is_none());
    }

    #[test]
    fn efforts_parse_by_name() {
        for effort in ReasoningEffort::ALL {
            assert_eq!(ReasoningEffort::parse(effort.as_str()), Some(effort));
        }
        assert_eq!(ReasoningEffort::parse("extreme"), None);
    }
}

#[cfg(test)]
mod tests {
    use super::ProviderError;

    fn http(status: u16, body: &str) -> ProviderError {
        ProviderError::Http {
            url: "https://api.example.com/v1/messages".into(),
            status,
            body: body.into(),
        }
    }

    // Bodies as the real APIs send them (the project's provider-error
    // fixtures).
    const ANTHROPIC_OVERLOADED: &str =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    const ANTHROPIC_RATE_LIMIT: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
    const ANTHROPIC_TOO_LONG: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210341 tokens > 200000 maximum"}}"#;
    const OPENAI_RATE_LIMIT: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    const OPENAI_SERVER_ERROR: &str = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
    const OPENAI_CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;

    #[test]
    fn busy_and_unreachable_models_are_told_from_wrong_requests() {
        for (error, kind) in [
            (http(529, ANTHROPIC_OVERLOADED), "overloaded"),
            (http(429, ANTHROPIC_RATE_LIMIT), "rate_limited"),
            (http(429, OPENAI_RATE_LIMIT), "rate_limited"),
            (http(500, OPENAI_SERVER_ERROR), "server_error"),
            (http(503, OPENAI_SERVER_ERROR), "server_error"),
            // A proxy that says it in a status of its own.
            (http(400, ANTHROPIC_OVERLOADED), "overloaded"),
            (
                ProviderError::Connect {
                    url: "http://127.0.0.1:9/v1".into(),
                    message: "connection refused".into(),
                },
                "unreachable",
            ),
            (
                ProviderError::FirstByteTimeout {
                    url: "http://127.0.0.1:9/v1".into(),
                    secs: 300.0,
                },
                "timeout",
            ),
            (
                ProviderError::RetryAfterTooLong {
                    url: "http://127.0.0.1:9/v1".into(),
                    status: 429,
                    asked: "1 h".into(),
                    limit_secs: 60.0,
                },
                "rate_limited",
            ),
            (ProviderError::Reported("Overloaded".into()), "overloaded"),
        ] {
            assert!(error.is_overload_or_unavailable(), "{error}");
            assert_eq!(error.kind(), kind, "{error}");
        }
        for error in [
            http(400, ANTHROPIC_TOO_LONG),
            http(400, OPENAI_CONTEXT),
            http(401, r#"{"error":{"message":"Incorrect API key provided"}}"#),
            http(404, "not found"),
            ProviderError::Broken {
                received: 10,
                message: "reset".into(),
            },
            ProviderError::Stalled {
                received: 10,
                secs: 300.0,
            },
            ProviderError::TooLarge { limit: 1 },
            ProviderError::Reported("the script says no".into()),
            ProviderError::MissingKey("OPENAI_API_KEY".into()),
        ] {
            assert!(!error.is_overload_or_unavailable(), "{error}");
            assert_eq!(error.kind(), "error", "{error}");
        }
    }
}
