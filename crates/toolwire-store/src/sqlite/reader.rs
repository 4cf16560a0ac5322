//! The file's own readers (rusqlite), and the lines of paths they keep.

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

/// Reads at once (each on a blocking thread with a connection of its
/// own); more wait for one of them as tasks. Their connections are kept
/// for reuse.
const READERS: usize = 8;

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
    /// One permit per read going on (see [`READERS`]).
    slots: Arc<tokio::sync::Semaphore>,
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
            slots: Arc::new(tokio::sync::Semaphore::new(READERS)),
            keep,
            kept: Mutex::new(Kept::default()),
            pool: Arc::default(),
        }
    }

    /// Waits for a read's turn; the read holds the permit while it runs.
    pub(super) async fn turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        // The semaphore is never closed: `None` cannot happen.
        Arc::clone(&self.slots).acquire_owned().await.ok()
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
        // Read-write (the file exists: the writer created and migrated
        // it) so that the WAL index can always be set up, but refusing
        // writes.
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
        if idle.len() < READERS {
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

    /// Runs `f` in one read transaction (one snapshot), blocking. A
    /// connection that failed is dropped rather than reused.
    pub(super) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let mut conn = self.take()?;
        let tx = conn.transaction()?;
        let value = f(&tx)?;
        tx.commit()?;
        self.give_back(conn);
        Ok(value)
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
    fn lines(&mut self, stamp: Stamp, segments: &[(Uuid, i64)]) -> Option<Vec<Vec<Arc<Vec<Row>>>>> {
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
        .prepare_cached(crate::sql::PATH_LINES)?
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
