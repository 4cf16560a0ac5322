//! Anthropic prompt caching: where a request's `cache_control`
//! breakpoints go, so that a tool loop reads its growing prefix from the
//! cache instead of paying for it again at every step.
//!
//! Anthropic reads a request as tools, then system, then messages; a
//! breakpoint caches everything up to and including its block, and a later
//! request that starts with the same bytes up to a breakpoint reads them
//! back (at a tenth of the input price; writing costs 1.25×). At most four
//! breakpoints per request; a prefix shorter than the model's minimum
//! (1,024 tokens for Sonnet and Opus, more for Haiku) is simply not cached.
//! A hit is found at a breakpoint or up to 20 blocks before one.
//!
//! The four go on:
//! 1. the last tool definition (the tools change least);
//! 2. the system prompt (tools and system);
//! 3. the last block of the last message: the whole request, so that the
//!    next step finds it;
//! 4. the last block of the message before the last assistant message: the
//!    last breakpoint of the previous request, so that its prefix is read
//!    back even when a step added more than 20 blocks (many parallel tool
//!    calls and results), beyond the lookback.
//!
//! The marks never change the bytes before them: a request's prefix stays
//! byte-identical from one step to the next, which is what the cache keys
//! on.

use crate::anthropic_wire::{AnthropicMessage, Block, Ephemeral};

/// Anthropic's limit of breakpoints per request.
pub const MAX_BREAKPOINTS: usize = 4;

/// Puts the breakpoints of `messages` (3 and 4 above); the body marks
/// its last tool and its system prompt (1 and 2), so that four is never
/// exceeded.
pub(crate) fn mark(messages: &mut [AnthropicMessage<'_>]) {
    let mut targets = Vec::with_capacity(2);
    if let Some(last) = messages.len().checked_sub(1) {
        targets.push(last);
    }
    let last_assistant = messages.iter().rposition(|m| m.role == "assistant");
    if let Some(previous) = last_assistant.and_then(|i| i.checked_sub(1)) {
        targets.push(previous);
    }
    for index in targets {
        if let Some(block) = messages.get_mut(index).and_then(last_markable_block) {
            *block.cache_control() = Some(Ephemeral::MARK);
        }
    }
}

/// The last block of `message` that may carry `cache_control`.
fn last_markable_block<'m, 'a>(message: &'m mut AnthropicMessage<'a>) -> Option<&'m mut Block<'a>> {
    message
        .content
        .iter_mut()
        .rev()
        .find(|block| block.markable())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use toolwire_core::{ContentBlock, ConversationId, Message, Role, ToolCallId, ToolSpec};

    use super::*;
    use crate::http::{DEFAULT_MAX_TOKENS, HttpSettings, RetryPolicy, StreamLimits};
    use crate::{AnthropicProvider, ModelRequest, RequestImages};

    /// Sorted: whether object keys keep their order depends on
    /// serde_json's features.
    fn marked(body: &Value) -> Vec<String> {
        let mut out = Vec::new();
        walk(body, "", &mut out);
        out.sort();
        out
    }

    /// JSON pointers of every object carrying `cache_control`.
    fn walk(v: &Value, at: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if o.contains_key("cache_control") {
                    out.push(at.to_owned());
                }
                for (k, v) in o {
                    walk(v, &format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(v, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    /// The body Anthropic is sent, as JSON.
    fn body(system: &str, tools: &[&str], messages: Vec<Message>) -> Value {
        let provider = AnthropicProvider::new(
            HttpSettings {
                base_url: "http://127.0.0.1:1".into(),
                api_key: None,
                retry: RetryPolicy::default(),
                headers: Vec::new(),
                limits: StreamLimits::default(),
                max_tokens: DEFAULT_MAX_TOKENS,
            },
            "claude-test",
            true,
        );
        let request = ModelRequest {
            system: system.into(),
            messages,
            tools: tools
                .iter()
                .map(|name| {
                    std::sync::Arc::new(ToolSpec {
                        name: (*name).into(),
                        server: None,
                        description: String::new(),
                        parameters: json!({"type": "object"}),
                        read_only: true,
                    })
                })
                .collect(),
            turn: 0,
            iteration: 1,
            images: RequestImages::default(),
            reasoning_effort: None,
            response_format: None,
        };
        let bytes = provider.body(&request).expect("the body encodes");
        serde_json::from_slice(&bytes).expect("the body is JSON")
    }

    fn message(role: Role, content: Vec<ContentBlock>) -> Message {
        Message::new(ConversationId::new(), None, role, content)
    }

    fn text(t: &str) -> ContentBlock {
        ContentBlock::Text { text: t.into() }
    }

    fn call(id: &str) -> ContentBlock {
        ContentBlock::ToolUse {
            id: ToolCallId(id.into()),
            server: None,
            name: "a".into(),
            arguments: json!({}),
        }
    }

    fn result(id: &str) -> ContentBlock {
        ContentBlock::ToolResult {
            tool_use_id: ToolCallId(id.into()),
            content: "ok".into(),
            is_error: false,
            images: Vec::new(),
        }
    }

    #[test]
    fn one_question_marks_tools_system_and_the_question() {
        let body = body(
            "be brief",
            &["a", "b"],
            vec![message(Role::User, vec![text("hi")])],
        );
        assert_eq!(
            marked(&body),
            ["/messages/0/content/0", "/system/0", "/tools/1"]
        );
        assert_eq!(body["system"][0]["text"], "be brief");
    }

    #[test]
    fn a_tool_loop_marks_this_step_and_the_step_before() {
        let body = body(
            "s",
            &["a"],
            vec![
                message(Role::User, vec![text("go")]),
                message(Role::Assistant, vec![call("1")]),
                message(Role::Tool, vec![result("1")]),
                message(Role::Assistant, vec![text("more"), call("2"), call("3")]),
                message(Role::Tool, vec![result("2"), result("3")]),
            ],
        );
        assert_eq!(
            marked(&body),
            [
                "/messages/2/content/0",
                "/messages/4/content/1",
                "/system/0",
                "/tools/0"
            ]
        );
    }

    #[test]
    fn never_more_than_four_and_never_on_an_empty_block() {
        let mut messages = vec![
            AnthropicMessage {
                role: "user",
                content: vec![
                    Block::Text {
                        text: "plain text".into(),
                        cache_control: None,
                    },
                    Block::Text {
                        text: "".into(),
                        cache_control: None,
                    },
                ],
            },
            AnthropicMessage {
                role: "assistant",
                content: vec![Block::Text {
                    text: "x".into(),
                    cache_control: None,
                }],
            },
            AnthropicMessage {
                role: "user",
                content: vec![Block::Text {
                    text: "again".into(),
                    cache_control: None,
                }],
            },
        ];
        mark(&mut messages);
        let at = marked(&serde_json::to_value(&messages).expect("messages encode"));
        assert!(at.len() <= MAX_BREAKPOINTS - 2, "{at:?}");
        assert_eq!(at, ["/0/content/0", "/2/content/0"]);
        // The empty block is passed over for the one before it; the
        // assistant's message is not marked: only the last message and the
        // one before the last assistant's.
        let body = body(
            "s",
            &["a"],
            vec![
                message(Role::User, vec![text("plain text")]),
                message(Role::Assistant, vec![text("x")]),
                message(Role::User, vec![text("again")]),
            ],
        );
        let at = marked(&body);
        assert!(at.len() <= MAX_BREAKPOINTS, "{at:?}");
        assert_eq!(
            at,
            [
                "/messages/0/content/0",
                "/messages/2/content/0",
                "/system/0",
                "/tools/0"
            ]
        );
        assert_eq!(body["messages"][0]["content"][0]["text"], "plain text");
    }

    #[test]
    fn without_tools_or_system_only_messages_are_marked() {
        let body = body("", &[], vec![message(Role::User, vec![text("hi")])]);
        assert_eq!(marked(&body), ["/messages/0/content/0"]);
        assert!(body.get("system").is_none());
    }
}
