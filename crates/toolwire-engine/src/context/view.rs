//! What a request sends of a stored path: the latest compaction node's
//! summary in place of the messages it covers, the rest verbatim, and a
//! tool result larger than its share of the window cut, with a note. The
//! stored path is never changed: a branch from before a compaction node
//! has no node on its path, so its requests send the originals.

use toolwire_core::{ContentBlock, Message, Role};

use super::tokens::{Counts, Family};

/// How the summary is introduced to the model.
pub const SUMMARY_INTRO: &str = "[The earlier part of this conversation was compacted to stay \
     within the context window. Summary of what it held:]";

/// A path as a request sends it.
#[derive(Debug, Clone)]
pub struct View {
    /// The root (system message) first, then what is sent.
    pub messages: Vec<Message>,
    /// Messages from this index on were written after the latest
    /// compaction node (all after the root when there is none): only
    /// their usage reports a request of this view.
    pub fresh_from: usize,
    /// The compaction node in effect, if any.
    pub compaction: Option<Message>,
}

/// The view of `path` (root first): the latest compaction node on it
/// applied, tool results over `max_result_tokens` cut.
pub fn view(
    path: &[Message],
    family: Family,
    max_result_tokens: Option<u64>,
    counts: &mut Counts,
) -> View {
    let mut view = compacted(path);
    if let Some(limit) = max_result_tokens {
        for m in view.messages.iter_mut() {
            if m.role == Role::Tool {
                cut_results(m, family, limit, counts);
            }
        }
    }
    view
}

/// The latest compaction node applied.
pub fn compacted(path: &[Message]) -> View {
    let node = path
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, m)| m.compaction().map(|(s, t)| (i, s, t)));
    let Some((at, summary, through)) = node else {
        return View {
            messages: path.to_vec(),
            fresh_from: 1,
            compaction: None,
        };
    };
    let Some(covered_end) = path[..at].iter().rposition(|m| m.id == through) else {
        tracing::warn!(node = %path[at].id, "a compaction node covers a message not on its path; sending the path whole");
        return View {
            messages: path
                .iter()
                .filter(|m| m.compaction().is_none())
                .cloned()
                .collect(),
            fresh_from: 1,
            compaction: None,
        };
    };
    let mut messages = Vec::with_capacity(path.len() - covered_end + 1);
    messages.extend(path.first().cloned());
    messages.push(summary_message(&path[at], summary));
    let mut fresh_from = None;
    for (i, m) in path.iter().enumerate().skip(covered_end + 1) {
        if i > at && fresh_from.is_none() {
            fresh_from = Some(messages.len());
        }
        if m.compaction().is_none() {
            messages.push(m.clone());
        }
    }
    View {
        fresh_from: fresh_from.unwrap_or(messages.len()),
        messages,
        compaction: Some(path[at].clone()),
    }
}

/// The summary as the user message the model reads (the node's id, so
/// that counts of it are kept).
fn summary_message(node: &Message, summary: &str) -> Message {
    let mut m = node.clone();
    m.role = Role::User;
    m.content = vec![ContentBlock::Text {
        text: format!("{SUMMARY_INTRO}\n\n{summary}"),
    }];
    m
}

/// Cuts each result of tool message `m` over `limit` tokens: its head and
/// tail kept, a note in between. Says whether one was cut. A result's
/// count is kept in `counts`: each step cuts again, without counting.
fn cut_results(m: &mut Message, family: Family, limit: u64, counts: &mut Counts) -> bool {
    let mut cut = false;
    let id = m.id;
    for (i, block) in m.content.iter_mut().enumerate() {
        let ContentBlock::ToolResult { content, .. } = block else {
            continue;
        };
        // A token is at least one byte: shorter text cannot be over.
        if (content.len() as u64) <= limit {
            continue;
        }
        let tokens = counts.result(family, id, i, content);
        if tokens <= limit {
            continue;
        }
        *content = shortened(content, tokens, limit);
        cut = true;
    }
    cut
}

/// `text` (of `tokens` tokens) cut to about `limit` tokens: two thirds
/// from its head, one from its tail, and a note saying what was left out.
pub fn shortened(text: &str, tokens: u64, limit: u64) -> String {
    let chars = text.chars().count() as u64;
    // Characters per token of this text, so the cut lands near `limit`.
    let keep = (chars * limit / tokens.max(1)).saturating_sub(80);
    let head = (keep * 2 / 3) as usize;
    let tail = (keep / 3) as usize;
    let head_end = text.char_indices().nth(head).map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth((chars as usize).saturating_sub(tail))
        .map_or(text.len(), |(i, _)| i)
        .max(head_end);
    let left_out = text[head_end..tail_start].chars().count();
    format!(
        "{}\n\n[toolwire: {left_out} of {chars} characters (about {} of {tokens} tokens) of this \
         result were cut here to fit the context window; the whole result is stored. Read the \
         rest in parts: read_file with offset and limit, or narrow the command's output \
         (head, tail, grep, a line range).]\n\n{}",
        &text[..head_end],
        tokens.saturating_sub(limit),
        &text[tail_start..],
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolwire_core::{ConversationId, MessageId, ToolCallId};

    use super::*;

    fn msg(c: ConversationId, parent: Option<MessageId>, role: Role, text: &str) -> Message {
        Message::new(
            c,
            parent,
            role,
            vec![ContentBlock::Text {
                text: text.to_owned(),
            }],
        )
    }

    #[test]
    fn the_latest_node_stands_for_what_it_covers() {
        let c = ConversationId::new();
        let root = msg(c, None, Role::System, "sys");
        let u = msg(c, Some(root.id), Role::User, "task");
        let a = msg(c, Some(u.id), Role::Assistant, "old");
        let b = msg(c, Some(a.id), Role::Assistant, "kept");
        let node = Message::new(
            c,
            Some(b.id),
            Role::System,
            vec![ContentBlock::Compaction {
                summary: "did the task's first half".into(),
                through: a.id,
                covered: 2,
                tokens_before: 100,
                tokens_after: 10,
            }],
        );
        let after = msg(c, Some(node.id), Role::User, "next");
        let path = vec![root.clone(), u, a, b.clone(), node.clone(), after.clone()];
        let v = compacted(&path);
        let ids: Vec<_> = v.messages.iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![root.id, node.id, b.id, after.id]);
        assert_eq!(v.messages[1].role, Role::User);
        assert!(v.messages[1].text().contains("first half"));
        assert_eq!(v.fresh_from, 3);
        // Before the node: the originals.
        assert_eq!(compacted(&path[..4]).messages.len(), 4);
    }

    #[test]
    fn a_large_result_is_cut_with_a_note() {
        let c = ConversationId::new();
        let big = (0..3000).map(|i| format!("line {i}\n")).collect::<String>();
        let mut m = Message::new(
            c,
            None,
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: ToolCallId("c".into()),
                content: big.clone(),
                is_error: false,
                images: Vec::new(),
            }],
        );
        assert!(cut_results(
            &mut m,
            Family::O200k,
            500,
            &mut Counts::default()
        ));
        let ContentBlock::ToolResult { content, .. } = &m.content[0] else {
            panic!()
        };
        let tokens = Family::O200k.count(content);
        assert!(tokens < 700, "{tokens}");
        assert!(content.starts_with("line 0\n"));
        assert!(content.ends_with("line 2999\n"));
        assert!(content.contains("the whole result is stored"));
        let _ = json!({});
    }
}
