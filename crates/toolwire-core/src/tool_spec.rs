//! What a model is told about a tool, and a call the model makes of it:
//! shared by the tools, the providers that write both in their wire
//! format, and the events and paused turns that carry calls.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ToolCallId;

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

/// A tool call as the model wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, as the model gave it.
    pub id: ToolCallId,
    /// The MCP server the tool belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The tool's name.
    pub name: String,
    /// The arguments, a JSON object.
    pub arguments: Value,
}
