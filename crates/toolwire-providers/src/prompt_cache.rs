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

use serde_json::{Value, json};

/// Anthropic's limit of breakpoints per request.
pub const MAX_BREAKPOINTS: usize = 4;

/// Puts the breakpoints into `body`, an Anthropic messages request.
pub(crate) fn mark(body: &mut Value) {
    let mut placed = 0;
    if let Some(tool) = body
        .get_mut("tools")
        .and_then(Value::as_array_mut)
        .and_then(|tools| tools.last_mut())
    {
        placed += usize::from(set(tool));
    }
    if let Some(system) = body.get_mut("system") {
        if let Some(text) = system.as_str().filter(|t| !t.is_empty()) {
            *system = json!([{"type": "text", "text": text}]);
        }
        if let Some(block) = system.as_array_mut().and_then(|b| b.last_mut()) {
            placed += usize::from(set(block));
        }
    }
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    let mut targets = Vec::new();
    if let Some(last) = messages.len().checked_sub(1) {
        targets.push(last);
    }
    let last_assistant = messages
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    if let Some(previous) = last_assistant.and_then(|i| i.checked_sub(1)) {
        targets.push(previous);
    }
    for index in targets {
        if placed >= MAX_BREAKPOINTS {
            break;
        }
        if let Some(block) = messages.get_mut(index).and_then(last_markable_block) {
            placed += usize::from(set(block));
        }
    }
}

/// The last block of `message` that may carry `cache_control` (thinking
/// blocks may not), its string content turned into a text block first.
fn last_markable_block(message: &mut Value) -> Option<&mut Value> {
    let content = message.get_mut("content")?;
    if let Some(text) = content.as_str().filter(|t| !t.is_empty()) {
        *content = json!([{"type": "text", "text": text}]);
    }
    content.as_array_mut()?.iter_mut().rev().find(|block| {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let empty_text = kind == "text" && block.get("text").and_then(Value::as_str) == Some("");
        !matches!(kind, "thinking" | "redacted_thinking") && !empty_text
    })
}

/// Marks `block`; false if it was marked already (one breakpoint counted
/// once).
fn set(block: &mut Value) -> bool {
    let Some(object) = block.as_object_mut() else {
        return false;
    };
    object
        .insert("cache_control".into(), json!({"type": "ephemeral"}))
        .is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn one_question_marks_tools_system_and_the_question() {
        let mut body = json!({
            "system": "be brief",
            "tools": [{"name": "a"}, {"name": "b"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        });
        mark(&mut body);
        assert_eq!(
            marked(&body),
            ["/messages/0/content/0", "/system/0", "/tools/1"]
        );
        assert_eq!(body["system"][0]["text"], "be brief");
    }

    #[test]
    fn a_tool_loop_marks_this_step_and_the_step_before() {
        let mut body = json!({
            "system": "s",
            "tools": [{"name": "a"}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "1"}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "more"},
                    {"type": "tool_use", "id": "2"},
                    {"type": "tool_use", "id": "3"}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "2"},
                    {"type": "tool_result", "tool_use_id": "3"}
                ]},
            ],
        });
        mark(&mut body);
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
    fn never_more_than_four_and_never_on_thinking() {
        let mut body = json!({
            "system": [{"type": "text", "text": "s"}],
            "tools": [{"name": "a"}],
            "messages": [
                {"role": "user", "content": "plain text"},
                {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "thinking", "thinking": "t"}]},
                {"role": "user", "content": [{"type": "text", "text": "again"}]},
            ],
        });
        mark(&mut body);
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
        let mut body = json!({
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        });
        mark(&mut body);
        assert_eq!(marked(&body), ["/messages/0/content/0"]);
        assert!(body.get("system").is_none());
    }
}
