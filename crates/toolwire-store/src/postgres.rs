//! The PostgreSQL backend, for several toolwire instances sharing one
//! database (`postgres://…`), on sqlx: a pool of connections, each
//! method one statement or one transaction, migrations by `sqlx::migrate!`
//! (recorded in `_sqlx_migrations`). The SQL is [`crate::sql`]'s, shared
//! with the SQLite backend; only the path query is this backend's own.

use async_trait::async_trait;
use sqlx::Row as _;
use sqlx::postgres::{PgPool, PgPoolOptions};
use toolwire_core::{
    AgentEvent, BlobRef, Conversation, ConversationId, InstanceId, Message, MessageId, RunId,
    StopReason, TreeError,
};

use crate::rows::{
    self, ConversationRow, DocumentRow, EventRow, InstanceRow, MessageRow, MessageValues, RunRow,
    SummaryRow, Ts, UnfinishedRow, message_columns,
};
use crate::sql::{
    self, CHILDREN_AND_SELF, CONVERSATION_MESSAGES, DELETE_DOCUMENT, EVENTS_SINCE, FINISH_RUN,
    FORGET_INSTANCES, HEARTBEAT_INSTANCE, INSERT_CONVERSATION, INSERT_EVENT, INSERT_MESSAGE,
    INTERRUPT_RUN, LEAVES, LIST_CONVERSATIONS, MESSAGE_CONVERSATION, MESSAGE_PLACE, PUT_BLOB,
    PUT_DOCUMENT, REGISTER_INSTANCE, RUN_EXISTS, SELECT_BLOB, SELECT_CONVERSATION, SELECT_DOCUMENT,
    SELECT_DOCUMENTS, SELECT_INSTANCE, SELECT_MESSAGE, SELECT_RUN, SET_ACTIVE_LEAF, SIBLINGS,
    START_RUN, TAKE_EVENT_SEQS, TOTAL_COST, UNFINISHED_RUNS, UPDATE_MESSAGE, check_parent,
    check_update, forked, new_conversation, path_lines,
};
use crate::{
    Blob, ConversationSummary, Document, InstanceRecord, Result, RunRecord, Store, StoreError,
    StoreRead, StoredEvent, UnfinishedRun,
};

type Conn = <sqlx::Postgres as sqlx::Database>::Connection;

/// The path in one query: each line's part (see [`path_lines`]) is one
/// range of the `(line, seq)` index.
const PATH_TO: &str = concat!(
    path_lines!(),
    " SELECT ",
    message_columns!(),
    " FROM seg JOIN messages m ON m.line = seg.line AND m.seq <= seg.upto \
      ORDER BY m.seq"
);

/// A [`Store`] in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to the database at `url` and migrates it.
    pub async fn open(url: &str) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect(url)
            .await?;
        let migrator = sqlx::migrate!("./migrations/postgres");
        // No table yet: a new database, nothing to say.
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
        if !applied.is_empty() {
            for m in migrator.iter().filter(|m| !applied.contains(&m.version)) {
                crate::announce_migration(m.version, &m.description);
            }
        }
        migrator.run(&pool).await?;
        Ok(PostgresStore { pool })
    }

    /// Closes the connections (waiting for the ones in use).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

impl PostgresStore {
    async fn write(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        Ok(self.pool.begin().await?)
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
        let corrupt =
            |seq: i64| StoreError::Corrupt(format!("conversation {conversation}: event seq {seq}"));
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
            Err(e) if rows::is_unique_violation(&e) => Err(StoreError::DuplicateMessage(m.id)),
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

    /// The messages `sql` (one of [`crate::sql`]'s message lists) selects
    /// for `key`.
    async fn messages_where(&self, sql: &'static str, key: uuid::Uuid) -> Result<Vec<Message>> {
        rows::messages(
            sqlx::query_as::<_, MessageRow>(sql)
                .bind(key)
                .fetch_all(&self.pool)
                .await?,
        )
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
impl StoreRead for PostgresStore {
    async fn conversation(&self, id: ConversationId) -> Result<Conversation> {
        let mut conn = self.pool.acquire().await?;
        Self::get_conversation(&mut conn, id).await
    }

    async fn list_conversations(&self) -> Result<Vec<ConversationSummary>> {
        sqlx::query_as::<_, SummaryRow>(LIST_CONVERSATIONS)
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(ConversationSummary::try_from)
            .collect()
    }

    async fn message(&self, id: MessageId) -> Result<Message> {
        sqlx::query_as::<_, MessageRow>(SELECT_MESSAGE)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::MessageNotFound(id))?
            .try_into()
    }

    async fn path_to(&self, leaf: MessageId) -> Result<Vec<Message>> {
        let mut conn = self.pool.acquire().await?;
        Self::path(&mut conn, leaf).await
    }

    async fn children(&self, id: MessageId) -> Result<Vec<Message>> {
        let found = self.messages_where(CHILDREN_AND_SELF, id.0).await?;
        sql::children_only(found, id)
    }

    async fn siblings(&self, id: MessageId) -> Result<Vec<Message>> {
        let found = self.messages_where(SIBLINGS, id.0).await?;
        sql::some(found, StoreError::MessageNotFound(id))
    }

    async fn leaves(&self, conversation: ConversationId) -> Result<Vec<Message>> {
        let found = self.messages_where(LEAVES, conversation.0).await?;
        sql::some(found, StoreError::ConversationNotFound(conversation))
    }

    async fn total_cost(&self, conversation: ConversationId) -> Result<f64> {
        sqlx::query_scalar(TOTAL_COST)
            .bind(conversation.0)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::ConversationNotFound(conversation))
    }

    async fn instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>> {
        sqlx::query_as::<_, InstanceRow>(SELECT_INSTANCE)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?
            .map(InstanceRecord::try_from)
            .transpose()
    }

    async fn run(&self, id: RunId) -> Result<RunRecord> {
        sqlx::query_as::<_, RunRow>(SELECT_RUN)
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

    async fn events_since(
        &self,
        conversation: ConversationId,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>> {
        let mut conn = self.pool.acquire().await?;
        let events = sqlx::query_as::<_, EventRow>(EVENTS_SINCE)
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
        sqlx::query_as::<_, DocumentRow>(SELECT_DOCUMENT)
            .bind(kind)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .map(Document::try_from)
            .transpose()
    }

    async fn blob(&self, sha256: &str) -> Result<Option<Blob>> {
        let row = sqlx::query(SELECT_BLOB)
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(Blob {
                media_type: r.try_get(0)?,
                bytes: r.try_get(1)?,
            })
        })
        .transpose()
    }

    async fn documents(&self, kind: &str) -> Result<Vec<Document>> {
        sqlx::query_as::<_, DocumentRow>(SELECT_DOCUMENTS)
            .bind(kind)
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(Document::try_from)
            .collect()
    }

    async fn messages(&self, conversation: ConversationId) -> Result<Vec<Message>> {
        let found = self
            .messages_where(CONVERSATION_MESSAGES, conversation.0)
            .await?;
        sql::some(found, StoreError::ConversationNotFound(conversation))
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_conversation(
        &self,
        system_prompt: &str,
        title: Option<&str>,
    ) -> Result<Conversation> {
        let (conversation, root) = new_conversation(system_prompt, title);
        let mut tx = self.write().await?;
        Self::insert_conversation(&mut tx, &conversation).await?;
        Self::insert_message(&mut tx, &root).await?;
        tx.commit().await?;
        Ok(conversation)
    }

    async fn append_with_events(
        &self,
        message: &Message,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
        let mut tx = self.write().await?;
        let parent_conversation: Option<uuid::Uuid> = sqlx::query_scalar(MESSAGE_CONVERSATION)
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

    async fn set_active_leaf(&self, conversation: ConversationId, leaf: MessageId) -> Result<()> {
        let mut tx = self.write().await?;
        let owner: Option<uuid::Uuid> = sqlx::query_scalar(MESSAGE_CONVERSATION)
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

    async fn register_instance(
        &self,
        id: InstanceId,
        host: &str,
        pid: u32,
    ) -> Result<InstanceRecord> {
        sqlx::query_as::<_, InstanceRow>(REGISTER_INSTANCE)
            .bind(id.0)
            .bind(host)
            .bind(i64::from(pid))
            .bind(Ts::now())
            .fetch_one(&self.pool)
            .await?
            .try_into()
    }

    async fn heartbeat_instance(&self, id: InstanceId) -> Result<()> {
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

    async fn forget_instances(&self, silent_since: chrono::DateTime<chrono::Utc>) -> Result<u64> {
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

    async fn finish_run(&self, id: RunId, reason: StopReason, error: Option<&str>) -> Result<()> {
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

    async fn interrupt_run(&self, id: RunId) -> Result<bool> {
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
        let mut tx = self.write().await?;
        let seqs = Self::insert_events(&mut tx, conversation, events).await?;
        tx.commit().await?;
        Ok(seqs)
    }

    async fn put_blob(&self, media_type: &str, bytes: &[u8]) -> Result<BlobRef> {
        let reference = BlobRef::of(media_type, bytes);
        sqlx::query(PUT_BLOB)
            .bind(&reference.sha256)
            .bind(media_type)
            .bind(bytes)
            .bind(Ts::now())
            .execute(&self.pool)
            .await?;
        Ok(reference)
    }

    async fn delete_document(&self, kind: &str, id: &str) -> Result<bool> {
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
        let mut tx = self.write().await?;
        let now = Ts::now();
        for (id, body) in changes {
            match body {
                Some(body) => {
                    sqlx::query(PUT_DOCUMENT)
                        .bind(kind)
                        .bind(id)
                        .bind(sqlx::types::Json(body))
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                }
                None => {
                    sqlx::query(DELETE_DOCUMENT)
                        .bind(kind)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?
                }
            };
        }
        tx.commit().await?;
        Ok(())
    }
}
