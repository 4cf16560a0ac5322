//! The file's WAL checkpoints, in place of SQLite's automatic ones
//! (which run, and `fsync`, inside the commit that passes the size).
//!
//! A checkpoint is due once [`CHECKPOINT_PAGES`] frames were appended to
//! the WAL since the last one, not whenever the WAL is that long: under
//! steady load a passive checkpoint rarely empties the WAL (readers keep
//! the frames of their snapshots, so it is not restarted), and counting
//! its length had every commit start a checkpoint, each copying a few
//! pages and syncing both files (420 checkpoints in a 500-message
//! `plain-load`, a tenth of the server's CPU).
//!
//! Those checkpoints restarted the WAL now and then, by chance, when one
//! found no reader in its way; fewer checkpoints find that moment more
//! rarely, and the WAL grew to 600 MB in a `serve-load` run. So a WAL
//! past [`WAL_LIMIT_FRAMES`] gets a `RESTART` checkpoint, which waits
//! (up to [`RESTART_WAIT`]) for the writers and readers of the moment and
//! copies every frame, so that the next commit writes the WAL from its
//! start again (the file keeps its size, ready for reuse): this process's
//! writes wait for it on a blocking thread, as for another process's
//! writer. A `TRUNCATE` one, which also gives the file's space back, had
//! the file grown again block by block each time.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::Result;
use crate::sqlite::Location;

/// Frames appended to the WAL since the last checkpoint past which a
/// commit has it checkpointed (SQLite's own default size for its
/// automatic checkpoints).
const CHECKPOINT_PAGES: i32 = 1000;

/// The WAL's length in frames (32 MiB of 4 KiB pages) past which a
/// checkpoint has it restarted.
const WAL_LIMIT_FRAMES: i32 = 8 * CHECKPOINT_PAGES;

/// How long a `RESTART` checkpoint waits for the write lock and for the
/// readers of the moment, holding up this process's writes meanwhile;
/// past it, it copies what it can and the WAL stays (the next commit
/// asks again). Reads take milliseconds.
const RESTART_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(in crate::sqlite) struct Checkpoints {
    /// Set by a commit that found [`CHECKPOINT_PAGES`] new frames; the
    /// write that sees it has the WAL checkpointed.
    due: AtomicBool,
    /// Set with `due` when the WAL passed [`WAL_LIMIT_FRAMES`].
    restart: AtomicBool,
    /// A checkpoint is on its way (one at a time).
    running: AtomicBool,
    /// The WAL's length in frames after the last commit.
    wal_frames: AtomicI32,
    /// Frames appended since the last checkpoint began.
    appended: AtomicI32,
    /// The checkpoints' own connection, opened by the first one.
    conn: Mutex<Option<Connection>>,
}

impl Checkpoints {
    /// Called after each commit with the WAL's length in frames (from
    /// the connection's WAL hook).
    pub(in crate::sqlite) fn committed(&self, frames: i32) {
        let before = self.wal_frames.swap(frames, Ordering::SeqCst);
        // A WAL shorter than before was restarted: all its frames are new.
        let added = if frames >= before {
            frames - before
        } else {
            frames
        };
        let appended = self.appended.fetch_add(added, Ordering::SeqCst) + added;
        if frames >= WAL_LIMIT_FRAMES {
            self.restart.store(true, Ordering::SeqCst);
        }
        if appended >= CHECKPOINT_PAGES || frames >= WAL_LIMIT_FRAMES {
            self.due.store(true, Ordering::SeqCst);
        }
    }

    /// Has the WAL checkpointed on a blocking thread if a commit found it
    /// due and no checkpoint is on its way.
    pub(in crate::sqlite) fn run_if_due(self: &Arc<Self>, location: &Location) {
        let Location::File(path) = location else {
            return;
        };
        if !self.due.swap(false, Ordering::SeqCst) || self.running.swap(true, Ordering::SeqCst) {
            return;
        }
        self.appended.store(0, Ordering::SeqCst);
        let this = Arc::clone(self);
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = this.checkpoint(&path) {
                tracing::warn!(error = %e, "checkpointing the database's WAL failed");
            }
            this.running.store(false, Ordering::SeqCst);
        });
    }

    /// A passive checkpoint: the WAL's frames copied into the database
    /// as far as no reader still needs them, writers going on meanwhile;
    /// or, once the WAL is too long, a `RESTART` one. Another process's
    /// checkpoint going on makes it do nothing.
    fn checkpoint(&self, path: &std::path::Path) -> Result<()> {
        let mut slot = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let conn = match slot.take() {
            Some(conn) => conn,
            None => {
                let conn = Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                // Only a `RESTART` checkpoint waits (a passive one never
                // calls the busy handler).
                conn.busy_timeout(RESTART_WAIT)?;
                conn
            }
        };
        let sql = if self.restart.swap(false, Ordering::SeqCst) {
            "PRAGMA wal_checkpoint(RESTART)"
        } else {
            "PRAGMA wal_checkpoint(PASSIVE)"
        };
        // Its columns: whether it could not run (busy), the WAL's
        // frames, and how many of them are in the database now. Frames a
        // reader held back are copied by the next one.
        let _: (i64, i64, i64) =
            conn.query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        *slot = Some(conn);
        Ok(())
    }

    pub(in crate::sqlite) fn close(&self) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_after_enough_new_frames_not_a_long_wal() {
        let c = Checkpoints::default();
        c.committed(CHECKPOINT_PAGES - 1);
        assert!(!c.due.load(Ordering::SeqCst));
        c.committed(CHECKPOINT_PAGES);
        assert!(c.due.swap(false, Ordering::SeqCst));
        // Checkpointed (as `run_if_due` begins one), the WAL not
        // restarted: a long WAL is not due again until 1,000 more frames.
        c.appended.store(0, Ordering::SeqCst);
        c.committed(CHECKPOINT_PAGES + 10);
        assert!(!c.due.load(Ordering::SeqCst));
        c.committed(2 * CHECKPOINT_PAGES - 1);
        assert!(!c.due.load(Ordering::SeqCst));
        // Restarted: its frames are all new.
        c.committed(1);
        assert!(c.due.swap(false, Ordering::SeqCst));
        c.appended.store(0, Ordering::SeqCst);
        assert!(!c.restart.load(Ordering::SeqCst));
    }

    #[test]
    fn a_wal_past_its_limit_is_restarted() {
        let c = Checkpoints::default();
        c.committed(WAL_LIMIT_FRAMES - 1);
        assert!(!c.restart.load(Ordering::SeqCst));
        c.due.store(false, Ordering::SeqCst);
        c.appended.store(0, Ordering::SeqCst);
        c.committed(WAL_LIMIT_FRAMES);
        assert!(c.due.load(Ordering::SeqCst));
        assert!(c.restart.load(Ordering::SeqCst));
    }
}
