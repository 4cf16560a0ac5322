//! OpenAI-compatible chat completions (OpenAI, vLLM, llama.cpp server,
//! Ollama, DeepSeek, Groq, …), streaming.

use std::borrow::Cow;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use toolwire_core::{Message, Role};
use toolwire_stream::OpenAiChatDecoder;

use crate::history::{Answer, Group, grouped, images, joined_text, plain_text};
use crate::http::{HttpSettings, KeyHeader, encode, endpoint, post_stream};
use crate::images::{RequestImages, Shown};
use crate::{EventStream, ModelRequest, Provider, ProviderError};
use toolwire_core::ToolSpec;

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A chat completions endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    client: reqwest::Client,
    settings: HttpSettings,
    model: String,
    /// Send tool definitions (false with the XML tool format).
    native_tools: bool,
    /// Write the output limit as `max_completion_tokens` (OpenAI's own
    /// API and Azure's), else as `max_tokens`.
    completion_tokens_field: bool,
}

impl OpenAiProvider {
    pub fn new(settings: HttpSettings, model: impl Into<String>, native_tools: bool) -> Self {
        OpenAiProvider {
            client: reqwest::Client::new(),
            completion_tokens_field: Self::wants_completion_tokens(&settings.base_url),
            settings,
            model: model.into(),
            native_tools,
        }
    }

    /// The JSON body for `request`, as sent: serialized straight from
    /// the request (no `Value` tree in between), keys in the order
    /// OpenAI's own clients write them.
    pub fn body(&self, request: &ModelRequest) -> Result<Vec<u8>, ProviderError> {
        let max_tokens = Some(self.settings.max_tokens);
        let (max_tokens, max_completion_tokens) = if self.completion_tokens_field {
            (None, max_tokens)
        } else {
            (max_tokens, None)
        };
        let tools = (self.native_tools && !request.tools.is_empty())
            .then(|| request.tools.iter().map(|t| ChatTool::of(t)).collect());
        encode(&Body {
            model: &self.model,
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            messages: messages(&request.system, &request.messages, &request.images),
            max_tokens,
            max_completion_tokens,
            reasoning_effort: request.reasoning_effort.map(|e| e.as_str()),
            tools,
            response_format: request.response_format.as_ref(),
        })
    }

    /// OpenAI's own API (and Azure's) refuse `max_tokens` for reasoning
    /// models and want `max_completion_tokens`; the servers that speak its
    /// wire format (vLLM, llama.cpp, Ollama, Groq, DeepSeek, LM Studio…)
    /// all read `max_tokens`, and not all know the newer name.
    /// Decided once, when the provider is made: parsing the URL at every
    /// request showed in profiles.
    fn wants_completion_tokens(base_url: &str) -> bool {
        let host = reqwest::Url::parse(base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_default();
        host == "api.openai.com" || host.ends_with(".openai.azure.com")
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let url = endpoint(&self.settings.base_url, "chat/completions");
        let body = self.body(request)?;
        post_stream(
            &url,
            || self.settings.post(&self.client, &url, KeyHeader::Bearer),
            body,
            self.settings.retry,
            self.settings.limits,
            Box::new(OpenAiChatDecoder::new()),
        )
        .await
    }
}

/// A chat completions request.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    stream: bool,
    stream_options: StreamOptions,
    messages: Vec<ChatMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<ChatTool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<&'a Value>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// A function tool: `{"type": "function", "function": {…}}`.
#[derive(Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> ChatTool<'a> {
    fn of(spec: &'a ToolSpec) -> Self {
        ChatTool {
            kind: "function",
            function: Function {
                name: &spec.name,
                description: &spec.description,
                parameters: &spec.parameters,
            },
        }
    }
}

/// One chat message as sent.
#[derive(Serialize)]
#[serde(untagged)]
pub enum ChatMessage<'a> {
    /// A system or user message.
    Plain {
        role: &'static str,
        content: Content<'a>,
    },
    Assistant {
        role: &'static str,
        content: Cow<'a, str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall<'a>>,
    },
    Tool {
        role: &'static str,
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
}

/// A message's content: a string, or parts (text and images).
#[derive(Serialize)]
#[serde(untagged)]
pub enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part<'a> {
    Text { text: Cow<'a, str> },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Serialize)]
pub struct ImageUrl {
    url: String,
}

/// A call as the assistant message carries it, its arguments as a JSON
/// string.
#[derive(Serialize)]
pub struct ToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: &'a str,
    arguments: String,
}

/// The conversation as chat messages: tool results become `tool` messages
/// in the order of the calls they answer. A user message with images
/// carries content parts (its text, then `image_url` parts with data URLs);
/// one without keeps plain string content.
pub fn messages<'a>(
    system: &'a str,
    path: &'a [Message],
    shown: &RequestImages,
) -> Vec<ChatMessage<'a>> {
    let mut out = Vec::with_capacity(path.len() + 1);
    if !system.is_empty() {
        out.push(ChatMessage::Plain {
            role: "system",
            content: Content::Text(Cow::Borrowed(system)),
        });
    }
    for group in grouped(path) {
        match group {
            Group::Message(m) => match m.role {
                Role::System => out.push(ChatMessage::Plain {
                    role: "system",
                    content: Content::Text(plain_text(m)),
                }),
                Role::User => {
                    let images = images(m);
                    let content = if images.is_empty() {
                        Content::Text(plain_text(m))
                    } else {
                        let mut parts = Vec::new();
                        let text = plain_text(m);
                        if !text.is_empty() {
                            parts.push(Part::Text { text });
                        }
                        parts.extend(images.into_iter().map(|i| image_part(shown.show(i))));
                        Content::Parts(parts)
                    };
                    out.push(ChatMessage::Plain {
                        role: "user",
                        content,
                    });
                }
                Role::Assistant => {
                    let tool_calls = m
                        .tool_uses()
                        .map(|(id, _, name, args)| ToolCall {
                            id: &id.0,
                            kind: "function",
                            function: CallFunction {
                                name,
                                arguments: args.to_string(),
                            },
                        })
                        .collect();
                    out.push(ChatMessage::Assistant {
                        role: "assistant",
                        content: joined_text(m),
                        tool_calls,
                    });
                }
                Role::Tool => {}
            },
            Group::Results(results) => tool_messages(&mut out, results, shown),
        }
    }
    out
}

/// The results as `tool` messages. A `tool` message's content is text on
/// many servers that speak this format (vLLM, llama.cpp, Ollama, older
/// OpenAI models), so images a tool returned go in one `user` message
/// after the results, each after a line naming its call: what codex and
/// other agents send. Placeholders (a model without vision) stay in the
/// result's text.
fn tool_messages<'a>(
    out: &mut Vec<ChatMessage<'a>>,
    results: Vec<Answer<'a>>,
    shown: &RequestImages,
) {
    let mut parts = Vec::new();
    for answer in results {
        let mut content = answer.content;
        let placeholders = shown.placeholders(answer.images);
        if !placeholders.is_empty() {
            content.to_mut().push_str(&placeholders);
        }
        let visible: Vec<_> = answer.images.iter().filter(|i| shown.visible(i)).collect();
        if !visible.is_empty() {
            let plural = if visible.len() == 1 { "" } else { "s" };
            parts.push(Part::Text {
                text: Cow::Owned(format!(
                    "The image{plural} tool call {} returned:",
                    answer.id.0
                )),
            });
            parts.extend(visible.into_iter().map(|i| image_part(shown.show(i))));
        }
        out.push(ChatMessage::Tool {
            role: "tool",
            tool_call_id: &answer.id.0,
            content,
        });
    }
    if !parts.is_empty() {
        out.push(ChatMessage::Plain {
            role: "user",
            content: Content::Parts(parts),
        });
    }
}

/// An image as a content part: a data URL, or the placeholder as text.
fn image_part<'a>(shown: Shown) -> Part<'a> {
    match shown {
        Shown::Image { media_type, data } => Part::ImageUrl {
            image_url: ImageUrl {
                url: format!("data:{media_type};base64,{data}"),
            },
        },
        Shown::Placeholder(text) => Part::Text {
            text: Cow::Owned(text),
        },
    }
}
