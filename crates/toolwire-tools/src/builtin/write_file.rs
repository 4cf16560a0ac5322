//! `write_file`: create or replace a file in the workspace.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Workspace;
use super::common::{parse_args, report_location, spec, write_beneath};
use crate::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

pub struct WriteFile {
    workspace: Arc<Workspace>,
    spec: Arc<ToolSpec>,
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
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        let at = self.workspace.locate(&args.path)?;
        report_location(&ctx.progress, &at.abs, None);
        let shown = at.shown.clone();
        let len = args.content.len();
        let existed = self
            .workspace
            .blocking(move |workspace| write_beneath(&workspace, &at, args.content.as_bytes()))
            .await?;
        let verb = if existed { "overwrote" } else { "created" };
        Ok(ToolOutput::ok(format!(
            "{verb} `{shown}`: wrote {} bytes",
            len
        )))
    }
}
