//! Where a `sqlite:` URL points: a file, or a database in memory.

use std::path::PathBuf;

use crate::{Result, StoreError};

/// A SQLite database as a URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// `sqlite://PATH` or `sqlite:PATH` (created if missing).
    File(PathBuf),
    /// `sqlite::memory:`, or any URL with `mode=memory`: a database of its
    /// own for each store, gone when the store is.
    Memory,
}

impl Location {
    /// Reads `url` as `sqlite://PATH[?mode=rwc|rw|memory]`,
    /// `sqlite:PATH[?…]` or `sqlite::memory:`; the path is percent-decoded.
    pub(crate) fn parse(url: &str) -> Result<Location> {
        let bad = |reason: String| StoreError::BadUrl {
            url: url.to_owned(),
            reason,
        };
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| bad("not a sqlite: URL".into()))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut memory = path == ":memory:";
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=').unwrap_or((pair, "")) {
                ("mode", "memory") => memory = true,
                // The store always creates a missing file.
                ("mode", "rwc" | "rw") => {}
                ("mode", "ro") => {
                    return Err(bad("read-only databases are not supported".into()));
                }
                // Shared or not, an in-memory database is the store's own.
                ("cache", "shared" | "private") => {}
                (name, value) => return Err(bad(format!("unknown parameter `{name}={value}`"))),
            }
        }
        if memory {
            return Ok(Location::Memory);
        }
        if path.is_empty() {
            return Err(bad("no file named".into()));
        }
        Ok(Location::File(PathBuf::from(
            percent_decoded(path).ok_or_else(|| bad("bad percent-encoding in the path".into()))?,
        )))
    }
}

/// `s` with each `%XX` replaced by its byte; `None` if that is not UTF-8 or
/// a `%` is not followed by two hex digits.
fn percent_decoded(s: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.len());
    let mut rest = s.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail.get(..2)?;
            let hex = std::str::from_utf8(hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_files_or_memory() {
        let file = |p: &str| Location::File(PathBuf::from(p));
        for (url, location) in [
            ("sqlite://toolwire.db", file("toolwire.db")),
            ("sqlite:///var/lib/t.db", file("/var/lib/t.db")),
            ("sqlite:t.db", file("t.db")),
            ("sqlite://a%20b.db?mode=rwc", file("a b.db")),
            ("sqlite::memory:", Location::Memory),
            ("sqlite://x.db?mode=memory&cache=shared", Location::Memory),
        ] {
            assert_eq!(Location::parse(url).unwrap(), location, "{url}");
        }
        for (url, says) in [
            ("sqlite://t.db?mode=ro", "read-only"),
            (
                "sqlite://t.db?journal=off",
                "unknown parameter `journal=off`",
            ),
            ("sqlite://", "no file named"),
            ("sqlite://a%2", "percent-encoding"),
            ("postgres://x", "not a sqlite: URL"),
        ] {
            let e = Location::parse(url).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(url), "{url}: {e}");
        }
    }
}
