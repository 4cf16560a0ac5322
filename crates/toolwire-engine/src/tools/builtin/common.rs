//! Helpers shared by the built-in tools.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde_json::Value;
use toolwire_core::{Location, Progress};

use super::Workspace;
use crate::tools::{ProgressHandle, ToolError, ToolSpec};

pub(crate) fn spec(name: &str, description: &str, parameters: Value, read_only: bool) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        server: None,
        description: description.into(),
        parameters,
        read_only,
    }
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

pub(crate) fn io_error(workspace: &Workspace, path: &Path, source: std::io::Error) -> ToolError {
    ToolError::Io {
        path: workspace.display(path),
        source,
    }
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

/// The suffix of [`atomic_write`]'s temporary files (the file watcher
/// ignores them).
pub(crate) const TMP_SUFFIX: &str = ".toolwire-tmp";

/// [`atomic_write`], recorded in the workspace's [`OwnWrites`] first so the
/// file watcher knows the change is the agent's own.
///
/// [`OwnWrites`]: crate::watch::OwnWrites
pub(crate) async fn tracked_write(
    workspace: &Workspace,
    path: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    workspace.own_writes().record(path, bytes);
    let result = atomic_write(path, bytes).await;
    if result.is_err() {
        // The file kept its old content (the write is atomic).
        workspace.own_writes().forget(path);
    }
    result
}

/// Writes `bytes` to a temporary file next to `path` and renames it over
/// `path`, so readers never see a half-written file and a failed write
/// leaves the old content. An existing file's permissions are kept.
pub(crate) async fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.{}.{}{TMP_SUFFIX}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = write_then_rename(&tmp, path, bytes).await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

async fn write_then_rename(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .await?;
    file.write_all(bytes).await?;
    file.sync_all().await?;
    drop(file);
    if let Ok(meta) = tokio::fs::metadata(path).await {
        tokio::fs::set_permissions(tmp, meta.permissions()).await?;
    }
    tokio::fs::rename(tmp, path).await
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
