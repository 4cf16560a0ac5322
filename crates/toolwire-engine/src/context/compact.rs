//! Compaction: which messages of a view a summary covers (the oldest,
//! never splitting a tool call from its result, the newest kept verbatim
//! up to a share of the window), the transcript the summarising model
//! reads, and the summarising call itself.

use futures::StreamExt;
use toolwire_core::{ContentBlock, Message, MessageId, Role, Usage};
use toolwire_providers::{ModelRequest, Provider};
use toolwire_stream::StreamEvent;

use super::tokens::{Counts, Family};
use super::view::{View, shortened};

/// The summarising call's system prompt (its first words tell a mock
/// model that a summary is asked for).
pub const SUMMARY_SYSTEM: &str = "You are compacting a long agent session so that it can go on \
within the model's context window. Write a summary that lets the agent continue the work without \
the original messages: the user's requests and constraints (quote them), decisions taken, what \
was done and found (files, commands, results and errors that matter), the current state, and \
what remains to do next. Be concise and factual, without preamble.";

/// Which messages a compaction covers.
#[derive(Debug, Clone)]
pub struct Plan {
    /// View index of the first message kept verbatim: `view[1..keep]`
    /// is summarised (an earlier summary among them).
    pub keep: usize,
    /// The last path message covered.
    pub through: MessageId,
}

/// The cut that keeps the newest messages within `keep_tokens`, at a
/// message that is not a tool result (so a call and its results stay on
/// one side), covering at least one message that is not an earlier
/// summary and keeping at least the last message. `None` when no cut
/// fits those rules.
pub fn plan(view: &View, family: Family, counts: &mut Counts, keep_tokens: u64) -> Option<Plan> {
    let m = &view.messages;
    // The earlier summary (index 1) alone is not worth covering again.
    let first_cut = if view.compaction.is_some() { 3 } else { 2 };
    let mut kept = 0u64;
    let mut best = None;
    for k in (first_cut..m.len()).rev() {
        kept += counts.message(family, &m[k]);
        if m[k].role == Role::Tool {
            continue;
        }
        if kept > keep_tokens && best.is_some() {
            break;
        }
        best = Some(k);
    }
    let keep = best?;
    Some(Plan {
        keep,
        through: m[keep - 1].id,
    })
}

/// The cut that covers every message after the root (Letta's compaction
/// `mode: all`): the view becomes the root and the summary. `None` when
/// nothing but an earlier summary is there to cover.
pub fn plan_all(view: &View) -> Option<Plan> {
    let m = &view.messages;
    let first = if view.compaction.is_some() { 2 } else { 1 };
    if m.len() <= first {
        return None;
    }
    Some(Plan {
        keep: m.len(),
        through: m[m.len() - 1].id,
    })
}

/// The covered messages as one text for the summarising model, under
/// `budget` tokens: tool results are cut first (evenly), then the oldest
/// part.
pub fn transcript(covered: &[Message], family: Family, budget: u64) -> String {
    let mut parts: Vec<(bool, String)> = covered.iter().flat_map(render).collect();
    let total: u64 = parts.iter().map(|(_, p)| family.count(p)).sum();
    if total > budget {
        let results: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].0).collect();
        let other: u64 = parts
            .iter()
            .filter(|(r, _)| !r)
            .map(|(_, p)| family.count(p))
            .sum();
        if !results.is_empty() {
            let each = (budget.saturating_sub(other) / results.len() as u64).max(40);
            for i in results {
                let tokens = family.count(&parts[i].1);
                if tokens > each {
                    parts[i].1 = shortened(&parts[i].1, tokens, each);
                }
            }
        }
    }
    let mut text = parts
        .into_iter()
        .map(|(_, p)| p)
        .collect::<Vec<_>>()
        .join("\n\n");
    let tokens = family.count(&text);
    if tokens > budget {
        // Still over: the newest part is kept (the older one is what an
        // earlier summary, first in the transcript, already tells).
        let chars = text.chars().count() as u64;
        let drop = (chars - chars * budget / tokens) as usize;
        let at = text.char_indices().nth(drop).map_or(0, |(i, _)| i);
        text = format!("[… older part left out …]\n{}", &text[at..]);
    }
    text
}

/// One message as transcript pieces: (is a tool result, text).
fn render(m: &Message) -> Vec<(bool, String)> {
    let who = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut out = Vec::new();
    for block in &m.content {
        match block {
            ContentBlock::Text { text } if !text.is_empty() => {
                out.push((false, format!("[{who}]\n{text}")));
            }
            ContentBlock::ToolUse {
                name, arguments, ..
            } => out.push((false, format!("[{who} calls {name}] {arguments}"))),
            ContentBlock::ToolResult {
                content, is_error, ..
            } => {
                let kind = if *is_error {
                    "tool error"
                } else {
                    "tool result"
                };
                out.push((true, format!("[{kind}]\n{content}")));
            }
            ContentBlock::Notification { source, text, .. } => {
                out.push((false, format!("[notification from {source}] {text}")));
            }
            ContentBlock::Image(image) => out.push((false, format!("[{who}] {}", image.mention()))),
            ContentBlock::Compaction { summary, .. } => {
                out.push((
                    false,
                    format!("[summary of the earlier conversation]\n{summary}"),
                ));
            }
            ContentBlock::Text { .. } | ContentBlock::Reasoning { .. } => {}
        }
    }
    out
}

/// Why the summarising call gave no summary.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SummaryError {
    #[error("{0}")]
    Provider(String),
    #[error("the model's summary went over {0} bytes")]
    TooLong(usize),
    #[error("the model returned no summary text")]
    Empty,
}

/// Asks `provider` for a summary of `transcript`; its text and usage.
pub async fn summarise(
    provider: &dyn Provider,
    transcript: &str,
    turn: usize,
    max_bytes: usize,
) -> Result<(String, Option<Usage>), SummaryError> {
    let request = ModelRequest {
        system: SUMMARY_SYSTEM.to_owned(),
        messages: vec![Message::new(
            toolwire_core::ConversationId::new(),
            None,
            Role::User,
            vec![ContentBlock::Text {
                text: format!(
                    "<transcript>\n{transcript}\n</transcript>\n\nSummarise the conversation above."
                ),
            }],
        )],
        tools: Vec::new(),
        turn,
        iteration: 0,
        images: Default::default(),
        // A summary is free text, at the provider's own effort.
        reasoning_effort: None,
        response_format: None,
    };
    let mut stream = provider
        .stream(&request)
        .await
        .map_err(|e| SummaryError::Provider(e.to_string()))?;
    let mut text = String::new();
    let mut usage = None;
    while let Some(event) = stream.next().await {
        match event.map_err(|e| SummaryError::Provider(e.to_string()))? {
            StreamEvent::TextDelta { text: piece } => {
                text.push_str(&piece);
                if text.len() > max_bytes {
                    return Err(SummaryError::TooLong(max_bytes));
                }
            }
            StreamEvent::Usage(u) => {
                usage = Some(Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    cached_tokens: u.cached_tokens,
                    cache_write_tokens: u.cache_write_tokens,
                })
            }
            StreamEvent::ProviderError { message } => {
                return Err(SummaryError::Provider(format!(
                    "the provider reported: {message}"
                )));
            }
            StreamEvent::LimitExceeded { message } => {
                return Err(SummaryError::Provider(message));
            }
            _ => {}
        }
    }
    let text = text.trim().to_owned();
    if text.is_empty() {
        return Err(SummaryError::Empty);
    }
    Ok((text, usage))
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolwire_core::{ConversationId, ToolCallId};

    use super::*;
    use crate::context::view::compacted;

    #[test]
    fn a_cut_never_falls_between_a_call_and_its_result() {
        let c = ConversationId::new();
        let mut path = vec![Message::new(c, None, Role::System, Vec::new())];
        let mut parent = path[0].id;
        for i in 0..10 {
            let call = Message::new(
                c,
                Some(parent),
                Role::Assistant,
                vec![ContentBlock::ToolUse {
                    id: ToolCallId(format!("c{i}")),
                    server: None,
                    name: "echo".into(),
                    arguments: json!({"i": i}),
                }],
            );
            let result = Message::new(
                c,
                Some(call.id),
                Role::Tool,
                vec![ContentBlock::ToolResult {
                    tool_use_id: ToolCallId(format!("c{i}")),
                    content: "x ".repeat(100),
                    is_error: false,
                    images: Vec::new(),
                }],
            );
            parent = result.id;
            path.push(call);
            path.push(result);
        }
        let view = compacted(&path);
        let mut counts = Counts::default();
        let p = plan(&view, Family::O200k, &mut counts, 500).unwrap();
        assert_eq!(view.messages[p.keep].role, Role::Assistant);
        assert_eq!(view.messages[p.keep - 1].role, Role::Tool);
        let kept: u64 = view.messages[p.keep..]
            .iter()
            .map(|m| counts.message(Family::O200k, m))
            .sum();
        assert!(kept <= 500, "{kept}");
        assert!(p.keep > 2);
    }

    #[test]
    fn plan_all_covers_everything_after_the_root_once() {
        let c = ConversationId::new();
        let root = Message::new(c, None, Role::System, Vec::new());
        let text = |t: &str| vec![ContentBlock::Text { text: t.into() }];
        assert!(plan_all(&compacted(std::slice::from_ref(&root))).is_none());
        let user = Message::new(c, Some(root.id), Role::User, text("hi"));
        let answer = Message::new(c, Some(user.id), Role::Assistant, text("hello"));
        let path = vec![root.clone(), user, answer.clone()];
        let view = compacted(&path);
        let p = plan_all(&view).unwrap();
        assert_eq!((p.keep, p.through), (3, answer.id));

        // After a node that covered everything, only its summary is left:
        // nothing more to cover.
        let node = Message::new(
            c,
            Some(answer.id),
            Role::System,
            vec![ContentBlock::Compaction {
                summary: "they said hi".into(),
                through: answer.id,
                covered: 2,
                tokens_before: 10,
                tokens_after: 3,
            }],
        );
        let mut path = path;
        path.push(node);
        let view = compacted(&path);
        assert_eq!(view.messages.len(), 2, "the root and the summary");
        assert!(plan_all(&view).is_none());
    }

    #[test]
    fn a_transcript_over_its_budget_is_cut_to_it() {
        let c = ConversationId::new();
        let m = Message::new(
            c,
            None,
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: ToolCallId("c".into()),
                content: "word ".repeat(5000),
                is_error: false,
                images: Vec::new(),
            }],
        );
        let t = transcript(&[m], Family::O200k, 1000);
        assert!(Family::O200k.count(&t) <= 1200);
    }
}
