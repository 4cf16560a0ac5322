//! Helpers shared by the built-in tools.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{FileType, Mode};

use serde::de::DeserializeOwned;
use serde_json::Value;
use toolwire_core::{Location, Progress};

use super::Workspace;
use super::beneath;
use super::workspace::{Located, io_error, moved, open_error, special};
use crate::{ProgressHandle, ToolError, ToolSpec};

pub(crate) fn spec(
    name: &str,
    description: &str,
    parameters: Value,
    read_only: bool,
) -> Arc<ToolSpec> {
    Arc::new(ToolSpec {
        name: name.into(),
        server: None,
        description: description.into(),
        parameters,
        read_only,
    })
}

/// Models sometimes send `null` for a tool whose arguments are all
/// optional; that means "no arguments", not an error.
pub fn parse_args<T: DeserializeOwned>(arguments: Value) -> Result<T, ToolError> {
    let arguments = match arguments {
        Value::Null => Value::Object(Default::default()),
        other => other,
    };
    serde_json::from_value(arguments).map_err(|e| ToolError::InvalidArguments(e.to_string()))
}

/// Editors want absolute paths for locations.
pub(crate) fn report_location(progress: &ProgressHandle, path: &Path, line: Option<u64>) {
    progress.report(Progress::Locations {
        locations: vec![location(path, line)],
    });
}

pub(crate) fn location(path: &Path, line: Option<u64>) -> Location {
    Location {
        path: path.display().to_string(),
        line: line.and_then(|l| u32::try_from(l).ok()),
    }
}

/// Binary files are sniffed the way git does: a NUL in the first 8 KiB.
pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(8192)].contains(&0)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char
/// boundary.
pub(crate) fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The suffix of [`write_beneath`]'s temporary files (the file watcher
/// ignores them).
pub const TMP_SUFFIX: &str = ".toolwire-tmp";

/// Writes `bytes` to the file `at` atomically, creating missing parent
/// directories, everything relative to fds opened beneath the root (see
/// [`beneath::atomic_write_at`]). Recorded in the workspace's
/// [`OwnWrites`] first so the file watcher knows the change is the
/// agent's own. Blocking; returns whether the file existed.
///
/// [`OwnWrites`]: crate::OwnWrites
pub(crate) fn write_beneath(
    workspace: &Workspace,
    at: &Located,
    bytes: &[u8],
) -> Result<bool, ToolError> {
    let shown = at.shown.as_str();
    if at.rel.as_os_str().is_empty() {
        return Err(ToolError::Refused(format!("`{shown}` is a directory")));
    }
    let (dir, name) = beneath::open_parent(workspace.dir(at.root), &at.rel, true)
        .map_err(|e| open_error(shown, e))?;
    let keep_mode = match beneath::kind_at(dir.as_fd(), &name).map_err(|e| io_error(shown, e))? {
        None => None,
        Some((FileType::RegularFile, mode)) => {
            Some(Mode::from_raw_mode(mode.as_raw_mode() & 0o7777))
        }
        Some((FileType::Directory, _)) => {
            return Err(ToolError::Refused(format!("`{shown}` is a directory")));
        }
        Some((FileType::Symlink, _)) => return Err(moved(shown)),
        Some((kind, _)) => return Err(special(shown, beneath::kind_name(kind))),
    };
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut tmp = OsString::from(".");
    tmp.push(&name);
    tmp.push(format!(
        ".{}.{}{TMP_SUFFIX}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    workspace.own_writes().record(&at.abs, bytes);
    let result = beneath::atomic_write_at(dir.as_fd(), &name, &tmp, keep_mode, bytes);
    if let Err(e) = result {
        // The file kept its old content (the write is atomic).
        workspace.own_writes().forget(&at.abs);
        return Err(open_error(shown, e));
    }
    Ok(keep_mode.is_some())
}

/// Length of a multi-byte character cut off at the end of `bytes`.
pub(crate) fn unfinished_char(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let len = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if len > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_boundary() {
        assert_eq!(floor_char_boundary("héllo", 2), 1);
        assert_eq!(floor_char_boundary("héllo", 3), 3);
        assert_eq!(floor_char_boundary("hi", 10), 2);
    }
}
