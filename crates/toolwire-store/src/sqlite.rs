//! The SQLite backend: one file (`sqlite://PATH`, created if missing) in
//! WAL mode, or `sqlite::memory:` for throwaway stores.
//!
//! Everything goes through sqlx, except [`Store::path_to`](crate::Store)
//! on a file: it reads through its own `rusqlite` connections, on tokio's
//! blocking threads. sqlx's SQLite driver copies every value of every row
//! it returns (and hands the rows over from its worker thread one by one),
//! which made a 10,000-message path cost some 40 ms more than reading it;
//! rusqlite reads the values in place. Both libraries link the one SQLite
//! library (`libsqlite3-sys`), and each read is a transaction of its own on
//! the file, so these readers see exactly what the sqlx connections — and
//! any other process — have committed: nothing is cached.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use reader::Readers;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

/// How long a writer waits for another one before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A [`Store`](crate::Store) in an SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The file's own readers; `None` for an in-memory database, which only
    /// the sqlx connection can see.
    readers: Option<Arc<Readers>>,
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
        Ok(SqliteStore { pool, readers })
    }

    /// Closes the connections (waiting for the ones in use).
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(readers) = &self.readers {
            readers.close();
        }
    }

    /// [`Store::path_to`](crate::Store::path_to).
    async fn read_path(&self, leaf: MessageId) -> Result<Vec<Message>> {
        let Some(readers) = &self.readers else {
            let mut conn = self.pool.acquire().await?;
            return Self::path(&mut conn, leaf).await;
        };
        let readers = Arc::clone(readers);
        match tokio::task::spawn_blocking(move || readers.path(leaf)).await {
            Ok(path) => path,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(sqlx::Error::WorkerCrashed.into()),
        }
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
            let path = read_path(&mut conn, leaf)?;
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

    /// The path to `leaf`, root first, in one read transaction (one snapshot).
    fn read_path(conn: &mut Connection, leaf: MessageId) -> Result<Vec<Message>> {
        let tx = conn.transaction()?;
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
        drop(segment);
        tx.commit()?;
        Ok(path)
    }
}

crate::sql::impl_store!(SqliteStore, sqlx::Sqlite, begin_write = "BEGIN IMMEDIATE");
