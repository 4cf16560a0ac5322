//! What an editor shows of a tool call before it has a result: a title for
//! people ("Edit src/lib.rs", "Run `cargo test`"), a kind, and the places
//! it touches. Computed from whatever arguments are known so far, so the
//! title sharpens as the model writes the fields. Pure: no I/O.

use std::path::Path;

use serde_json::Value;
use toolwire_core::{Location, ToolCallId, ToolCallState, ToolKind, kind_of};

/// Titles longer than this are cut (a command can be a whole script).
const MAX_TITLE: usize = 80;

/// A call's title, kind and locations from its name and the arguments known
/// so far (`args` may be a partial object, or not an object at all).
pub struct Described {
    pub title: String,
    pub kind: ToolKind,
    pub locations: Vec<Location>,
}

pub fn describe(name: &str, args: &Value, cwd: &Path) -> Described {
    let text = |key: &str| args.get(key).and_then(Value::as_str);
    let number = |key: &str| args.get(key).and_then(Value::as_u64);
    let at = |path: &str, line: Option<u64>| Location {
        path: absolute(cwd, path),
        line: line.and_then(|l| u32::try_from(l).ok()),
    };
    let (title, locations) = match name {
        "read_file" => match text("path") {
            Some(path) => {
                let offset = number("offset");
                let range = match (offset, number("limit")) {
                    (Some(first), Some(limit)) if limit > 0 => {
                        format!(":{first}-{}", first + limit - 1)
                    }
                    (None, Some(limit)) if limit > 0 => format!(":1-{limit}"),
                    (Some(first), _) => format!(":{first}"),
                    _ => String::new(),
                };
                (
                    format!("Read {path}{range}"),
                    vec![at(path, offset.or(Some(1)))],
                )
            }
            None => ("Read file".to_owned(), Vec::new()),
        },
        "write_file" | "apply_diff" => match text("path") {
            Some(path) => (format!("Edit {path}"), vec![at(path, None)]),
            None => ("Edit file".to_owned(), Vec::new()),
        },
        "list_dir" => {
            let path = text("path").unwrap_or(".");
            (format!("List {path}"), vec![at(path, None)])
        }
        "search" => match text("pattern") {
            Some(pattern) => {
                let mut title = format!("Search {}", quoted(pattern));
                let path = text("path");
                if let Some(path) = path {
                    title.push_str(&format!(" in {path}"));
                }
                if let Some(glob) = text("glob") {
                    title.push_str(&format!(" ({glob})"));
                }
                (title, path.map(|p| vec![at(p, None)]).unwrap_or_default())
            }
            None => ("Search".to_owned(), Vec::new()),
        },
        "run_command" => match text("command") {
            Some(command) => {
                let background = args.get("background").and_then(Value::as_bool) == Some(true);
                let mut title = format!("Run {}", quoted(command));
                if background {
                    title.push_str(" in the background");
                }
                let locations = text("cwd").map(|c| vec![at(c, None)]).unwrap_or_default();
                (title, locations)
            }
            None => ("Run command".to_owned(), Vec::new()),
        },
        _ => (name.to_owned(), Vec::new()),
    };
    Described {
        title: shorten(&title),
        kind: kind_of(name),
        locations,
    }
}

/// `s` in backticks, on one line (a multi-line command shows its first).
fn quoted(s: &str) -> String {
    let first = s.lines().next().unwrap_or_default();
    let more = if s.trim_end().contains('\n') {
        " …"
    } else {
        ""
    };
    format!("`{first}`{more}")
}

fn shorten(title: &str) -> String {
    if title.chars().count() <= MAX_TITLE {
        return title.to_owned();
    }
    let mut cut: String = title.chars().take(MAX_TITLE - 1).collect();
    cut.push('…');
    cut
}

/// `path` as an absolute path: relative ones are under the session's cwd.
pub fn absolute(cwd: &Path, path: &str) -> String {
    let path = Path::new(path);
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    // `./x` and `.` read better without the dot.
    let mut clean = std::path::PathBuf::new();
    for part in joined.components() {
        if part != std::path::Component::CurDir {
            clean.push(part);
        }
    }
    clean.display().to_string()
}

/// A call's state with the title, kind and locations its arguments give.
pub(crate) fn described_state(
    id: &ToolCallId,
    name: &str,
    args: &serde_json::Value,
    cwd: &Path,
) -> ToolCallState {
    let d = describe(name, args, cwd);
    let mut state = ToolCallState::new(id.clone(), d.title, d.kind);
    state.locations = d.locations;
    state
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn title(name: &str, args: Value) -> String {
        describe(name, &args, Path::new("/w")).title
    }

    #[test]
    fn titles_read_like_what_the_call_does() {
        assert_eq!(
            title("write_file", json!({"path": "src/lib.rs"})),
            "Edit src/lib.rs"
        );
        assert_eq!(title("apply_diff", json!({})), "Edit file");
        assert_eq!(
            title(
                "read_file",
                json!({"path": "src/main.rs", "offset": 10, "limit": 11})
            ),
            "Read src/main.rs:10-20"
        );
        assert_eq!(title("read_file", json!({"path": "a"})), "Read a");
        assert_eq!(
            title("run_command", json!({"command": "cargo test"})),
            "Run `cargo test`"
        );
        assert_eq!(
            title("run_command", json!({"command": "a\nb\n"})),
            "Run `a` …"
        );
        assert_eq!(title("search", json!({"pattern": "foo"})), "Search `foo`");
        assert_eq!(title("list_dir", json!({})), "List .");
        assert_eq!(title("github__issue", json!({"n": 1})), "github__issue");
        assert!(
            title("run_command", json!({"command": "x".repeat(500)}))
                .chars()
                .count()
                <= MAX_TITLE
        );
    }

    #[test]
    fn locations_are_absolute_with_lines() {
        let d = describe(
            "read_file",
            &json!({"path": "./src/main.rs", "offset": 10}),
            Path::new("/w"),
        );
        assert_eq!(
            d.locations,
            [Location {
                path: "/w/src/main.rs".into(),
                line: Some(10)
            }]
        );
        assert_eq!(d.kind, ToolKind::Read);
        let d = describe("write_file", &json!({"path": "/etc/x"}), Path::new("/w"));
        assert_eq!(d.locations[0].path, "/etc/x");
        assert_eq!(d.locations[0].line, None);
    }
}
