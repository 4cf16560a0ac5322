//! `write_file`: create or replace a file in the workspace.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Workspace;
use super::common::{io_error, parse_args, report_location, spec, tracked_write};
use crate::tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

pub struct WriteFile {
    workspace: Arc<Workspace>,
    spec: ToolSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
    content: String,
}

impl WriteFile {
    pub fn new(workspace: Arc<Workspace>) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace root (or absolute inside it)."},
                "content": {"type": "string", "description": "The complete new content of the file."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        });
        let description = "Writes a file in the workspace, replacing it if it exists and creating \
            missing parent directories. The write is atomic. Prefer apply_diff for small edits \
            to an existing file.";
        WriteFile {
            workspace,
            spec: spec("write_file", description, parameters, false),
        }
    }
}

#[async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        let path = self.workspace.resolve(&args.path)?;
        let shown = self.workspace.display(&path);
        let io = |e| io_error(&self.workspace, &path, e);
        let existed = match tokio::fs::metadata(&path).await {
            Ok(meta) if meta.is_dir() => {
                return Err(ToolError::Refused(format!("`{shown}` is a directory")));
            }
            Ok(_) => true,
            Err(_) => false,
        };
        report_location(&ctx.progress, &path, None);
        if let Some(parent) = path.parent() {
            // Resolution already proved every missing component lies under
            // the root, so creating them cannot leave it.
            tokio::fs::create_dir_all(parent).await.map_err(io)?;
        }
        tracked_write(&self.workspace, &path, args.content.as_bytes())
            .await
            .map_err(io)?;
        let verb = if existed { "overwrote" } else { "created" };
        Ok(ToolOutput::ok(format!(
            "{verb} `{shown}`: wrote {} bytes",
            args.content.len()
        )))
    }
}
