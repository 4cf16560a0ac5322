//! The record of the agent's own writes: what the built-in tools wrote,
//! so that a file watcher can tell them from outside changes.

use std::collections::HashMap;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the built-in tools wrote, so that the watcher can tell the agent's
/// own writes from outside changes.
///
/// A tool records a path with the length and hash of the content it is
/// about to write; when the watcher sees that path change, it compares the
/// file's content now: the same content is the agent's own write (not
/// reported); different content is someone else's change (reported, and
/// the record is forgotten). Records expire after ten minutes, and at most
/// 4,096 are kept.
#[derive(Debug, Default)]
pub struct OwnWrites {
    written: Mutex<HashMap<PathBuf, Written>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written {
    len: u64,
    hash: u64,
    at: Instant,
}

const OWN_WRITE_TTL: Duration = Duration::from_secs(600);
const OWN_WRITES_MAX: usize = 4096;

impl OwnWrites {
    /// A tool is about to write `content` to `path` (absolute, inside the
    /// workspace).
    pub fn record(&self, path: &Path, content: &[u8]) {
        let now = Instant::now();
        let mut written = self.lock();
        if written.len() >= OWN_WRITES_MAX && !written.contains_key(path) {
            written.retain(|_, w| now.duration_since(w.at) < OWN_WRITE_TTL);
            if written.len() >= OWN_WRITES_MAX
                && let Some(oldest) = written
                    .iter()
                    .min_by_key(|(_, w)| w.at)
                    .map(|(p, _)| p.clone())
            {
                written.remove(&oldest);
            }
        }
        written.insert(
            path.to_path_buf(),
            Written {
                len: content.len() as u64,
                hash: hash(content),
                at: now,
            },
        );
    }

    /// Forgets what was recorded for `path`.
    pub fn forget(&self, path: &Path) {
        self.lock().remove(path);
    }

    /// Whether the file at `path` holds what a built-in tool last wrote
    /// there (reads it). A file that differs is forgotten: its changes are
    /// someone else's from now on.
    pub fn is_own(&self, path: &Path) -> bool {
        let Some(record) = self.lock().get(path).copied() else {
            return false;
        };
        let same = record.at.elapsed() < OWN_WRITE_TTL
            && std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == record.len)
            && std::fs::read(path).is_ok_and(|bytes| hash(&bytes) == record.hash);
        if !same {
            let mut written = self.lock();
            // Unless a tool wrote again meanwhile.
            if written.get(path) == Some(&record) {
                written.remove(path);
            }
        }
        same
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Written>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn hash(bytes: &[u8]) -> u64 {
    // SipHash with fixed keys: the same bytes hash the same in a process.
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_writes_match_on_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        let own = OwnWrites::default();
        std::fs::write(&path, "mine").unwrap();
        assert!(!own.is_own(&path), "nothing recorded");
        own.record(&path, b"mine");
        assert!(own.is_own(&path));
        assert!(own.is_own(&path), "still, for later events of the write");
        std::fs::write(&path, "theirs").unwrap();
        assert!(!own.is_own(&path));
        // Forgotten: the same content again is not the tool's any more.
        std::fs::write(&path, "mine").unwrap();
        assert!(!own.is_own(&path));
    }

    #[test]
    fn own_writes_stay_bounded() {
        let own = OwnWrites::default();
        for i in 0..OWN_WRITES_MAX + 10 {
            own.record(Path::new(&format!("/w/{i}")), b"x");
        }
        assert_eq!(own.lock().len(), OWN_WRITES_MAX);
    }
}
