//! The [`Store`](crate::Store) implementation both backends share.
//!
//! SQLite and PostgreSQL run the very same SQL here: `$N` placeholders
//! (sqlx binds SQLite's `$1` as parameter 1), `CAST(json AS TEXT)` to read JSON,
//! `RETURNING`, recursive CTEs, and row types ([`crate::rows`]) whose
//! column types decode on both. Only the connection type and the statement
//! that opens a write transaction differ (SQLite takes its write lock up
//! front with `BEGIN IMMEDIATE`, so that a transaction that reads before it
//! writes never fails to upgrade its lock). sqlx's generic bounds over a
//! `Database` are heavy and fragile with `async_trait`, so this is a macro
//! instantiated once per backend with its concrete types.
//!
//! The write statements, and the checks around them, are module items
//! rather than macro text, because the SQLite backend's own writer
//! (`rusqlite`, in `sqlite.rs`) runs them too.

use toolwire_core::tree::{fork_copy, root_message};
use toolwire_core::{Conversation, ConversationId, ForkOrigin, Message, MessageId};
use uuid::Uuid;

use crate::rows::{Ts, conversation_columns, instance_columns};
use crate::{Result, StoreError};

// The write statements, shared with the SQLite backend's own writer (which
// binds `$N` by name, as SQLite numbers named parameters in the order they
// first appear).

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
    line, role, content, prompt_tokens, completion_tokens, cached_tokens, cost, model, \
    duration_ms, status, created_at) \
    VALUES ($1, $2, $3, \
        COALESCE((SELECT p.line FROM messages p WHERE p.id = $3 \
                  AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = $3)), $1), \
        $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

pub(crate) const MESSAGE_CONVERSATION: &str = "SELECT conversation_id FROM messages WHERE id = $1";

pub(crate) const MESSAGE_PLACE: &str =
    "SELECT conversation_id, parent_id, role FROM messages WHERE id = $1";

pub(crate) const UPDATE_MESSAGE: &str = "UPDATE messages SET content = $2, prompt_tokens = $3, \
    completion_tokens = $4, cached_tokens = $5, cost = $6, model = $7, \
    duration_ms = $8, status = $9 WHERE id = $1";

pub(crate) const SET_ACTIVE_LEAF: &str = "UPDATE conversations SET active_leaf = $2 WHERE id = $1";

/// Takes `$2` event numbers of conversation `$1`; returns the last one.
pub(crate) const TAKE_EVENT_SEQS: &str = "UPDATE conversations \
    SET last_event_seq = last_event_seq + $2 WHERE id = $1 RETURNING last_event_seq";

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

/// Runs going on, oldest first, with their owners' columns (`NULL` when
/// unknown); see [`crate::rows::UnfinishedRow`].
pub(crate) const UNFINISHED_RUNS: &str = "SELECT r.id, r.conversation_id, r.stop_reason, \
    r.error, r.started_at, r.finished_at, r.owner, i.id AS instance_id, \
    i.host AS instance_host, i.pid AS instance_pid, i.started_at AS instance_started_at, \
    i.heartbeat_at AS instance_heartbeat_at \
    FROM runs r LEFT JOIN instances i ON i.id = r.owner \
    WHERE r.stop_reason IS NULL ORDER BY r.started_at, r.id";

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
    };
    Ok((conversation, copies))
}

/// Implements [`Store`](crate::Store) for `$store`, a struct with a
/// `pool: sqlx::Pool<$db>` field.
///
/// With `own_writes = field`, where `field` is an `Option` of something
/// with async methods named and typed as the write methods of the trait
/// (`create_conversation`, `append_with_events`, `update`,
/// `set_active_leaf`, `fork`, `register_instance`, `heartbeat_instance`,
/// `forget_instances`, `start_run`, `finish_run`, `interrupt_run`,
/// `append_events`, `write_documents`, `delete_document`), those go there
/// when it is `Some`, and through sqlx otherwise.
macro_rules! impl_store {
    ($store:ident, $db:ty, begin_write = $begin:literal $(, own_writes = $own:ident)?) => {
        use $crate::rows::{
            self, conversation_columns, message_columns, run_columns, ConversationRow, EventRow,
            DocumentRow, InstanceRow, MessageRow, MessageValues, RunRow, SummaryRow, Ts, UnfinishedRow,
        };
        use $crate::sql::{
            check_parent, check_update, forked, new_conversation, DELETE_DOCUMENT, FINISH_RUN,
            INSERT_CONVERSATION, PUT_DOCUMENT,
            INSERT_EVENT, INSERT_MESSAGE, INTERRUPT_RUN, MESSAGE_CONVERSATION, MESSAGE_PLACE,
            SELECT_CONVERSATION, SET_ACTIVE_LEAF, START_RUN, TAKE_EVENT_SEQS, UPDATE_MESSAGE,
            FORGET_INSTANCES, HEARTBEAT_INSTANCE, REGISTER_INSTANCE, RUN_EXISTS, SELECT_INSTANCE,
            UNFINISHED_RUNS,
        };
        use $crate::{
            ConversationSummary, Document, InstanceRecord, Result, RunRecord, Store, StoreError,
            StoredEvent, UnfinishedRun,
        };
        use async_trait::async_trait;
        use sqlx::Row as _;
        use toolwire_core::{
            AgentEvent, Conversation, ConversationId, InstanceId, Message, MessageId, RunId,
            StopReason, TreeError,
        };

        type Conn = <$db as sqlx::Database>::Connection;

        /// The path is the part up to the leaf of the leaf's line, then the
        /// part up to the line's fork point of the line it forked from, and
        /// so on up to the root's line: `seg` lists those parts, one per
        /// line crossed, and each is one range of the `(line, seq)` index.
        const PATH_TO: &str = concat!(
            "WITH RECURSIVE seg (line, upto) AS ( \
                 SELECT line, seq FROM messages WHERE id = $1 \
                 UNION ALL \
                 SELECT p.line, p.seq FROM seg \
                 JOIN messages f ON f.id = seg.line \
                 JOIN messages p ON p.id = f.parent_id) \
             SELECT ",
            message_columns!(),
            " FROM seg JOIN messages m ON m.line = seg.line AND m.seq <= seg.upto \
              ORDER BY m.seq"
        );

        impl $store {
            async fn write(&self) -> Result<sqlx::Transaction<'static, $db>> {
                Ok(self.pool.begin_with($begin).await?)
            }

            async fn insert_conversation(conn: &mut Conn, c: &Conversation) -> Result<()> {
                sqlx::query(INSERT_CONVERSATION)
                    .bind(c.id.0)
                    .bind(c.title.as_deref())
                    .bind(c.root_id.0)
                    .bind(c.active_leaf.0)
                    .bind(c.forked_from.map(|f| f.conversation_id.0))
                    .bind(c.forked_from.map(|f| f.message_id.0))
                    .bind(Ts::from(c.created_at))
                    .execute(conn)
                    .await?;
                Ok(())
            }

            /// Appends `events` to the conversation's log. The counter's row
            /// stays locked until commit, so concurrent appends to one
            /// conversation take 1, 2, 3 … in turn, without gaps.
            async fn insert_events(
                conn: &mut Conn,
                conversation: ConversationId,
                events: &[AgentEvent],
            ) -> Result<Vec<u64>> {
                if events.is_empty() {
                    return Ok(Vec::new());
                }
                let corrupt = |seq: i64| {
                    StoreError::Corrupt(format!("conversation {conversation}: event seq {seq}"))
                };
                let count = i64::try_from(events.len()).map_err(|_| corrupt(-1))?;
                let last: i64 = sqlx::query_scalar(TAKE_EVENT_SEQS)
                    .bind(conversation.0)
                    .bind(count)
                    .fetch_optional(&mut *conn)
                    .await?
                    .ok_or(StoreError::ConversationNotFound(conversation))?;
                let now = Ts::now();
                let mut seqs = Vec::with_capacity(events.len());
                for (seq, event) in (last - count + 1..).zip(events) {
                    let (kind, payload) = rows::event_json(event)?;
                    sqlx::query(INSERT_EVENT)
                        .bind(conversation.0)
                        .bind(seq)
                        .bind(kind)
                        .bind(payload)
                        .bind(now)
                        .execute(&mut *conn)
                        .await?;
                    seqs.push(u64::try_from(seq).map_err(|_| corrupt(seq))?);
                }
                Ok(seqs)
            }

            async fn insert_message(conn: &mut Conn, m: &Message) -> Result<()> {
                let v = MessageValues::from(m);
                let inserted = sqlx::query(INSERT_MESSAGE)
                    .bind(v.id)
                    .bind(v.conversation_id)
                    .bind(v.parent_id)
                    .bind(v.role)
                    .bind(v.content)
                    .bind(v.prompt_tokens)
                    .bind(v.completion_tokens)
                    .bind(v.cached_tokens)
                    .bind(v.cost)
                    .bind(v.model)
                    .bind(v.duration_ms)
                    .bind(v.status)
                    .bind(v.created_at)
                    .execute(conn)
                    .await;
                match inserted {
                    Err(e) if rows::is_unique_violation(&e) => {
                        Err(StoreError::DuplicateMessage(m.id))
                    }
                    other => other.map(|_| ()).map_err(Into::into),
                }
            }

            /// The path to `leaf` through sqlx (the backend's `path_to` may
            /// read it another way).
            async fn path(conn: &mut Conn, leaf: MessageId) -> Result<Vec<Message>> {
                let path = sqlx::query_as::<_, MessageRow>(PATH_TO)
                    .bind(leaf.0)
                    .fetch_all(conn)
                    .await?;
                if path.is_empty() {
                    return Err(StoreError::MessageNotFound(leaf));
                }
                rows::messages(path)
            }

            async fn get_conversation(conn: &mut Conn, id: ConversationId) -> Result<Conversation> {
                sqlx::query_as::<_, ConversationRow>(SELECT_CONVERSATION)
                    .bind(id.0)
                    .fetch_optional(conn)
                    .await?
                    .ok_or(StoreError::ConversationNotFound(id))?
                    .try_into()
            }
        }

        #[async_trait]
        impl Store for $store {
            async fn create_conversation(
                &self,
                system_prompt: &str,
                title: Option<&str>,
            ) -> Result<Conversation> {
                $(if let Some(own) = &self.$own {
                    return own.create_conversation(system_prompt, title).await;
                })?
                let (conversation, root) = new_conversation(system_prompt, title);
                let mut tx = self.write().await?;
                Self::insert_conversation(&mut tx, &conversation).await?;
                Self::insert_message(&mut tx, &root).await?;
                tx.commit().await?;
                Ok(conversation)
            }

            async fn conversation(&self, id: ConversationId) -> Result<Conversation> {
                let mut conn = self.pool.acquire().await?;
                Self::get_conversation(&mut conn, id).await
            }

            async fn list_conversations(&self) -> Result<Vec<ConversationSummary>> {
                sqlx::query_as::<_, SummaryRow>(concat!(
                    "SELECT ",
                    conversation_columns!(),
                    ", COUNT(m.id) AS message_count, \
                         COALESCE(SUM(m.cost), 0.0) AS total_cost \
                     FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id \
                     GROUP BY c.id ORDER BY c.created_at DESC, c.id DESC"
                ))
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(ConversationSummary::try_from)
                .collect()
            }

            async fn append_with_events(
                &self,
                message: &Message,
                events: &[AgentEvent],
            ) -> Result<Vec<u64>> {
                $(if let Some(own) = &self.$own {
                    return own.append_with_events(message, events).await;
                })?
                let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
                let mut tx = self.write().await?;
                let parent_conversation: Option<uuid::Uuid> =
                    sqlx::query_scalar(MESSAGE_CONVERSATION)
                        .bind(parent.0)
                        .fetch_optional(&mut *tx)
                        .await?;
                check_parent(message, parent, parent_conversation)?;
                // The conversation's row first: on PostgreSQL its lock
                // serialises appends to one conversation, so that two
                // children of one parent never both take its line.
                sqlx::query(SET_ACTIVE_LEAF)
                    .bind(message.conversation_id.0)
                    .bind(message.id.0)
                    .execute(&mut *tx)
                    .await?;
                Self::insert_message(&mut tx, message).await?;
                let seqs = Self::insert_events(&mut tx, message.conversation_id, events).await?;
                tx.commit().await?;
                Ok(seqs)
            }

            async fn update(&self, message: &Message) -> Result<()> {
                $(if let Some(own) = &self.$own {
                    return own.update(message).await;
                })?
                let mut tx = self.write().await?;
                let stored = sqlx::query(MESSAGE_PLACE)
                    .bind(message.id.0)
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or(StoreError::MessageNotFound(message.id))?;
                let conversation: uuid::Uuid = stored.try_get(0)?;
                let parent: Option<uuid::Uuid> = stored.try_get(1)?;
                let role: String = stored.try_get(2)?;
                check_update(message, conversation, parent, &role)?;
                let v = MessageValues::from(message);
                sqlx::query(UPDATE_MESSAGE)
                    .bind(v.id)
                    .bind(v.content)
                    .bind(v.prompt_tokens)
                    .bind(v.completion_tokens)
                    .bind(v.cached_tokens)
                    .bind(v.cost)
                    .bind(v.model)
                    .bind(v.duration_ms)
                    .bind(v.status)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn message(&self, id: MessageId) -> Result<Message> {
                sqlx::query_as::<_, MessageRow>(concat!(
                    "SELECT ",
                    message_columns!(),
                    " FROM messages m WHERE m.id = $1"
                ))
                .bind(id.0)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::MessageNotFound(id))?
                .try_into()
            }

            async fn path_to(&self, leaf: MessageId) -> Result<Vec<Message>> {
                self.read_path(leaf).await
            }

            async fn children(&self, id: MessageId) -> Result<Vec<Message>> {
                // The message itself comes along (first, being older than
                // its children) so that one query also tells it exists.
                let mut found = rows::messages(
                    sqlx::query_as::<_, MessageRow>(concat!(
                        "SELECT ",
                        message_columns!(),
                        " FROM messages m WHERE m.id = $1 OR m.parent_id = $1 ORDER BY m.seq"
                    ))
                    .bind(id.0)
                    .fetch_all(&self.pool)
                    .await?,
                )?;
                match found.iter().position(|m| m.id == id) {
                    Some(at) => {
                        found.remove(at);
                        Ok(found)
                    }
                    None => Err(StoreError::MessageNotFound(id)),
                }
            }

            async fn siblings(&self, id: MessageId) -> Result<Vec<Message>> {
                let found = rows::messages(
                    sqlx::query_as::<_, MessageRow>(concat!(
                        "SELECT ",
                        message_columns!(),
                        " FROM messages m WHERE m.id = $1 \
                          OR m.parent_id = (SELECT parent_id FROM messages WHERE id = $1) \
                          ORDER BY m.seq"
                    ))
                    .bind(id.0)
                    .fetch_all(&self.pool)
                    .await?,
                )?;
                if found.is_empty() {
                    return Err(StoreError::MessageNotFound(id));
                }
                Ok(found)
            }

            async fn leaves(&self, conversation: ConversationId) -> Result<Vec<Message>> {
                let found = rows::messages(
                    sqlx::query_as::<_, MessageRow>(concat!(
                        "SELECT ",
                        message_columns!(),
                        " FROM messages m WHERE m.conversation_id = $1 \
                          AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = m.id) \
                          ORDER BY m.seq"
                    ))
                    .bind(conversation.0)
                    .fetch_all(&self.pool)
                    .await?,
                )?;
                // Every conversation has at least its root.
                if found.is_empty() {
                    return Err(StoreError::ConversationNotFound(conversation));
                }
                Ok(found)
            }

            async fn set_active_leaf(
                &self,
                conversation: ConversationId,
                leaf: MessageId,
            ) -> Result<()> {
                $(if let Some(own) = &self.$own {
                    return own.set_active_leaf(conversation, leaf).await;
                })?
                let mut tx = self.write().await?;
                let owner: Option<uuid::Uuid> =
                    sqlx::query_scalar(MESSAGE_CONVERSATION)
                        .bind(leaf.0)
                        .fetch_optional(&mut *tx)
                        .await?;
                match owner {
                    None => Err(StoreError::MessageNotFound(leaf)),
                    Some(c) if c == conversation.0 => {
                        sqlx::query(SET_ACTIVE_LEAF)
                            .bind(conversation.0)
                            .bind(leaf.0)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok(())
                    }
                    Some(_) => {
                        Self::get_conversation(&mut tx, conversation).await?;
                        Err(TreeError::UnknownMessage(leaf).into())
                    }
                }
            }

            async fn fork(&self, at: MessageId) -> Result<Conversation> {
                $(if let Some(own) = &self.$own {
                    return own.fork(at).await;
                })?
                let mut tx = self.write().await?;
                let path = Self::path(&mut tx, at).await?;
                let source = path
                    .first()
                    .map(|root| root.conversation_id)
                    .ok_or(StoreError::MessageNotFound(at))?;
                let source = Self::get_conversation(&mut tx, source).await?;
                let (conversation, copies) = forked(source, at, &path)?;
                Self::insert_conversation(&mut tx, &conversation).await?;
                for copy in &copies {
                    Self::insert_message(&mut tx, copy).await?;
                }
                tx.commit().await?;
                Ok(conversation)
            }

            async fn total_cost(&self, conversation: ConversationId) -> Result<f64> {
                sqlx::query_scalar(
                    "SELECT (SELECT COALESCE(SUM(cost), 0.0) FROM messages \
                             WHERE conversation_id = $1) \
                     FROM conversations WHERE id = $1",
                )
                .bind(conversation.0)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::ConversationNotFound(conversation))
            }

            async fn register_instance(
                &self,
                id: InstanceId,
                host: &str,
                pid: u32,
            ) -> Result<InstanceRecord> {
                $(if let Some(own) = &self.$own {
                    return own.register_instance(id, host, pid).await;
                })?
                sqlx::query_as::<_, InstanceRow>(REGISTER_INSTANCE)
                    .bind(id.0)
                    .bind(host)
                    .bind(i64::from(pid))
                    .bind(Ts::now())
                    .fetch_one(&self.pool)
                    .await?
                    .try_into()
            }

            async fn instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>> {
                sqlx::query_as::<_, InstanceRow>(SELECT_INSTANCE)
                    .bind(id.0)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(InstanceRecord::try_from)
                    .transpose()
            }

            async fn heartbeat_instance(&self, id: InstanceId) -> Result<()> {
                $(if let Some(own) = &self.$own {
                    return own.heartbeat_instance(id).await;
                })?
                let updated = sqlx::query(HEARTBEAT_INSTANCE)
                    .bind(id.0)
                    .bind(Ts::now())
                    .execute(&self.pool)
                    .await?;
                if updated.rows_affected() == 0 {
                    return Err(StoreError::InstanceNotFound(id));
                }
                Ok(())
            }

            async fn forget_instances(
                &self,
                silent_since: chrono::DateTime<chrono::Utc>,
            ) -> Result<u64> {
                $(if let Some(own) = &self.$own {
                    return own.forget_instances(silent_since).await;
                })?
                Ok(sqlx::query(FORGET_INSTANCES)
                    .bind(Ts::from(silent_since))
                    .execute(&self.pool)
                    .await?
                    .rows_affected())
            }

            async fn start_run(
                &self,
                id: RunId,
                conversation: ConversationId,
                owner: InstanceId,
            ) -> Result<()> {
                $(if let Some(own) = &self.$own {
                    return own.start_run(id, conversation, owner).await;
                })?
                let inserted = sqlx::query(START_RUN)
                    .bind(id.0)
                    .bind(conversation.0)
                    .bind(Ts::now())
                    .bind(owner.0)
                    .execute(&self.pool)
                    .await?;
                if inserted.rows_affected() == 0 {
                    return Err(StoreError::ConversationNotFound(conversation));
                }
                Ok(())
            }

            async fn finish_run(
                &self,
                id: RunId,
                reason: StopReason,
                error: Option<&str>,
            ) -> Result<()> {
                $(if let Some(own) = &self.$own {
                    return own.finish_run(id, reason, error).await;
                })?
                let updated = sqlx::query(FINISH_RUN)
                    .bind(id.0)
                    .bind(reason.as_str())
                    .bind(error)
                    .bind(Ts::now())
                    .execute(&self.pool)
                    .await?;
                if updated.rows_affected() == 0 {
                    return Err(StoreError::RunNotFound(id));
                }
                Ok(())
            }

            async fn run(&self, id: RunId) -> Result<RunRecord> {
                sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE id = $1"
                ))
                .bind(id.0)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::RunNotFound(id))?
                .try_into()
            }

            async fn unfinished_runs(&self) -> Result<Vec<UnfinishedRun>> {
                sqlx::query_as::<_, UnfinishedRow>(UNFINISHED_RUNS)
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(UnfinishedRun::try_from)
                    .collect()
            }

            async fn interrupt_run(&self, id: RunId) -> Result<bool> {
                $(if let Some(own) = &self.$own {
                    return own.interrupt_run(id).await;
                })?
                let updated = sqlx::query(INTERRUPT_RUN)
                    .bind(id.0)
                    .bind(StopReason::Interrupted.as_str())
                    .bind(Ts::now())
                    .execute(&self.pool)
                    .await?;
                if updated.rows_affected() > 0 {
                    return Ok(true);
                }
                // Runs are never deleted: one not found now never existed.
                let known: Option<i32> = sqlx::query_scalar(RUN_EXISTS)
                    .bind(id.0)
                    .fetch_optional(&self.pool)
                    .await?;
                match known {
                    Some(_) => Ok(false),
                    None => Err(StoreError::RunNotFound(id)),
                }
            }

            async fn append_events(
                &self,
                conversation: ConversationId,
                events: &[AgentEvent],
            ) -> Result<Vec<u64>> {
                $(if let Some(own) = &self.$own {
                    return own.append_events(conversation, events).await;
                })?
                let mut tx = self.write().await?;
                let seqs = Self::insert_events(&mut tx, conversation, events).await?;
                tx.commit().await?;
                Ok(seqs)
            }

            async fn events_since(
                &self,
                conversation: ConversationId,
                after: u64,
                limit: u32,
            ) -> Result<Vec<StoredEvent>> {
                let mut conn = self.pool.acquire().await?;
                let events = sqlx::query_as::<_, EventRow>(
                    "SELECT seq, CAST(payload AS TEXT) AS payload FROM events \
                     WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                )
                .bind(conversation.0)
                .bind(i64::try_from(after).unwrap_or(i64::MAX))
                .bind(i64::from(limit))
                .fetch_all(&mut *conn)
                .await?;
                if events.is_empty() {
                    // Nothing new, or no such conversation?
                    Self::get_conversation(&mut conn, conversation).await?;
                }
                events
                    .into_iter()
                    .map(|e| e.into_event(conversation))
                    .collect()
            }

            async fn document(&self, kind: &str, id: &str) -> Result<Option<Document>> {
                sqlx::query_as::<_, DocumentRow>(
                    "SELECT kind, id, CAST(body AS TEXT) AS body, created_at, updated_at \
                     FROM documents WHERE kind = $1 AND id = $2",
                )
                .bind(kind)
                .bind(id)
                .fetch_optional(&self.pool)
                .await?
                .map(Document::try_from)
                .transpose()
            }

            async fn documents(&self, kind: &str) -> Result<Vec<Document>> {
                sqlx::query_as::<_, DocumentRow>(
                    "SELECT kind, id, CAST(body AS TEXT) AS body, created_at, updated_at \
                     FROM documents WHERE kind = $1 ORDER BY created_at, id",
                )
                .bind(kind)
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(Document::try_from)
                .collect()
            }

            async fn delete_document(&self, kind: &str, id: &str) -> Result<bool> {
                $(if let Some(own) = &self.$own {
                    return own.delete_document(kind, id).await;
                })?
                let deleted = sqlx::query(DELETE_DOCUMENT)
                    .bind(kind)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(deleted.rows_affected() > 0)
            }

            async fn write_documents(
                &self,
                kind: &str,
                changes: &[(String, Option<serde_json::Value>)],
            ) -> Result<()> {
                $(if let Some(own) = &self.$own {
                    return own.write_documents(kind, changes).await;
                })?
                let mut tx = self.write().await?;
                let now = Ts::now();
                for (id, body) in changes {
                    match body {
                        Some(body) => sqlx::query(PUT_DOCUMENT)
                            .bind(kind)
                            .bind(id)
                            .bind(sqlx::types::Json(body))
                            .bind(now)
                            .execute(&mut *tx)
                            .await?,
                        None => sqlx::query(DELETE_DOCUMENT)
                            .bind(kind)
                            .bind(id)
                            .execute(&mut *tx)
                            .await?,
                    };
                }
                tx.commit().await?;
                Ok(())
            }

            async fn messages(&self, conversation: ConversationId) -> Result<Vec<Message>> {
                let found = rows::messages(
                    sqlx::query_as::<_, MessageRow>(concat!(
                        "SELECT ",
                        message_columns!(),
                        " FROM messages m WHERE m.conversation_id = $1 ORDER BY m.seq"
                    ))
                    .bind(conversation.0)
                    .fetch_all(&self.pool)
                    .await?,
                )?;
                // Every conversation has at least its root.
                if found.is_empty() {
                    return Err(StoreError::ConversationNotFound(conversation));
                }
                Ok(found)
            }
        }
    };
}

pub(crate) use impl_store;
