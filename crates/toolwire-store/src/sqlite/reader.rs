//! The file's own readers (rusqlite), and the lines of paths they keep.
//!
//! Two kinds of reader connection: those of paths read on blocking
//! threads map the file (see [`READER_MMAP_SIZE`]); those of every other
//! read (point reads, lists, short paths) read pages through their own
//! cache. SQLite drops a connection's mapping — an `munmap`, and a TLB
//! shootdown on the other cores — at the start of every read transaction
//! that finds the WAL changed since its last one: under a steady stream
//! of writes, every read. Only a long path's read gains more from the
//! mapping than that costs.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OpenFlags};
use toolwire_core::{Message, MessageId};
use uuid::Uuid;

use super::BUSY_TIMEOUT;
use super::lines::{Range, Row, count, read_raw, segments};
use super::raw::{Decoded, Sink};
use super::transaction::{Begin, configure, is_busy, transaction, without_waiting};
use super::writer::{Stamp, Writer};
use crate::Result;

/// How much of the file a path's reader maps (address space, not
/// memory).
const READER_MMAP_SIZE: i64 = 1 << 28;

/// What a reader connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    /// Paths read on blocking threads: the file mapped.
    Path,
    /// Everything else: pages read into the connection's cache.
    Other,
}

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
    /// Connections kept for reuse, for paths and for other reads.
    idle_paths: Mutex<Vec<Connection>>,
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
            idle_paths: Mutex::new(Vec::new()),
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

    fn idle(&self, to: Use) -> MutexGuard<'_, Vec<Connection>> {
        match to {
            Use::Path => &self.idle_paths,
            Use::Other => &self.idle,
        }
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, to: Use) -> Result<Connection> {
        let idle = self.idle(to).pop();
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
        configure(&conn)?;
        conn.pragma_update(None, "query_only", true)?;
        if to == Use::Path {
            // Read the file through the OS's page cache, mapped, rather
            // than copying pages into a per-connection cache (which a
            // long path would overflow, and read again in full every
            // time).
            conn.pragma_update(None, "mmap_size", READER_MMAP_SIZE)?;
        }
        Ok(conn)
    }

    fn give_back(&self, to: Use, conn: Connection) {
        let mut idle = self.idle(to);
        if idle.len() < READERS {
            idle.push(conn);
        }
    }

    /// Whether the paths crossing `line` are kept (they are long: read
    /// on a blocking thread).
    pub(super) fn keeps(&self, line: Uuid) -> bool {
        self.keep && self.kept().lines.contains_key(&line)
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn close(&self) {
        self.idle(Use::Path).clear();
        self.idle(Use::Other).clear();
        *self.kept() = Kept::default();
    }

    /// Runs `f` in one read transaction (one snapshot), blocking. A
    /// connection that failed is dropped rather than reused.
    pub(super) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.take(Use::Other)?;
        let value = transaction(&conn, Begin::Deferred, f)?;
        self.give_back(Use::Other, conn);
        Ok(value)
    }

    /// Runs `f` in one read transaction here and now, if that can be done
    /// without waiting: `None` when every read's turn is taken or no
    /// connection is idle (opening one takes a while), or when SQLite
    /// would have waited for another connection's lock (`f` is to be run
    /// again where it may wait).
    pub(super) fn now<T>(&self, f: &mut impl FnMut(&Connection) -> Result<T>) -> Option<Result<T>> {
        let _turn = self.slots.try_acquire().ok()?;
        let conn = self.idle(Use::Other).pop()?;
        match without_waiting(&conn, |conn| transaction(conn, Begin::Deferred, &mut *f)) {
            Ok(value) => {
                self.give_back(Use::Other, conn);
                Some(Ok(value))
            }
            Err(e) if is_busy(&e) => {
                self.give_back(Use::Other, conn);
                None
            }
            Err(e) => Some(Err(e)),
        }
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
        let conn = self.take(Use::Path)?;
        // One read transaction: one snapshot.
        let read = transaction(&conn, Begin::Deferred, |tx| {
            self.path_in(tx, writer, leaf, sink)
        })?;
        self.give_back(Use::Path, conn);
        Ok(read)
    }

    /// [`Readers::path`] in its transaction, on `tx`.
    fn path_in(
        &self,
        tx: &Connection,
        writer: &Writer,
        leaf: MessageId,
        sink: &mut Sink,
    ) -> Result<PathRead> {
        let ((conversation, segments), stamp) = writer.quiet(|| segments(tx, leaf))?;
        let kept = stamp
            .filter(|_| self.keep)
            .and_then(|stamp| self.kept().lines(stamp, &segments));
        let read = match stamp.zip(kept) {
            None => {
                let mut ranges = Vec::with_capacity(segments.len());
                let mut len = 0;
                for &(line, upto) in &segments {
                    let (rows, first) = count(tx, line, 0, upto)?;
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
                read_raw(tx, &ranges, sink)?;
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
                        let (fresh, first) = count(tx, line, after, upto)?;
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
                read_raw(tx, &ranges, sink)?;
                PathRead::Kept { stamp, parts }
            }
        };
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
