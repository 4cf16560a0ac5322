//! The root directory every built-in tool is confined to.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::tools::ToolError;
use crate::watch::OwnWrites;

/// A directory the built-in tools may not leave.
///
/// The root is canonical, so a resolved path is inside the workspace exactly
/// when it starts with the root: no symlink or `..` can hide in the root
/// itself.
///
/// It also keeps the [`OwnWrites`] registry: what the file tools wrote,
/// so that the file watcher does not report the agent's own writes back to
/// it as outside changes. Clones share it.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    own_writes: Arc<OwnWrites>,
}

impl Workspace {
    pub fn new(root: impl AsRef<Path>) -> Result<Self, ToolError> {
        let given = root.as_ref();
        let root = std::fs::canonicalize(given).map_err(|source| ToolError::Io {
            path: given.display().to_string(),
            source,
        })?;
        if !root.is_dir() {
            return Err(ToolError::Refused(format!(
                "workspace root `{}` is not a directory",
                given.display()
            )));
        }
        Ok(Workspace {
            root,
            own_writes: Arc::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What the built-in tools wrote here (shared with the file watcher).
    pub fn own_writes(&self) -> &Arc<OwnWrites> {
        &self.own_writes
    }

    /// Turns a path from the model into one inside the root, or refuses.
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
        let lexically_inside = lexical.starts_with(&self.root);
        // An absolute path may reach the root through a symlinked prefix
        // (e.g. /tmp vs /private/tmp), so only a relative one is judged
        // lexically; both are judged again after canonicalization.
        if !lexically_inside && !Path::new(user_path).is_absolute() {
            return Err(outside(user_path));
        }
        let resolved = self.canonicalize_existing(user_path, &lexical)?;
        if resolved.starts_with(&self.root) {
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

    /// A path as the model should see it: relative to the root.
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

fn is_missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

fn io_error(user_path: &str, source: io::Error) -> ToolError {
    ToolError::Io {
        path: user_path.to_owned(),
        source,
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
