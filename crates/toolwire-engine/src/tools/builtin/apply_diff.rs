//! `apply_diff`: edit a file with a unified diff.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Workspace;
use super::common::{io_error, parse_args, report_location, spec, tracked_write};
use super::diff::{self, Text};
use crate::tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

pub struct ApplyDiff {
    workspace: Arc<Workspace>,
    spec: ToolSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
    diff: String,
}

impl ApplyDiff {
    pub fn new(workspace: Arc<Workspace>) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file to change, relative to the workspace root."},
                "diff": {"type": "string", "description": "A unified diff of that one file: optional `---`/`+++` headers, then `@@ -a,b +c,d @@` hunks with ' ' context, '-' removed and '+' added lines."}
            },
            "required": ["path", "diff"],
            "additionalProperties": false
        });
        let description = "Applies a unified diff to one file. Context and removed lines must \
            match the file exactly (trailing whitespace aside); a hunk may sit at a different \
            line than its header says. If any hunk does not apply, nothing is written. \
            `--- /dev/null` creates a new file.";
        ApplyDiff {
            workspace,
            spec: spec("apply_diff", description, parameters, false),
        }
    }
}

#[async_trait]
impl Tool for ApplyDiff {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        let patch = diff::parse(&args.diff).map_err(|e| ToolError::InvalidArguments(e.0))?;
        let path = self.workspace.resolve(&args.path)?;
        let shown = self.workspace.display(&path);
        let io = |e| io_error(&self.workspace, &path, e);

        let old = match tokio::fs::read(&path).await {
            Ok(bytes) => {
                if patch.creates && !bytes.is_empty() {
                    return Err(ToolError::Refused(format!(
                        "the diff creates `{shown}` (`--- /dev/null`), but it already exists"
                    )));
                }
                String::from_utf8(bytes).map_err(|_| {
                    ToolError::Refused(format!("`{shown}` is not UTF-8 text; cannot apply a diff"))
                })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && patch.creates => String::new(),
            Err(e) => return Err(io(e)),
        };
        let applied = diff::apply(&patch, &Text::parse(&old))
            .map_err(|e| ToolError::Failed(format!("`{shown}` unchanged: {e}")))?;
        let first_line = applied.positions.first().map(|p| p.0 as u64);
        report_location(&ctx.progress, &path, first_line);

        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(io)?;
        }
        tracked_write(&self.workspace, &path, applied.text.render().as_bytes())
            .await
            .map_err(io)?;

        let moved: Vec<String> = applied
            .positions
            .iter()
            .enumerate()
            .filter(|(_, (_, offset))| *offset != 0)
            .map(|(n, (line, offset))| format!("hunk {} at line {line} (offset {offset:+})", n + 1))
            .collect();
        let hunks = applied.positions.len();
        let mut report = format!(
            "applied {hunks} hunk{} to `{shown}`",
            if hunks == 1 { "" } else { "s" }
        );
        if !moved.is_empty() {
            report.push_str(&format!("; {}", moved.join(", ")));
        }
        Ok(ToolOutput::ok(report))
    }
}
