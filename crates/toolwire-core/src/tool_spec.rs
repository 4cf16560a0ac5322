//! What a model is told about a tool: shared by the tools that have one
//! and the providers that write it in their wire format.

use serde_json::Value;

/// What the model is told about a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// The MCP server (or other namespace) the tool belongs to.
    pub server: Option<String>,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
    /// The tool only reads (no side effects): safe to run without asking.
    pub read_only: bool,
}
