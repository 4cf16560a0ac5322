//! Group commit: writes that queued behind the one running are run
//! together, in one transaction (`BEGIN IMMEDIATE`, a savepoint per
//! write, one `COMMIT`), instead of one transaction each. A commit
//! writes every page it dirtied to the WAL, and the checkpoint copies
//! them again: writes of one batch that touch the same pages (the
//! events' and runs' tables and indexes, the conversations' counters)
//! write them once.
//!
//! Each write keeps its own outcome: one that fails is rolled back to
//! its savepoint, alone, and its caller gets its error; the others are
//! committed. No caller is answered before the `COMMIT` (a batch that
//! fails to commit answers every write of it with that failure), so
//! nothing is reported stored that is not.
//!
//! Who runs a batch: the writer that finds the connection free at once
//! with writes queued, or a queued writer once the connection is its
//! (the lock is fair: writers get it in the order they asked for it).
//! A writer whose write was run by another's batch is answered without
//! ever taking the connection. A batch is bounded in writes and in time
//! ([`MAX_WRITES`], [`MAX_TIME`]); writes left over wait for the next.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::{OwnedMutexGuard, oneshot};

use super::Writer;
use crate::sqlite::Inline;
use crate::sqlite::transaction::{Begin, is_busy, transaction, without_waiting};
use crate::{Result, StoreError};

/// Writes run in one batch at most: what one batch's callers wait for
/// stays short.
const MAX_WRITES: usize = 32;

/// No write joins a batch that has run this long (its first write's
/// callers have waited that long already).
const MAX_TIME: Duration = Duration::from_millis(2);

/// Writes waiting for the connection, oldest first.
#[derive(Default)]
pub(in crate::sqlite) struct Queue(Mutex<VecDeque<Box<dyn Queued>>>);

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Box<dyn Queued>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("writes", &self.lock().len())
            .finish()
    }
}

/// A write as a batch runs it: its work, its outcome, its caller.
pub(in crate::sqlite) trait Queued: Send {
    /// Runs the write on `conn` (in the batch's transaction), keeping
    /// its outcome; its error, if it failed.
    fn run(&mut self, conn: &Connection) -> Option<&StoreError>;

    /// Answers the caller: the write's own outcome if the batch
    /// committed (or the write failed on its own), else `failed`.
    fn answer(self: Box<Self>, failed: Option<&StoreError>);
}

struct Pending<T, F> {
    f: F,
    outcome: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> Queued for Pending<T, F>
where
    T: Send,
    F: FnMut(&Connection) -> Result<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> Option<&StoreError> {
        self.outcome = Some((self.f)(conn));
        self.outcome.as_ref().and_then(|o| o.as_ref().err())
    }

    fn answer(self: Box<Self>, failed: Option<&StoreError>) {
        let outcome = match (self.outcome, failed) {
            (Some(Err(own)), _) => Err(own),
            (Some(Ok(value)), None) => Ok(value),
            (_, Some(failed)) => Err(again(failed)),
            (None, None) => Err(StoreError::Closed),
        };
        // A caller that gave up waiting is not there to hear it.
        let _ = self.reply.send(outcome);
    }
}

/// `e` once more, for another caller of the batch it failed.
fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(code, message)) => {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(*code, message.clone()))
        }
        StoreError::Closed => StoreError::Closed,
        other => StoreError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(format!("a write committed with this one failed: {other}")),
        )),
    }
}

impl Writer {
    /// Runs `f` as one write (see [`Writer::write`]), in a batch with
    /// the writes queued with it unless the connection is free at once
    /// and none is queued.
    pub(super) async fn write_batched<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnMut(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let free = match Arc::clone(&self.conn).try_lock_owned().ok() {
            // Today's path: its own transaction, at once.
            Some(slot) if self.queued_none() => {
                return self
                    .run_locked(slot, Begin::Immediate, Inline::Try, f)
                    .await;
            }
            free => free,
        };
        let (reply, mut answer) = oneshot::channel();
        self.queue.lock().push_back(Box::new(Pending {
            f,
            outcome: None,
            reply,
        }));
        if let Some(slot) = free {
            self.lead(slot).await;
        }
        // Until this write is answered, by this caller's batch or
        // another's: a batch bounded short of it leaves it queued, and
        // its caller leads one again.
        loop {
            tokio::select! {
                biased;
                answered = &mut answer => return answered.unwrap_or(Err(StoreError::Closed)),
                slot = Arc::clone(&self.conn).lock_owned() => self.lead(slot).await,
            }
        }
    }

    fn queued_none(&self) -> bool {
        self.queue.lock().is_empty()
    }

    /// The next write queued, if any.
    fn next_queued(&self) -> Option<Box<dyn Queued>> {
        self.queue.lock().pop_front()
    }

    /// Runs a batch of the queued writes on the connection in `slot` and
    /// answers their callers: on this thread if SQLite need not wait,
    /// else on a blocking thread. The callers are answered before the
    /// connection is let go, so a caller that takes it with nothing
    /// queued has its answer waiting: it leads no empty transaction.
    /// (It can take it so: its wait looked at its answer, found none,
    /// and then found the connection free, the batch that ran its write
    /// having ended on another thread in between.)
    async fn lead(self: &Arc<Self>, mut slot: OwnedMutexGuard<Option<Connection>>) {
        if self.queued_none() {
            return;
        }
        let mut batch = Vec::new();
        if let Some(conn) = slot.as_mut().filter(|c| c.is_autocommit()) {
            let done = without_waiting(conn, |conn| self.run_batch(conn, &mut batch));
            if !done.as_ref().is_err_and(is_busy) {
                answer(batch, done);
                drop(slot);
                self.checkpoint_if_due();
                return;
            }
        }
        // Waits (for another process's writer) or opens the connection
        // again: not on the caller's thread. The blocking task owns the
        // batch, so its writes are answered whatever becomes of this
        // caller.
        let this = Arc::clone(self);
        let ran = tokio::task::spawn_blocking(move || {
            let done = this
                .ready(&mut slot)
                .and_then(|conn| this.run_batch(conn, &mut batch));
            answer(batch, done);
            drop(slot);
        })
        .await;
        if let Err(e) = ran
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
        self.checkpoint_if_due();
    }

    /// Runs `batch` (again, after SQLite was busy) and as many queued
    /// writes as the bounds allow, in one transaction: `Err` when it did
    /// not commit (nothing of it is stored then).
    fn run_batch(&self, conn: &Connection, batch: &mut Vec<Box<dyn Queued>>) -> Result<()> {
        transaction(conn, Begin::Immediate, |conn| self.run_writes(conn, batch))
    }

    fn run_writes(&self, conn: &Connection, batch: &mut Vec<Box<dyn Queued>>) -> Result<()> {
        let started = Instant::now();
        let mut done = 0;
        loop {
            if done == batch.len() {
                if batch.len() >= MAX_WRITES || started.elapsed() >= MAX_TIME {
                    return Ok(());
                }
                match self.next_queued() {
                    Some(write) => batch.push(write),
                    None => return Ok(()),
                }
            }
            let write = &mut batch[done];
            done += 1;
            conn.prepare_cached("SAVEPOINT batched")?.execute([])?;
            if let Some(e) = write.run(conn) {
                if is_busy(e) || conn.is_autocommit() {
                    // Waiting for a lock, or the transaction gone with
                    // the error (SQLite rolled it back whole): the batch
                    // fails as this write did.
                    return Err(again(e));
                }
                conn.prepare_cached("ROLLBACK TO batched")?.execute([])?;
            }
            conn.prepare_cached("RELEASE batched")?.execute([])?;
        }
    }
}

/// Answers each write of a batch that committed (`done` is `Ok`) or
/// failed.
fn answer(batch: Vec<Box<dyn Queued>>, done: Result<()>) {
    let failed = done.err();
    for write in batch {
        write.answer(failed.as_ref());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use toolwire_core::{AgentEvent, ConversationId, RunId};

    use super::*;
    use crate::sqlite::Location;

    fn delta(i: usize) -> AgentEvent {
        AgentEvent::TextDelta {
            run_id: RunId::new(),
            text: format!("piece {i}"),
        }
    }

    /// Writes that queued behind a held connection are run in one
    /// transaction (one commit), each keeps its own outcome: the one that
    /// fails gets its own error and stores nothing, the others are all
    /// stored, numbered as if each had been alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_writes_commit_together_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Arc::new(Writer::new(Location::File(dir.path().join("t.db"))));
        writer.migrate().await.unwrap();
        let c = writer.create_conversation("sys", None).await.unwrap();

        let commits = Arc::new(AtomicUsize::new(0));
        let mut held = Arc::clone(&writer.conn).lock_owned().await;
        let counted = Arc::clone(&commits);
        held.as_mut()
            .unwrap()
            .commit_hook(Some(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                false
            }))
            .unwrap();
        const WRITES: usize = 10;
        let unknown = ConversationId::new();
        let writes: Vec<_> = (0..WRITES)
            .map(|i| {
                let writer = Arc::clone(&writer);
                let to = if i == 4 { unknown } else { c.id };
                tokio::spawn(async move { writer.append_events(to, &[delta(i), delta(i)]).await })
            })
            .collect();
        while writer.queue.lock().len() < WRITES {
            tokio::task::yield_now().await;
        }
        drop(held);

        let mut seqs = Vec::new();
        for (i, write) in writes.into_iter().enumerate() {
            let done = write.await.unwrap();
            if i == 4 {
                assert!(
                    matches!(done, Err(StoreError::ConversationNotFound(id)) if id == unknown),
                    "{done:?}"
                );
            } else {
                let done = done.unwrap();
                assert_eq!(done.len(), 2);
                assert_eq!(done[1], done[0] + 1, "a write's events numbered together");
                seqs.extend(done);
            }
        }
        assert_eq!(commits.load(Ordering::SeqCst), 1, "one commit for all");
        // Numbered in the order the writes queued, which need not be the
        // order they were spawned in: every number once.
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=18).collect::<Vec<u64>>(), "each number once");
        let stored: i64 = writer
            .read(Inline::Never, move |conn| {
                Ok(conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?)
            })
            .await
            .unwrap();
        assert_eq!(stored, 18);
    }

    /// More writes than a batch takes: every one is stored and answered,
    /// in as many commits as batches.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_is_bounded_and_the_rest_follow() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Arc::new(Writer::new(Location::File(dir.path().join("t.db"))));
        writer.migrate().await.unwrap();
        let c = writer.create_conversation("sys", None).await.unwrap();
        let held = Arc::clone(&writer.conn).lock_owned().await;
        let writes = 3 * MAX_WRITES + 1;
        let tasks: Vec<_> = (0..writes)
            .map(|i| {
                let writer = Arc::clone(&writer);
                tokio::spawn(async move { writer.append_events(c.id, &[delta(i)]).await })
            })
            .collect();
        while writer.queue.lock().len() < writes {
            tokio::task::yield_now().await;
        }
        drop(held);
        let mut seqs = Vec::new();
        for task in tasks {
            seqs.extend(task.await.unwrap().unwrap());
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=writes as u64).collect::<Vec<_>>());
        assert!(writer.queue.lock().is_empty());
    }
}
