//! `search`: a regex over the text files of the workspace.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use ignore::WalkBuilder;
use ignore::overrides::OverrideBuilder;
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::{Location, Progress};

use rustix::fs::{FileType, OFlags};

use super::Workspace;
use super::beneath;
use super::common::{floor_char_boundary, location, looks_binary, parse_args, spec};
use super::workspace::{Located, Node};
use crate::{ProgressHandle, Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// Matches shown as locations to an editor; more would be noise.
const LOCATIONS: usize = 20;
/// A minified file's one line should not fill the model's context.
const MAX_LINE: usize = 300;
/// Larger files are almost never source; reading them would stall the walk.
const MAX_FILE: u64 = 8 * 1024 * 1024;

pub struct Search {
    workspace: Arc<Workspace>,
    spec: Arc<ToolSpec>,
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
    fn spec(&self) -> &Arc<ToolSpec> {
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
        let at = self.workspace.locate(args.path.as_deref().unwrap_or("."))?;
        let run = Run {
            workspace: self.workspace.clone(),
            regex,
            max: args.max_results,
            progress: ctx.progress.clone(),
            cancel: ctx.cancel.clone(),
        };
        let glob = args.glob.clone();
        let found = self
            .workspace
            .blocking(move |workspace| {
                // A FIFO, device or socket is refused by name; a file or
                // directory is searched.
                workspace.open_node(&at)?;
                check_ignore_files(&workspace, &at)?;
                let walker = walker(&workspace, &at.abs, glob.as_deref())?;
                run.search(walker)
            })
            .await?;
        Ok(ToolOutput::ok(
            found.render(&args.pattern, args.max_results),
        ))
    }
}

/// The walker reads `.gitignore` and `.ignore` files by path, in the
/// searched directory and its parents; one that is a FIFO would block it
/// for good. Those the walk will read below are checked as it goes
/// ([`Run::search`]'s entry filter).
fn check_ignore_files(workspace: &Workspace, at: &Located) -> Result<(), ToolError> {
    let root = workspace.roots().nth(at.root).unwrap_or(workspace.root());
    let mut dir = Some(at.rel.as_path());
    while let Some(rel) = dir {
        if let Some(kind) = odd_ignore_file(workspace, at.root, rel) {
            let shown = workspace.display(&root.join(rel));
            return Err(ToolError::Refused(format!(
                "`{shown}` holds an ignore file that is {kind}; search only reads regular files"
            )));
        }
        dir = rel.parent();
    }
    Ok(())
}

/// An ignore file in the directory `rel` (relative to root `root` of the
/// workspace) that is neither missing nor a regular file: what it is.
fn odd_ignore_file(workspace: &Workspace, root: usize, rel: &Path) -> Option<&'static str> {
    let dir = beneath::open(workspace.dir(root), rel, OFlags::PATH | OFlags::DIRECTORY).ok()?;
    [".gitignore", ".ignore", ".git/info/exclude"]
        .iter()
        .find_map(
            |name| match beneath::kind_at(dir.as_fd(), OsStr::new(name)) {
                Ok(Some((FileType::RegularFile, _))) | Ok(None) => None,
                Ok(Some((kind, _))) => Some(beneath::kind_name(kind)),
                Err(_) => None,
            },
        )
}

fn walker(
    workspace: &Workspace,
    root: &Path,
    glob: Option<&str>,
) -> Result<WalkBuilder, ToolError> {
    let mut builder = WalkBuilder::new(root);
    // .gitignore applies even when the workspace is not a git checkout.
    // Symlinks are never followed (the default, said here because the
    // confinement depends on it).
    builder
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b));
    // A directory whose ignore file is a FIFO (or device) is skipped, not
    // entered: the walker would block reading it.
    let workspace = workspace.clone();
    builder.filter_entry(move |entry| {
        !entry.file_type().is_some_and(|t| t.is_dir())
            || workspace
                .beneath(entry.path())
                .is_some_and(|(root, rel)| odd_ignore_file(&workspace, root, rel).is_none())
    });
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

    /// Reads the file through the workspace's fd like read_file does, so a
    /// directory swapped for a symlink mid-walk leads nowhere and a FIFO
    /// is never opened for reading. Unreadable files are skipped like
    /// grep -s does.
    fn search_file(&self, path: &Path, found: &mut Found) {
        let Some((root, rel)) = self.workspace.beneath(path) else {
            return;
        };
        let at = Located {
            abs: path.to_path_buf(),
            rel: rel.to_path_buf(),
            shown: String::new(),
            root,
        };
        let Ok(Node::File(file, len)) = self.workspace.open_node(&at) else {
            return;
        };
        if len > MAX_FILE {
            return;
        }
        let mut bytes = Vec::new();
        if file.take(MAX_FILE).read_to_end(&mut bytes).is_err() {
            return;
        }
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
