//! The SQLite backend: one file (`sqlite://PATH`, created if missing) in
//! WAL mode, or `sqlite::memory:` for throwaway stores.
//!
//! On a file, reads go through sqlx, except [`Store::path_to`](crate::Store):
//! it reads through the backend's own `rusqlite` connections, on tokio's
//! blocking threads, while the caller decodes the rows read so far, helped
//! by the reader once it has read them all (see [`raw`]). sqlx's SQLite driver copies every value of every row
//! it returns (and hands the rows over from its worker thread one by one),
//! which made a 10,000-message path cost some 40 ms more than reading it;
//! rusqlite reads the values in place. Both libraries link the one SQLite
//! library (`libsqlite3-sys`), and each read is a transaction of its own on
//! the file, so these readers see exactly what the other connections — and
//! any other process — have committed. Of a long path the readers keep the
//! messages they decoded (reading and decoding them is most of the cost),
//! and next time read only the rows added since, as long as the writer can
//! tell that nothing else changed the file meanwhile (see [`reader`]).
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

mod raw;

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
            (!in_memory).then(|| Arc::new(Readers::new(options.get_filename().to_owned(), true)));
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
        crate::migrate!(&pool, "./migrations/sqlite")?;
        Ok(SqliteStore {
            pool,
            readers,
            writer,
        })
    }

    /// Whether the store keeps what it decoded of long paths, to read only
    /// their new rows next time (on by default; a file only). Off, every
    /// [`Store::path_to`](crate::Store::path_to) reads the path whole: the
    /// benchmark measures whole reads this way.
    pub fn keep_paths(mut self, keep: bool) -> Self {
        if let Some(readers) = &mut self.readers {
            *readers = Arc::new(Readers::new(readers.file().to_owned(), keep));
        }
        self
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
        let (Some(readers), Some(writer)) = (&self.readers, &self.writer) else {
            let mut conn = self.pool.acquire().await?;
            return Self::path(&mut conn, leaf).await;
        };
        let (reader, writer) = (Arc::clone(readers), Arc::clone(writer));
        let handoff = Arc::new(raw::Handoff::default());
        let mut sink = raw::Sink::new(Arc::clone(&handoff), Arc::clone(readers.pool()));
        let read = tokio::task::spawn_blocking(move || {
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
        Err(_) => Err(sqlx::Error::WorkerCrashed.into()),
    }
}

/// The file's own readers (rusqlite), and the lines of paths they keep.
mod reader {
    use std::collections::HashMap;
    use std::collections::hash_map::Entry;
    use std::fmt;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

    use rusqlite::{Connection, OpenFlags, OptionalExtension};
    use toolwire_core::{Message, MessageId};
    use uuid::Uuid;

    use super::BUSY_TIMEOUT;
    use super::raw::{Decoded, Sink};
    use super::writer::{Stamp, Writer};
    use crate::{Result, StoreError};

    /// How much of the file a reader maps (address space, not memory).
    const READER_MMAP_SIZE: i64 = 1 << 28;

    /// Idle connections kept for reuse; more are opened when needed.
    const IDLE_READERS: usize = 4;

    /// Paths shorter than this are read whole every time (a 1,000-message
    /// path takes well under a millisecond), so that a process holding many
    /// short conversations keeps nothing of them.
    const KEEP_FROM: usize = 1_000;

    /// About how much memory the kept messages may take; the lines used
    /// longest ago go first. A 10,000-message path of short messages takes
    /// some 4 MiB.
    const KEPT_BYTES: usize = 32 << 20;

    /// rusqlite connections to the store's file, for reads only.
    #[derive(Debug)]
    pub(super) struct Readers {
        path: PathBuf,
        idle: Mutex<Vec<Connection>>,
        /// Whether paths are kept at all (see [`SqliteStore::keep_paths`]).
        ///
        /// [`SqliteStore::keep_paths`]: super::SqliteStore::keep_paths
        keep: bool,
        kept: Mutex<Kept>,
        /// Chunk buffers for the reads' rows (see [`raw::Pool`]).
        pool: Arc<super::raw::Pool>,
    }

    impl Readers {
        pub(super) fn new(path: PathBuf, keep: bool) -> Readers {
            Readers {
                path,
                idle: Mutex::new(Vec::new()),
                keep,
                kept: Mutex::new(Kept::default()),
                pool: Arc::default(),
            }
        }

        pub(super) fn pool(&self) -> &Arc<super::raw::Pool> {
            &self.pool
        }

        pub(super) fn file(&self) -> &std::path::Path {
            &self.path
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

        fn kept(&self) -> MutexGuard<'_, Kept> {
            self.kept.lock().unwrap_or_else(PoisonError::into_inner)
        }

        pub(super) fn close(&self) {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            *self.kept() = Kept::default();
        }

        /// The path to `leaf` (blocking), to be finished by
        /// [`Readers::finish`]. A connection that failed is dropped rather
        /// than reused.
        ///
        /// The read's snapshot is taken while `writer` holds still (see
        /// [`Writer::quiet`]). When its stamp is the one the kept lines were
        /// read under, nothing but this store's inserts has reached the file
        /// since: stored messages are never deleted and change only through
        /// an update, so the kept part of each line is what this snapshot
        /// holds, and only the rows after it are read.
        ///
        /// The rows not kept are sent to `sink` raw, in path order, for the
        /// caller to decode.
        pub(super) fn path(
            &self,
            writer: &Writer,
            leaf: MessageId,
            sink: &mut Sink,
        ) -> Result<PathRead> {
            let mut conn = self.take()?;
            // One read transaction: one snapshot.
            let tx = conn.transaction()?;
            let ((conversation, segments), stamp) = writer.quiet(|| segments(&tx, leaf))?;
            let kept = stamp
                .filter(|_| self.keep)
                .and_then(|stamp| self.kept().lines(stamp, &segments));
            let read = match stamp.zip(kept) {
                None => {
                    let mut ranges = Vec::with_capacity(segments.len());
                    let mut len = 0;
                    for &(line, upto) in &segments {
                        let (rows, first) = count(&tx, line, 0, upto)?;
                        len += rows;
                        ranges.push(Range {
                            line,
                            after: 0,
                            upto,
                            rows,
                            first,
                            parent: None,
                        });
                    }
                    sink.start(conversation, len);
                    read_raw(&tx, &ranges, sink)?;
                    PathRead::Whole
                }
                Some((stamp, kept)) => {
                    let mut parts = Vec::with_capacity(segments.len());
                    let mut ranges = Vec::new();
                    // The message before the next one on the path, when it
                    // is kept; `None` when it is read.
                    let mut last: Option<Option<Uuid>> = Some(None);
                    let mut len = 0;
                    for (&(line, upto), chunks) in segments.iter().zip(kept) {
                        let mut part = Part {
                            line,
                            on_path: 0,
                            after: None,
                            fresh: 0,
                            kept: Vec::new(),
                        };
                        for chunk in &chunks {
                            let n = chunk.partition_point(|r| r.seq <= upto);
                            part.on_path += n;
                            if let Some(r) = chunk[..n].last() {
                                last = Some(Some(r.message.id.0));
                            }
                        }
                        let kept_last = chunks.last().and_then(|c| c.last());
                        if kept_last.is_none_or(|r| r.seq < upto) {
                            let after = kept_last.map_or(0, |r| r.seq);
                            let (fresh, first) = count(&tx, line, after, upto)?;
                            part.fresh = fresh;
                            part.after = Some(after);
                            if part.fresh > 0 {
                                ranges.push(Range {
                                    line,
                                    after,
                                    upto,
                                    rows: part.fresh,
                                    first,
                                    parent: last,
                                });
                                last = None;
                            }
                        }
                        len += part.fresh;
                        part.kept = chunks;
                        parts.push(part);
                    }
                    sink.start(conversation, len);
                    read_raw(&tx, &ranges, sink)?;
                    PathRead::Kept { stamp, parts }
                }
            };
            tx.commit()?;
            self.give_back(conn);
            Ok(read)
        }

        /// The messages of a path read by [`Readers::path`], copied from the
        /// kept lines, and the rows just read kept with them (if the path is
        /// long enough). This runs on the caller's thread, so that the path
        /// is allocated where it will be freed: copied on a blocking thread,
        /// a 10,000-message path took four times as long in the benchmark
        /// (5–6 ms against 1.2–1.4), glibc handing the memory back to the
        /// system after each read and freeing it across threads.
        pub(super) fn finish(&self, read: PathRead, decoded: Decoded) -> Vec<Message> {
            let (stamp, parts) = match read {
                PathRead::Whole => return decoded.messages,
                PathRead::Kept { stamp, parts } => (stamp, parts),
            };
            let len = parts.iter().map(|p| p.on_path + p.fresh).sum();
            let keep = len >= KEEP_FROM;
            let mut path = Vec::with_capacity(len);
            let mut read = Vec::new();
            let mut fresh = decoded
                .messages
                .into_iter()
                .zip(decoded.seqs)
                .zip(decoded.sizes)
                .map(|((message, seq), size)| Row { seq, message, size });
            for part in parts {
                let mut left = part.on_path;
                for chunk in &part.kept {
                    let n = left.min(chunk.len());
                    path.extend(chunk[..n].iter().map(|r| r.message.clone()));
                    left -= n;
                }
                let rows = fresh.by_ref().take(part.fresh);
                match part.after {
                    Some(after) if keep => {
                        let rows: Vec<Row> = rows.collect();
                        path.extend(rows.iter().map(|r| r.message.clone()));
                        read.push((part.line, after, rows));
                    }
                    _ => path.extend(rows.map(|r| r.message)),
                }
            }
            if keep {
                self.kept().keep(stamp, read);
            }
            path
        }
    }

    /// A path as [`Readers::path`] reads it.
    pub(super) enum PathRead {
        /// Read whole (every row sent raw): nothing could be kept.
        Whole,
        /// Per line crossed, root first: the kept rows and those read after
        /// them.
        Kept { stamp: Stamp, parts: Vec<Part> },
    }

    pub(super) struct Part {
        line: Uuid,
        /// The line as kept when the read began.
        kept: Vec<Arc<Vec<Row>>>,
        /// How many kept rows are on the path.
        on_path: usize,
        /// The seq the rows read follow, when rows were read.
        after: Option<i64>,
        /// How many rows were read (sent raw, in path order).
        fresh: usize,
    }

    /// A message as it is kept, with its place in its line.
    #[derive(Debug, Clone)]
    struct Row {
        seq: i64,
        message: Message,
        /// About how much memory the message takes.
        size: usize,
    }

    /// Lines of paths already read, each from its first message on, and
    /// the writer's [`Stamp`] they were read under.
    #[derive(Default)]
    struct Kept {
        stamp: Option<Stamp>,
        lines: HashMap<Uuid, Line>,
        bytes: usize,
        clock: u64,
    }

    struct Line {
        /// The rows in chunks, each shared with the reads copying from it
        /// (so that no lock is held while they do) and never changed; a
        /// chunk no longer than the next is merged into it when that is
        /// added, which keeps them few.
        chunks: Vec<Arc<Vec<Row>>>,
        bytes: usize,
        used: u64,
    }

    impl Line {
        fn last_seq(&self) -> Option<i64> {
            self.chunks.last().and_then(|c| c.last()).map(|r| r.seq)
        }

        fn push(&mut self, rows: Vec<Row>) {
            let mut rows = rows;
            while let Some(previous) = self.chunks.pop_if(|c| c.len() <= rows.len()) {
                // Copied only if a read still holds it.
                let mut merged = Arc::unwrap_or_clone(previous);
                merged.append(&mut rows);
                rows = merged;
            }
            self.chunks.push(Arc::new(rows));
        }
    }

    impl fmt::Debug for Kept {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Kept")
                .field("stamp", &self.stamp)
                .field("lines", &self.lines.len())
                .field("bytes", &self.bytes)
                .finish()
        }
    }

    impl Kept {
        /// What is kept of each of `segments`' lines, for a snapshot stamped
        /// `stamp`; `None` for a snapshot older than the kept lines.
        fn lines(
            &mut self,
            stamp: Stamp,
            segments: &[(Uuid, i64)],
        ) -> Option<Vec<Vec<Arc<Vec<Row>>>>> {
            match self.stamp {
                Some(kept) if kept == stamp => {}
                Some(kept) if kept > stamp => return None,
                // Something else than this store's inserts reached the file
                // (or nothing is kept yet).
                _ => {
                    *self = Kept {
                        stamp: Some(stamp),
                        ..Kept::default()
                    }
                }
            }
            self.clock += 1;
            let clock = self.clock;
            Some(
                segments
                    .iter()
                    .map(|(line, _)| {
                        self.lines.get_mut(line).map_or_else(Vec::new, |l| {
                            l.used = clock;
                            l.chunks.clone()
                        })
                    })
                    .collect(),
            )
        }

        /// Adds rows read under `stamp`: for each line, those after `after`
        /// (its last kept seq, or 0 from its start).
        fn keep(&mut self, stamp: Stamp, read: Vec<(Uuid, i64, Vec<Row>)>) {
            if self.stamp != Some(stamp) {
                return;
            }
            for (line, after, rows) in read {
                if rows.is_empty() {
                    continue;
                }
                let bytes: usize = rows.iter().map(|r| r.size).sum();
                match self.lines.entry(line) {
                    Entry::Occupied(mut kept) => {
                        let kept = kept.get_mut();
                        // Another read may have extended it meanwhile.
                        if kept.last_seq() == Some(after) {
                            kept.push(rows);
                            kept.bytes += bytes;
                            self.bytes += bytes;
                        }
                    }
                    Entry::Vacant(slot) => {
                        if after == 0 {
                            slot.insert(Line {
                                chunks: vec![Arc::new(rows)],
                                bytes,
                                used: self.clock,
                            });
                            self.bytes += bytes;
                        }
                    }
                }
            }
            while self.bytes > KEPT_BYTES {
                let Some((&oldest, _)) = self.lines.iter().min_by_key(|(_, l)| l.used) else {
                    break;
                };
                if let Some(line) = self.lines.remove(&oldest) {
                    self.bytes -= line.bytes;
                }
            }
        }
    }

    /// The lines the path to `leaf` crosses, leaf first: each line's id and
    /// the seq of its last message on the path.
    const PATH_SEGMENTS: &str = "WITH RECURSIVE seg (line, upto) AS ( \
             SELECT line, seq FROM messages WHERE id = ?1 \
             UNION ALL \
             SELECT p.line, p.seq FROM seg \
             JOIN messages f ON f.id = seg.line \
             JOIN messages p ON p.id = f.parent_id) \
         SELECT line, upto FROM seg";

    /// The columns a path read takes of each message, in the order
    /// `raw::Sink::push` and `read_rows` read them: the small ones as the
    /// one generated column `fields` (see [`crate::rows::Fields`]), since
    /// every column taken costs about as much as the rest of the row. The
    /// conversation and the parent are known (the leaf's conversation, the
    /// message before), so they are not read again.
    macro_rules! line_rows {
        ($from_where:literal) => {
            concat!(
                "SELECT seq, id, content, cost, fields ",
                $from_where,
                " ORDER BY seq"
            )
        };
    }

    /// Messages of a line in a range of seqs, in order: one range of the
    /// `(line, seq)` index.
    pub(super) const LINE_ROWS: &str =
        line_rows!("FROM messages WHERE line = ?1 AND seq > ?2 AND seq <= ?3");

    /// [`LINE_ROWS`] through the table's own order (seq is the rowid)
    /// rather than the line's index, skipping other lines' rows in the seq
    /// range: when the line holds most of the range (a conversation
    /// written alone), a step down the table is cheaper than one along the
    /// index followed by a seek into the table.
    pub(super) const LINE_ROWS_BY_SEQ: &str =
        line_rows!("FROM messages NOT INDEXED WHERE seq > ?2 AND seq <= ?3 AND line = ?1");

    /// [`LINE_ROWS_BY_SEQ`] for a range that holds nothing but the line's
    /// rows (as many as the range has seqs): no row needs its line checked.
    /// `?1` is bound but not used, so that all three take the same values.
    pub(super) const LINE_ONLY_ROWS: &str =
        line_rows!("FROM messages NOT INDEXED WHERE seq > ?2 AND seq <= ?3 AND ?1 IS NOT NULL");

    const LINE_COUNT: &str =
        "SELECT count(*), min(seq) FROM messages WHERE line = ?1 AND seq > ?2 AND seq <= ?3";

    /// The conversation of `leaf` and the lines its path crosses, root
    /// first, each with the seq of its last message on the path.
    fn segments(tx: &Connection, leaf: MessageId) -> Result<(Uuid, Vec<(Uuid, i64)>)> {
        let conversation: Uuid = tx
            .prepare_cached("SELECT conversation_id FROM messages WHERE id = ?1")?
            .query_row([leaf.0], |r| r.get(0))
            .optional()?
            .ok_or(StoreError::MessageNotFound(leaf))?;
        let mut segments = tx
            .prepare_cached(PATH_SEGMENTS)?
            .query_map([leaf.0], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        segments.reverse();
        Ok((conversation, segments))
    }

    /// The messages of `line` with `after < seq <= upto`: how many (rows
    /// and paths are allocated at their size, where growing a
    /// 10,000-message path by doubling took a fifth of the read: copies,
    /// and page faults on each new buffer), and the first one's seq.
    fn count(tx: &Connection, line: Uuid, after: i64, upto: i64) -> Result<(usize, i64)> {
        let (n, first): (i64, Option<i64>) = tx
            .prepare_cached(LINE_COUNT)?
            .query_row((line, after, upto), |r| Ok((r.get(0)?, r.get(1)?)))?;
        // A count is never negative.
        Ok((usize::try_from(n).unwrap_or(0), first.unwrap_or(upto)))
    }

    /// The path along `segments`, read whole (nothing kept).
    fn read_segments(
        tx: &Connection,
        conversation: Uuid,
        segments: &[(Uuid, i64)],
    ) -> Result<Vec<Message>> {
        let mut len = 0;
        for &(line, upto) in segments {
            len += count(tx, line, 0, upto)?.0;
        }
        let mut path: Vec<Message> = Vec::with_capacity(len);
        for &(line, upto) in segments {
            let parent = path.last().map(|m| m.id.0);
            read_rows(tx, conversation, line, (0, upto), parent, |row| {
                path.push(row.message)
            })?;
        }
        Ok(path)
    }

    /// Messages of a line to read: those with `after < seq <= upto`.
    struct Range {
        line: Uuid,
        after: i64,
        upto: i64,
        /// How many there are, and the first one's seq.
        rows: usize,
        first: i64,
        /// The parent of the first, when it is not the last row read
        /// before it.
        parent: Option<Option<Uuid>>,
    }

    /// The rows of `ranges`, in order, sent raw to `sink`.
    fn read_raw(tx: &Connection, ranges: &[Range], sink: &mut Sink) -> Result<()> {
        let mut last = None;
        for range in ranges {
            let mut parent = range.parent.unwrap_or(last);
            // By seq, other lines' rows between the first and the last
            // cost a step each: the line must hold at least half of them.
            let span = u64::try_from(range.upto - range.first + 1).unwrap_or(u64::MAX);
            let rows = range.rows as u64;
            let (sql, after) = if span == rows {
                (LINE_ONLY_ROWS, range.first - 1)
            } else if span <= 2 * rows {
                (LINE_ROWS_BY_SEQ, range.first - 1)
            } else {
                (LINE_ROWS, range.after)
            };
            let mut statement = tx.prepare_cached(sql)?;
            let mut rows = statement.query((range.line, after, range.upto))?;
            while let Some(r) = rows.next()? {
                parent = Some(sink.push(r, parent)?);
                if sink.given_up() {
                    return Ok(());
                }
            }
            last = parent;
        }
        sink.flush();
        Ok(())
    }

    /// The path to `leaf`, root first, read whole in the transaction going
    /// on on `tx` (the writer's).
    pub(super) fn read_path(tx: &Connection, leaf: MessageId) -> Result<Vec<Message>> {
        let (conversation, segments) = segments(tx, leaf)?;
        read_segments(tx, conversation, &segments)
    }

    /// The messages of `line` with `after < seq <= upto`, in order, each
    /// handed to `each`; the first one's parent is `parent`.
    fn read_rows(
        tx: &Connection,
        conversation: Uuid,
        line: Uuid,
        (after, upto): (i64, i64),
        mut parent: Option<Uuid>,
        mut each: impl FnMut(Row),
    ) -> Result<()> {
        let mut statement = tx.prepare_cached(LINE_ROWS)?;
        let mut rows = statement.query((line, after, upto))?;
        while let Some(r) = rows.next()? {
            let seq: i64 = r.get(0)?;
            let id: Uuid = r.get(1)?;
            let bytes = |i: usize| -> Result<&[u8]> {
                r.get_ref(i)?
                    .as_bytes()
                    .map_err(|e| StoreError::Corrupt(format!("message {id}: column {i}: {e}")))
            };
            let content = bytes(2)?;
            // The decoded content takes about as much as its JSON.
            let mut size = std::mem::size_of::<Row>() + content.len();
            let message = Message::try_from(super::raw::fields(id, bytes(4)?)?.parts(
                id,
                conversation,
                parent,
                content,
                r.get(3)?,
            )?)?;
            size += message.content.len() * std::mem::size_of::<toolwire_core::ContentBlock>()
                + message.model.as_ref().map_or(0, String::capacity);
            parent = Some(id);
            each(Row { seq, message, size });
        }
        Ok(())
    }
}

/// The file's own writer (rusqlite): each write method is one transaction,
/// run whole on one blocking thread, where sqlx's driver would hand every
/// statement to its connection's worker thread and wait for it (some
/// 30–40 µs a statement). The SQL is [`crate::sql`]'s, as the sqlx
/// implementation runs it (PostgreSQL's, and an in-memory database's).
mod writer {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, PoisonError, TryLockError};

    use rusqlite::hooks::Action;
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
    /// Writes on blocking threads at once: one with the connection, the
    /// rest waiting for it.
    const WRITERS_QUEUED: usize = 4;

    #[derive(Debug)]
    pub(in crate::sqlite) struct Writer {
        path: PathBuf,
        /// Opened on first use (the file exists: sqlx created and migrated
        /// it); dropped after a failure that left it in a transaction.
        conn: Mutex<Option<Connection>>,
        /// Taken before a write goes to a blocking thread: beyond the few
        /// writers queued at the connection (so that the next one starts
        /// the moment it is free), writers wait here as tasks rather than
        /// each on a blocking thread of its own (200 clients kept some 250
        /// threads alive, most of them waiting for this one connection).
        queued: Arc<tokio::sync::Semaphore>,
        /// Counts the connections opened and the changes made through them
        /// to stored messages other than inserts: see [`Stamp`].
        generation: Arc<AtomicU64>,
    }

    /// The state of the file as the writer sees it while it holds still
    /// (see [`Writer::quiet`]). Two snapshots taken under one stamp differ
    /// at most by messages this store inserted: `data_version` (of the
    /// writer's connection) changes with every commit of any other
    /// connection, `generation` with this store's own updates (and
    /// deletions) of messages, and with each new writer connection, whose
    /// `data_version` counts afresh. Both only grow, so stamps are ordered
    /// as they were taken.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub(in crate::sqlite) struct Stamp {
        generation: u64,
        data_version: i64,
    }

    impl Writer {
        pub(in crate::sqlite) fn new(path: PathBuf) -> Writer {
            Writer {
                path,
                conn: Mutex::new(None),
                queued: Arc::new(tokio::sync::Semaphore::new(WRITERS_QUEUED)),
                generation: Arc::new(AtomicU64::new(0)),
            }
        }

        /// Runs `f`, a read that takes its snapshot on another connection,
        /// while none of this store's writes can commit, and stamps it:
        /// `None` when the writer is busy (it may be waiting for another
        /// process's writer, for as long as the busy timeout), or when
        /// another connection committed while `f` ran (the snapshot may or
        /// may not hold that commit).
        pub(in crate::sqlite) fn quiet<T>(
            &self,
            f: impl FnOnce() -> Result<T>,
        ) -> Result<(T, Option<Stamp>)> {
            let mut conn = match self.conn.try_lock() {
                Ok(conn) => conn,
                Err(TryLockError::Poisoned(conn)) => conn.into_inner(),
                Err(TryLockError::WouldBlock) => return Ok((f()?, None)),
            };
            if conn.as_ref().is_some_and(|c| !c.is_autocommit()) {
                // Left in a transaction by a failure; the next write reopens.
                return Ok((f()?, None));
            }
            let conn = match &mut *conn {
                Some(conn) => conn,
                none => none.insert(self.open()?),
            };
            let before = self.stamp(conn)?;
            let value = f()?;
            let after = self.stamp(conn)?;
            Ok((value, (before == after).then_some(before)))
        }

        fn stamp(&self, conn: &Connection) -> Result<Stamp> {
            let data_version = conn
                .prepare_cached("PRAGMA data_version")?
                .query_row([], |r| r.get(0))?;
            Ok(Stamp {
                generation: self.generation.load(Ordering::SeqCst),
                data_version,
            })
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
            // Readers keep the messages they read while the stamp holds:
            // any write that changes or removes one (however it comes about,
            // committed or not) must change it.
            self.generation.fetch_add(1, Ordering::SeqCst);
            let generation = Arc::clone(&self.generation);
            conn.update_hook(Some(move |action, _: &str, table: &str, _| {
                if table == "messages" && action != Action::SQLITE_INSERT {
                    generation.fetch_add(1, Ordering::SeqCst);
                }
            }))?;
            Ok(conn)
        }

        /// Runs `f` in one write transaction (`BEGIN IMMEDIATE` … `COMMIT`),
        /// on a blocking thread; an error rolls it back.
        async fn write<T: Send + 'static>(
            self: &Arc<Self>,
            f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
        ) -> Result<T> {
            // The semaphore is never closed: `None` cannot happen.
            let queued = Arc::clone(&self.queued).acquire_owned().await.ok();
            let this = Arc::clone(self);
            blocking(move || {
                // Given back with the connection, not when the caller
                // wakes: the next writer's thread starts at once.
                let _queued = queued;
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

        pub(in crate::sqlite) async fn write_documents(
            self: &Arc<Self>,
            kind: &str,
            changes: &[(String, Option<serde_json::Value>)],
        ) -> Result<()> {
            let kind = kind.to_owned();
            let changes: Vec<(String, Option<String>)> = changes
                .iter()
                .map(|(id, body)| (id.clone(), body.as_ref().map(|b| b.to_string())))
                .collect();
            let now = Ts::now().0.timestamp_micros();
            self.write(move |tx| {
                for (id, body) in &changes {
                    match body {
                        Some(body) => tx
                            .prepare_cached(sql::PUT_DOCUMENT)?
                            .execute(numbered(&[&kind, id, body, &now]).as_slice())?,
                        None => tx
                            .prepare_cached(sql::DELETE_DOCUMENT)?
                            .execute(numbered(&[&kind, id]).as_slice())?,
                    };
                }
                Ok(())
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
