//! The last path of each conversation, kept between its turns, so that
//! the next turn going on from its leaf reads nothing of it again (a
//! model step sends the whole path; read from the store, every message is
//! decoded again, a cost that grows with the conversation).
//!
//! **Why it stays right.** A message's place never changes and its
//! ancestors are fixed, so the path to a message id is the same list for
//! ever, but for a stored message being changed (an update: a new system
//! prompt, a message marked interrupted). Each such change bumps the
//! conversation's `revision` in the store (a trigger, whoever writes:
//! this process, another process on the SQLite file, another instance on
//! PostgreSQL). A path is kept with the revision read before it was, and
//! given to a turn only when its leaf is the new message's parent and the
//! revision the turn's start read (with the conversation's leaf, a read
//! it makes anyway) is that one. Turns whose start reads no revision (a
//! message under a chosen parent, an edit, answers to a pause) read the
//! path from the store, as do those after a change.
//!
//! Messages are kept as the store returns them (see [`as_stored`]): a
//! kept path equals what `path_to` reads.
//!
//! **Bounded.** At most [`KEPT_BYTES`] (estimated) for all conversations
//! together, the one used longest ago dropped first, and no path over
//! [`MAX_PATH_BYTES`] (the store keeps long paths' lines itself): a
//! process holding 10,000 idle conversations holds at most that much of
//! them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};
use toolwire_core::{ContentBlock, ConversationId, Message, MessageId};

/// About how much memory the kept paths may take, all together.
pub(crate) const KEPT_BYTES: usize = 8 << 20;

/// A longer path is not kept (it would push out many short ones).
pub(crate) const MAX_PATH_BYTES: usize = KEPT_BYTES / 8;

/// A path and what it is valid for.
#[derive(Debug)]
struct Entry {
    path: Vec<Message>,
    /// The conversation's revision read before the path was.
    revision: u64,
    bytes: usize,
    /// When it was kept, on [`Paths::clock`].
    used: u64,
}

#[derive(Debug, Default)]
struct Paths {
    entries: HashMap<ConversationId, Entry>,
    /// The entries by `used`, oldest first.
    order: BTreeMap<u64, ConversationId>,
    bytes: usize,
    clock: u64,
}

impl Paths {
    fn remove(&mut self, conversation: ConversationId) -> Option<Entry> {
        let entry = self.entries.remove(&conversation)?;
        self.order.remove(&entry.used);
        self.bytes -= entry.bytes;
        Some(entry)
    }
}

/// The kept paths of the engine's conversations.
#[derive(Debug, Default)]
pub(crate) struct KeptPaths {
    inner: Mutex<Paths>,
}

impl KeptPaths {
    fn paths(&self) -> std::sync::MutexGuard<'_, Paths> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `conversation`'s kept path if it ends at `leaf` and was kept
    /// at `revision` (the turn that takes it gives it back, longer, when
    /// it ends). Whatever was kept is dropped either way: the turn writes
    /// the next one.
    pub(crate) fn take(
        &self,
        conversation: ConversationId,
        leaf: MessageId,
        revision: u64,
    ) -> Option<Vec<Message>> {
        let entry = self.paths().remove(conversation)?;
        let ends_at_leaf = entry.path.last().is_some_and(|m| m.id == leaf);
        (ends_at_leaf && entry.revision == revision).then_some(entry.path)
    }

    /// Keeps `path` (its messages as stored) as `conversation`'s, read
    /// when the conversation's revision was `revision` or later.
    pub(crate) fn keep(&self, conversation: ConversationId, revision: u64, path: Vec<Message>) {
        let bytes = path_bytes(&path);
        let mut paths = self.paths();
        paths.remove(conversation);
        if path.is_empty() || bytes > MAX_PATH_BYTES {
            return;
        }
        while paths.bytes + bytes > KEPT_BYTES {
            let Some((_, oldest)) = paths.order.pop_first() else {
                break;
            };
            paths.remove(oldest);
        }
        paths.clock += 1;
        let used = paths.clock;
        paths.order.insert(used, conversation);
        paths.bytes += bytes;
        paths.entries.insert(
            conversation,
            Entry {
                path,
                revision,
                bytes,
                used,
            },
        );
    }

    /// A copy of `conversation`'s kept path, if there is one.
    pub(crate) fn peek(&self, conversation: ConversationId) -> Option<Vec<Message>> {
        self.paths()
            .entries
            .get(&conversation)
            .map(|e| e.path.clone())
    }

    /// Drops `conversation`'s kept path (something changed it that its
    /// revision, read before, does not show).
    pub(crate) fn forget(&self, conversation: ConversationId) {
        self.paths().remove(conversation);
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.paths().bytes
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.paths().entries.len()
    }
}

/// `message` as the store returns it: times to the microsecond (both
/// databases keep no finer).
pub(crate) fn as_stored(message: &Message) -> Message {
    let mut stored = message.clone();
    stored.created_at = to_micros(message.created_at);
    stored
}

fn to_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// About how much memory `path` takes.
fn path_bytes(path: &[Message]) -> usize {
    path.iter().map(message_bytes).sum()
}

fn message_bytes(m: &Message) -> usize {
    std::mem::size_of::<Message>()
        + m.model.as_ref().map_or(0, String::capacity)
        + m.content
            .iter()
            .map(|block| {
                std::mem::size_of::<ContentBlock>()
                    + match block {
                        ContentBlock::Text { text } | ContentBlock::Reasoning { text } => {
                            text.capacity()
                        }
                        ContentBlock::ToolUse {
                            id,
                            name,
                            arguments,
                            ..
                        } => id.0.capacity() + name.capacity() + value_bytes(arguments),
                        ContentBlock::ToolResult {
                            tool_use_id,
                            content,
                            images,
                            ..
                        } => {
                            tool_use_id.0.capacity()
                                + content.capacity()
                                + images.len() * std::mem::size_of::<toolwire_core::BlobRef>()
                        }
                        ContentBlock::Compaction { summary, .. } => summary.capacity(),
                        ContentBlock::Notification { source, text, .. } => {
                            source.capacity() + text.capacity()
                        }
                        ContentBlock::Image(_) => 0,
                    }
            })
            .sum::<usize>()
}

/// About how much memory a JSON value takes.
fn value_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    std::mem::size_of::<Value>()
        + match value {
            Value::String(s) => s.capacity(),
            Value::Array(items) => items.iter().map(value_bytes).sum(),
            Value::Object(fields) => fields
                .iter()
                .map(|(k, v)| k.capacity() + 32 + value_bytes(v))
                .sum(),
            _ => 0,
        }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use toolwire_core::Role;

    fn path(conversation: ConversationId, len: usize, text: &str) -> Vec<Message> {
        let mut path: Vec<Message> = Vec::new();
        for _ in 0..len {
            let parent = path.last().map(|m| m.id);
            path.push(Message::new(
                conversation,
                parent,
                Role::User,
                vec![ContentBlock::Text { text: text.into() }],
            ));
        }
        path
    }

    #[test]
    fn a_path_is_given_for_its_leaf_and_revision_only() {
        let kept = KeptPaths::default();
        let c = ConversationId::new();
        let p = path(c, 3, "hi");
        let leaf = p[2].id;
        kept.keep(c, 4, p.clone());
        assert_eq!(kept.take(c, leaf, 4), Some(p.clone()));
        // Taken: the turn gives it back.
        assert_eq!(kept.take(c, leaf, 4), None);

        kept.keep(c, 4, p.clone());
        assert_eq!(kept.take(c, leaf, 5), None, "a message was changed since");
        assert_eq!(kept.take(c, leaf, 4), None, "dropped by the failed take");

        kept.keep(c, 4, p.clone());
        assert_eq!(kept.take(c, p[1].id, 4), None, "another leaf");
        kept.keep(c, 4, p.clone());
        kept.forget(c);
        assert_eq!(kept.take(c, leaf, 4), None);
        assert_eq!((kept.len(), kept.bytes()), (0, 0));
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_goes_first() {
        let kept = KeptPaths::default();
        let text = "x".repeat(4096);
        let conversations: Vec<ConversationId> = (0..4000).map(|_| ConversationId::new()).collect();
        let mut leaves = Vec::new();
        for c in &conversations {
            let p = path(*c, 2, &text);
            leaves.push(p[1].id);
            kept.keep(*c, 0, p);
            assert!(kept.bytes() <= KEPT_BYTES);
        }
        assert!(kept.len() < conversations.len());
        let last = conversations.len() - 1;
        assert!(kept.take(conversations[last], leaves[last], 0).is_some());
        assert!(kept.take(conversations[0], leaves[0], 0).is_none());

        // A path over the bound of one is not kept.
        let c = ConversationId::new();
        let long = path(c, MAX_PATH_BYTES / 4096 + 1, &text);
        let leaf = long.last().unwrap().id;
        kept.keep(c, 0, long);
        assert!(kept.take(c, leaf, 0).is_none());
    }

    #[test]
    fn stored_times_are_whole_microseconds() {
        let m = Message::new(ConversationId::new(), None, Role::System, Vec::new());
        let stored = as_stored(&m);
        assert_eq!(stored.created_at.timestamp_subsec_nanos() % 1000, 0);
        assert_eq!(
            stored.created_at.timestamp_micros(),
            m.created_at.timestamp_micros()
        );
    }
}
