//! A conversation as the live view draws it: every node of the tree with a
//! short summary, and one message whole with its siblings.

use std::collections::HashMap;

use serde_json::{Value, json};
use toolwire_core::{ContentBlock, Conversation, ConversationId, Message, MessageId, ToolCallId};

use toolwire_store::StoreError;

use crate::agents::AgentRecord;
use crate::error::ApiResult;
use crate::state::AppState;

/// Characters of a node's text its summary keeps.
const SUMMARY_CHARS: usize = 200;

/// `ConversationSummary`.
pub fn summary(conversation: &Conversation, agent: Option<&AgentRecord>) -> Value {
    let mut summary = json!({
        "id": conversation.id,
        "title": conversation.title,
        "created_at": conversation.created_at,
    });
    if let Some(agent) = agent {
        summary["agent_id"] = json!(agent.id);
    }
    if let Some(origin) = &conversation.forked_from {
        summary["forked_from"] = json!({
            "conversation_id": origin.conversation_id,
            "message_id": origin.message_id,
        });
    }
    summary
}

/// The names of the tools called in `messages`, by call.
fn tool_names(messages: &[Message]) -> HashMap<&ToolCallId, &str> {
    messages
        .iter()
        .flat_map(|m| m.tool_uses())
        .map(|(id, _, name, _)| (id, name))
        .collect()
}

/// `s` cut to `max` characters (an ellipsis says it was cut).
fn clip(s: &str, max: usize) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(max.saturating_sub(1)) {
        Some((cut, _)) if one_line.chars().count() > max => format!("{}…", &one_line[..cut]),
        _ => one_line,
    }
}

/// A node's summary: its text, or the tools it calls, or the tool it
/// answers.
fn node_summary(message: &Message, names: &HashMap<&ToolCallId, &str>) -> String {
    let text = message.text();
    if !text.trim().is_empty() {
        return clip(&text, SUMMARY_CHARS);
    }
    let called: Vec<&str> = message.tool_uses().map(|(_, _, name, _)| name).collect();
    if !called.is_empty() {
        return clip(&called.join(", "), SUMMARY_CHARS);
    }
    let answered: Vec<&str> = message
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(
                names
                    .get(tool_use_id)
                    .copied()
                    .unwrap_or(tool_use_id.0.as_str()),
            ),
            _ => None,
        })
        .collect();
    if !answered.is_empty() {
        return clip(&answered.join(", "), SUMMARY_CHARS);
    }
    message.summary(SUMMARY_CHARS)
}

/// `Node`: `message` with its children.
fn node(message: &Message, children: &[&Message], names: &HashMap<&ToolCallId, &str>) -> Value {
    let notifications = message
        .content
        .iter()
        .filter(|b| matches!(b, ContentBlock::Notification { .. }))
        .count();
    let mut node = json!({
        "id": message.id,
        "parent_id": message.parent_id,
        "children": children.iter().map(|c| c.id).collect::<Vec<_>>(),
        "role": message.role.as_str(),
        "summary": node_summary(message, names),
        "status": message.status.as_str(),
        "usage": message.usage,
        "cost": message.cost,
        "model": message.model,
        "created_at": message.created_at,
        "tool_calls": message
            .tool_uses()
            .map(|(id, _, name, _)| json!({"tool_call_id": id, "tool_name": name}))
            .collect::<Vec<_>>(),
        "notifications": notifications,
    });
    if let Some(covers) = compaction(message) {
        node["compaction"] = covers;
    }
    node
}

/// What a compaction node covers: the path from the root's child through
/// `through` (`covered` messages), and the request's size before and the
/// summary's after.
fn compaction(message: &Message) -> Option<Value> {
    message.content.iter().find_map(|b| match b {
        ContentBlock::Compaction {
            through,
            covered,
            tokens_before,
            tokens_after,
            ..
        } => Some(json!({
            "through": through,
            "covered": covered,
            "tokens_before": tokens_before,
            "tokens_after": tokens_after,
        })),
        _ => None,
    })
}

/// The children of each message, oldest first.
fn children_of(messages: &[Message]) -> HashMap<toolwire_core::MessageId, Vec<&Message>> {
    let mut children: HashMap<_, Vec<&Message>> = HashMap::new();
    for m in messages {
        if let Some(parent) = m.parent_id {
            children.entry(parent).or_default().push(m);
        }
    }
    children
}

/// `Tree` of `conversation`, as of event `last_seq` or later.
pub async fn tree(state: &AppState, id: ConversationId, last_seq: u64) -> ApiResult<Value> {
    // Read before the rest: a tree that says no turn runs is then one
    // that no turn wrote into while it was read.
    let running = state.engine.is_running(id);
    let conversation = state.store().conversation(id).await?;
    let messages = state.store().messages(id).await?;
    let names = tool_names(&messages);
    let children = children_of(&messages);
    let nodes: Vec<Value> = messages
        .iter()
        .map(|m| {
            node(
                m,
                children.get(&m.id).map_or(&[][..], Vec::as_slice),
                &names,
            )
        })
        .collect();
    let total_cost: f64 = messages.iter().filter_map(|m| m.cost).sum();
    Ok(json!({
        "conversation_id": conversation.id,
        "root_id": conversation.root_id,
        "active_leaf": conversation.active_leaf,
        "total_cost": total_cost,
        "running": running,
        "last_seq": last_seq,
        "nodes": nodes,
    }))
}

/// The `MessageView`s of messages `ids` of conversation `id`, in the
/// order asked. A view per request read the path to each message: a page
/// of a long conversation asked for thousands. Here the messages come
/// from the paths to the deepest ones (a batch from one branch is one
/// path read, which the store keeps for long paths) and their children
/// are read per message (an index lookup), never the whole conversation.
/// `Err(id)` names an id that is not one of its messages.
pub async fn message_views(
    state: &AppState,
    id: ConversationId,
    ids: &[MessageId],
) -> ApiResult<Result<Vec<Value>, MessageId>> {
    let store = state.store();
    let mut by_id: HashMap<MessageId, Message> = HashMap::new();
    // Deepest first: the page asks in branch order, so the last id's path
    // holds the others.
    for wanted in ids.iter().rev() {
        if by_id.contains_key(wanted) {
            continue;
        }
        let path = match store.path_to(*wanted).await {
            Ok(path) => path,
            Err(StoreError::MessageNotFound(_)) => return Ok(Err(*wanted)),
            Err(e) => return Err(e.into()),
        };
        if path
            .last()
            .is_none_or(|m| m.conversation_id != id || m.id != *wanted)
        {
            return Ok(Err(*wanted));
        }
        for message in path {
            by_id.entry(message.id).or_insert(message);
        }
    }
    let mut children: HashMap<MessageId, Vec<Message>> = HashMap::new();
    let mut views = Vec::with_capacity(ids.len());
    for wanted in ids {
        let Some(message) = by_id.get(wanted) else {
            return Ok(Err(*wanted));
        };
        for of in [Some(message.id), message.parent_id].into_iter().flatten() {
            if let std::collections::hash_map::Entry::Vacant(entry) = children.entry(of) {
                entry.insert(store.children(of).await?);
            }
        }
        let names = answered_names(message, &by_id);
        let kids: Vec<&Message> = children
            .get(&message.id)
            .map_or(Vec::new(), |c| c.iter().collect());
        let siblings: Vec<MessageId> = match message.parent_id {
            Some(parent) => children
                .get(&parent)
                .map_or(Vec::new(), |c| c.iter().map(|m| m.id).collect()),
            None => vec![message.id],
        };
        views.push(view(message, &kids, &names, &siblings));
    }
    Ok(Ok(views))
}

/// The names of the calls `message` answers, from the nearest ancestors
/// that made them (usually its parent): as the path gives them, without
/// walking the whole path.
fn answered_names<'a>(
    message: &'a Message,
    by_id: &'a HashMap<MessageId, Message>,
) -> HashMap<&'a ToolCallId, &'a str> {
    let mut wanted: Vec<&ToolCallId> = message
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id),
            _ => None,
        })
        .collect();
    let mut names = HashMap::new();
    let mut at = message.parent_id;
    while !wanted.is_empty()
        && let Some(ancestor) = at.and_then(|p| by_id.get(&p))
    {
        for (call, _, name, _) in ancestor.tool_uses() {
            if let Some(i) = wanted.iter().position(|w| *w == call) {
                wanted.swap_remove(i);
                names.insert(call, name);
            }
        }
        at = ancestor.parent_id;
    }
    names
}

/// `MessageView` of `message`.
pub async fn message_view(state: &AppState, message: &Message) -> ApiResult<Value> {
    let store = state.store();
    let children = store.children(message.id).await?;
    let siblings = store.siblings(message.id).await?;
    // The path gives the names of the calls a tool result answers.
    let path = store.path_to(message.id).await?;
    let names = tool_names(&path);
    let children: Vec<&Message> = children.iter().collect();
    let siblings: Vec<MessageId> = siblings.iter().map(|s| s.id).collect();
    Ok(view(message, &children, &names, &siblings))
}

/// A `MessageView`: the node, its content and where it stands among its
/// siblings.
fn view(
    message: &Message,
    children: &[&Message],
    names: &HashMap<&ToolCallId, &str>,
    siblings: &[MessageId],
) -> Value {
    let mut view = node(message, children, names);
    view["content_blocks"] = json!(message.content);
    view["siblings"] = json!({
        "index": siblings.iter().position(|s| *s == message.id).unwrap_or(0),
        "ids": siblings,
    });
    view
}
