//! `list_dir`: what is in a directory of the workspace.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use async_trait::async_trait;
use rustix::fs::FileType;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Workspace;
use super::beneath;
use super::common::{parse_args, report_location, spec};
use super::workspace::{Node, io_error};
use crate::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// Directories whose contents drown everything else in a recursive listing.
const SKIPPED: &[&str] = &[".git", "target", "node_modules"];

pub struct ListDir {
    workspace: Arc<Workspace>,
    spec: Arc<ToolSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    recursive: bool,
    #[serde(default = "default_max")]
    max_entries: usize,
}

fn default_max() -> usize {
    500
}

impl ListDir {
    pub fn new(workspace: Arc<Workspace>) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory, relative to the workspace root. Default: the root."},
                "recursive": {"type": "boolean", "description": "List subdirectories too. Default false."},
                "max_entries": {"type": "integer", "minimum": 1, "description": "Stop after this many entries. Default 500."}
            },
            "additionalProperties": false
        });
        let description = "Lists a directory of the workspace, sorted by name. Directories end \
            in `/`, symbolic links in `@` (not followed). Recursive listings show `.git`, \
            `target` and `node_modules` but not their contents.";
        ListDir {
            workspace,
            spec: spec("list_dir", description, parameters, true),
        }
    }
}

#[async_trait]
impl Tool for ListDir {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        if args.max_entries == 0 {
            return Err(ToolError::InvalidArguments(
                "max_entries must be at least 1".into(),
            ));
        }
        let at = self.workspace.locate(args.path.as_deref().unwrap_or("."))?;
        let progress = ctx.progress.clone();
        let listing = Listing {
            recursive: args.recursive,
            max: args.max_entries,
            entries: Vec::new(),
            truncated: false,
            cancel: ctx.cancel.clone(),
        };
        let (listing, shown) = self
            .workspace
            .blocking(move |workspace| {
                let shown = at.shown.as_str();
                let dir = match workspace.open_node(&at)? {
                    Node::Dir(dir) => dir,
                    Node::File(..) => {
                        return Err(ToolError::Refused(format!(
                            "`{shown}` is not a directory; use read_file to read it"
                        )));
                    }
                };
                report_location(&progress, &at.abs, None);
                let mut listing = listing;
                listing.walk(&dir, "").map_err(|e| io_error(shown, e))?;
                Ok((listing, at.shown))
            })
            .await?;
        if listing.cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        Ok(ToolOutput::ok(listing.render(&shown)))
    }
}

struct Listing {
    recursive: bool,
    max: usize,
    entries: Vec<String>,
    truncated: bool,
    cancel: CancellationToken,
}

impl Listing {
    /// Depth-first with siblings sorted, so a cut listing is still the
    /// first entries in order.
    fn walk(&mut self, dir: &OwnedFd, prefix: &str) -> std::io::Result<()> {
        let mut children: Vec<_> = beneath::entries(dir)?
            .into_iter()
            .map(|(name, kind)| (name.to_string_lossy().into_owned(), name, kind))
            .collect();
        children.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, raw, kind) in children {
            if self.entries.len() >= self.max {
                self.truncated = true;
                return Ok(());
            }
            if self.cancel.is_cancelled() {
                return Ok(());
            }
            let rel = format!("{prefix}{name}");
            if kind == FileType::Symlink {
                self.entries.push(format!("{rel}@"));
            } else if kind == FileType::Directory {
                self.entries.push(format!("{rel}/"));
                if self.recursive && !SKIPPED.contains(&name.as_str()) {
                    // Opened relative to its parent's fd without following
                    // a symlink, so a swap cannot lead the walk outside. An
                    // unreadable subdirectory should not hide the rest.
                    let walked = beneath::open_subdir(dir, &raw)
                        .and_then(|sub| self.walk(&sub, &format!("{rel}/")));
                    if let Err(e) = walked {
                        self.entries.push(format!("{rel}/ [unreadable: {e}]"));
                    }
                }
            } else {
                self.entries.push(rel);
            }
        }
        Ok(())
    }

    fn render(self, shown: &str) -> String {
        if self.entries.is_empty() {
            return format!("`{shown}` is empty");
        }
        let mut out = self.entries.join("\n");
        if self.truncated {
            out.push_str(&format!(
                "\n[truncated after {} entries; list a subdirectory or raise max_entries]",
                self.max
            ));
        }
        out
    }
}
