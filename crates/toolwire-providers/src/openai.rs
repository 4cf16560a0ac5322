//! OpenAI-compatible chat completions (OpenAI, vLLM, llama.cpp server,
//! Ollama, DeepSeek, Groq, …), streaming.

use async_trait::async_trait;
use serde_json::{Value, json};
use toolwire_core::{Message, Role};
use toolwire_stream::OpenAiChatDecoder;

use crate::history::{Answer, Group, grouped, images, plain_text};
use crate::http::{HttpSettings, KeyHeader, endpoint, post_stream};
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
}

impl OpenAiProvider {
    pub fn new(settings: HttpSettings, model: impl Into<String>, native_tools: bool) -> Self {
        OpenAiProvider {
            client: reqwest::Client::new(),
            settings,
            model: model.into(),
            native_tools,
        }
    }

    /// The JSON body for `request`.
    pub fn body(&self, request: &ModelRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": messages(&request.system, &request.messages, &request.images),
        });
        body[self.max_tokens_field()] = json!(self.settings.max_tokens);
        if let Some(effort) = request.reasoning_effort {
            body["reasoning_effort"] = json!(effort.as_str());
        }
        if self.native_tools && !request.tools.is_empty() {
            body["tools"] = request.tools.iter().map(tool).collect();
        }
        if let Some(format) = &request.response_format {
            body["response_format"] = format.clone();
        }
        body
    }

    /// OpenAI's own API (and Azure's) refuse `max_tokens` for reasoning
    /// models and want `max_completion_tokens`; the servers that speak its
    /// wire format (vLLM, llama.cpp, Ollama, Groq, DeepSeek, LM Studio…)
    /// all read `max_tokens`, and not all know the newer name.
    fn max_tokens_field(&self) -> &'static str {
        let host = reqwest::Url::parse(&self.settings.base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_default();
        if host == "api.openai.com" || host.ends_with(".openai.azure.com") {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let url = endpoint(&self.settings.base_url, "chat/completions");
        let body = self.body(request);
        post_stream(
            &url,
            || self.settings.post(&self.client, &url, KeyHeader::Bearer),
            &body,
            self.settings.retry,
            self.settings.limits,
            Box::new(OpenAiChatDecoder::new()),
        )
        .await
    }
}

fn tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        }
    })
}

/// The conversation as chat messages: tool results become `tool` messages
/// in the order of the calls they answer. A user message with images
/// carries content parts (its text, then `image_url` parts with data URLs);
/// one without keeps plain string content.
pub fn messages(system: &str, path: &[Message], shown: &RequestImages) -> Vec<Value> {
    let mut out = Vec::new();
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for group in grouped(path) {
        match group {
            Group::Message(m) => match m.role {
                Role::System => out.push(json!({"role": "system", "content": plain_text(m)})),
                Role::User => {
                    let images = images(m);
                    let content = if images.is_empty() {
                        json!(plain_text(m))
                    } else {
                        let mut parts = Vec::new();
                        let text = plain_text(m);
                        if !text.is_empty() {
                            parts.push(json!({"type": "text", "text": text}));
                        }
                        parts.extend(images.into_iter().map(|i| image_part(shown.show(i))));
                        Value::Array(parts)
                    };
                    out.push(json!({"role": "user", "content": content}));
                }
                Role::Assistant => {
                    let mut msg = json!({"role": "assistant", "content": m.text()});
                    let calls: Vec<Value> = m
                        .tool_uses()
                        .map(|(id, _, name, args)| {
                            json!({
                                "id": id.0,
                                "type": "function",
                                "function": {"name": name, "arguments": args.to_string()},
                            })
                        })
                        .collect();
                    if !calls.is_empty() {
                        msg["tool_calls"] = Value::Array(calls);
                    }
                    out.push(msg);
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
fn tool_messages(out: &mut Vec<Value>, results: Vec<Answer>, shown: &RequestImages) {
    let mut parts = Vec::new();
    for answer in results {
        let mut content = answer.content;
        content.push_str(&shown.placeholders(&answer.images));
        let visible: Vec<_> = answer.images.iter().filter(|i| shown.visible(i)).collect();
        if !visible.is_empty() {
            let plural = if visible.len() == 1 { "" } else { "s" };
            parts.push(json!({
                "type": "text",
                "text": format!("The image{plural} tool call {} returned:", answer.id.0),
            }));
            parts.extend(visible.into_iter().map(|i| image_part(shown.show(i))));
        }
        out.push(json!({"role": "tool", "tool_call_id": answer.id.0, "content": content}));
    }
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
}

/// An image as a content part: a data URL, or the placeholder as text.
fn image_part(shown: Shown) -> Value {
    match shown {
        Shown::Image { media_type, data } => json!({
            "type": "image_url",
            "image_url": {"url": format!("data:{media_type};base64,{data}")},
        }),
        Shown::Placeholder(text) => json!({"type": "text", "text": text}),
    }
}
