//! [`Cluster`] for processes sharing one SQLite file: conversation leases
//! as open-file-description byte-range locks (`F_OFD_SETLK`) on a file
//! beside the database (`DB-leases`), one byte per conversation at an
//! offset folded from its id. The kernel lets go of them when the holder
//! closes the file or dies, so a crashed process's conversations are free
//! at once and its runs are interrupted by the next sweep. Each store's
//! cluster opens the file itself: two engines of one process exclude each
//! other too.
//!
//! Only leases: events and commands are not carried between processes on
//! SQLite (each process's followers see its own turns live and the
//! others' from the log when they resume).

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;
use tokio::sync::mpsc;
use toolwire_core::{ConversationId, InstanceId};

use crate::cluster::{Cluster, Command, ExclusiveGuard, Signal};
use crate::{Result, StoreError};

/// Offsets stay below this (positive `off_t`, with room for the byte).
const OFFSETS: u64 = 1 << 62;

fn conversation_offset(conversation: ConversationId) -> i64 {
    let (hi, lo) = conversation.0.as_u64_pair();
    i64::try_from((hi ^ lo) % OFFSETS).unwrap_or(0)
}

fn section_offset(name: &str) -> i64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    i64::try_from(hash % OFFSETS).unwrap_or(0)
}

/// Locks (`lock`) or unlocks byte `offset` of `file`; `false` when
/// another open file description holds it.
fn set(file: &File, offset: i64, lock: bool) -> Result<bool> {
    let kind = if lock { libc::F_WRLCK } else { libc::F_UNLCK };
    let range = libc::flock {
        l_type: i16::try_from(kind).unwrap_or(0),
        l_whence: i16::try_from(libc::SEEK_SET).unwrap_or(0),
        l_start: offset,
        l_len: 1,
        // Must be 0 for open file description locks.
        l_pid: 0,
    };
    match fcntl(file, FcntlArg::F_OFD_SETLK(&range)) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN | Errno::EACCES) => Ok(false),
        Err(e) => Err(StoreError::Connection(format!("the leases file: {e}"))),
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct FileLeases {
    file: std::sync::Arc<File>,
    held: Mutex<HashMap<ConversationId, u32>>,
}

impl FileLeases {
    /// Opens (creating) the leases file of the database at `db`.
    pub(crate) fn open(db: &Path) -> Result<FileLeases> {
        let mut name = db.as_os_str().to_owned();
        name.push("-leases");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&name)
            .map_err(|e| {
                StoreError::Connection(format!("cannot open {}: {e}", Path::new(&name).display()))
            })?;
        Ok(FileLeases {
            file: std::sync::Arc::new(file),
            held: Mutex::new(HashMap::new()),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<ConversationId, u32>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Cluster for FileLeases {
    fn shared(&self) -> bool {
        true
    }

    async fn try_lease(&self, conversation: ConversationId) -> Result<bool> {
        let mut held = self.held();
        if let Some(count) = held.get_mut(&conversation) {
            *count += 1;
            return Ok(true);
        }
        let taken = set(&self.file, conversation_offset(conversation), true)?;
        if taken {
            held.insert(conversation, 1);
        }
        Ok(taken)
    }

    fn release(&self, conversation: ConversationId) {
        let mut held = self.held();
        match held.get_mut(&conversation) {
            Some(count) if *count > 1 => *count -= 1,
            Some(_) => {
                held.remove(&conversation);
                if let Err(e) = set(&self.file, conversation_offset(conversation), false) {
                    tracing::warn!(%conversation, error = %e, "could not give back a lease");
                }
            }
            None => {}
        }
    }

    fn announce(&self, _conversation: ConversationId, _seq: u64) {}

    fn signals(&self) -> Option<mpsc::UnboundedReceiver<Signal>> {
        None
    }

    async fn send(&self, to: InstanceId, _command: &Command) -> Result<()> {
        Err(StoreError::InstanceNotFound(to))
    }

    async fn take_commands(&self) -> Result<Vec<Command>> {
        Ok(Vec::new())
    }

    async fn lease_free(&self, conversation: ConversationId) -> Result<bool> {
        let offset = conversation_offset(conversation);
        // Held through this file itself: taken, whatever the lock says.
        if self.held().contains_key(&conversation) {
            return Ok(false);
        }
        if !set(&self.file, offset, true)? {
            return Ok(false);
        }
        set(&self.file, offset, false)?;
        Ok(true)
    }

    /// No routing between processes on SQLite: nobody is named.
    async fn turn_owner(&self, _conversation: ConversationId) -> Result<Option<InstanceId>> {
        Ok(None)
    }

    async fn exclusively(&self, name: &str) -> Result<Option<ExclusiveGuard>> {
        let offset = section_offset(name);
        if !set(&self.file, offset, true)? {
            return Ok(None);
        }
        let file = std::sync::Arc::clone(&self.file);
        Ok(Some(ExclusiveGuard::new(move || {
            let _ = set(&file, offset, false);
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lease_is_one_holders_until_given_back_or_closed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let (a, b) = (
            FileLeases::open(&db).unwrap(),
            FileLeases::open(&db).unwrap(),
        );
        let conversation = ConversationId::new();
        assert!(a.try_lease(conversation).await.unwrap());
        assert!(
            a.try_lease(conversation).await.unwrap(),
            "again by its holder"
        );
        assert!(!b.try_lease(conversation).await.unwrap());
        assert!(!b.lease_free(conversation).await.unwrap());
        a.release(conversation);
        assert!(!b.try_lease(conversation).await.unwrap(), "held once more");
        a.release(conversation);
        assert!(b.lease_free(conversation).await.unwrap());
        assert!(b.try_lease(conversation).await.unwrap());
        // A holder that goes (a process that dies) lets go of everything.
        drop(b);
        assert!(a.try_lease(conversation).await.unwrap());
        let section = a.exclusively("sweep").await.unwrap();
        let c = FileLeases::open(&db).unwrap();
        assert!(c.exclusively("sweep").await.unwrap().is_none());
        drop(section);
        assert!(c.exclusively("sweep").await.unwrap().is_some());
    }
}
