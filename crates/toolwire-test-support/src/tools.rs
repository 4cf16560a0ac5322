//! Tools for the loop's tests: an echo tool that answers with its
//! arguments after a delay and notices cancellation.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

/// A tool that answers with its arguments, after `delay`, noticing
/// cancellation.
pub struct EchoTool {
    spec: Arc<ToolSpec>,
    delay: Duration,
}

/// An [`EchoTool`] named `name`.
pub fn echo_tool(name: &str, delay: Duration) -> Arc<dyn Tool> {
    Arc::new(EchoTool {
        spec: Arc::new(ToolSpec {
            name: name.into(),
            server: None,
            description: format!("{name}: echoes its arguments"),
            parameters: json!({"type": "object"}),
            read_only: true,
        }),
        delay,
    })
}

#[async_trait]
impl Tool for EchoTool {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        ctx.progress.status(format!("{} working", self.spec.name));
        tokio::select! {
            _ = tokio::time::sleep(self.delay) => Ok(ToolOutput::ok(format!("{} got {arguments}", self.spec.name))),
            _ = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
        }
    }
}

/// A registry of echo tools named `names` (each with `delay`).
pub fn echo_tools(names: &[&str], delay: Duration) -> ToolRegistry {
    let mut r = ToolRegistry::new();
    for n in names {
        r.register(echo_tool(n, delay));
    }
    r
}
