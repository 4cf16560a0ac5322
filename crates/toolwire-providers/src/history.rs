//! A conversation path as every provider shows it to a model: tool results
//! grouped after their assistant message in the order of its calls (they
//! are stored in the order the tools finished), and the text a message
//! carries, notifications included.

use std::borrow::Cow;

use toolwire_core::{BlobRef, ContentBlock, Message, Role, ToolCallId, format_block};

use toolwire_core::NOT_RUN_AFTER_STOP;

/// A path element as providers send it.
pub enum Group<'a> {
    Message(&'a Message),
    /// The results following an assistant message, in the order of the
    /// calls.
    Results(Vec<Answer<'a>>),
}

/// One tool result as providers send it, borrowed from the path.
pub struct Answer<'a> {
    pub id: &'a ToolCallId,
    /// Its text, notifications delivered with it included.
    pub content: Cow<'a, str>,
    pub is_error: bool,
    /// The images it returned.
    pub images: &'a [BlobRef],
}

/// Groups consecutive tool messages and orders their results by call. A
/// call that no result answers (a crash cut it, and recovery has not
/// answered it yet) is sent with a "not run" result in its place: APIs
/// refuse a request holding an unanswered call, so one must never go out.
pub fn grouped(path: &[Message]) -> Vec<Group<'_>> {
    let mut out = Vec::new();
    let mut call_order: Vec<&ToolCallId> = Vec::new();
    let mut i = 0;
    while i < path.len() {
        let m = &path[i];
        if m.role != Role::Tool {
            close_open_calls(&mut out, &mut call_order, Vec::new());
            if m.role == Role::Assistant {
                call_order = m.tool_uses().map(|(id, ..)| id).collect();
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
                    images,
                } = block
                {
                    let content = match &notifications {
                        Some(block) if content.is_empty() => Cow::Owned(block.clone()),
                        Some(block) => Cow::Owned(format!("{content}\n\n{block}")),
                        None => Cow::Borrowed(content.as_str()),
                    };
                    results.push(Answer {
                        id: tool_use_id,
                        content,
                        is_error: *is_error,
                        images,
                    });
                }
            }
            i += 1;
        }
        close_open_calls(&mut out, &mut call_order, results);
    }
    close_open_calls(&mut out, &mut call_order, Vec::new());
    out
}

/// Pushes `results` (with a "not run" result for each call of
/// `call_order` they leave open), ordered by call; nothing when there are
/// neither results nor open calls. Clears `call_order`: the calls are
/// answered.
fn close_open_calls<'a>(
    out: &mut Vec<Group<'a>>,
    call_order: &mut Vec<&'a ToolCallId>,
    mut results: Vec<Answer<'a>>,
) {
    for &id in call_order.iter() {
        if !results.iter().any(|answer| answer.id == id) {
            tracing::warn!(call = %id.0, "a tool call without a result is sent as not run");
            results.push(Answer {
                id,
                content: Cow::Borrowed(NOT_RUN_AFTER_STOP),
                is_error: true,
                images: &[],
            });
        }
    }
    if results.is_empty() {
        return;
    }
    results.sort_by_key(|answer| {
        call_order
            .iter()
            .position(|&c| c == answer.id)
            .unwrap_or(usize::MAX)
    });
    call_order.clear();
    out.push(Group::Results(results));
}

/// The images of a user message, in order.
pub(crate) fn images(m: &Message) -> Vec<&BlobRef> {
    m.content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Image(image) => Some(image),
            _ => None,
        })
        .collect()
}

/// Text and notifications of a message, as the model reads them: the
/// text, then the notifications' block. Borrowed when the message is one
/// text block (most are).
pub(crate) fn plain_text(m: &Message) -> Cow<'_, str> {
    let notifications = format_block(&m.content);
    if notifications.is_none()
        && let Some(text) = only_text(m)
    {
        return Cow::Borrowed(text);
    }
    let mut s = String::new();
    for block in &m.content {
        if let ContentBlock::Text { text } = block {
            if !s.is_empty() {
                s.push('\n');
            }
            s.push_str(text);
        }
    }
    if let Some(block) = notifications {
        if !s.is_empty() {
            s.push_str("\n\n");
        }
        s.push_str(&block);
    }
    Cow::Owned(s)
}

/// The text blocks of a message, joined without a separator (what
/// [`Message::text`] gives), borrowed when there is at most one.
pub(crate) fn joined_text(m: &Message) -> Cow<'_, str> {
    match only_text(m) {
        Some(text) => Cow::Borrowed(text),
        None => Cow::Owned(m.text()),
    }
}

/// The text of a message with at most one text block ("" with none);
/// `None` when it has several.
fn only_text(m: &Message) -> Option<&str> {
    let mut texts = m.content.iter().filter_map(|b| match b {
        ContentBlock::Text { text } => Some(text.as_str()),
        _ => None,
    });
    let first = texts.next().unwrap_or("");
    texts.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolwire_core::{ConversationId, MessageId};

    use super::*;

    fn message(role: Role, parent: Option<MessageId>, content: Vec<ContentBlock>) -> Message {
        Message::new(ConversationId::new(), parent, role, content)
    }

    fn call(id: &str) -> ContentBlock {
        ContentBlock::ToolUse {
            id: ToolCallId(id.into()),
            server: None,
            name: "run_command".into(),
            arguments: json!({}),
        }
    }

    fn result(id: &str) -> ContentBlock {
        ContentBlock::ToolResult {
            tool_use_id: ToolCallId(id.into()),
            content: format!("{id} done"),
            is_error: false,
            images: Vec::new(),
        }
    }

    fn results(groups: &[Group<'_>]) -> Vec<Vec<(String, String)>> {
        groups
            .iter()
            .filter_map(|g| match g {
                Group::Results(r) => Some(
                    r.iter()
                        .map(|a| (a.id.0.clone(), a.content.to_string()))
                        .collect(),
                ),
                Group::Message(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_call_left_open_is_sent_with_a_not_run_result() {
        let user = message(
            Role::User,
            None,
            vec![ContentBlock::Text { text: "go".into() }],
        );
        let asked = message(Role::Assistant, Some(user.id), vec![call("a"), call("b")]);
        let a = message(Role::Tool, Some(asked.id), vec![result("a")]);
        let next = message(
            Role::User,
            Some(a.id),
            vec![ContentBlock::Text {
                text: "again".into(),
            }],
        );
        let path = vec![user, asked, a, next];
        let groups = grouped(&path);
        assert_eq!(
            results(&groups),
            vec![vec![
                ("a".to_owned(), "a done".to_owned()),
                ("b".to_owned(), NOT_RUN_AFTER_STOP.to_owned())
            ]]
        );
        // Results come right after the calls, before the next user message.
        assert!(matches!(groups[2], Group::Results(_)));
        assert!(matches!(groups[3], Group::Message(m) if m.role == Role::User));
    }

    #[test]
    fn calls_with_no_result_at_all_are_answered_before_what_follows() {
        let asked = message(Role::Assistant, None, vec![call("x")]);
        let next = message(
            Role::User,
            Some(asked.id),
            vec![ContentBlock::Text { text: "hi".into() }],
        );
        let path = vec![asked, next];
        let groups = grouped(&path);
        assert_eq!(
            results(&groups),
            vec![vec![("x".to_owned(), NOT_RUN_AFTER_STOP.to_owned())]]
        );
        assert!(matches!(groups[1], Group::Results(_)));
    }

    #[test]
    fn answered_calls_are_left_as_they_are() {
        let asked = message(Role::Assistant, None, vec![call("a"), call("b")]);
        let b = message(Role::Tool, Some(asked.id), vec![result("b")]);
        let a = message(Role::Tool, Some(b.id), vec![result("a")]);
        let path = vec![asked, b, a];
        assert_eq!(
            results(&grouped(&path)),
            vec![vec![
                ("a".to_owned(), "a done".to_owned()),
                ("b".to_owned(), "b done".to_owned())
            ]]
        );
    }
}
