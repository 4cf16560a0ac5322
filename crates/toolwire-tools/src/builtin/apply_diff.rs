//! `apply_diff`: edit a file with a unified diff.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Workspace;
use super::common::{parse_args, report_location, spec, write_beneath};
use super::diff::{self, Text};
use super::workspace::{Located, Node, io_error};
use crate::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

pub struct ApplyDiff {
    workspace: Arc<Workspace>,
    spec: Arc<ToolSpec>,
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
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        let patch = diff::parse(&args.diff).map_err(|e| ToolError::InvalidArguments(e.0))?;
        let at = self.workspace.locate(&args.path)?;
        let progress = ctx.progress.clone();
        let applied = self
            .workspace
            .blocking(move |workspace| {
                let shown = at.shown.as_str();
                let old = read_old(&workspace, &at, patch.creates)?;
                let applied = diff::apply(&patch, &Text::parse(&old))
                    .map_err(|e| ToolError::Failed(format!("`{shown}` unchanged: {e}")))?;
                let first_line = applied.positions.first().map(|p| p.0 as u64);
                report_location(&progress, &at.abs, first_line);
                write_beneath(&workspace, &at, applied.text.render().as_bytes())?;
                Ok((applied.positions, at.shown))
            })
            .await?;
        let (positions, shown) = applied;
        let moved: Vec<String> = positions
            .iter()
            .enumerate()
            .filter(|(_, (_, offset))| *offset != 0)
            .map(|(n, (line, offset))| format!("hunk {} at line {line} (offset {offset:+})", n + 1))
            .collect();
        let hunks = positions.len();
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

/// The file's text now; empty for a diff that creates a missing file.
fn read_old(workspace: &Workspace, at: &Located, creates: bool) -> Result<String, ToolError> {
    use std::io::Read;
    let shown = at.shown.as_str();
    let mut file = match workspace.open_node(at) {
        Ok(Node::File(file, _)) => file,
        Ok(Node::Dir(_)) => {
            return Err(ToolError::Refused(format!(
                "`{shown}` is a directory; apply_diff edits one file"
            )));
        }
        Err(ToolError::Io { source, .. })
            if creates && source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(String::new());
        }
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| io_error(shown, e))?;
    if creates && !bytes.is_empty() {
        return Err(ToolError::Refused(format!(
            "the diff creates `{shown}` (`--- /dev/null`), but it already exists"
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        ToolError::Refused(format!("`{shown}` is not UTF-8 text; cannot apply a diff"))
    })
}
