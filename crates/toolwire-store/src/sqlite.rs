//! The SQLite backend: one file (`sqlite://PATH`, created if missing) in
//! WAL mode, or `sqlite::memory:` for throwaway stores.
//!
//! On a file, reads go through sqlx, except [`Store::path_to`](crate::Store):
//! it reads through the backend's own `rusqlite` connections, on tokio's
//! blocking threads. sqlx's SQLite driver copies every value of every row
//! it returns (and hands the rows over from its worker thread one by one),
//! which made a 10,000-message path cost some 40 ms more than reading it;
//! rusqlite reads the values in place. Both libraries link the one SQLite
//! library (`libsqlite3-sys`), and each read is a transaction of its own on
//! the file, so these readers see exactly what the other connections — and
//! any other process — have committed: nothing is cached.
//!
//! Every write method on a file runs its whole transaction on one blocking
//! thread, on the backend's one `rusqlite` writer connection (see
//! [`writer`]): sqlx's driver runs each statement on its connection's
//! worker thread, a round trip of some 30–40 µs, and a write is four or
//! more statements. The writer runs the SQL of [`crate::sql`], which the
//! sqlx implementation runs on PostgreSQL and on an in-memory database
//! (which no second connection can see).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use reader::Readers;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use writer::Writer;

/// How long a writer waits for another one before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A [`Store`](crate::Store) in an SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The file's own readers; `None` for an in-memory database, which only
    /// the sqlx connection can see.
    readers: Option<Arc<Readers>>,
    /// The file's own writer; `None` for an in-memory database, written
    /// through sqlx.
    writer: Option<Arc<Writer>>,
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the database at `url`.
    pub async fn open(url: &str) -> crate::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        // An in-memory database lives as long as its last connection, and
        // its shared cache does not wait for locks: keep exactly one.
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let readers =
            (!in_memory).then(|| Arc::new(Readers::new(options.get_filename().to_owned())));
        let writer = (!in_memory).then(|| Arc::new(Writer::new(options.get_filename().to_owned())));
        let pool = if in_memory {
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(8)
        }
        .connect_with(options)
        .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(SqliteStore {
            pool,
            readers,
            writer,
        })
    }

    /// Closes the connections (waiting for the ones in use).
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(readers) = &self.readers {
            readers.close();
        }
        if let Some(writer) = &self.writer {
            writer.close();
        }
    }

    /// [`Store::path_to`](crate::Store::path_to).
    async fn read_path(&self, leaf: MessageId) -> Result<Vec<Message>> {
        let Some(readers) = &self.readers else {
            let mut conn = self.pool.acquire().await?;
            return Self::path(&mut conn, leaf).await;
        };
        let readers = Arc::clone(readers);
        blocking(move || readers.path(leaf)).await
    }
}

/// Runs `f` on one of tokio's blocking threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(sqlx::Error::WorkerCrashed.into()),
    }
}

/// The file's own readers (rusqlite).
mod reader {
    use std::path::PathBuf;
    use std::sync::{Mutex, PoisonError};

    use rusqlite::{Connection, OpenFlags};
    use toolwire_core::{Message, MessageId};
    use uuid::Uuid;

    use super::BUSY_TIMEOUT;

    /// How much of the file a reader maps (address space, not memory).
    const READER_MMAP_SIZE: i64 = 1 << 28;
    use crate::rows::{MessageParts, Ts};
    use crate::{Result, StoreError};

    /// Idle connections kept for reuse; more are opened when needed.
    const IDLE_READERS: usize = 4;

    /// rusqlite connections to the store's file, for reads only.
    #[derive(Debug)]
    pub(super) struct Readers {
        path: PathBuf,
        idle: Mutex<Vec<Connection>>,
    }

    impl Readers {
        pub(super) fn new(path: PathBuf) -> Readers {
            Readers {
                path,
                idle: Mutex::new(Vec::new()),
            }
        }

        fn take(&self) -> Result<Connection> {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            if let Some(conn) = idle {
                return Ok(conn);
            }
            // Read-write (the file exists: sqlx created and migrated it) so that
            // the WAL index can always be set up, but refusing writes.
            let conn = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            conn.busy_timeout(BUSY_TIMEOUT)?;
            conn.pragma_update(None, "query_only", true)?;
            // Read the file through the OS's page cache, mapped, rather than
            // copying pages into a per-connection cache (which a long path
            // would overflow, and read again in full every time).
            conn.pragma_update(None, "mmap_size", READER_MMAP_SIZE)?;
            Ok(conn)
        }

        fn give_back(&self, conn: Connection) {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < IDLE_READERS {
                idle.push(conn);
            }
        }

        pub(super) fn close(&self) {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }

        /// The path to `leaf` (blocking). A connection that failed is dropped
        /// rather than reused.
        pub(super) fn path(&self, leaf: MessageId) -> Result<Vec<Message>> {
            let mut conn = self.take()?;
            // One read transaction: one snapshot.
            let tx = conn.transaction()?;
            let path = read_path(&tx, leaf)?;
            tx.commit()?;
            self.give_back(conn);
            Ok(path)
        }
    }

    /// The lines the path to `leaf` crosses, leaf first: each line's id and
    /// the seq of its last message on the path; and the conversation.
    const PATH_SEGMENTS: &str = "WITH RECURSIVE seg (line, upto) AS ( \
             SELECT line, seq FROM messages WHERE id = ?1 \
             UNION ALL \
             SELECT p.line, p.seq FROM seg \
             JOIN messages f ON f.id = seg.line \
             JOIN messages p ON p.id = f.parent_id) \
         SELECT line, upto FROM seg";

    /// One segment of a path, in order: one range of the `(line, seq)` index.
    /// The conversation and the parent are known (the leaf's conversation, the
    /// message before), so they are not read again.
    const PATH_SEGMENT: &str = "SELECT id, role, content, prompt_tokens, completion_tokens, \
         cached_tokens, cost, model, duration_ms, status, created_at \
         FROM messages WHERE line = ?1 AND seq <= ?2 ORDER BY seq";

    /// The path to `leaf`, root first, read in the transaction going on on
    /// `tx` (the readers' or the writer's).
    pub(super) fn read_path(tx: &Connection, leaf: MessageId) -> Result<Vec<Message>> {
        let conversation: Option<Uuid> = tx
            .prepare_cached("SELECT conversation_id FROM messages WHERE id = ?1")?
            .query_row([leaf.0.as_bytes()], |r| r.get(0))
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        let conversation = conversation.ok_or(StoreError::MessageNotFound(leaf))?;
        let segments = tx
            .prepare_cached(PATH_SEGMENTS)?
            .query_map([leaf.0.as_bytes()], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut path: Vec<Message> = Vec::new();
        let mut segment = tx.prepare_cached(PATH_SEGMENT)?;
        for (line, upto) in segments.iter().rev() {
            let mut rows = segment.query((line, upto))?;
            while let Some(r) = rows.next()? {
                let id: Uuid = r.get(0)?;
                let corrupt = |what: &str| StoreError::Corrupt(format!("message {id}: {what}"));
                let text = |i: usize| -> Result<&str> {
                    r.get_ref(i)?
                        .as_str()
                        .map_err(|e| corrupt(&format!("column {i}: {e}")))
                };
                let micros: i64 = r.get(10)?;
                let message = Message::try_from(MessageParts {
                    id,
                    conversation_id: conversation,
                    parent_id: path.last().map(|p| p.id.0),
                    role: text(1)?,
                    content: text(2)?,
                    prompt_tokens: r.get(3)?,
                    completion_tokens: r.get(4)?,
                    cached_tokens: r.get(5)?,
                    cost: r.get(6)?,
                    model: r.get(7)?,
                    duration_ms: r.get(8)?,
                    status: text(9)?,
                    created_at: chrono::DateTime::from_timestamp_micros(micros)
                        .map(Ts)
                        .ok_or_else(|| {
                            corrupt(&format!("timestamp {micros} µs is out of range"))
                        })?,
                })?;
                path.push(message);
            }
        }
        Ok(path)
    }
}

/// The file's own writer (rusqlite): each write method is one transaction,
/// run whole on one blocking thread, where sqlx's driver would hand every
/// statement to its connection's worker thread and wait for it (some
/// 30–40 µs a statement). The SQL is [`crate::sql`]'s, as the sqlx
/// implementation runs it (PostgreSQL's, and an in-memory database's).
mod writer {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex, PoisonError};

    use rusqlite::types::ToSql;
    use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};
    use toolwire_core::{
        AgentEvent, Conversation, ConversationId, InstanceId, Message, MessageId, RunId,
        StopReason, TreeError,
    };
    use uuid::Uuid;

    use super::{BUSY_TIMEOUT, blocking};
    use crate::rows::{self, ConversationRow, InstanceRow, MessageValues, Ts};
    use crate::sql;
    use crate::{InstanceRecord, Result, StoreError};

    /// The one connection our writes go through: writers of this process
    /// queue on its lock rather than on SQLite's (other processes' writers
    /// still wait for each other through the busy timeout).
    #[derive(Debug)]
    pub(in crate::sqlite) struct Writer {
        path: PathBuf,
        /// Opened on first use (the file exists: sqlx created and migrated
        /// it); dropped after a failure that left it in a transaction.
        conn: Mutex<Option<Connection>>,
    }

    impl Writer {
        pub(in crate::sqlite) fn new(path: PathBuf) -> Writer {
            Writer {
                path,
                conn: Mutex::new(None),
            }
        }

        pub(in crate::sqlite) fn close(&self) {
            *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }

        fn open(&self) -> Result<Connection> {
            let conn = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            // What sqlx sets on its connections (the journal mode, WAL,
            // is the file's own).
            conn.busy_timeout(BUSY_TIMEOUT)?;
            conn.pragma_update(None, "foreign_keys", true)?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            Ok(conn)
        }

        /// Runs `f` in one write transaction (`BEGIN IMMEDIATE` … `COMMIT`),
        /// on a blocking thread; an error rolls it back.
        async fn write<T: Send + 'static>(
            self: &Arc<Self>,
            f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
        ) -> Result<T> {
            let this = Arc::clone(self);
            blocking(move || {
                let mut conn = this.conn.lock().unwrap_or_else(PoisonError::into_inner);
                if conn.as_ref().is_some_and(|c| !c.is_autocommit()) {
                    // A transaction that could not be rolled back.
                    *conn = None;
                }
                let conn = match &mut *conn {
                    Some(conn) => conn,
                    none => none.insert(this.open()?),
                };
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let value = f(&tx)?;
                tx.commit()?;
                Ok(value)
            })
            .await
        }

        pub(in crate::sqlite) async fn put_document(
            self: &Arc<Self>,
            kind: &str,
            id: &str,
            body: &serde_json::Value,
        ) -> Result<()> {
            let (kind, id, body) = (kind.to_owned(), id.to_owned(), body.to_string());
            let now = Ts::now().0.timestamp_micros();
            self.write(move |tx| {
                tx.prepare_cached(sql::PUT_DOCUMENT)?
                    .execute(numbered(&[&kind, &id, &body, &now]).as_slice())?;
                Ok(())
            })
            .await
        }

        pub(in crate::sqlite) async fn delete_document(
            self: &Arc<Self>,
            kind: &str,
            id: &str,
        ) -> Result<bool> {
            let (kind, id) = (kind.to_owned(), id.to_owned());
            self.write(move |tx| {
                let deleted = tx
                    .prepare_cached(sql::DELETE_DOCUMENT)?
                    .execute(numbered(&[&kind, &id]).as_slice())?;
                Ok(deleted > 0)
            })
            .await
        }

        pub(in crate::sqlite) async fn create_conversation(
            self: &Arc<Self>,
            system_prompt: &str,
            title: Option<&str>,
        ) -> Result<Conversation> {
            let (conversation, root) = sql::new_conversation(system_prompt, title);
            self.write(move |tx| {
                insert_conversation(tx, &conversation)?;
                insert_message(tx, &root)?;
                Ok(conversation)
            })
            .await
        }

        pub(in crate::sqlite) async fn append_with_events(
            self: &Arc<Self>,
            message: &Message,
            events: &[AgentEvent],
        ) -> Result<Vec<u64>> {
            let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
            let message = message.clone();
            let events = event_rows(events)?;
            self.write(move |tx| {
                let parent_conversation: Option<Uuid> = tx
                    .prepare_cached(sql::MESSAGE_CONVERSATION)?
                    .query_row(numbered(&[&parent.0]).as_slice(), |r| r.get(0))
                    .optional()?;
                sql::check_parent(&message, parent, parent_conversation)?;
                tx.prepare_cached(sql::SET_ACTIVE_LEAF)?
                    .execute(numbered(&[&message.conversation_id.0, &message.id.0]).as_slice())?;
                insert_message(tx, &message)?;
                insert_events(tx, message.conversation_id, &events)
            })
            .await
        }

        pub(in crate::sqlite) async fn update(self: &Arc<Self>, message: &Message) -> Result<()> {
            let message = message.clone();
            self.write(move |tx| {
                let (conversation, parent, role): (Uuid, Option<Uuid>, String) = tx
                    .prepare_cached(sql::MESSAGE_PLACE)?
                    .query_row(numbered(&[&message.id.0]).as_slice(), |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .optional()?
                    .ok_or(StoreError::MessageNotFound(message.id))?;
                sql::check_update(&message, conversation, parent, &role)?;
                let v = MessageValues::from(&message);
                let content = content_json(&message)?;
                tx.prepare_cached(sql::UPDATE_MESSAGE)?.execute(
                    numbered(&[
                        &v.id,
                        &content,
                        &v.prompt_tokens,
                        &v.completion_tokens,
                        &v.cached_tokens,
                        &v.cost,
                        &v.model,
                        &v.duration_ms,
                        &v.status,
                    ])
                    .as_slice(),
                )?;
                Ok(())
            })
            .await
        }

        pub(in crate::sqlite) async fn set_active_leaf(
            self: &Arc<Self>,
            conversation: ConversationId,
            leaf: MessageId,
        ) -> Result<()> {
            self.write(move |tx| {
                let owner: Option<Uuid> = tx
                    .prepare_cached(sql::MESSAGE_CONVERSATION)?
                    .query_row(numbered(&[&leaf.0]).as_slice(), |r| r.get(0))
                    .optional()?;
                match owner {
                    None => Err(StoreError::MessageNotFound(leaf)),
                    Some(c) if c == conversation.0 => {
                        tx.prepare_cached(sql::SET_ACTIVE_LEAF)?
                            .execute(numbered(&[&conversation.0, &leaf.0]).as_slice())?;
                        Ok(())
                    }
                    Some(_) => {
                        get_conversation(tx, conversation)?;
                        Err(TreeError::UnknownMessage(leaf).into())
                    }
                }
            })
            .await
        }

        pub(in crate::sqlite) async fn fork(
            self: &Arc<Self>,
            at: MessageId,
        ) -> Result<Conversation> {
            self.write(move |tx| {
                let path = super::reader::read_path(tx, at)?;
                let source = path
                    .first()
                    .map(|root| root.conversation_id)
                    .ok_or(StoreError::MessageNotFound(at))?;
                let source = get_conversation(tx, source)?;
                let (conversation, copies) = sql::forked(source, at, &path)?;
                insert_conversation(tx, &conversation)?;
                for copy in &copies {
                    insert_message(tx, copy)?;
                }
                Ok(conversation)
            })
            .await
        }

        pub(in crate::sqlite) async fn register_instance(
            self: &Arc<Self>,
            id: InstanceId,
            host: &str,
            pid: u32,
        ) -> Result<InstanceRecord> {
            let host = host.to_owned();
            let now = Ts::now().0.timestamp_micros();
            self.write(move |tx| {
                let values = numbered(&[&id.0, &host, &pid, &now]);
                let (id, host, pid, started_at, heartbeat_at) = tx
                    .prepare_cached(sql::REGISTER_INSTANCE)?
                    .query_row(values.as_slice(), |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, i64>(4)?,
                        ))
                    })?;
                InstanceRow {
                    id,
                    host,
                    pid,
                    started_at: Ts::from_micros(started_at)?,
                    heartbeat_at: Ts::from_micros(heartbeat_at)?,
                }
                .try_into()
            })
            .await
        }

        pub(in crate::sqlite) async fn heartbeat_instance(
            self: &Arc<Self>,
            id: InstanceId,
        ) -> Result<()> {
            let now = Ts::now().0.timestamp_micros();
            self.write(move |tx| {
                let updated = tx
                    .prepare_cached(sql::HEARTBEAT_INSTANCE)?
                    .execute(numbered(&[&id.0, &now]).as_slice())?;
                if updated == 0 {
                    return Err(StoreError::InstanceNotFound(id));
                }
                Ok(())
            })
            .await
        }

        pub(in crate::sqlite) async fn forget_instances(
            self: &Arc<Self>,
            silent_since: chrono::DateTime<chrono::Utc>,
        ) -> Result<u64> {
            let before = Ts::from(silent_since).0.timestamp_micros();
            self.write(move |tx| {
                let deleted = tx
                    .prepare_cached(sql::FORGET_INSTANCES)?
                    .execute(numbered(&[&before]).as_slice())?;
                // A count of rows always fits.
                Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
            })
            .await
        }

        pub(in crate::sqlite) async fn start_run(
            self: &Arc<Self>,
            id: RunId,
            conversation: ConversationId,
            owner: InstanceId,
        ) -> Result<()> {
            let now = Ts::now().0.timestamp_micros();
            self.write(move |tx| {
                let inserted = tx
                    .prepare_cached(sql::START_RUN)?
                    .execute(numbered(&[&id.0, &conversation.0, &now, &owner.0]).as_slice())?;
                if inserted == 0 {
                    return Err(StoreError::ConversationNotFound(conversation));
                }
                Ok(())
            })
            .await
        }

        pub(in crate::sqlite) async fn finish_run(
            self: &Arc<Self>,
            id: RunId,
            reason: StopReason,
            error: Option<&str>,
        ) -> Result<()> {
            let error = error.map(str::to_owned);
            let now = Ts::now().0.timestamp_micros();
            self.write(move |tx| {
                let updated = tx
                    .prepare_cached(sql::FINISH_RUN)?
                    .execute(numbered(&[&id.0, &reason.as_str(), &error, &now]).as_slice())?;
                if updated == 0 {
                    return Err(StoreError::RunNotFound(id));
                }
                Ok(())
            })
            .await
        }

        pub(in crate::sqlite) async fn interrupt_run(self: &Arc<Self>, id: RunId) -> Result<bool> {
            let now = Ts::now().0.timestamp_micros();
            self.write(move |tx| {
                let updated = tx.prepare_cached(sql::INTERRUPT_RUN)?.execute(
                    numbered(&[&id.0, &StopReason::Interrupted.as_str(), &now]).as_slice(),
                )?;
                if updated > 0 {
                    return Ok(true);
                }
                tx.prepare_cached(sql::RUN_EXISTS)?
                    .query_row(numbered(&[&id.0]).as_slice(), |_| Ok(()))
                    .optional()?
                    .map(|()| false)
                    .ok_or(StoreError::RunNotFound(id))
            })
            .await
        }

        pub(in crate::sqlite) async fn append_events(
            self: &Arc<Self>,
            conversation: ConversationId,
            events: &[AgentEvent],
        ) -> Result<Vec<u64>> {
            let events = event_rows(events)?;
            self.write(move |tx| insert_events(tx, conversation, &events))
                .await
        }
    }

    /// `values` bound to `$1`, `$2` … by name: SQLite numbers the shared
    /// statements' `$N` in the order they first appear, not by `N`.
    fn numbered<'a>(values: &[&'a dyn ToSql]) -> Vec<(&'static str, &'a dyn ToSql)> {
        const NAMES: [&str; 16] = [
            "$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10", "$11", "$12", "$13",
            "$14", "$15", "$16",
        ];
        debug_assert!(values.len() <= NAMES.len());
        NAMES.iter().copied().zip(values.iter().copied()).collect()
    }

    /// A message's content as it is stored (what sqlx's `Json` writes).
    fn content_json(m: &Message) -> Result<String> {
        serde_json::to_string(&m.content).map_err(|e| {
            StoreError::Corrupt(format!(
                "message {}: content cannot be serialised: {e}",
                m.id
            ))
        })
    }

    /// Each event's type and JSON, as they are stored.
    fn event_rows(events: &[AgentEvent]) -> Result<Vec<(String, String)>> {
        events
            .iter()
            .map(|event| {
                let (kind, payload) = rows::event_json(event)?;
                Ok((kind, payload.0.to_string()))
            })
            .collect()
    }

    fn insert_conversation(tx: &Connection, c: &Conversation) -> Result<()> {
        tx.prepare_cached(sql::INSERT_CONVERSATION)?.execute(
            numbered(&[
                &c.id.0,
                &c.title,
                &c.root_id.0,
                &c.active_leaf.0,
                &c.forked_from.map(|f| f.conversation_id.0),
                &c.forked_from.map(|f| f.message_id.0),
                &Ts::from(c.created_at).0.timestamp_micros(),
            ])
            .as_slice(),
        )?;
        Ok(())
    }

    fn insert_message(tx: &Connection, m: &Message) -> Result<()> {
        let v = MessageValues::from(m);
        let content = content_json(m)?;
        let inserted = tx.prepare_cached(sql::INSERT_MESSAGE)?.execute(
            numbered(&[
                &v.id,
                &v.conversation_id,
                &v.parent_id,
                &v.role,
                &content,
                &v.prompt_tokens,
                &v.completion_tokens,
                &v.cached_tokens,
                &v.cost,
                &v.model,
                &v.duration_ms,
                &v.status,
                &v.created_at.0.timestamp_micros(),
            ])
            .as_slice(),
        );
        match inserted {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                Err(StoreError::DuplicateMessage(m.id))
            }
            other => other.map(drop).map_err(Into::into),
        }
    }

    /// Appends `events` (type and JSON) to the conversation's log, numbered
    /// on from its counter.
    fn insert_events(
        tx: &Connection,
        conversation: ConversationId,
        events: &[(String, String)],
    ) -> Result<Vec<u64>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let corrupt =
            |seq: i64| StoreError::Corrupt(format!("conversation {conversation}: event seq {seq}"));
        let count = i64::try_from(events.len()).map_err(|_| corrupt(-1))?;
        let last: i64 = tx
            .prepare_cached(sql::TAKE_EVENT_SEQS)?
            .query_row(numbered(&[&conversation.0, &count]).as_slice(), |r| {
                r.get(0)
            })
            .optional()?
            .ok_or(StoreError::ConversationNotFound(conversation))?;
        let now = Ts::now().0.timestamp_micros();
        let mut insert = tx.prepare_cached(sql::INSERT_EVENT)?;
        let mut seqs = Vec::with_capacity(events.len());
        for (seq, (kind, payload)) in (last - count + 1..).zip(events) {
            insert.execute(numbered(&[&conversation.0, &seq, kind, payload, &now]).as_slice())?;
            seqs.push(u64::try_from(seq).map_err(|_| corrupt(seq))?);
        }
        Ok(seqs)
    }

    fn get_conversation(tx: &Connection, id: ConversationId) -> Result<Conversation> {
        tx.prepare_cached(sql::SELECT_CONVERSATION)?
            .query_row(numbered(&[&id.0]).as_slice(), |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get::<_, i64>(6)?,
                ))
            })
            .optional()?
            .ok_or(StoreError::ConversationNotFound(id))
            .and_then(
                |(id, title, root_id, active_leaf, from_c, from_m, micros)| {
                    ConversationRow {
                        id,
                        title,
                        root_id,
                        active_leaf,
                        forked_from_conversation: from_c,
                        forked_from_message: from_m,
                        created_at: Ts::from_micros(micros)?,
                    }
                    .try_into()
                },
            )
    }
}

crate::sql::impl_store!(
    SqliteStore,
    sqlx::Sqlite,
    begin_write = "BEGIN IMMEDIATE",
    own_writes = writer
);
