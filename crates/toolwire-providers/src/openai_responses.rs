//! OpenAI's Responses API, streaming: what reasoning models that are not
//! offered through chat completions need, and OpenAI's newer API for the
//! others.
//!
//! toolwire keeps the conversation, so every request carries the whole
//! path as `input` items (`store: false`: nothing is kept on OpenAI's
//! side to refer back to). Reasoning the model did in an earlier step is
//! not sent back: Responses takes it only as an encrypted item that
//! toolwire does not store.

use std::borrow::Cow;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use toolwire_core::{Message, Role, ToolSpec};
use toolwire_stream::OpenAiResponsesDecoder;

use crate::history::{Group, grouped, images, joined_text, plain_text};
use crate::http::{HttpSettings, KeyHeader, encode, endpoint, post_stream};
use crate::images::{RequestImages, Shown};
use crate::{EventStream, ModelRequest, Provider, ProviderError};

pub use crate::openai::DEFAULT_BASE_URL;

/// A Responses API endpoint (`{base_url}/responses`).
#[derive(Debug, Clone)]
pub struct OpenAiResponsesProvider {
    client: reqwest::Client,
    settings: HttpSettings,
    model: String,
    /// Send tool definitions (false with the XML tool format).
    native_tools: bool,
}

impl OpenAiResponsesProvider {
    pub fn new(settings: HttpSettings, model: impl Into<String>, native_tools: bool) -> Self {
        OpenAiResponsesProvider {
            client: reqwest::Client::new(),
            settings,
            model: model.into(),
            native_tools,
        }
    }

    /// The JSON body for `request`, as sent: serialized straight from
    /// the request (no `Value` tree in between).
    pub fn body(&self, request: &ModelRequest) -> Result<Vec<u8>, ProviderError> {
        encode(&Body {
            model: &self.model,
            stream: true,
            store: false,
            max_output_tokens: self.settings.max_tokens,
            input: input(&request.messages, &request.images),
            instructions: (!request.system.is_empty()).then_some(request.system.as_str()),
            reasoning: request
                .reasoning_effort
                .map(|e| Reasoning { effort: e.as_str() }),
            tools: (self.native_tools && !request.tools.is_empty())
                .then(|| request.tools.iter().map(|t| FunctionTool::of(t)).collect()),
            text: request
                .response_format
                .as_ref()
                .and_then(text_format)
                .map(|format| TextOptions { format }),
        })
    }
}

/// A Responses request.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    stream: bool,
    store: bool,
    max_output_tokens: u32,
    input: Vec<Item<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Reasoning>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<FunctionTool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextOptions<'a>>,
}

#[derive(Serialize)]
struct Reasoning {
    effort: &'static str,
}

#[derive(Serialize)]
struct TextOptions<'a> {
    format: TextFormat<'a>,
}

/// `text.format`: a JSON schema's fields, or JSON mode.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TextFormat<'a> {
    JsonSchema {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        schema: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        strict: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<&'a Value>,
    },
    JsonObject,
}

/// A function tool as Responses takes it: flat, not under `function`.
#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> FunctionTool<'a> {
    fn of(spec: &'a ToolSpec) -> Self {
        FunctionTool {
            kind: "function",
            name: &spec.name,
            description: &spec.description,
            parameters: &spec.parameters,
        }
    }
}

/// The Responses API's `text.format` for a chat-style `response_format`:
/// the JSON schema's fields one level up.
fn text_format(format: &Value) -> Option<TextFormat<'_>> {
    match format.get("type").and_then(Value::as_str)? {
        "json_schema" => {
            let spec = format.get("json_schema")?;
            Some(TextFormat::JsonSchema {
                name: spec.get("name"),
                schema: spec.get("schema"),
                strict: spec.get("strict"),
                description: spec.get("description"),
            })
        }
        "json_object" => Some(TextFormat::JsonObject),
        _ => None,
    }
}

#[async_trait]
impl Provider for OpenAiResponsesProvider {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let url = endpoint(&self.settings.base_url, "responses");
        let body = self.body(request)?;
        post_stream(
            &url,
            || self.settings.post(&self.client, &url, KeyHeader::Bearer),
            body,
            self.settings.retry,
            self.settings.limits,
            Box::new(OpenAiResponsesDecoder::new()),
        )
        .await
    }
}

/// One input item as sent.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item<'a> {
    Message {
        role: &'static str,
        content: Vec<Part<'a>>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: String,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: Cow<'a, str>,
    },
}

/// A message's content part.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part<'a> {
    InputText { text: Cow<'a, str> },
    OutputText { text: Cow<'a, str> },
    InputImage { image_url: String },
}

/// The conversation as Responses input items: messages, then each call as
/// a `function_call` item and its result as a `function_call_output` item
/// with the same `call_id`, in the order of the calls.
pub fn input<'a>(path: &'a [Message], shown: &RequestImages) -> Vec<Item<'a>> {
    let mut out = Vec::with_capacity(path.len());
    for group in grouped(path) {
        match group {
            Group::Message(m) => match m.role {
                Role::User | Role::System => {
                    let text = plain_text(m);
                    let mut content = Vec::new();
                    if !text.is_empty() {
                        content.push(Part::InputText { text });
                    }
                    content.extend(images(m).into_iter().map(|i| image_part(shown.show(i))));
                    if !content.is_empty() {
                        let role = if m.role == Role::User {
                            "user"
                        } else {
                            "system"
                        };
                        out.push(Item::Message { role, content });
                    }
                }
                Role::Assistant => {
                    let text = joined_text(m);
                    if !text.is_empty() {
                        out.push(Item::Message {
                            role: "assistant",
                            content: vec![Part::OutputText { text }],
                        });
                    }
                    for (id, _, name, args) in m.tool_uses() {
                        out.push(Item::FunctionCall {
                            call_id: &id.0,
                            name,
                            arguments: args.to_string(),
                        });
                    }
                }
                Role::Tool => {}
            },
            Group::Results(results) => {
                // As with chat completions: a tool's images follow its
                // output in a user message, placeholders stay in the text.
                let mut parts = Vec::new();
                for answer in results {
                    let mut output = answer.content;
                    let placeholders = shown.placeholders(answer.images);
                    if !placeholders.is_empty() {
                        output.to_mut().push_str(&placeholders);
                    }
                    let visible: Vec<_> =
                        answer.images.iter().filter(|i| shown.visible(i)).collect();
                    if !visible.is_empty() {
                        parts.push(Part::InputText {
                            text: Cow::Owned(format!(
                                "The images tool call {} returned:",
                                answer.id.0
                            )),
                        });
                        parts.extend(visible.into_iter().map(|i| image_part(shown.show(i))));
                    }
                    out.push(Item::FunctionCallOutput {
                        call_id: &answer.id.0,
                        output,
                    });
                }
                if !parts.is_empty() {
                    out.push(Item::Message {
                        role: "user",
                        content: parts,
                    });
                }
            }
        }
    }
    out
}

/// An image as an input part: a data URL, or the placeholder as text.
fn image_part<'a>(shown: Shown) -> Part<'a> {
    match shown {
        Shown::Image { media_type, data } => Part::InputImage {
            image_url: format!("data:{media_type};base64,{data}"),
        },
        Shown::Placeholder(text) => Part::InputText {
            text: Cow::Owned(text),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolwire_core::{ContentBlock, ConversationId, NOT_RUN_AFTER_STOP, ToolCallId};

    use super::*;
    use crate::http::{DEFAULT_MAX_TOKENS, RetryPolicy, StreamLimits};

    fn message(role: Role, content: Vec<ContentBlock>) -> Message {
        Message::new(ConversationId::new(), None, role, content)
    }

    fn text(t: &str) -> ContentBlock {
        ContentBlock::Text { text: t.into() }
    }

    fn call(id: &str, args: Value) -> ContentBlock {
        ContentBlock::ToolUse {
            id: ToolCallId(id.into()),
            server: None,
            name: "read_file".into(),
            arguments: args,
        }
    }

    /// Input items as JSON values.
    fn json_of(items: &[Item<'_>]) -> Vec<Value> {
        items
            .iter()
            .map(|i| serde_json::to_value(i).expect("an item encodes"))
            .collect()
    }

    fn body_of(provider: &OpenAiResponsesProvider, request: &ModelRequest) -> Value {
        let bytes = provider.body(request).expect("the body encodes");
        serde_json::from_slice(&bytes).expect("the body is JSON")
    }

    fn provider(native: bool) -> OpenAiResponsesProvider {
        OpenAiResponsesProvider::new(
            HttpSettings {
                base_url: "http://127.0.0.1:1/v1".into(),
                api_key: None,
                retry: RetryPolicy::default(),
                headers: Vec::new(),
                limits: StreamLimits::default(),
                max_tokens: DEFAULT_MAX_TOKENS,
            },
            "o4-mini",
            native,
        )
    }

    #[test]
    fn calls_and_results_are_items_with_their_call_ids() {
        let path = vec![
            message(Role::User, vec![text("read a and b")]),
            message(
                Role::Assistant,
                vec![
                    text("Reading."),
                    call("call_a", json!({"path": "a"})),
                    call("call_b", json!({"path": "b"})),
                ],
            ),
            // Stored in the order the tools finished; b is never answered.
            message(
                Role::Tool,
                vec![ContentBlock::ToolResult {
                    tool_use_id: ToolCallId("call_a".into()),
                    content: "A".into(),
                    is_error: false,
                    images: Vec::new(),
                }],
            ),
        ];
        assert_eq!(
            json_of(&input(&path, &RequestImages::default())),
            vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read a and b"}]}),
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]}),
                json!({"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{\"path\":\"a\"}"}),
                json!({"type": "function_call", "call_id": "call_b", "name": "read_file", "arguments": "{\"path\":\"b\"}"}),
                json!({"type": "function_call_output", "call_id": "call_a", "output": "A"}),
                json!({"type": "function_call_output", "call_id": "call_b", "output": NOT_RUN_AFTER_STOP}),
            ]
        );
    }

    #[test]
    fn images_are_input_image_parts_or_placeholders() {
        let png = b"\x89PNG\r\n\x1a\nrest";
        let image = toolwire_core::BlobRef::of("image/png", png);
        let path = vec![message(
            Role::User,
            vec![text("what is this?"), ContentBlock::Image(image.clone())],
        )];
        let mut bytes = std::collections::HashMap::new();
        bytes.insert(image.sha256.clone(), std::sync::Arc::<[u8]>::from(&png[..]));
        let seen = json_of(&input(
            &path,
            &RequestImages {
                vision: true,
                bytes,
            },
        ));
        assert_eq!(seen[0]["content"][1]["type"], "input_image");
        assert!(
            seen[0]["content"][1]["image_url"]
                .as_str()
                .unwrap()
                .starts_with("data:image/png;base64,")
        );
        let blind = json_of(&input(&path, &RequestImages::default()));
        assert_eq!(blind[0]["content"][1]["type"], "input_text");
        assert!(
            blind[0]["content"][1]["text"]
                .as_str()
                .unwrap()
                .contains("cannot see images")
        );
    }

    #[test]
    fn body_has_instructions_flat_function_tools_and_max_output_tokens() {
        let request = ModelRequest {
            system: "be brief".into(),
            messages: vec![message(Role::User, vec![text("hi")])],
            tools: vec![std::sync::Arc::new(ToolSpec {
                name: "read_file".into(),
                server: None,
                description: "reads".into(),
                parameters: json!({"type": "object"}),
                read_only: true,
            })],
            turn: 0,
            iteration: 1,
            images: RequestImages::default(),
            reasoning_effort: None,
            response_format: None,
        };
        let body = body_of(&provider(true), &request);
        assert_eq!(body["model"], "o4-mini");
        assert_eq!(body["stream"], true);
        assert_eq!(body["store"], false);
        assert_eq!(body["instructions"], "be brief");
        assert_eq!(body["max_output_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "name": "read_file", "description": "reads", "parameters": {"type": "object"}}])
        );
        assert!(body.get("messages").is_none() && body.get("max_tokens").is_none());
        // The XML tool format sends no tool definitions.
        assert!(body_of(&provider(false), &request).get("tools").is_none());
        assert!(body.get("text").is_none(), "free text by default");
    }

    #[test]
    fn a_response_format_becomes_the_text_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let mut request = ModelRequest {
            system: String::new(),
            messages: vec![message(Role::User, vec![text("hi")])],
            tools: Vec::new(),
            turn: 0,
            iteration: 1,
            images: RequestImages::default(),
            reasoning_effort: None,
            response_format: Some(json!({"type": "json_schema", "json_schema": {
                "name": "answer", "schema": schema, "strict": true,
            }})),
        };
        let body = body_of(&provider(true), &request);
        assert_eq!(
            body["text"],
            json!({"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}})
        );
        request.response_format = Some(json!({"type": "json_object"}));
        assert_eq!(
            body_of(&provider(true), &request)["text"],
            json!({"format": {"type": "json_object"}})
        );
        request.response_format = Some(json!({"type": "text"}));
        assert!(body_of(&provider(true), &request).get("text").is_none());
    }
}
