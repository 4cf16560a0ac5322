//! Conversations are trees: every message has a parent (the root is the
//! system message), and what the model sees is the path from the root to a
//! leaf. Edits and regenerations add siblings, so nothing is ever lost.
//!
//! [`ConversationTree`] is the in-memory form; the store keeps the same
//! shape in tables and uses the same rules ([`edited_sibling`],
//! [`fork_copy`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{ConversationId, MessageId};
use crate::message::{ContentBlock, Message, Role};

/// What a conversation is, apart from its messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    /// The conversation's id.
    pub id: ConversationId,
    /// A title, when one is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its root, the system message.
    pub root_id: MessageId,
    /// The leaf the next turn continues from.
    pub active_leaf: MessageId,
    /// Where a fork was copied from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// How many times one of its stored messages was changed (messages
    /// are otherwise never changed): a path read while it was N is what
    /// the store holds while it is N. The store's own count, not part of
    /// any front door's JSON.
    #[serde(skip)]
    pub revision: u64,
}

/// The conversation and message a fork was taken at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    /// The conversation it was copied from.
    pub conversation_id: ConversationId,
    /// The message the fork was taken at.
    pub message_id: MessageId,
}

/// A tree operation that cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    /// No such message in the conversation.
    #[error("message {0} is not in this conversation")]
    UnknownMessage(MessageId),
    /// Only a user message can be edited.
    #[error("message {id} is a {role} message; only user messages can be edited")]
    NotAUserMessage {
        /// The message.
        id: MessageId,
        /// The role it has instead.
        role: &'static str,
    },
    /// Only an assistant message can be regenerated.
    #[error("message {id} is a {role} message; only assistant messages can be regenerated")]
    NotAnAssistantMessage {
        /// The message.
        id: MessageId,
        /// The role it has instead.
        role: &'static str,
    },
    /// The root has no parent to branch from.
    #[error("the root of a conversation has no parent")]
    RootHasNoParent,
}

/// A new root (system message) for a conversation.
pub fn root_message(conversation_id: ConversationId, system_prompt: &str) -> Message {
    let content = if system_prompt.is_empty() {
        Vec::new()
    } else {
        vec![ContentBlock::Text {
            text: system_prompt.to_owned(),
        }]
    };
    Message::new(conversation_id, None, Role::System, content)
}

/// The sibling that an edit of user message `original` creates.
pub fn edited_sibling(original: &Message, text: &str) -> Result<Message, TreeError> {
    if original.role != Role::User {
        return Err(TreeError::NotAUserMessage {
            id: original.id,
            role: original.role.as_str(),
        });
    }
    let parent = original.parent_id.ok_or(TreeError::RootHasNoParent)?;
    Ok(Message::new(
        original.conversation_id,
        Some(parent),
        Role::User,
        vec![ContentBlock::Text {
            text: text.to_owned(),
        }],
    ))
}

/// Where a regeneration of assistant message `original` attaches: its
/// parent, under which the new answer becomes a sibling.
pub fn regeneration_parent(original: &Message) -> Result<MessageId, TreeError> {
    if original.role != Role::Assistant {
        return Err(TreeError::NotAnAssistantMessage {
            id: original.id,
            role: original.role.as_str(),
        });
    }
    original.parent_id.ok_or(TreeError::RootHasNoParent)
}

/// Copies of `path` (root first) for conversation `into`, with fresh ids
/// and parents rewired to the copies; a compaction node's `through` names
/// the copy of the message it covers up to.
pub fn fork_copy(path: &[Message], into: ConversationId) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(path.len());
    let mut copied: HashMap<MessageId, MessageId> = HashMap::new();
    for m in path {
        let mut copy = m.clone();
        copy.id = MessageId::new();
        copy.conversation_id = into;
        copy.parent_id = out.last().map(|p| p.id);
        for block in copy.content.iter_mut() {
            if let ContentBlock::Compaction { through, .. } = block
                && let Some(c) = copied.get(through)
            {
                *through = *c;
            }
        }
        copied.insert(m.id, copy.id);
        out.push(copy);
    }
    out
}

/// A whole conversation in memory.
#[derive(Debug, Clone)]
pub struct ConversationTree {
    conversation: Conversation,
    messages: HashMap<MessageId, Message>,
    children: HashMap<MessageId, Vec<MessageId>>,
}

impl ConversationTree {
    /// A conversation holding only its root.
    pub fn new(system_prompt: &str) -> Self {
        let id = ConversationId::new();
        let root = root_message(id, system_prompt);
        Self::from_root(
            Conversation {
                id,
                title: None,
                root_id: root.id,
                active_leaf: root.id,
                forked_from: None,
                created_at: root.created_at,
                revision: 0,
            },
            root,
        )
    }

    fn from_root(conversation: Conversation, root: Message) -> Self {
        let mut messages = HashMap::new();
        messages.insert(root.id, root);
        ConversationTree {
            conversation,
            messages,
            children: HashMap::new(),
        }
    }

    /// The conversation record.
    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    /// The root (system) message's id.
    pub fn root(&self) -> MessageId {
        self.conversation.root_id
    }

    /// Message `id`, if it is in this conversation.
    pub fn get(&self, id: MessageId) -> Result<&Message, TreeError> {
        self.messages.get(&id).ok_or(TreeError::UnknownMessage(id))
    }

    /// Adds `message` under `parent` and makes it the active leaf.
    pub fn append(
        &mut self,
        parent: MessageId,
        mut message: Message,
    ) -> Result<MessageId, TreeError> {
        self.get(parent)?;
        message.parent_id = Some(parent);
        message.conversation_id = self.conversation.id;
        let id = message.id;
        self.children.entry(parent).or_default().push(id);
        self.messages.insert(id, message);
        self.conversation.active_leaf = id;
        Ok(id)
    }

    /// The context the model sees: root first, `leaf` last.
    pub fn path_to(&self, leaf: MessageId) -> Result<Vec<&Message>, TreeError> {
        let mut path = Vec::new();
        let mut cursor = Some(leaf);
        while let Some(id) = cursor {
            let m = self.get(id)?;
            path.push(m);
            cursor = m.parent_id;
        }
        path.reverse();
        Ok(path)
    }

    /// Children in the order they were added.
    pub fn children(&self, id: MessageId) -> Result<Vec<&Message>, TreeError> {
        self.get(id)?;
        Ok(self
            .children
            .get(&id)
            .into_iter()
            .flatten()
            .filter_map(|c| self.messages.get(c))
            .collect())
    }

    /// The children of `id`'s parent, `id` among them, in order.
    pub fn siblings(&self, id: MessageId) -> Result<Vec<&Message>, TreeError> {
        match self.get(id)?.parent_id {
            Some(parent) => self.children(parent),
            None => Ok(vec![self.get(id)?]),
        }
    }

    /// Every leaf (a branch's last message), oldest first.
    pub fn leaves(&self) -> Vec<&Message> {
        let mut leaves: Vec<&Message> = self
            .messages
            .values()
            .filter(|m| self.children.get(&m.id).is_none_or(Vec::is_empty))
            .collect();
        leaves.sort_by_key(|m| m.id);
        leaves
    }

    /// The leaf the next turn continues from.
    pub fn active_leaf(&self) -> MessageId {
        self.conversation.active_leaf
    }

    /// Makes `id` the leaf the next turn continues from.
    pub fn set_active_leaf(&mut self, id: MessageId) -> Result<(), TreeError> {
        self.get(id)?;
        self.conversation.active_leaf = id;
        Ok(())
    }

    /// Edits user message `id`: a new sibling with `text`, made active; the
    /// original and everything under it are kept.
    pub fn edit(&mut self, id: MessageId, text: &str) -> Result<MessageId, TreeError> {
        let sibling = edited_sibling(self.get(id)?, text)?;
        let parent = sibling.parent_id.ok_or(TreeError::RootHasNoParent)?;
        self.append(parent, sibling)
    }

    /// A new conversation holding a copy of the path to `at`.
    pub fn fork(&self, at: MessageId) -> Result<ConversationTree, TreeError> {
        let path: Vec<Message> = self.path_to(at)?.into_iter().cloned().collect();
        let id = ConversationId::new();
        let mut copies = fork_copy(&path, id).into_iter();
        let root = copies.next().ok_or(TreeError::UnknownMessage(at))?;
        let mut tree = Self::from_root(
            Conversation {
                id,
                title: self.conversation.title.clone(),
                root_id: root.id,
                active_leaf: root.id,
                forked_from: Some(ForkOrigin {
                    conversation_id: self.conversation.id,
                    message_id: at,
                }),
                created_at: Utc::now(),
                revision: 0,
            },
            root,
        );
        let mut parent = tree.root();
        for m in copies {
            parent = tree.append(parent, m)?;
        }
        Ok(tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::new(
            ConversationId::new(),
            None,
            Role::User,
            vec![ContentBlock::Text { text: text.into() }],
        )
    }

    fn assistant(text: &str) -> Message {
        Message {
            role: Role::Assistant,
            ..user(text)
        }
    }

    #[test]
    fn edit_regenerate_fork_and_switch() {
        let mut t = ConversationTree::new("be brief");
        let u1 = t.append(t.root(), user("hi")).unwrap();
        let a1 = t.append(u1, assistant("hello")).unwrap();
        let texts = |t: &ConversationTree, leaf| -> Vec<String> {
            t.path_to(leaf).unwrap().iter().map(|m| m.text()).collect()
        };
        assert_eq!(texts(&t, a1), ["be brief", "hi", "hello"]);

        // Edit: a sibling, made active; the original branch stays.
        let u1b = t.edit(u1, "hey").unwrap();
        assert_eq!(t.active_leaf(), u1b);
        assert_eq!(t.siblings(u1).unwrap().len(), 2);
        assert_eq!(texts(&t, a1), ["be brief", "hi", "hello"]);

        // Regenerate: a second answer under the same parent.
        let parent = regeneration_parent(t.get(a1).unwrap()).unwrap();
        let a1b = t.append(parent, assistant("hello again")).unwrap();
        assert_eq!(
            t.siblings(a1)
                .unwrap()
                .iter()
                .map(|m| m.id)
                .collect::<Vec<_>>(),
            [a1, a1b]
        );
        assert_eq!(t.leaves().len(), 3);

        // Switch and fork.
        t.set_active_leaf(a1).unwrap();
        let f = t.fork(a1).unwrap();
        assert_eq!(texts(&f, f.active_leaf()), ["be brief", "hi", "hello"]);
        let origin = f.conversation().forked_from.unwrap();
        assert_eq!(
            (origin.conversation_id, origin.message_id),
            (t.conversation().id, a1)
        );
        assert!(
            f.path_to(f.active_leaf())
                .unwrap()
                .iter()
                .all(|m| m.conversation_id == f.conversation().id)
        );

        // Rules.
        assert!(matches!(
            t.edit(a1, "x"),
            Err(TreeError::NotAUserMessage { .. })
        ));
        assert!(matches!(
            regeneration_parent(t.get(u1).unwrap()),
            Err(TreeError::NotAnAssistantMessage { .. })
        ));
        let stranger = MessageId::new();
        assert_eq!(
            t.set_active_leaf(stranger),
            Err(TreeError::UnknownMessage(stranger))
        );
    }
}
