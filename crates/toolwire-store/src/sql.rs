//! The SQL both backends run, and the checks around it.
//!
//! SQLite and PostgreSQL agree on nearly all of it: `$N` placeholders
//! (the SQLite backend binds them by name, as SQLite numbers named
//! parameters in the order they first appear), `CAST(json AS TEXT)` to read
//! JSON, `RETURNING`, `ON CONFLICT`, recursive CTEs, and columns whose
//! values decode the same on both ([`crate::rows`]). What differs lives
//! with its backend: SQLite's path reader and its writer's transactions
//! (`sqlite.rs`), PostgreSQL's recursive path query (`postgres.rs`).

use toolwire_core::tree::{fork_copy, root_message};
use toolwire_core::{Conversation, ConversationId, ForkOrigin, Message, MessageId};
use uuid::Uuid;

use crate::rows::{Ts, conversation_columns, instance_columns, message_columns, run_columns};
use crate::{Result, StoreError};

pub(crate) const INSERT_CONVERSATION: &str = "INSERT INTO conversations (id, title, root_id, \
    active_leaf, forked_from_conversation, forked_from_message, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

pub(crate) const SELECT_CONVERSATION: &str = concat!(
    "SELECT ",
    conversation_columns!(),
    " FROM conversations c WHERE c.id = $1"
);

/// The message goes on its parent's line when it is the parent's first
/// child, and starts a line of its own (named by its id) otherwise; see
/// `line` in the schema.
pub(crate) const INSERT_MESSAGE: &str = "INSERT INTO messages (id, conversation_id, parent_id, \
    line, role, content, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, \
    cost, model, duration_ms, status, created_at) \
    VALUES ($1, $2, $3, \
        COALESCE((SELECT p.line FROM messages p WHERE p.id = $3 \
                  AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = $3)), $1), \
        $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

pub(crate) const MESSAGE_CONVERSATION: &str = "SELECT conversation_id FROM messages WHERE id = $1";

pub(crate) const MESSAGE_PLACE: &str =
    "SELECT conversation_id, parent_id, role FROM messages WHERE id = $1";

pub(crate) const UPDATE_MESSAGE: &str = "UPDATE messages SET content = $2, prompt_tokens = $3, \
    completion_tokens = $4, cached_tokens = $5, cache_write_tokens = $6, cost = $7, model = $8, \
    duration_ms = $9, status = $10 WHERE id = $1";

pub(crate) const SET_ACTIVE_LEAF: &str = "UPDATE conversations SET active_leaf = $2 WHERE id = $1";

/// Takes `$2` event numbers of conversation `$1`; returns the last one.
pub(crate) const TAKE_EVENT_SEQS: &str = "UPDATE conversations \
    SET last_event_seq = last_event_seq + $2 WHERE id = $1 RETURNING last_event_seq";

/// [`TAKE_EVENT_SEQS`] in two statements, for SQLite: there an
/// `UPDATE … RETURNING` gathers its rows in a temporary b-tree first,
/// which costs more than reading the one row again.
pub(crate) const BUMP_EVENT_SEQS: &str =
    "UPDATE conversations SET last_event_seq = last_event_seq + $2 WHERE id = $1";

pub(crate) const LAST_EVENT_SEQ: &str = "SELECT last_event_seq FROM conversations WHERE id = $1";

pub(crate) const INSERT_EVENT: &str = "INSERT INTO events \
    (conversation_id, seq, type, payload, created_at) VALUES ($1, $2, $3, $4, $5)";

pub(crate) const START_RUN: &str = "INSERT INTO runs (id, conversation_id, started_at, owner) \
    SELECT $1, id, $3, $4 FROM conversations WHERE id = $2";

pub(crate) const FINISH_RUN: &str =
    "UPDATE runs SET stop_reason = $2, error = $3, finished_at = $4 WHERE id = $1";

/// The run's stop reason, only if it has none: of two instances that both
/// find the run orphaned, one interrupts it.
pub(crate) const INTERRUPT_RUN: &str = "UPDATE runs SET stop_reason = $2, finished_at = $3 \
    WHERE id = $1 AND stop_reason IS NULL";

/// The columns of [`crate::rows::UnfinishedRow`] and the join that
/// gives them, up to the `WHERE`.
macro_rules! unfinished_runs {
    () => {
        "SELECT r.id, r.conversation_id, r.stop_reason, \
         r.error, r.started_at, r.finished_at, r.owner, i.id AS instance_id, \
         i.host AS instance_host, i.pid AS instance_pid, i.started_at AS instance_started_at, \
         i.heartbeat_at AS instance_heartbeat_at \
         FROM runs r LEFT JOIN instances i ON i.id = r.owner "
    };
}

/// Runs going on, oldest first, with their owners' columns (`NULL` when
/// unknown); see [`crate::rows::UnfinishedRow`].
pub(crate) const UNFINISHED_RUNS: &str = concat!(
    unfinished_runs!(),
    "WHERE r.stop_reason IS NULL ORDER BY r.started_at, r.id"
);

/// [`UNFINISHED_RUNS`] of conversation `$1` alone, through the index of
/// unfinished runs by conversation (a turn's start reads them: its cost
/// must not grow with the runs of other conversations, nor with this
/// one's finished runs).
pub(crate) const CONVERSATION_UNFINISHED_RUNS: &str = concat!(
    unfinished_runs!(),
    "WHERE r.conversation_id = $1 AND r.stop_reason IS NULL ORDER BY r.started_at, r.id"
);

pub(crate) const RUN_EXISTS: &str = "SELECT 1 FROM runs WHERE id = $1";

/// Inserts instance `$1` with its heartbeat at `$4`, or renews the
/// heartbeat of a known one (an instance forgotten while it was silent
/// registers again under the same id).
pub(crate) const REGISTER_INSTANCE: &str = concat!(
    "INSERT INTO instances (id, host, pid, started_at, heartbeat_at) \
     VALUES ($1, $2, $3, $4, $4) \
     ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at \
     RETURNING ",
    instance_columns!()
);

pub(crate) const SELECT_INSTANCE: &str = concat!(
    "SELECT ",
    instance_columns!(),
    " FROM instances WHERE id = $1"
);

pub(crate) const HEARTBEAT_INSTANCE: &str = "UPDATE instances SET heartbeat_at = $2 WHERE id = $1";

/// An instance that still owns an unfinished run is kept: the run's owner
/// must stay known until someone decides it is gone.
pub(crate) const FORGET_INSTANCES: &str = "DELETE FROM instances WHERE heartbeat_at < $1 \
    AND NOT EXISTS (SELECT 1 FROM runs r \
                    WHERE r.owner = instances.id AND r.stop_reason IS NULL)";

pub(crate) const PUT_DOCUMENT: &str = "INSERT INTO documents \
    (kind, id, body, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) \
    ON CONFLICT (kind, id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at";

/// A blob is written once: the same bytes again change nothing.
pub(crate) const PUT_BLOB: &str = "INSERT INTO blobs (sha256, media_type, bytes, created_at) \
    VALUES ($1, $2, $3, $4) ON CONFLICT (sha256) DO NOTHING";

pub(crate) const SELECT_BLOB: &str = "SELECT media_type, bytes FROM blobs WHERE sha256 = $1";

pub(crate) const DELETE_DOCUMENT: &str = "DELETE FROM documents WHERE kind = $1 AND id = $2";

/// A new conversation and its root, for
/// [`Store::create_conversation`](crate::Store::create_conversation).
pub(crate) fn new_conversation(
    system_prompt: &str,
    title: Option<&str>,
) -> (Conversation, Message) {
    let id = ConversationId::new();
    let root = root_message(id, system_prompt);
    let conversation = Conversation {
        id,
        title: title.map(str::to_owned),
        root_id: root.id,
        active_leaf: root.id,
        forked_from: None,
        created_at: Ts::from(root.created_at).0,
        revision: 0,
    };
    (conversation, root)
}

/// The new message's parent is stored (in `parent_conversation`) and in the
/// message's conversation.
pub(crate) fn check_parent(
    message: &Message,
    parent: MessageId,
    parent_conversation: Option<Uuid>,
) -> Result<()> {
    let bad_parent = |reason| StoreError::BadParent {
        message: message.id,
        parent,
        reason,
    };
    match parent_conversation {
        None => Err(bad_parent("the parent does not exist")),
        Some(c) if c != message.conversation_id.0 => {
            Err(bad_parent("the parent is in another conversation"))
        }
        Some(_) => Ok(()),
    }
}

/// An update keeps the stored message's conversation, parent and role.
pub(crate) fn check_update(
    message: &Message,
    conversation: Uuid,
    parent: Option<Uuid>,
    role: &str,
) -> Result<()> {
    if conversation != message.conversation_id.0
        || parent != message.parent_id.map(|p| p.0)
        || role != message.role.as_str()
    {
        return Err(StoreError::BadParent {
            message: message.id,
            parent: message
                .parent_id
                .or(parent.map(MessageId))
                .unwrap_or(message.id),
            reason: "an update cannot change a message's conversation, parent or role",
        });
    }
    Ok(())
}

/// The fork of `source` at `at`, whose path is `path`: the new conversation
/// and the copies of the path, root first.
pub(crate) fn forked(
    source: Conversation,
    at: MessageId,
    path: &[Message],
) -> Result<(Conversation, Vec<Message>)> {
    let id = ConversationId::new();
    let copies = fork_copy(path, id);
    let (Some(root), Some(leaf)) = (copies.first(), copies.last()) else {
        return Err(StoreError::MessageNotFound(at));
    };
    let conversation = Conversation {
        id,
        title: source.title,
        root_id: root.id,
        active_leaf: leaf.id,
        forked_from: Some(ForkOrigin {
            conversation_id: source.id,
            message_id: at,
        }),
        created_at: Ts::now().0,
        revision: 0,
    };
    Ok((conversation, copies))
}

/// The lines the path to message `$1` crosses, as `seg (line, upto)`:
/// the leaf's line up to the leaf, then the line that one forked from up
/// to the fork point, and so on up to the root's line.
macro_rules! path_lines {
    () => {
        "WITH RECURSIVE seg (line, upto) AS ( \
             SELECT line, seq FROM messages WHERE id = $1 \
             UNION ALL \
             SELECT p.line, p.seq FROM seg \
             JOIN messages f ON f.id = seg.line \
             JOIN messages p ON p.id = f.parent_id)"
    };
}
pub(crate) use path_lines;

/// The lines of [`path_lines`], leaf's first.
pub(crate) const PATH_LINES: &str = concat!(path_lines!(), " SELECT line, upto FROM seg");

pub(crate) const SELECT_MESSAGE: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.id = $1"
);

/// The message itself comes along (first, being older than its children)
/// so that one query also tells it exists.
pub(crate) const CHILDREN_AND_SELF: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.id = $1 OR m.parent_id = $1 ORDER BY m.seq"
);

pub(crate) const SIBLINGS: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.id = $1 \
      OR m.parent_id = (SELECT parent_id FROM messages WHERE id = $1) \
      ORDER BY m.seq"
);

pub(crate) const LEAVES: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.conversation_id = $1 \
      AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = m.id) \
      ORDER BY m.seq"
);

pub(crate) const CONVERSATION_MESSAGES: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.conversation_id = $1 ORDER BY m.seq"
);

/// Every conversation, newest first, with its message count and total
/// cost after the conversation's columns.
pub(crate) const LIST_CONVERSATIONS: &str = concat!(
    "SELECT ",
    conversation_columns!(),
    ", COUNT(m.id) AS message_count, \
         COALESCE(SUM(m.cost), 0.0) AS total_cost \
     FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id \
     GROUP BY c.id ORDER BY c.created_at DESC, c.id DESC"
);

/// No row when the conversation does not exist.
pub(crate) const TOTAL_COST: &str = "SELECT (SELECT COALESCE(SUM(cost), 0.0) FROM messages \
         WHERE conversation_id = $1) \
     FROM conversations WHERE id = $1";

pub(crate) const SELECT_RUN: &str = concat!("SELECT ", run_columns!(), " FROM runs WHERE id = $1");

pub(crate) const EVENTS_SINCE: &str = "SELECT seq, CAST(payload AS TEXT) AS payload FROM events \
     WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3";

pub(crate) const SELECT_DOCUMENT: &str = "SELECT kind, id, CAST(body AS TEXT) AS body, \
     created_at, updated_at FROM documents WHERE kind = $1 AND id = $2";

pub(crate) const SELECT_DOCUMENTS: &str = "SELECT kind, id, CAST(body AS TEXT) AS body, \
     created_at, updated_at FROM documents WHERE kind = $1 ORDER BY created_at, id";

/// Of `found` (read by [`CHILDREN_AND_SELF`]), the children of `id`; not
/// found when `id` is not among them.
pub(crate) fn children_only(mut found: Vec<Message>, id: MessageId) -> Result<Vec<Message>> {
    let at = found
        .iter()
        .position(|m| m.id == id)
        .ok_or(StoreError::MessageNotFound(id))?;
    found.remove(at);
    Ok(found)
}

/// `found`, or `missing` when it is empty: a conversation holds at least
/// its root, a message is among its own siblings.
pub(crate) fn some(found: Vec<Message>, missing: StoreError) -> Result<Vec<Message>> {
    if found.is_empty() {
        return Err(missing);
    }
    Ok(found)
}
