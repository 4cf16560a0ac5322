//! The SQLite backend, on rusqlite: one file (`sqlite://PATH`, created if
//! missing) in WAL mode, or `sqlite::memory:` for throwaway stores.
//!
//! On a file, every write method runs its whole transaction in one place,
//! on the backend's one writer connection (see [`writer`]), which also
//! runs the migrations when the store opens ([`migrate`]). Reads go
//! through a few reader connections (see [`reader`]), each read one
//! transaction, so that they see exactly what the writer — and any other
//! process — has committed.
//!
//! Where a call runs: most take tens of microseconds, less than handing
//! them to one of tokio's blocking threads and back costs (two context
//! switches, and the futex waits around them). So a short call runs on
//! the caller's own thread: a write once the writer's connection is its
//! turn (writers wait for it as tasks, not on threads), a point read or a
//! short path when a reader is idle at once (else on a blocking thread).
//! Nothing can make such a call wait on the caller's thread: it runs with
//! no busy handler, and where SQLite would have waited for another
//! process's lock it gives up and runs again on a blocking thread, with
//! the busy timeout; the writer's connection never checkpoints in a
//! commit (see [`writer`]). Lists, long paths, forks and large blobs run
//! on blocking threads. See [`transaction`].
//!
//! A path
//! ([`StoreRead::path_to`]) is read in ranges of its lines while the
//! caller decodes the rows read so far, helped by the reader once it has
//! read them all (see [`raw`]); of a long path the readers keep the
//! messages they decoded, and next time read only the rows added since, as
//! long as the writer can tell that nothing else changed the file meanwhile.
//!
//! An in-memory database is one connection (a second one would see
//! another database): the writer's, which reads too.
//!
//! The SQL is [`crate::sql`]'s, shared with PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};
use toolwire_core::{
    AgentEvent, BlobRef, Conversation, ConversationId, InstanceId, Message, MessageId, RunId,
    StopReason,
};

use crate::rows::{
    ConversationRow, DocumentRow, EventRow, InstanceRow, MessageRow, RunRow, SummaryRow,
    UnfinishedRow,
};
use crate::sql;
use crate::{
    Blob, ConversationSummary, Document, InstanceRecord, RunRecord, Store, StoreError, StoreRead,
    StoredEvent, UnfinishedRun,
};

mod leases;
mod lines;
mod location;
mod migrate;
mod raw;
mod reader;
mod transaction;
mod writer;

pub(crate) use location::Location;
use reader::Readers;
use writer::Writer;

/// How long a writer waits for another one before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Paths of at most this many messages are read on the caller's thread
/// when a reader is idle (a short path takes a few tens of microseconds);
/// longer ones on a blocking thread, decoded as they are read (see
/// [`raw`]).
const INLINE_PATH_ROWS: usize = 128;

/// Pages of events read at once on the caller's thread; larger pages on
/// a blocking thread.
const INLINE_EVENTS: u32 = 16;

/// Whether a store call may run on the caller's thread (see the module's
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inline {
    /// If its connection is free at once; else on a blocking thread.
    Try,
    /// On a blocking thread: it may take a while.
    Never,
}

/// A [`Store`](crate::Store) in an SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<Writer>,
    /// The file's readers; `None` for an in-memory database, which reads
    /// through the writer's connection.
    readers: Option<Arc<Readers>>,
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the database at `url`.
    pub async fn open(url: &str) -> crate::Result<Self> {
        let location = Location::parse(url)?;
        let readers = match &location {
            Location::File(path) => Some(Arc::new(Readers::new(path.clone(), true))),
            Location::Memory => None,
        };
        let writer = Arc::new(Writer::new(location));
        writer.migrate().await?;
        Ok(SqliteStore { writer, readers })
    }

    /// Whether the store keeps what it decoded of long paths, to read only
    /// their new rows next time (on by default; a file only). Off, every
    /// [`StoreRead::path_to`](crate::StoreRead::path_to) reads the path
    /// whole: the benchmark measures whole reads this way.
    pub fn keep_paths(mut self, keep: bool) -> Self {
        if let Some(readers) = &mut self.readers {
            *readers = Arc::new(Readers::new(readers.file().to_owned(), keep));
        }
        self
    }

    /// Closes the connections (an in-memory database is gone after this).
    pub async fn close(&self) {
        if let Some(readers) = &self.readers {
            readers.close();
        }
        self.writer.close().await;
    }

    /// Runs `f`, a read, in one transaction: on a reader of the file, or on
    /// the in-memory database's one connection; on the caller's thread if
    /// `inline` allows it and a connection is free at once.
    async fn read<T: Send + 'static>(
        &self,
        inline: Inline,
        mut f: impl FnMut(&Connection) -> crate::Result<T> + Send + 'static,
    ) -> crate::Result<T> {
        match &self.readers {
            Some(readers) => {
                if inline == Inline::Try
                    && let Some(done) = readers.now(&mut f)
                {
                    return done;
                }
                let turn = readers.turn().await;
                let readers = Arc::clone(readers);
                blocking(move || {
                    let _turn = turn;
                    readers.read(f)
                })
                .await
            }
            None => self.writer.read(inline, f).await,
        }
    }

    /// A point read: on the caller's thread when it can be.
    async fn point<T: Send + 'static>(
        &self,
        f: impl FnMut(&Connection) -> crate::Result<T> + Send + 'static,
    ) -> crate::Result<T> {
        self.read(Inline::Try, f).await
    }

    /// A list (of any length): on a blocking thread.
    async fn list<T: Send + 'static>(
        &self,
        f: impl FnMut(&Connection) -> crate::Result<T> + Send + 'static,
    ) -> crate::Result<T> {
        self.read(Inline::Never, f).await
    }

    /// [`StoreRead::path_to`](crate::StoreRead::path_to).
    async fn read_path(&self, leaf: MessageId) -> crate::Result<Vec<Message>> {
        let Some(readers) = &self.readers else {
            return self
                .writer
                .read(Inline::Never, move |conn| lines::read_path(conn, leaf))
                .await;
        };
        // A short path at once, if a reader is idle; a long one (or one
        // whose lines are kept) is left to the blocking read below.
        let short = readers.now(&mut |conn| {
            lines::short_path(conn, leaf, INLINE_PATH_ROWS, |line| readers.keeps(line))
        });
        match short {
            Some(Ok(Some(path))) => return Ok(path),
            Some(Err(e)) => return Err(e),
            Some(Ok(None)) | None => {}
        }
        let (reader, writer) = (Arc::clone(readers), Arc::clone(&self.writer));
        let handoff = Arc::new(raw::Handoff::default());
        let mut sink = raw::Sink::new(Arc::clone(&handoff), Arc::clone(readers.pool()));
        let turn = readers.turn().await;
        let read = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let read = reader.path(&writer, leaf, &mut sink);
            if read.is_ok() {
                sink.help();
            }
            read
        });
        // Decoded here while the reader reads on (see [`raw`]).
        let decoded = handoff.decode(readers.pool()).await;
        let read = joined(read).await?;
        Ok(readers.finish(read, decoded?))
    }
}

/// Runs `f` on one of tokio's blocking threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    joined(tokio::task::spawn_blocking(f)).await
}

/// What a blocking task returned.
async fn joined<T>(task: tokio::task::JoinHandle<crate::Result<T>>) -> crate::Result<T> {
    match task.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(crate::StoreError::Closed),
    }
}

/// Every row `sql` selects for `params`, each read by `row` and converted.
/// `params` bind by position: every statement read this way names its
/// parameters `$1`, `$2` … in the order they first appear (SQLite numbers
/// them so; the writer binds by name where they are not).
fn all<R, T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    row: fn(&rusqlite::Row<'_>) -> rusqlite::Result<R>,
) -> crate::Result<Vec<T>>
where
    T: TryFrom<R, Error = StoreError>,
{
    let mut statement = conn.prepare_cached(sql)?;
    let rows = statement.query_map(params, row)?;
    rows.map(|r| T::try_from(r?)).collect()
}

/// The row `sql` selects for `params`, if any, read by `row` and converted.
fn one<R, T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    row: fn(&rusqlite::Row<'_>) -> rusqlite::Result<R>,
) -> crate::Result<Option<T>>
where
    T: TryFrom<R, Error = StoreError>,
{
    conn.prepare_cached(sql)?
        .query_row(params, row)
        .optional()?
        .map(T::try_from)
        .transpose()
}

fn get_conversation(conn: &Connection, id: ConversationId) -> crate::Result<Conversation> {
    one(
        conn,
        sql::SELECT_CONVERSATION,
        [id.0],
        ConversationRow::from_sqlite,
    )?
    .ok_or(StoreError::ConversationNotFound(id))
}

#[async_trait]
impl StoreRead for SqliteStore {
    async fn conversation(&self, id: ConversationId) -> crate::Result<Conversation> {
        self.point(move |conn| get_conversation(conn, id)).await
    }

    async fn list_conversations(&self) -> crate::Result<Vec<ConversationSummary>> {
        self.list(|conn| all(conn, sql::LIST_CONVERSATIONS, [], SummaryRow::from_sqlite))
            .await
    }

    async fn message(&self, id: MessageId) -> crate::Result<Message> {
        self.point(move |conn| one(conn, sql::SELECT_MESSAGE, [id.0], MessageRow::from_sqlite))
            .await?
            .ok_or(StoreError::MessageNotFound(id))
    }

    async fn path_to(&self, leaf: MessageId) -> crate::Result<Vec<Message>> {
        self.read_path(leaf).await
    }

    async fn children(&self, id: MessageId) -> crate::Result<Vec<Message>> {
        let found = self
            .list(move |conn| {
                all(
                    conn,
                    sql::CHILDREN_AND_SELF,
                    [id.0],
                    MessageRow::from_sqlite,
                )
            })
            .await?;
        sql::children_only(found, id)
    }

    async fn siblings(&self, id: MessageId) -> crate::Result<Vec<Message>> {
        let found = self
            .list(move |conn| all(conn, sql::SIBLINGS, [id.0], MessageRow::from_sqlite))
            .await?;
        sql::some(found, StoreError::MessageNotFound(id))
    }

    async fn leaves(&self, conversation: ConversationId) -> crate::Result<Vec<Message>> {
        let found = self
            .list(move |conn| all(conn, sql::LEAVES, [conversation.0], MessageRow::from_sqlite))
            .await?;
        sql::some(found, StoreError::ConversationNotFound(conversation))
    }

    async fn total_cost(&self, conversation: ConversationId) -> crate::Result<f64> {
        self.list(move |conn| {
            Ok(conn
                .prepare_cached(sql::TOTAL_COST)?
                .query_row([conversation.0], |r| r.get(0))
                .optional()?)
        })
        .await?
        .ok_or(StoreError::ConversationNotFound(conversation))
    }

    async fn instance(&self, id: InstanceId) -> crate::Result<Option<InstanceRecord>> {
        self.point(move |conn| one(conn, sql::SELECT_INSTANCE, [id.0], InstanceRow::from_sqlite))
            .await
    }

    async fn run(&self, id: RunId) -> crate::Result<RunRecord> {
        self.point(move |conn| one(conn, sql::SELECT_RUN, [id.0], RunRow::from_sqlite))
            .await?
            .ok_or(StoreError::RunNotFound(id))
    }

    async fn unfinished_runs(&self) -> crate::Result<Vec<UnfinishedRun>> {
        self.list(|conn| all(conn, sql::UNFINISHED_RUNS, [], UnfinishedRow::from_sqlite))
            .await
    }

    async fn conversation_unfinished_runs(
        &self,
        conversation: ConversationId,
    ) -> crate::Result<Vec<UnfinishedRun>> {
        // Rarely more than one: read at once, like a single row.
        self.point(move |conn| {
            all(
                conn,
                sql::CONVERSATION_UNFINISHED_RUNS,
                [conversation.0],
                UnfinishedRow::from_sqlite,
            )
        })
        .await
    }

    async fn events_since(
        &self,
        conversation: ConversationId,
        after: u64,
        limit: u32,
    ) -> crate::Result<Vec<StoredEvent>> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let inline = if limit <= INLINE_EVENTS {
            Inline::Try
        } else {
            Inline::Never
        };
        self.read(inline, move |conn| {
            let mut statement = conn.prepare_cached(sql::EVENTS_SINCE)?;
            let events = statement
                .query_map(
                    (conversation.0, after, i64::from(limit)),
                    EventRow::from_sqlite,
                )?
                .map(|e| e?.into_event(conversation))
                .collect::<crate::Result<Vec<_>>>()?;
            if events.is_empty() {
                // Nothing new, or no such conversation?
                get_conversation(conn, conversation)?;
            }
            Ok(events)
        })
        .await
    }

    async fn document(&self, kind: &str, id: &str) -> crate::Result<Option<Document>> {
        let (kind, id) = (kind.to_owned(), id.to_owned());
        self.point(move |conn| {
            one(
                conn,
                sql::SELECT_DOCUMENT,
                (&kind, &id),
                DocumentRow::from_sqlite,
            )
        })
        .await
    }

    async fn blob(&self, sha256: &str) -> crate::Result<Option<Blob>> {
        let sha256 = sha256.to_owned();
        // A blob may be large: copied out on a blocking thread.
        self.list(move |conn| {
            Ok(conn
                .prepare_cached(sql::SELECT_BLOB)?
                .query_row([&sha256], |r| {
                    Ok(Blob {
                        media_type: r.get(0)?,
                        bytes: r.get(1)?,
                    })
                })
                .optional()?)
        })
        .await
    }

    async fn documents(&self, kind: &str) -> crate::Result<Vec<Document>> {
        let kind = kind.to_owned();
        self.list(move |conn| {
            all(
                conn,
                sql::SELECT_DOCUMENTS,
                [&kind],
                DocumentRow::from_sqlite,
            )
        })
        .await
    }

    async fn messages(&self, conversation: ConversationId) -> crate::Result<Vec<Message>> {
        let found = self
            .list(move |conn| {
                all(
                    conn,
                    sql::CONVERSATION_MESSAGES,
                    [conversation.0],
                    MessageRow::from_sqlite,
                )
            })
            .await?;
        sql::some(found, StoreError::ConversationNotFound(conversation))
    }

    async fn conversation_and_document(
        &self,
        id: ConversationId,
        kind: &str,
        document: &str,
    ) -> crate::Result<(Conversation, Option<Document>)> {
        let (kind, document) = (kind.to_owned(), document.to_owned());
        self.point(move |conn| {
            let conversation = get_conversation(conn, id)?;
            let document = one(
                conn,
                sql::SELECT_DOCUMENT,
                (&kind, &document),
                DocumentRow::from_sqlite,
            )?;
            Ok((conversation, document))
        })
        .await
    }
}

#[async_trait]
impl Store for SqliteStore {
    /// Leases on a file beside the database (`leases.rs`), so that
    /// processes sharing the file never run two turns in a conversation;
    /// an in-memory database has one process.
    async fn cluster(&self, _me: InstanceId) -> crate::Result<Arc<dyn crate::cluster::Cluster>> {
        match &self.readers {
            Some(readers) => Ok(Arc::new(leases::FileLeases::open(readers.file())?)),
            None => Ok(Arc::new(crate::cluster::Alone)),
        }
    }

    async fn create_conversation(
        &self,
        system_prompt: &str,
        title: Option<&str>,
    ) -> crate::Result<Conversation> {
        self.writer.create_conversation(system_prompt, title).await
    }

    async fn append_with_events(
        &self,
        message: &Message,
        events: &[AgentEvent],
    ) -> crate::Result<Vec<u64>> {
        self.writer.append_with_events(message, events).await
    }

    async fn update(&self, message: &Message) -> crate::Result<()> {
        self.writer.update(message).await
    }

    async fn set_active_leaf(
        &self,
        conversation: ConversationId,
        leaf: MessageId,
    ) -> crate::Result<()> {
        self.writer.set_active_leaf(conversation, leaf).await
    }

    async fn fork(&self, at: MessageId) -> crate::Result<Conversation> {
        self.writer.fork(at).await
    }

    async fn register_instance(
        &self,
        id: InstanceId,
        host: &str,
        pid: u32,
    ) -> crate::Result<InstanceRecord> {
        self.writer.register_instance(id, host, pid).await
    }

    async fn heartbeat_instance(&self, id: InstanceId) -> crate::Result<()> {
        self.writer.heartbeat_instance(id).await
    }

    async fn forget_instances(
        &self,
        silent_since: chrono::DateTime<chrono::Utc>,
    ) -> crate::Result<u64> {
        self.writer.forget_instances(silent_since).await
    }

    async fn start_run(
        &self,
        id: RunId,
        conversation: ConversationId,
        owner: InstanceId,
    ) -> crate::Result<()> {
        self.writer.start_run(id, conversation, owner).await
    }

    async fn finish_run(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
    ) -> crate::Result<()> {
        self.writer.finish_run(id, reason, error).await
    }

    async fn finish_run_with_events(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> crate::Result<Vec<u64>> {
        self.writer
            .finish_run_with_events(id, reason, error, conversation, events)
            .await
    }

    async fn finish_run_with_message(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        message: &Message,
        events: &[AgentEvent],
    ) -> crate::Result<Vec<u64>> {
        self.writer
            .finish_run_with_message(id, reason, error, message, events)
            .await
    }

    async fn interrupt_run(&self, id: RunId) -> crate::Result<bool> {
        self.writer.interrupt_run(id).await
    }

    async fn start_run_with_message(
        &self,
        id: RunId,
        owner: InstanceId,
        message: &Message,
        events: &[AgentEvent],
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> crate::Result<Vec<u64>> {
        self.writer
            .start_run_with_message(id, owner, message, events, documents)
            .await
    }

    async fn append_events(
        &self,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> crate::Result<Vec<u64>> {
        self.writer.append_events(conversation, events).await
    }

    async fn delete_document(&self, kind: &str, id: &str) -> crate::Result<bool> {
        self.writer.delete_document(kind, id).await
    }

    async fn put_blob(&self, media_type: &str, bytes: &[u8]) -> crate::Result<BlobRef> {
        self.writer.put_blob(media_type, bytes).await
    }

    async fn write_documents(
        &self,
        kind: &str,
        changes: &[(String, Option<serde_json::Value>)],
    ) -> crate::Result<()> {
        self.writer.write_documents(kind, changes).await
    }

    async fn put_documents(
        &self,
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> crate::Result<()> {
        self.writer.put_documents(documents).await
    }
}
