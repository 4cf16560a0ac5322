//! Anthropic messages, streaming, with prompt caching ([`crate::prompt_cache`]).

use std::borrow::Cow;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use toolwire_core::{Message, Role, ToolSpec};
use toolwire_stream::AnthropicDecoder;

use crate::anthropic_wire::{AnthropicMessage, Block, Ephemeral, ImageSource, ResultContent};
use crate::history::{Group, grouped, images, joined_text, plain_text};
use crate::http::{HttpSettings, KeyHeader, encode, endpoint, post_stream};
use crate::images::{RequestImages, Shown};
use crate::prompt_cache;
use crate::{EventStream, ModelRequest, Provider, ProviderError};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
const API_VERSION: &str = "2023-06-01";

/// The Anthropic messages endpoint.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    client: reqwest::Client,
    settings: HttpSettings,
    model: String,
    native_tools: bool,
    /// Mark `cache_control` breakpoints (on unless turned off).
    prompt_caching: bool,
}

impl AnthropicProvider {
    pub fn new(settings: HttpSettings, model: impl Into<String>, native_tools: bool) -> Self {
        AnthropicProvider {
            client: reqwest::Client::new(),
            settings,
            model: model.into(),
            native_tools,
            prompt_caching: true,
        }
    }

    /// With prompt caching on (the default) or off: off, no request
    /// carries a `cache_control` breakpoint.
    pub fn with_prompt_caching(mut self, on: bool) -> Self {
        self.prompt_caching = on;
        self
    }

    /// The JSON body for `request`, as sent: serialized straight from
    /// the request (no `Value` tree in between), with the prompt-cache
    /// breakpoints ([`prompt_cache`]) when caching is on.
    pub fn body(&self, request: &ModelRequest) -> Result<Vec<u8>, ProviderError> {
        let mut messages = messages(&request.messages, &request.images);
        let cache = self.prompt_caching;
        let system = (!request.system.is_empty()).then(|| {
            if cache {
                System::Blocks([SystemBlock {
                    kind: "text",
                    text: &request.system,
                    cache_control: Some(Ephemeral::MARK),
                }])
            } else {
                System::Text(&request.system)
            }
        });
        let tools: Option<Vec<AnthropicTool<'_>>> = (self.native_tools
            && !request.tools.is_empty())
        .then(|| {
            let mut tools: Vec<_> = request.tools.iter().map(|t| AnthropicTool::of(t)).collect();
            if cache && let Some(last) = tools.last_mut() {
                last.cache_control = Some(Ephemeral::MARK);
            }
            tools
        });
        if cache {
            prompt_cache::mark(&mut messages);
        }
        encode(&Body {
            model: &self.model,
            max_tokens: self.settings.max_tokens,
            stream: true,
            messages,
            system,
            thinking: request
                .reasoning_effort
                .and_then(|e| e.thinking_budget(self.settings.max_tokens))
                .map(|budget_tokens| Thinking {
                    kind: "enabled",
                    budget_tokens,
                }),
            tools,
        })
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let url = endpoint(&self.settings.base_url, "v1/messages");
        let body = self.body(request)?;
        post_stream(
            &url,
            || {
                self.settings
                    .post(&self.client, &url, KeyHeader::Named("x-api-key"))
                    .header("anthropic-version", API_VERSION)
            },
            body,
            self.settings.retry,
            self.settings.limits,
            Box::new(AnthropicDecoder::new()),
        )
        .await
    }
}

/// An Anthropic messages request.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    max_tokens: u32,
    stream: bool,
    messages: Vec<AnthropicMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<System<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<AnthropicTool<'a>>>,
}

/// The system prompt: a string, or one text block to carry a breakpoint.
#[derive(Serialize)]
#[serde(untagged)]
enum System<'a> {
    Text(&'a str),
    Blocks([SystemBlock<'a>; 1]),
}

#[derive(Serialize)]
struct SystemBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Ephemeral>,
}

#[derive(Serialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

#[derive(Serialize)]
struct AnthropicTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Ephemeral>,
}

impl<'a> AnthropicTool<'a> {
    fn of(spec: &'a ToolSpec) -> Self {
        AnthropicTool {
            name: &spec.name,
            description: &spec.description,
            input_schema: &spec.parameters,
            cache_control: None,
        }
    }
}

/// The conversation as Anthropic messages. Roles must alternate, so tool
/// results and a user message that follows them share one user message.
/// Images are `image` blocks with base64 sources, in a user message after
/// its text, and inside a `tool_result`'s content list after its text.
pub fn messages<'a>(path: &'a [Message], shown: &RequestImages) -> Vec<AnthropicMessage<'a>> {
    let mut out: Vec<AnthropicMessage<'a>> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Block<'a>>| {
        if blocks.is_empty() {
            return;
        }
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => out.push(AnthropicMessage {
                role,
                content: blocks,
            }),
        }
    };
    for group in grouped(path) {
        match group {
            Group::Message(m) => match m.role {
                Role::User | Role::System => {
                    let text = plain_text(m);
                    let mut blocks = Vec::new();
                    if !text.is_empty() {
                        blocks.push(Block::text(text));
                    }
                    blocks.extend(images(m).into_iter().map(|i| image_block(shown.show(i))));
                    push("user", blocks);
                }
                Role::Assistant => {
                    let mut blocks = Vec::new();
                    let text = joined_text(m);
                    if !text.is_empty() {
                        blocks.push(Block::text(text));
                    }
                    for (id, _, name, args) in m.tool_uses() {
                        blocks.push(Block::ToolUse {
                            id: &id.0,
                            name,
                            input: args,
                            cache_control: None,
                        });
                    }
                    push("assistant", blocks);
                }
                Role::Tool => {}
            },
            Group::Results(results) => push(
                "user",
                results
                    .into_iter()
                    .map(|answer| {
                        // Plain string content unless there are images:
                        // the shape every request had before them.
                        let content = if answer.images.is_empty() {
                            ResultContent::Text(answer.content)
                        } else {
                            let mut blocks = Vec::new();
                            if !answer.content.is_empty() {
                                blocks.push(Block::text(answer.content));
                            }
                            blocks.extend(answer.images.iter().map(|i| image_block(shown.show(i))));
                            ResultContent::Blocks(blocks)
                        };
                        Block::ToolResult {
                            tool_use_id: &answer.id.0,
                            content,
                            is_error: answer.is_error,
                            cache_control: None,
                        }
                    })
                    .collect(),
            ),
        }
    }
    out
}

/// An image as a content block, or the placeholder as a text block.
fn image_block<'a>(shown: Shown) -> Block<'a> {
    match shown {
        Shown::Image { media_type, data } => Block::Image {
            source: ImageSource {
                kind: "base64",
                media_type,
                data,
            },
            cache_control: None,
        },
        Shown::Placeholder(text) => Block::text(Cow::Owned(text)),
    }
}
