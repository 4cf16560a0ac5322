//! Anthropic messages, streaming, with prompt caching ([`crate::prompt_cache`]).

use async_trait::async_trait;
use serde_json::{Value, json};
use toolwire_core::{Message, Role};
use toolwire_stream::AnthropicDecoder;

use crate::history::{Group, grouped, images, plain_text};
use crate::http::{HttpSettings, KeyHeader, endpoint, post_stream};
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

    /// The JSON body for `request`.
    pub fn body(&self, request: &ModelRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": self.settings.max_tokens,
            "stream": true,
            "messages": messages(&request.messages, &request.images),
        });
        if !request.system.is_empty() {
            body["system"] = json!(request.system);
        }
        if let Some(budget) = request
            .reasoning_effort
            .and_then(|e| e.thinking_budget(self.settings.max_tokens))
        {
            body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
        }
        if self.native_tools && !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
        }
        if self.prompt_caching {
            prompt_cache::mark(&mut body);
        }
        body
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let url = endpoint(&self.settings.base_url, "v1/messages");
        let body = self.body(request);
        post_stream(
            &url,
            || {
                self.settings
                    .post(&self.client, &url, KeyHeader::Named("x-api-key"))
                    .header("anthropic-version", API_VERSION)
            },
            &body,
            self.settings.retry,
            self.settings.limits,
            Box::new(AnthropicDecoder::new()),
        )
        .await
    }
}

/// The conversation as Anthropic messages. Roles must alternate, so tool
/// results and a user message that follows them share one user message.
/// Images are `image` blocks with base64 sources, in a user message after
/// its text, and inside a `tool_result`'s content list after its text.
pub fn messages(path: &[Message], shown: &RequestImages) -> Vec<Value> {
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        match out.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => out.push((role, blocks)),
        }
    };
    for group in grouped(path) {
        match group {
            Group::Message(m) => match m.role {
                Role::User | Role::System => {
                    let text = plain_text(m);
                    let mut blocks = Vec::new();
                    if !text.is_empty() {
                        blocks.push(json!({"type": "text", "text": text}));
                    }
                    blocks.extend(images(m).into_iter().map(|i| image_block(shown.show(i))));
                    push("user", blocks);
                }
                Role::Assistant => {
                    let mut blocks = Vec::new();
                    let text = m.text();
                    if !text.is_empty() {
                        blocks.push(json!({"type": "text", "text": text}));
                    }
                    for (id, _, name, args) in m.tool_uses() {
                        blocks.push(json!({"type": "tool_use", "id": id.0, "name": name, "input": args}));
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
                            json!(answer.content)
                        } else {
                            let mut blocks = Vec::new();
                            if !answer.content.is_empty() {
                                blocks.push(json!({"type": "text", "text": answer.content}));
                            }
                            blocks.extend(answer.images.iter().map(|i| image_block(shown.show(i))));
                            Value::Array(blocks)
                        };
                        json!({"type": "tool_result", "tool_use_id": answer.id.0, "content": content, "is_error": answer.is_error})
                    })
                    .collect(),
            ),
        }
    }
    out.into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// An image as a content block, or the placeholder as a text block.
fn image_block(shown: Shown) -> Value {
    match shown {
        Shown::Image { media_type, data } => json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }),
        Shown::Placeholder(text) => json!({"type": "text", "text": text}),
    }
}
