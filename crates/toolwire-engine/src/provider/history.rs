//! A conversation path as every provider shows it to a model: tool results
//! grouped after their assistant message in the order of its calls (they
//! are stored in the order the tools finished), and the text a message
//! carries, notifications included.

use toolwire_core::{ContentBlock, Message, Role, ToolCallId, format_block};

/// A path element as providers send it.
pub enum Group<'a> {
    Message(&'a Message),
    /// The results following an assistant message: (call id, content,
    /// is_error), in the order of the calls.
    Results(Vec<(ToolCallId, String, bool)>),
}

/// Groups consecutive tool messages and orders their results by call.
pub fn grouped(path: &[Message]) -> Vec<Group<'_>> {
    let mut out = Vec::new();
    let mut call_order: Vec<ToolCallId> = Vec::new();
    let mut i = 0;
    while i < path.len() {
        let m = &path[i];
        if m.role != Role::Tool {
            if m.role == Role::Assistant {
                call_order = m.tool_uses().map(|(id, ..)| id.clone()).collect();
            }
            out.push(Group::Message(m));
            i += 1;
            continue;
        }
        let mut results = Vec::new();
        while i < path.len() && path[i].role == Role::Tool {
            // Notifications delivered with a result: the model reads them
            // after the tool's own output.
            let notifications = format_block(&path[i].content);
            for block in &path[i].content {
                if let ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } = block
                {
                    let content = match &notifications {
                        Some(block) if content.is_empty() => block.clone(),
                        Some(block) => format!("{content}\n\n{block}"),
                        None => content.clone(),
                    };
                    results.push((tool_use_id.clone(), content, *is_error));
                }
            }
            i += 1;
        }
        results.sort_by_key(|(id, ..)| {
            call_order
                .iter()
                .position(|c| c == id)
                .unwrap_or(usize::MAX)
        });
        out.push(Group::Results(results));
    }
    out
}

/// Text and notifications of a message, as the model reads them: the
/// text, then the notifications' block.
pub(crate) fn plain_text(m: &Message) -> String {
    let mut s = String::new();
    for block in &m.content {
        if let ContentBlock::Text { text } = block {
            if !s.is_empty() {
                s.push('\n');
            }
            s.push_str(text);
        }
    }
    if let Some(block) = format_block(&m.content) {
        if !s.is_empty() {
            s.push_str("\n\n");
        }
        s.push_str(&block);
    }
    s
}
