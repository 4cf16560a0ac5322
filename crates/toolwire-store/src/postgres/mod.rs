//! The PostgreSQL backend, for several toolwire instances sharing one
//! database (`postgres://…`), on tokio-postgres: a pool of connections
//! ([`pool`]), each method one statement or one transaction on one of them
//! (its statements prepared once per connection), migrations run when the
//! store opens ([`migrate`]). The SQL is [`crate::sql`]'s, shared with the
//! SQLite backend, and so are the rows, read by position ([`rows`]); only
//! the path query is this backend's own.

mod cluster;
mod migrate;
mod pool;
mod rows;

use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::types::{FromSqlOwned, Json, ToSql};
use toolwire_core::{
    AgentEvent, BlobRef, Conversation, ConversationId, InstanceId, Message, MessageId, RunId,
    StopReason, TreeError,
};

pub(crate) use pool::describe;
use rows::FromPostgres;

use crate::rows::{
    self as shared, ConversationRow, DocumentRow, EventRow, InstanceRow, MessageRow, MessageValues,
    RunRow, SummaryRow, Ts, UnfinishedRow, message_columns,
};
use crate::sql::{
    self, CHILDREN_AND_SELF, CONVERSATION_MESSAGES, CONVERSATION_UNFINISHED_RUNS, DELETE_DOCUMENT,
    EVENTS_SINCE, FINISH_RUN, FORGET_INSTANCES, HEARTBEAT_INSTANCE, INSERT_CONVERSATION,
    INSERT_EVENT, INSERT_MESSAGE, INTERRUPT_RUN, LEAVES, LIST_CONVERSATIONS, MESSAGE_CONVERSATION,
    MESSAGE_PLACE, PUT_BLOB, PUT_DOCUMENT, REGISTER_INSTANCE, RUN_EXISTS, SELECT_BLOB,
    SELECT_CONVERSATION, SELECT_DOCUMENT, SELECT_DOCUMENTS, SELECT_INSTANCE, SELECT_MESSAGE,
    SELECT_RUN, SET_ACTIVE_LEAF, SIBLINGS, START_RUN, TAKE_EVENT_SEQS, TOTAL_COST, UNFINISHED_RUNS,
    UPDATE_MESSAGE, check_parent, check_update, forked, new_conversation, path_lines,
};
use crate::{
    Blob, ConversationSummary, Document, InstanceRecord, Result, RunRecord, Store, StoreError,
    StoreRead, StoredEvent, UnfinishedRun,
};

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
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// For the connection each instance keeps outside the pool
    /// ([`cluster`]).
    config: tokio_postgres::Config,
}

impl std::fmt::Debug for PostgresStore {
    // The pool's configuration holds the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("connections", &self.pool.status().size)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` and migrates it.
    pub async fn open(url: &str) -> Result<Self> {
        let (pool, config) = pool::pool(url)?;
        // Made now, so that a wrong URL fails here and not at first use.
        let mut client = pool
            .get()
            .await
            .map_err(|e| pool::first_connection_failed(e, url))?;
        migrate::run(&mut client).await?;
        Ok(PostgresStore { pool, config })
    }

    /// Closes the pool: connections in use close when their methods end,
    /// and methods called from now on fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        self.pool.close();
    }
}

/// The rows `sql` selects, each read as an `R`.
async fn all<R: FromPostgres>(
    c: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<R>> {
    let statement = c.prepare_cached(sql).await?;
    let rows = c.query(&statement, params).await?;
    Ok(rows
        .iter()
        .map(R::from_postgres)
        .collect::<std::result::Result<_, _>>()?)
}

/// The row `sql` selects, if any, read as an `R`.
async fn one<R: FromPostgres>(
    c: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<R>> {
    let statement = c.prepare_cached(sql).await?;
    let row = c.query_opt(&statement, params).await?;
    Ok(row.as_ref().map(R::from_postgres).transpose()?)
}

/// The first column of the row `sql` selects, if any.
async fn scalar<T: FromSqlOwned>(
    c: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<T>> {
    let statement = c.prepare_cached(sql).await?;
    let row = c.query_opt(&statement, params).await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}

/// Runs `sql`; returns how many rows it changed.
async fn execute(c: &impl GenericClient, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.execute(&statement, params).await?)
}

async fn insert_conversation(c: &impl GenericClient, conversation: &Conversation) -> Result<()> {
    execute(
        c,
        INSERT_CONVERSATION,
        &[
            &conversation.id.0,
            &conversation.title,
            &conversation.root_id.0,
            &conversation.active_leaf.0,
            &conversation.forked_from.map(|f| f.conversation_id.0),
            &conversation.forked_from.map(|f| f.message_id.0),
            &Ts::from(conversation.created_at).0,
        ],
    )
    .await?;
    Ok(())
}

/// Appends `events` to the conversation's log. The counter's row stays
/// locked until commit, so concurrent appends to one conversation take
/// 1, 2, 3 … in turn, without gaps.
async fn insert_events(
    c: &impl GenericClient,
    conversation: ConversationId,
    events: &[AgentEvent],
) -> Result<Vec<u64>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let corrupt =
        |seq: i64| StoreError::Corrupt(format!("conversation {conversation}: event seq {seq}"));
    let count = i64::try_from(events.len()).map_err(|_| corrupt(-1))?;
    let last: i64 = scalar(c, TAKE_EVENT_SEQS, &[&conversation.0, &count])
        .await?
        .ok_or(StoreError::ConversationNotFound(conversation))?;
    let now = Ts::now().0;
    let mut seqs = Vec::with_capacity(events.len());
    for (seq, event) in (last - count + 1..).zip(events) {
        let (kind, payload) = shared::event_json(event)?;
        execute(
            c,
            INSERT_EVENT,
            &[&conversation.0, &seq, &kind, &Json(&payload), &now],
        )
        .await?;
        seqs.push(u64::try_from(seq).map_err(|_| corrupt(seq))?);
    }
    Ok(seqs)
}

async fn insert_message(c: &impl GenericClient, m: &Message) -> Result<()> {
    let v = MessageValues::from(m);
    let inserted = execute(
        c,
        INSERT_MESSAGE,
        &[
            &v.id,
            &v.conversation_id,
            &v.parent_id,
            &v.role,
            &Json(v.content),
            &v.prompt_tokens,
            &v.completion_tokens,
            &v.cached_tokens,
            &v.cache_write_tokens,
            &v.cost,
            &v.model,
            &v.duration_ms,
            &v.status,
            &v.created_at.0,
        ],
    )
    .await;
    match inserted {
        Err(e) if pool::is_unique_violation(&e) => Err(StoreError::DuplicateMessage(m.id)),
        other => other.map(drop),
    }
}

async fn path(c: &impl GenericClient, leaf: MessageId) -> Result<Vec<Message>> {
    let path: Vec<MessageRow> = all(c, PATH_TO, &[&leaf.0]).await?;
    if path.is_empty() {
        return Err(StoreError::MessageNotFound(leaf));
    }
    shared::messages(path)
}

async fn get_conversation(c: &impl GenericClient, id: ConversationId) -> Result<Conversation> {
    one::<ConversationRow>(c, SELECT_CONVERSATION, &[&id.0])
        .await?
        .ok_or(StoreError::ConversationNotFound(id))?
        .try_into()
}

impl PostgresStore {
    async fn client(&self) -> Result<deadpool_postgres::Client> {
        Ok(self.pool.get().await?)
    }

    /// The messages `sql` (one of [`crate::sql`]'s message lists) selects
    /// for `key`.
    async fn messages_where(&self, sql: &'static str, key: uuid::Uuid) -> Result<Vec<Message>> {
        let client = self.client().await?;
        shared::messages(all(&client, sql, &[&key]).await?)
    }
}

#[async_trait]
impl StoreRead for PostgresStore {
    async fn conversation(&self, id: ConversationId) -> Result<Conversation> {
        get_conversation(&self.client().await?, id).await
    }

    async fn list_conversations(&self) -> Result<Vec<ConversationSummary>> {
        let client = self.client().await?;
        all::<SummaryRow>(&client, LIST_CONVERSATIONS, &[])
            .await?
            .into_iter()
            .map(ConversationSummary::try_from)
            .collect()
    }

    async fn message(&self, id: MessageId) -> Result<Message> {
        let client = self.client().await?;
        one::<MessageRow>(&client, SELECT_MESSAGE, &[&id.0])
            .await?
            .ok_or(StoreError::MessageNotFound(id))?
            .try_into()
    }

    async fn path_to(&self, leaf: MessageId) -> Result<Vec<Message>> {
        path(&self.client().await?, leaf).await
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
        scalar(&self.client().await?, TOTAL_COST, &[&conversation.0])
            .await?
            .ok_or(StoreError::ConversationNotFound(conversation))
    }

    async fn instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>> {
        one::<InstanceRow>(&self.client().await?, SELECT_INSTANCE, &[&id.0])
            .await?
            .map(InstanceRecord::try_from)
            .transpose()
    }

    async fn run(&self, id: RunId) -> Result<RunRecord> {
        one::<RunRow>(&self.client().await?, SELECT_RUN, &[&id.0])
            .await?
            .ok_or(StoreError::RunNotFound(id))?
            .try_into()
    }

    async fn unfinished_runs(&self) -> Result<Vec<UnfinishedRun>> {
        all::<UnfinishedRow>(&self.client().await?, UNFINISHED_RUNS, &[])
            .await?
            .into_iter()
            .map(UnfinishedRun::try_from)
            .collect()
    }

    async fn conversation_unfinished_runs(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<UnfinishedRun>> {
        all::<UnfinishedRow>(
            &self.client().await?,
            CONVERSATION_UNFINISHED_RUNS,
            &[&conversation.0],
        )
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
        let client = self.client().await?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let events: Vec<EventRow> = all(
            &client,
            EVENTS_SINCE,
            &[&conversation.0, &after, &i64::from(limit)],
        )
        .await?;
        if events.is_empty() {
            // Nothing new, or no such conversation?
            get_conversation(&client, conversation).await?;
        }
        events
            .into_iter()
            .map(|e| e.into_event(conversation))
            .collect()
    }

    async fn document(&self, kind: &str, id: &str) -> Result<Option<Document>> {
        one::<DocumentRow>(&self.client().await?, SELECT_DOCUMENT, &[&kind, &id])
            .await?
            .map(Document::try_from)
            .transpose()
    }

    async fn blob(&self, sha256: &str) -> Result<Option<Blob>> {
        let client = self.client().await?;
        let statement = client.prepare_cached(SELECT_BLOB).await?;
        let row = client.query_opt(&statement, &[&sha256]).await?;
        Ok(row
            .map(|r| -> Result<Blob> {
                Ok(Blob {
                    media_type: r.try_get(0)?,
                    bytes: r.try_get(1)?,
                })
            })
            .transpose()?)
    }

    async fn conversation_and_document(
        &self,
        id: ConversationId,
        kind: &str,
        document: &str,
    ) -> Result<(Conversation, Option<Document>)> {
        let client = self.client().await?;
        let params: [&(dyn ToSql + Sync); 2] = [&kind, &document];
        // Both statements on one connection, pipelined: one checkout.
        let (conversation, document) = futures::try_join!(
            get_conversation(&client, id),
            one::<DocumentRow>(&client, SELECT_DOCUMENT, &params),
        )?;
        Ok((conversation, document.map(Document::try_from).transpose()?))
    }

    async fn documents(&self, kind: &str) -> Result<Vec<Document>> {
        all::<DocumentRow>(&self.client().await?, SELECT_DOCUMENTS, &[&kind])
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
    async fn cluster(&self, me: InstanceId) -> Result<std::sync::Arc<dyn crate::cluster::Cluster>> {
        let mut config = self.config.clone();
        // A dead server (or network) is noticed on the link, which holds
        // the leases, within about a minute rather than hours.
        config
            .keepalives(true)
            .keepalives_idle(std::time::Duration::from_secs(10));
        let cluster = cluster::PgCluster::start(config, self.pool.clone(), me).await?;
        Ok(std::sync::Arc::new(cluster))
    }

    async fn create_conversation(
        &self,
        system_prompt: &str,
        title: Option<&str>,
    ) -> Result<Conversation> {
        let (conversation, root) = new_conversation(system_prompt, title);
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        insert_conversation(&tx, &conversation).await?;
        insert_message(&tx, &root).await?;
        tx.commit().await?;
        Ok(conversation)
    }

    async fn append_with_events(
        &self,
        message: &Message,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let parent_conversation: Option<uuid::Uuid> =
            scalar(&tx, MESSAGE_CONVERSATION, &[&parent.0]).await?;
        check_parent(message, parent, parent_conversation)?;
        // The conversation's row first: on PostgreSQL its lock serialises
        // appends to one conversation, so that two children of one parent
        // never both take its line.
        execute(
            &tx,
            SET_ACTIVE_LEAF,
            &[&message.conversation_id.0, &message.id.0],
        )
        .await?;
        insert_message(&tx, message).await?;
        let seqs = insert_events(&tx, message.conversation_id, events).await?;
        tx.commit().await?;
        Ok(seqs)
    }

    async fn update(&self, message: &Message) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let statement = tx.prepare_cached(MESSAGE_PLACE).await?;
        let stored = tx
            .query_opt(&statement, &[&message.id.0])
            .await?
            .ok_or(StoreError::MessageNotFound(message.id))?;
        let conversation: uuid::Uuid = stored.try_get(0)?;
        let parent: Option<uuid::Uuid> = stored.try_get(1)?;
        let role: String = stored.try_get(2)?;
        check_update(message, conversation, parent, &role)?;
        let v = MessageValues::from(message);
        execute(
            &tx,
            UPDATE_MESSAGE,
            &[
                &v.id,
                &Json(v.content),
                &v.prompt_tokens,
                &v.completion_tokens,
                &v.cached_tokens,
                &v.cache_write_tokens,
                &v.cost,
                &v.model,
                &v.duration_ms,
                &v.status,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_active_leaf(&self, conversation: ConversationId, leaf: MessageId) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let owner: Option<uuid::Uuid> = scalar(&tx, MESSAGE_CONVERSATION, &[&leaf.0]).await?;
        match owner {
            None => Err(StoreError::MessageNotFound(leaf)),
            Some(c) if c == conversation.0 => {
                execute(&tx, SET_ACTIVE_LEAF, &[&conversation.0, &leaf.0]).await?;
                tx.commit().await?;
                Ok(())
            }
            Some(_) => {
                get_conversation(&tx, conversation).await?;
                Err(TreeError::UnknownMessage(leaf).into())
            }
        }
    }

    async fn fork(&self, at: MessageId) -> Result<Conversation> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let path = path(&tx, at).await?;
        let source = path
            .first()
            .map(|root| root.conversation_id)
            .ok_or(StoreError::MessageNotFound(at))?;
        let source = get_conversation(&tx, source).await?;
        let (conversation, copies) = forked(source, at, &path)?;
        insert_conversation(&tx, &conversation).await?;
        for copy in &copies {
            insert_message(&tx, copy).await?;
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
        one::<InstanceRow>(
            &self.client().await?,
            REGISTER_INSTANCE,
            &[&id.0, &host, &i64::from(pid), &Ts::now().0],
        )
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("instance {id}: registering returned no row")))?
        .try_into()
    }

    async fn heartbeat_instance(&self, id: InstanceId) -> Result<()> {
        let client = self.client().await?;
        if execute(&client, HEARTBEAT_INSTANCE, &[&id.0, &Ts::now().0]).await? == 0 {
            return Err(StoreError::InstanceNotFound(id));
        }
        Ok(())
    }

    async fn forget_instances(&self, silent_since: chrono::DateTime<chrono::Utc>) -> Result<u64> {
        let client = self.client().await?;
        execute(&client, FORGET_INSTANCES, &[&Ts::from(silent_since).0]).await
    }

    async fn start_run(
        &self,
        id: RunId,
        conversation: ConversationId,
        owner: InstanceId,
    ) -> Result<()> {
        let client = self.client().await?;
        let params: [&(dyn ToSql + Sync); 4] = [&id.0, &conversation.0, &Ts::now().0, &owner.0];
        if execute(&client, START_RUN, &params).await? == 0 {
            return Err(StoreError::ConversationNotFound(conversation));
        }
        Ok(())
    }

    async fn finish_run(&self, id: RunId, reason: StopReason, error: Option<&str>) -> Result<()> {
        let client = self.client().await?;
        let params: [&(dyn ToSql + Sync); 4] = [&id.0, &reason.as_str(), &error, &Ts::now().0];
        if execute(&client, FINISH_RUN, &params).await? == 0 {
            return Err(StoreError::RunNotFound(id));
        }
        Ok(())
    }

    async fn finish_run_with_events(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let params: [&(dyn ToSql + Sync); 4] = [&id.0, &reason.as_str(), &error, &Ts::now().0];
        if execute(&tx, FINISH_RUN, &params).await? == 0 {
            return Err(StoreError::RunNotFound(id));
        }
        let seqs = insert_events(&tx, conversation, events).await?;
        tx.commit().await?;
        Ok(seqs)
    }

    async fn finish_run_with_message(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        message: &Message,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
        let conversation = message.conversation_id;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let parent_conversation: Option<uuid::Uuid> =
            scalar(&tx, MESSAGE_CONVERSATION, &[&parent.0]).await?;
        check_parent(message, parent, parent_conversation)?;
        // The conversation's row first, as in `append_with_events`.
        execute(&tx, SET_ACTIVE_LEAF, &[&conversation.0, &message.id.0]).await?;
        insert_message(&tx, message).await?;
        let seqs = insert_events(&tx, conversation, events).await?;
        let params: [&(dyn ToSql + Sync); 4] = [&id.0, &reason.as_str(), &error, &Ts::now().0];
        if execute(&tx, FINISH_RUN, &params).await? == 0 {
            return Err(StoreError::RunNotFound(id));
        }
        tx.commit().await?;
        Ok(seqs)
    }

    async fn start_run_with_message(
        &self,
        id: RunId,
        owner: InstanceId,
        message: &Message,
        events: &[AgentEvent],
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> Result<Vec<u64>> {
        let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
        let conversation = message.conversation_id;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let now = Ts::now().0;
        let parent_conversation: Option<uuid::Uuid> =
            scalar(&tx, MESSAGE_CONVERSATION, &[&parent.0]).await?;
        check_parent(message, parent, parent_conversation)?;
        // The conversation's row first, as in `append_with_events`.
        execute(&tx, SET_ACTIVE_LEAF, &[&conversation.0, &message.id.0]).await?;
        let params: [&(dyn ToSql + Sync); 4] = [&id.0, &conversation.0, &now, &owner.0];
        if execute(&tx, START_RUN, &params).await? == 0 {
            return Err(StoreError::ConversationNotFound(conversation));
        }
        insert_message(&tx, message).await?;
        let seqs = insert_events(&tx, conversation, events).await?;
        for (kind, id, body) in documents {
            execute(&tx, PUT_DOCUMENT, &[kind, id, &Json(*body), &now]).await?;
        }
        tx.commit().await?;
        Ok(seqs)
    }

    async fn interrupt_run(&self, id: RunId) -> Result<bool> {
        let client = self.client().await?;
        let interrupted = StopReason::Interrupted.as_str();
        if execute(&client, INTERRUPT_RUN, &[&id.0, &interrupted, &Ts::now().0]).await? > 0 {
            return Ok(true);
        }
        // Runs are never deleted: one not found now never existed.
        match scalar::<i32>(&client, RUN_EXISTS, &[&id.0]).await? {
            Some(_) => Ok(false),
            None => Err(StoreError::RunNotFound(id)),
        }
    }

    async fn append_events(
        &self,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let seqs = insert_events(&tx, conversation, events).await?;
        tx.commit().await?;
        Ok(seqs)
    }

    async fn put_blob(&self, media_type: &str, bytes: &[u8]) -> Result<BlobRef> {
        let reference = BlobRef::of(media_type, bytes);
        let client = self.client().await?;
        execute(
            &client,
            PUT_BLOB,
            &[&reference.sha256, &media_type, &bytes, &Ts::now().0],
        )
        .await?;
        Ok(reference)
    }

    async fn delete_document(&self, kind: &str, id: &str) -> Result<bool> {
        let client = self.client().await?;
        Ok(execute(&client, DELETE_DOCUMENT, &[&kind, &id]).await? > 0)
    }

    async fn write_documents(
        &self,
        kind: &str,
        changes: &[(String, Option<serde_json::Value>)],
    ) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let now = Ts::now().0;
        for (id, body) in changes {
            match body {
                Some(body) => execute(&tx, PUT_DOCUMENT, &[&kind, id, &Json(body), &now]).await?,
                None => execute(&tx, DELETE_DOCUMENT, &[&kind, id]).await?,
            };
        }
        tx.commit().await?;
        Ok(())
    }

    async fn put_documents(&self, documents: &[(&str, &str, &serde_json::Value)]) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let now = Ts::now().0;
        for (kind, id, body) in documents {
            execute(&tx, PUT_DOCUMENT, &[kind, id, &Json(*body), &now]).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
