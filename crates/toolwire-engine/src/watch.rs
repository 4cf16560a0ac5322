//! The file watcher: changes under the workspace root, told to every
//! conversation the engine works on as `file_watcher` notifications
//! ([`Engine::notify_attached`]).
//!
//! One thread per watcher owns the `notify` watcher and debounces its
//! events per path: a path is reported once it has been quiet for
//! `debounce` (or `max_delay` after its first event, for a file written
//! without pause). What happened is decided then, from the first event
//! (did the file exist before?) and the file system now (does it exist?):
//! created, modified or removed; a file that came and went is not
//! reported, nor are directories themselves.
//!
//! Paths with an ignored component (`.git`, `target`, `node_modules`) are
//! skipped; on Linux their directories are not even watched (one inotify
//! watch per directory, added as directories appear), so a large build
//! tree costs no watches. Files named in [`WatchSettings::ignore_paths`]
//! (the store's own database files) are never reported, wherever they
//! are. The built-in tools' temporary files are skipped,
//! and a file whose content is what a built-in tool last wrote there
//! ([`OwnWrites`]) is the agent's own change: not reported back to it.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use ::notify::event::{ModifyKind, RenameMode};
use ::notify::{
    Config, ErrorKind, Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher, WatcherKind,
};
use tokio::sync::oneshot;
use toolwire_core::{FileChange, Incoming};

use crate::Engine;
use toolwire_tools::OwnWrites;
use toolwire_tools::builtin::{TMP_SUFFIX, Workspace};

/// The source name of the watcher's notifications.
pub const SOURCE: &str = "file_watcher";

/// Directory names whose contents are never reported, at any depth.
pub const DEFAULT_IGNORED: [&str; 3] = [".git", "target", "node_modules"];

/// How the watcher behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchSettings {
    /// A path is reported once no event has come for it for this long…
    pub debounce: Duration,
    /// …or this long after its first event, whichever comes first.
    pub max_delay: Duration,
    /// Path components whose contents are not watched.
    pub ignore: Vec<String>,
    /// Files never reported, by exact path (the store's database and its
    /// `-wal`, `-shm`, `-journal` siblings): a relative path is taken from
    /// the current directory, and the directory is resolved (symbolic
    /// links, `..`), so the file itself need not exist yet.
    pub ignore_paths: Vec<PathBuf>,
    /// Directories watched at most (one inotify watch each on Linux);
    /// past this, new directories are not watched and a warning says so.
    pub max_dirs: usize,
}

impl Default for WatchSettings {
    fn default() -> Self {
        WatchSettings {
            debounce: Duration::from_millis(300),
            max_delay: Duration::from_secs(2),
            ignore: DEFAULT_IGNORED.iter().map(|s| (*s).to_owned()).collect(),
            ignore_paths: Vec::new(),
            max_dirs: 20_000,
        }
    }
}

/// Why the watcher could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch `{path}`: {source}")]
    Root {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot watch `{0}`: not a directory")]
    NotADirectory(String),
    #[error("the file watcher could not start: {0}")]
    Notify(#[from] ::notify::Error),
    #[error("the file watcher's thread could not start: {0}")]
    Thread(io::Error),
}

/// A running watcher; it stops when this is dropped.
pub struct WatchHandle {
    root: PathBuf,
    tx: mpsc::Sender<Msg>,
}

impl WatchHandle {
    /// The directory watched (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl std::fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHandle")
            .field("root", &self.root)
            .finish()
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
    }
}

enum Msg {
    Event(::notify::Result<Event>),
    Stop,
}

/// Watches `workspace`'s root with `settings` and tells the conversations
/// `engine` works on (those it has run a turn in) about changes, as
/// passive notifications, leaving out the built-in tools' own writes. The
/// handle keeps a clone of the engine; dropping it stops the watcher.
pub async fn start(
    engine: &Engine,
    workspace: &Workspace,
    settings: WatchSettings,
) -> Result<WatchHandle, WatchError> {
    let engine = engine.clone();
    start_with(
        workspace.root(),
        workspace.own_writes().clone(),
        settings,
        move |event| engine.notify_attached(event),
    )
    .await
}

/// Watches `root` with `settings`, calling `sink` (on the watcher's own
/// thread) with each change. Returns once every directory is watched, so
/// a change made after it returns is seen.
pub async fn start_with<F>(
    root: &Path,
    own_writes: Arc<OwnWrites>,
    settings: WatchSettings,
    sink: F,
) -> Result<WatchHandle, WatchError>
where
    F: Fn(Incoming) + Send + 'static,
{
    let mut settings = settings;
    settings.ignore_paths = settings.ignore_paths.iter().map(|p| resolved(p)).collect();
    let canonical = std::fs::canonicalize(root).map_err(|source| WatchError::Root {
        path: root.display().to_string(),
        source,
    })?;
    if !canonical.is_dir() {
        return Err(WatchError::NotADirectory(root.display().to_string()));
    }
    let (tx, rx) = mpsc::channel();
    // Made first: if this future is dropped while the thread starts, the
    // handle's drop stops it.
    let handle = WatchHandle {
        root: canonical.clone(),
        tx: tx.clone(),
    };
    let (ready_tx, ready_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("toolwire-watch".into())
        .spawn(move || {
            let watcher = RecommendedWatcher::new(
                move |event| {
                    let _ = tx.send(Msg::Event(event));
                },
                Config::default().with_follow_symlinks(false),
            );
            let mut state = match watcher {
                Ok(watcher) => State::new(canonical, own_writes, settings, watcher),
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            if let Err(e) = state.watch_root() {
                let _ = ready_tx.send(Err(e.into()));
                return;
            }
            let _ = ready_tx.send(Ok(()));
            state.run(&rx, &sink);
        })
        .map_err(WatchError::Thread)?;
    match ready_rx.await {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(WatchError::Thread(io::Error::other(
            "the watcher's thread ended while starting",
        ))),
    }
}

/// `path` absolute, its directory canonical (as the watcher's paths are),
/// the file itself as named: it need not exist.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (absolute.parent(), absolute.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|dir| dir.join(name))
            .unwrap_or(absolute),
        _ => absolute,
    }
}

/// A path with events not reported yet.
struct Pending {
    /// Whether the file existed before its first event.
    existed: bool,
    first: Instant,
    last: Instant,
}

/// What an event says of a path.
#[derive(Clone, Copy)]
enum Seen {
    Appeared,
    Changed,
    Gone,
}

struct State {
    root: PathBuf,
    own: Arc<OwnWrites>,
    settings: WatchSettings,
    watcher: RecommendedWatcher,
    /// One non-recursive watch per directory (inotify), or one recursive
    /// watch of the root (elsewhere).
    per_dir: bool,
    /// The directories under the root, ignored ones aside.
    dirs: HashSet<PathBuf>,
    /// `max_dirs` or the system's watch limit was reached (warned once).
    full: bool,
    pending: HashMap<PathBuf, Pending>,
    next_flush: Instant,
}

impl State {
    fn new(
        root: PathBuf,
        own: Arc<OwnWrites>,
        settings: WatchSettings,
        watcher: RecommendedWatcher,
    ) -> State {
        State {
            root,
            own,
            settings,
            watcher,
            per_dir: RecommendedWatcher::kind() == WatcherKind::Inotify,
            dirs: HashSet::new(),
            full: false,
            pending: HashMap::new(),
            next_flush: Instant::now(),
        }
    }

    fn watch_root(&mut self) -> Result<(), ::notify::Error> {
        if !self.per_dir {
            self.watcher.watch(&self.root, RecursiveMode::Recursive)?;
        }
        self.add_tree(self.root.clone(), false, Instant::now())
    }

    fn run<F: Fn(Incoming)>(mut self, rx: &mpsc::Receiver<Msg>, sink: &F) {
        let tick = (self.settings.debounce / 4).max(Duration::from_millis(10));
        loop {
            let timeout = if self.pending.is_empty() {
                Duration::from_secs(3600)
            } else {
                self.next_flush
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1))
            };
            match rx.recv_timeout(timeout) {
                Ok(Msg::Event(event)) => self.on_event(event, Instant::now()),
                Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            if now >= self.next_flush {
                self.flush(now, sink);
                self.next_flush = now + tick;
            }
        }
    }

    fn on_event(&mut self, event: ::notify::Result<Event>, now: Instant) {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                if matches!(e.kind, ErrorKind::MaxFilesWatch) {
                    self.warn_full("the system's limit on watched directories");
                } else {
                    tracing::debug!(error = %e, "file watcher error");
                }
                return;
            }
        };
        if event.need_rescan() {
            tracing::warn!(
                "file events were lost (the kernel's queue overflowed): some changes in the workspace may go unreported"
            );
        }
        let seen = match event.kind {
            EventKind::Access(_)
            | EventKind::Modify(ModifyKind::Metadata(_))
            // The `From` and `To` halves come as events of their own.
            | EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => return,
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
                Some(Seen::Appeared)
            }
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
                Some(Seen::Gone)
            }
            // A rename whose side is unknown: the file system says.
            EventKind::Modify(ModifyKind::Name(_)) => None,
            _ => Some(Seen::Changed),
        };
        for path in event.paths {
            if self.ignored(&path) {
                continue;
            }
            let seen = seen.unwrap_or_else(|| {
                if std::fs::symlink_metadata(&path).is_ok() {
                    Seen::Appeared
                } else {
                    Seen::Gone
                }
            });
            match seen {
                Seen::Appeared => {
                    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                        // A new directory, or one moved in: watch it, and
                        // report what it already holds.
                        if let Err(e) = self.add_tree(path, true, now) {
                            tracing::debug!(error = %e, "could not watch a new directory");
                        }
                    } else {
                        self.touch(path, false, now);
                    }
                }
                Seen::Gone => {
                    if self.dirs.contains(&path) {
                        self.drop_tree(&path);
                    } else {
                        self.touch(path, true, now);
                    }
                }
                Seen::Changed => {
                    if !self.dirs.contains(&path) {
                        self.touch(path, true, now);
                    }
                }
            }
        }
    }

    /// Notes an event for `path`; `existed` counts for its first one.
    fn touch(&mut self, path: PathBuf, existed: bool, now: Instant) {
        self.pending
            .entry(path)
            .or_insert(Pending {
                existed,
                first: now,
                last: now,
            })
            .last = now;
    }

    /// Reports the paths that are due, in path order.
    fn flush<F: Fn(Incoming)>(&mut self, now: Instant, sink: &F) {
        let (debounce, max_delay) = (self.settings.debounce, self.settings.max_delay);
        let mut due: Vec<PathBuf> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                now.duration_since(p.last) >= debounce || now.duration_since(p.first) >= max_delay
            })
            .map(|(path, _)| path.clone())
            .collect();
        due.sort();
        for path in due {
            let Some(pending) = self.pending.remove(&path) else {
                continue;
            };
            let change = match (pending.existed, std::fs::symlink_metadata(&path)) {
                (_, Ok(meta)) if meta.is_dir() => continue,
                (false, Ok(_)) => FileChange::Created,
                (true, Ok(_)) => FileChange::Modified,
                (true, Err(_)) => FileChange::Removed,
                // Came and went.
                (false, Err(_)) => continue,
            };
            if change == FileChange::Removed {
                self.own.forget(&path);
            } else if self.own.is_own(&path) {
                continue;
            }
            sink(Incoming::file(SOURCE, self.relative(&path), change));
        }
    }

    /// Watches `top` and the directories under it (ignored ones aside);
    /// with `report_files`, the files found count as created. An error
    /// only when `top` itself cannot be watched.
    fn add_tree(
        &mut self,
        top: PathBuf,
        report_files: bool,
        now: Instant,
    ) -> Result<(), ::notify::Error> {
        let mut stack = vec![top.clone()];
        while let Some(dir) = stack.pop() {
            if self.dirs.contains(&dir) {
                continue;
            }
            if self.full {
                return Ok(());
            }
            if self.dirs.len() >= self.settings.max_dirs {
                self.warn_full("max_dirs");
                return Ok(());
            }
            if self.per_dir
                && let Err(e) = self.watcher.watch(&dir, RecursiveMode::NonRecursive)
            {
                if matches!(e.kind, ErrorKind::MaxFilesWatch) {
                    self.warn_full("the system's limit on watched directories");
                    return Ok(());
                }
                if dir == top {
                    return Err(e);
                }
                tracing::debug!(dir = %dir.display(), error = %e, "could not watch a directory");
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                self.dirs.insert(dir);
                continue;
            };
            self.dirs.insert(dir);
            for entry in entries.flatten() {
                let path = entry.path();
                if self.ignored(&path) {
                    continue;
                }
                // Symbolic links are not followed (file_type does not).
                match entry.file_type() {
                    Ok(kind) if kind.is_dir() => stack.push(path),
                    Ok(_) if report_files => self.touch(path, false, now),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Forgets `top` and the directories under it (gone or moved away).
    fn drop_tree(&mut self, top: &Path) {
        let gone: Vec<PathBuf> = self
            .dirs
            .iter()
            .filter(|d| d.starts_with(top))
            .cloned()
            .collect();
        for dir in gone {
            if self.per_dir {
                // Usually gone with the directory already.
                let _ = self.watcher.unwatch(&dir);
            }
            self.dirs.remove(&dir);
        }
        if top == self.root {
            tracing::warn!(root = %self.root.display(), "the workspace root is gone: the file watcher stops reporting");
        }
    }

    fn warn_full(&mut self, limit: &str) {
        if !self.full {
            self.full = true;
            tracing::warn!(
                root = %self.root.display(),
                dirs = self.dirs.len(),
                "the file watcher reached {limit}: directories added from now on are not watched"
            );
        }
    }

    fn ignored(&self, path: &Path) -> bool {
        let Ok(rel) = path.strip_prefix(&self.root) else {
            return true;
        };
        rel.components().any(|c| {
            self.settings
                .ignore
                .iter()
                .any(|name| c.as_os_str() == name.as_str())
        }) || path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with(TMP_SUFFIX))
            || self.settings.ignore_paths.iter().any(|p| p == path)
    }

    /// `path` as the model sees it: relative to the root, `/`-separated.
    fn relative(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.root).unwrap_or(path);
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    }
}
