//! The root directories every built-in tool is confined to: the
//! workspace root, and the additional roots a session may add (an
//! editor's other folders of a multi-root project).

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::beneath;
use super::beneath::is_missing;
use crate::OwnWrites;
use crate::ToolError;

/// Blocking file work the tools may have in flight at once. A stuck file
/// system then stalls at most this many of tokio's blocking threads (512
/// by default), never all of them; further calls wait their turn.
const FILE_WORKERS: usize = 8;

/// A directory the built-in tools may not leave.
///
/// The root is canonical, so a resolved path is inside the workspace exactly
/// when it starts with the root: no symlink or `..` can hide in the root
/// itself. That check is by name; the tools then open what it named
/// relative to the root's directory fd, held from the start, with the
/// kernel refusing to leave it ([`beneath`]), so a path swapped after the
/// check fails instead of escaping.
///
/// It also keeps the [`OwnWrites`] registry: what the file tools wrote,
/// so that the file watcher does not report the agent's own writes back to
/// it as outside changes. Clones share it.
///
/// Additional roots ([`Workspace::with_additional_roots`]) are held the
/// same way, each canonical with its own directory fd: a path is inside
/// when it starts with one of the roots, and is opened beneath that
/// root's fd. Relative paths are the main root's.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    dir: Arc<OwnedFd>,
    additional: Arc<[Root]>,
    own_writes: Arc<OwnWrites>,
    file_work: Arc<Semaphore>,
}

/// An additional root: canonical, and its directory fd.
#[derive(Debug)]
struct Root {
    path: PathBuf,
    dir: OwnedFd,
}

/// A path the model gave, checked by [`Workspace::resolve`].
#[derive(Debug, Clone)]
pub(crate) struct Located {
    /// Absolute, canonical: what the editor and the file watcher see.
    pub abs: PathBuf,
    /// Relative to its root, no `..`, no symlink: what is opened.
    pub rel: PathBuf,
    /// As the model should see it (relative to the main root, else
    /// absolute).
    pub shown: String,
    /// Which root it is beneath: 0 the main one, then the additional
    /// ones in order.
    pub root: usize,
}

/// `given` as a root: canonical, a directory, and its fd.
fn open_root(given: &Path) -> Result<(PathBuf, OwnedFd), ToolError> {
    let io = |source| ToolError::Io {
        path: given.display().to_string(),
        source,
    };
    let root = std::fs::canonicalize(given).map_err(io)?;
    if !root.is_dir() {
        return Err(ToolError::Refused(format!(
            "workspace root `{}` is not a directory",
            given.display()
        )));
    }
    let dir = std::fs::File::open(&root).map_err(io)?;
    Ok((root, OwnedFd::from(dir)))
}

impl Workspace {
    pub fn new(root: impl AsRef<Path>) -> Result<Self, ToolError> {
        let (root, dir) = open_root(root.as_ref())?;
        Ok(Workspace {
            root,
            dir: Arc::new(dir),
            additional: Arc::from(Vec::new()),
            own_writes: Arc::default(),
            file_work: Arc::new(Semaphore::new(FILE_WORKERS)),
        })
    }

    /// This workspace with `roots` in its reach too (absolute
    /// directories; a repeated one, or the main root again, is left
    /// out). Relative paths stay the main root's.
    pub fn with_additional_roots(mut self, roots: &[PathBuf]) -> Result<Self, ToolError> {
        let mut additional: Vec<Root> = Vec::with_capacity(roots.len());
        for given in roots {
            if !given.is_absolute() {
                return Err(ToolError::Refused(format!(
                    "additional root `{}` is not an absolute path",
                    given.display()
                )));
            }
            let (path, dir) = open_root(given)?;
            if path != self.root && additional.iter().all(|r| r.path != path) {
                additional.push(Root { path, dir });
            }
        }
        self.additional = Arc::from(additional);
        Ok(self)
    }

    /// Every root: the main one first, then the additional ones.
    pub fn roots(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.root.as_path()).chain(self.additional.iter().map(|r| r.path.as_path()))
    }

    /// The root `abs` (absolute, canonical) is beneath, by its index in
    /// [`Self::roots`], and the rest of the path relative to it.
    pub(crate) fn beneath<'p>(&self, abs: &'p Path) -> Option<(usize, &'p Path)> {
        self.roots()
            .enumerate()
            .find_map(|(i, root)| abs.strip_prefix(root).ok().map(|rel| (i, rel)))
    }

    /// The directory fd of root `index` of [`Self::roots`], opened once:
    /// every open beneath that root starts there.
    pub(crate) fn dir(&self, index: usize) -> BorrowedFd<'_> {
        match index.checked_sub(1).and_then(|i| self.additional.get(i)) {
            Some(root) => root.dir.as_fd(),
            None => self.dir.as_fd(),
        }
    }

    /// [`resolve`](Self::resolve), with the path relative to the root that
    /// the tools open beneath it.
    pub(crate) fn locate(&self, user_path: &str) -> Result<Located, ToolError> {
        let abs = self.resolve(user_path)?;
        let (root, rel) = self.beneath(&abs).ok_or_else(|| outside(user_path))?;
        let rel = rel.to_path_buf();
        let shown = self.display(&abs);
        Ok(Located {
            abs,
            rel,
            shown,
            root,
        })
    }

    /// Opens what `at` names without following any symlink and without
    /// opening a FIFO, device or socket: a regular file or a directory, or
    /// a refusal naming what it is (blocking; run it in [`Self::blocking`]).
    pub(crate) fn open_node(&self, at: &Located) -> Result<Node, ToolError> {
        match beneath::open_node(self.dir(at.root), &at.rel)
            .map_err(|e| open_error(&at.shown, e))?
        {
            beneath::Opened::File(file, len) => Ok(Node::File(file, len)),
            beneath::Opened::Dir(dir) => Ok(Node::Dir(dir)),
            beneath::Opened::Special(kind) => Err(special(&at.shown, kind)),
            beneath::Opened::Moved => Err(moved(&at.shown)),
            beneath::Opened::Missing(e) => Err(io_error(&at.shown, e)),
        }
    }

    /// Runs blocking file work on tokio's blocking pool, at most
    /// [`FILE_WORKERS`] at a time for this workspace.
    pub(crate) async fn blocking<T, F>(&self, work: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce(Workspace) -> Result<T, ToolError> + Send + 'static,
    {
        let permit = self
            .file_work
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ToolError::Failed("the file tools are shut down".into()))?;
        let workspace = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work(workspace)
        })
        .await
        .map_err(|e| ToolError::Failed(format!("file operation failed: {e}")))?
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What the built-in tools wrote here (shared with the file watcher).
    pub fn own_writes(&self) -> &Arc<OwnWrites> {
        &self.own_writes
    }

    /// Turns a path from the model into one inside a root, or refuses.
    ///
    /// The existing part of the path is canonicalized (so every symlink on
    /// it, parents included, is followed and checked); the missing rest is
    /// appended as written, after `..` has been folded away lexically, so a
    /// file that does not exist yet can still be named.
    pub fn resolve(&self, user_path: &str) -> Result<PathBuf, ToolError> {
        if user_path.is_empty() {
            return Err(ToolError::Refused("the path is empty".into()));
        }
        if user_path.contains('\0') {
            return Err(ToolError::Refused(format!(
                "`{}` contains a NUL byte",
                user_path.escape_debug()
            )));
        }
        let lexical = normalize(&self.root.join(user_path));
        let lexically_inside = self.beneath(&lexical).is_some();
        // An absolute path may reach the root through a symlinked prefix
        // (e.g. /tmp vs /private/tmp), so only a relative one is judged
        // lexically; both are judged again after canonicalization.
        if !lexically_inside && !Path::new(user_path).is_absolute() {
            return Err(outside(user_path));
        }
        let resolved = self.canonicalize_existing(user_path, &lexical)?;
        if self.beneath(&resolved).is_some() {
            Ok(resolved)
        } else if lexically_inside {
            Err(ToolError::Refused(format!(
                "`{user_path}` leads through a symbolic link to `{}`, which is outside the workspace root",
                resolved.display()
            )))
        } else {
            Err(outside(user_path))
        }
    }

    /// A path as the model should see it: relative to the main root, else
    /// absolute (a path beneath an additional root).
    pub fn display(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
            Ok(rel) => rel.display().to_string(),
            Err(_) => path.display().to_string(),
        }
    }

    fn canonicalize_existing(&self, user_path: &str, path: &Path) -> Result<PathBuf, ToolError> {
        let mut existing = path.to_path_buf();
        let mut missing: Vec<OsString> = Vec::new();
        loop {
            match std::fs::canonicalize(&existing) {
                Ok(mut canonical) => {
                    if let Some(first) = missing.last() {
                        // canonicalize reports a dangling symlink as missing;
                        // creating through it would write wherever it points.
                        let candidate = canonical.join(first);
                        if std::fs::symlink_metadata(&candidate).is_ok() {
                            return Err(ToolError::Refused(format!(
                                "`{user_path}` goes through the symbolic link `{}` whose target does not exist; refusing to follow it",
                                self.display(&candidate)
                            )));
                        }
                    }
                    canonical.extend(missing.iter().rev());
                    return Ok(canonical);
                }
                Err(e) if is_missing(&e) => {
                    let Some(name) = existing.file_name() else {
                        return Err(io_error(user_path, e));
                    };
                    missing.push(name.to_os_string());
                    existing.pop();
                }
                Err(e) => return Err(io_error(user_path, e)),
            }
        }
    }
}

/// What [`Workspace::open_node`] found.
#[derive(Debug)]
pub(crate) enum Node {
    /// A regular file open for reading, and its length.
    File(std::fs::File, u64),
    Dir(OwnedFd),
}

/// A FIFO, device or socket: reading one could block forever or never end.
pub(crate) fn special(shown: &str, kind: &str) -> ToolError {
    ToolError::Refused(format!(
        "`{shown}` is {kind}, not a regular file or directory; the file tools do not open it"
    ))
}

/// The path changed after it was checked, so that opening it would follow
/// a symlink (perhaps out of the workspace).
pub(crate) fn moved(shown: &str) -> ToolError {
    ToolError::Refused(format!(
        "`{shown}` changed while it was being opened (a symbolic link appeared on it); \
         refusing to follow it"
    ))
}

pub(crate) fn io_error(shown: &str, source: std::io::Error) -> ToolError {
    ToolError::Io {
        path: shown.to_owned(),
        source,
    }
}

/// An open beneath the root failed: a symlink on the way is the path
/// having changed since it was checked; anything else is plain I/O.
pub(crate) fn open_error(shown: &str, e: std::io::Error) -> ToolError {
    if beneath::is_moved(&e) {
        moved(shown)
    } else {
        io_error(shown, e)
    }
}

fn outside(user_path: &str) -> ToolError {
    ToolError::Refused(format!("`{user_path}` is outside the workspace root"))
}

/// Folds `.` and `..` without touching the file system (`..` at `/` stays).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_folds_dots() {
        assert_eq!(normalize(Path::new("/a/b/../c/./d")), Path::new("/a/c/d"));
        assert_eq!(normalize(Path::new("/a/../../..")), Path::new("/"));
    }
}
