//! OpenAI's Responses API, streaming: what reasoning models that are not
//! offered through chat completions need, and OpenAI's newer API for the
//! others.
//!
//! toolwire keeps the conversation, so every request carries the whole
//! path as `input` items (`store: false`: nothing is kept on OpenAI's
//! side to refer back to). Reasoning the model did in an earlier step is
//! not sent back: Responses takes it only as an encrypted item that
//! toolwire does not store.

use async_trait::async_trait;
use serde_json::{Value, json};
use toolwire_core::{Message, Role, ToolSpec};
use toolwire_stream::OpenAiResponsesDecoder;

use crate::history::{Group, grouped, plain_text};
use crate::http::{HttpSettings, endpoint, post_stream};
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

    /// The JSON body for `request`.
    pub fn body(&self, request: &ModelRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "stream": true,
            "store": false,
            "max_output_tokens": self.settings.max_tokens,
            "input": input(&request.messages),
        });
        if !request.system.is_empty() {
            body["instructions"] = json!(request.system);
        }
        if self.native_tools && !request.tools.is_empty() {
            body["tools"] = request.tools.iter().map(tool).collect();
        }
        body
    }
}

#[async_trait]
impl Provider for OpenAiResponsesProvider {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let url = endpoint(&self.settings.base_url, "responses");
        let body = self.body(request);
        post_stream(
            &url,
            || {
                let mut req = self.client.post(&url);
                if let Some(key) = &self.settings.api_key {
                    req = req.bearer_auth(key);
                }
                for (k, v) in &self.settings.headers {
                    req = req.header(k, v);
                }
                req
            },
            &body,
            self.settings.retry,
            self.settings.limits,
            Box::new(OpenAiResponsesDecoder::new()),
        )
        .await
    }
}

/// A function tool as Responses takes it: flat, not under `function`.
fn tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
    })
}

/// The conversation as Responses input items: messages, then each call as
/// a `function_call` item and its result as a `function_call_output` item
/// with the same `call_id`, in the order of the calls.
pub fn input(path: &[Message]) -> Vec<Value> {
    let mut out = Vec::new();
    for group in grouped(path) {
        match group {
            Group::Message(m) => match m.role {
                Role::User | Role::System => {
                    let text = plain_text(m);
                    if !text.is_empty() {
                        let role = if m.role == Role::User {
                            "user"
                        } else {
                            "system"
                        };
                        out.push(json!({
                            "type": "message",
                            "role": role,
                            "content": [{"type": "input_text", "text": text}],
                        }));
                    }
                }
                Role::Assistant => {
                    let text = m.text();
                    if !text.is_empty() {
                        out.push(json!({
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": text}],
                        }));
                    }
                    for (id, _, name, args) in m.tool_uses() {
                        out.push(json!({
                            "type": "function_call",
                            "call_id": id.0,
                            "name": name,
                            "arguments": args.to_string(),
                        }));
                    }
                }
                Role::Tool => {}
            },
            Group::Results(results) => {
                for (id, content, _) in results {
                    out.push(json!({
                        "type": "function_call_output",
                        "call_id": id.0,
                        "output": content,
                    }));
                }
            }
        }
    }
    out
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
                }],
            ),
        ];
        assert_eq!(
            input(&path),
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
    fn body_has_instructions_flat_function_tools_and_max_output_tokens() {
        let request = ModelRequest {
            system: "be brief".into(),
            messages: vec![message(Role::User, vec![text("hi")])],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                server: None,
                description: "reads".into(),
                parameters: json!({"type": "object"}),
                read_only: true,
            }],
            turn: 0,
            iteration: 1,
        };
        let body = provider(true).body(&request);
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
        assert!(provider(false).body(&request).get("tools").is_none());
    }
}
