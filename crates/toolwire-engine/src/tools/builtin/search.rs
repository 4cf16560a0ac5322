//! `search`: a regex over the text files of the workspace.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use ignore::WalkBuilder;
use ignore::overrides::OverrideBuilder;
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{Location, Progress};

use super::Workspace;
use super::common::{floor_char_boundary, io_error, location, looks_binary, parse_args, spec};
use crate::tools::{ProgressHandle, Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// Matches shown as locations to an editor; more would be noise.
const LOCATIONS: usize = 20;
/// A minified file's one line should not fill the model's context.
const MAX_LINE: usize = 300;
/// Larger files are almost never source; reading them would stall the walk.
const MAX_FILE: u64 = 8 * 1024 * 1024;

pub struct Search {
    workspace: Arc<Workspace>,
    spec: ToolSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default = "default_max")]
    max_results: usize,
}

fn default_max() -> usize {
    200
}

impl Search {
    pub fn new(workspace: Arc<Workspace>) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression (Rust `regex` syntax), matched per line."},
                "path": {"type": "string", "description": "File or directory to search, relative to the workspace root. Default: the root."},
                "glob": {"type": "string", "description": "Only files whose name matches, e.g. `*.rs` or `src/**/*.ts`."},
                "max_results": {"type": "integer", "minimum": 1, "description": "Stop after this many matching lines. Default 200."}
            },
            "required": ["pattern"],
            "additionalProperties": false
        });
        let description = "Searches the workspace's text files for a regular expression and \
            returns `path:line: text` for each matching line. Honours .gitignore, skips hidden \
            and binary files.";
        Search {
            workspace,
            spec: spec("search", description, parameters, true),
        }
    }
}

#[async_trait]
impl Tool for Search {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        if args.max_results == 0 {
            return Err(ToolError::InvalidArguments(
                "max_results must be at least 1".into(),
            ));
        }
        let regex = Regex::new(&args.pattern)
            .map_err(|e| ToolError::InvalidArguments(format!("bad pattern: {e}")))?;
        let root = self
            .workspace
            .resolve(args.path.as_deref().unwrap_or("."))?;
        tokio::fs::metadata(&root)
            .await
            .map_err(|e| io_error(&self.workspace, &root, e))?;
        let walker = walker(&root, args.glob.as_deref())?;
        let run = Run {
            workspace: self.workspace.clone(),
            regex,
            max: args.max_results,
            progress: ctx.progress.clone(),
            cancel: ctx.cancel.clone(),
        };
        let found = tokio::task::spawn_blocking(move || run.search(walker))
            .await
            .map_err(|e| ToolError::Failed(format!("search failed: {e}")))??;
        Ok(ToolOutput::ok(
            found.render(&args.pattern, args.max_results),
        ))
    }
}

fn walker(root: &Path, glob: Option<&str>) -> Result<WalkBuilder, ToolError> {
    let mut builder = WalkBuilder::new(root);
    // .gitignore applies even when the workspace is not a git checkout.
    builder
        .require_git(false)
        .sort_by_file_name(|a, b| a.cmp(b));
    if let Some(glob) = glob {
        let bad = |e: ignore::Error| ToolError::InvalidArguments(format!("bad glob `{glob}`: {e}"));
        let mut overrides = OverrideBuilder::new(root);
        overrides.add(glob).map_err(bad)?;
        builder.overrides(overrides.build().map_err(bad)?);
    }
    Ok(builder)
}

struct Run {
    workspace: Arc<Workspace>,
    regex: Regex,
    max: usize,
    progress: ProgressHandle,
    cancel: tokio_util::sync::CancellationToken,
}

#[derive(Default)]
struct Found {
    lines: Vec<String>,
    locations: Vec<Location>,
    capped: bool,
}

impl Run {
    fn search(self, walker: WalkBuilder) -> Result<Found, ToolError> {
        let mut found = Found::default();
        for entry in walker.build() {
            if self.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            // Unreadable entries are skipped like grep -s does.
            let Ok(entry) = entry else { continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            if entry.metadata().is_ok_and(|m| m.len() > MAX_FILE) {
                continue;
            }
            self.search_file(entry.path(), &mut found);
            if found.capped {
                break;
            }
        }
        if !found.locations.is_empty() {
            self.progress.report(Progress::Locations {
                locations: found.locations.clone(),
            });
        }
        Ok(found)
    }

    fn search_file(&self, path: &Path, found: &mut Found) {
        let Ok(bytes) = std::fs::read(path) else {
            return;
        };
        if looks_binary(&bytes) {
            return;
        }
        let text = String::from_utf8_lossy(&bytes);
        let shown = self.workspace.display(path);
        for (n, line) in text.lines().enumerate() {
            if !self.regex.is_match(line) {
                continue;
            }
            if found.lines.len() >= self.max {
                found.capped = true;
                return;
            }
            let line = line.trim_end_matches('\r');
            let cut = floor_char_boundary(line, MAX_LINE);
            let ellipsis = if cut < line.len() { "…" } else { "" };
            found
                .lines
                .push(format!("{shown}:{}: {}{ellipsis}", n + 1, &line[..cut]));
            if found.locations.len() < LOCATIONS {
                found.locations.push(location(path, Some(n as u64 + 1)));
            }
        }
    }
}

impl Found {
    fn render(self, pattern: &str, max: usize) -> String {
        if self.lines.is_empty() {
            return format!("no matches for `{pattern}`");
        }
        let mut out = self.lines.join("\n");
        if self.capped {
            out.push_str(&format!(
                "\n[stopped after {max} matches; narrow the pattern, path or glob, or raise max_results]"
            ));
        }
        out
    }
}
