//! One listed MCP tool as a toolwire [`Tool`] ([`McpTool`]): its registry
//! name ([`tool_name`]) and what the model sees of a result.

use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::Value;

use super::{Listed, McpServer};
use crate::{Tool, ToolContext, ToolError, ToolImage, ToolOutput, ToolSpec};

/// OpenAI (and others) accept tool names matching `^[a-zA-Z0-9_-]{1,64}$`.
const MAX_NAME_LEN: usize = 64;

/// One MCP tool of one server, as last listed.
pub(super) struct McpTool {
    server: Arc<McpServer>,
    listed: Arc<Listed>,
}

impl McpTool {
    pub(super) fn shared(server: &Arc<McpServer>, listed: &Arc<Listed>) -> Arc<dyn Tool> {
        Arc::new(McpTool {
            server: Arc::clone(server),
            listed: Arc::clone(listed),
        })
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.listed.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let arguments = match arguments {
            // Models send `null` for "no arguments".
            Value::Null => serde_json::Map::new(),
            Value::Object(map) => map,
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "arguments must be a JSON object, got {other}"
                )));
            }
        };
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
            result = self.server.call(&self.listed.tool, arguments, &ctx.progress) => result,
        }
    }
}

/// What the model sees of a result: text items as they are, images as
/// images (a marker in the text keeps their place among the text items),
/// other items as a short marker (the model cannot use base64 payloads).
/// An image that is not valid base64, not an image or too large is a
/// marker saying why.
pub(super) fn tool_output(result: CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = Vec::with_capacity(result.content.len());
    let mut images = Vec::new();
    for block in result.content {
        parts.push(match block {
            ContentBlock::Text(text) => text.text,
            ContentBlock::Image(image) => {
                let decoded = STANDARD
                    .decode(image.data.as_bytes())
                    .map_err(|e| format!("not valid base64: {e}"))
                    .and_then(|bytes| {
                        ToolImage::new(bytes, Some(&image.mime_type)).map_err(|e| e.to_string())
                    });
                match decoded {
                    Ok(decoded) => {
                        images.push(decoded);
                        format!("[image: {}]", image.mime_type)
                    }
                    Err(why) => format!("[image: {}: refused: {why}]", image.mime_type),
                }
            }
            ContentBlock::Audio(audio) => format!("[audio: {}]", audio.mime_type),
            ContentBlock::Resource(embedded) => match embedded.resource {
                // The text of an embedded text resource is the answer (a file
                // read, say); keep it after its uri.
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource: {uri}]\n{text}")
                }
                ResourceContents::BlobResourceContents { uri, mime_type, .. } => match mime_type {
                    Some(mime) => format!("[resource: {uri} ({mime})]"),
                    None => format!("[resource: {uri}]"),
                },
                _ => "[resource]".to_owned(),
            },
            ContentBlock::ResourceLink(link) => format!("[resource: {}]", link.uri),
            _ => "[unsupported content]".to_owned(),
        });
    }
    if parts.is_empty()
        && let Some(structured) = result.structured_content
    {
        parts.push(structured.to_string());
    }
    ToolOutput {
        content: parts.join("\n"),
        is_error: result.is_error.unwrap_or(false),
        images,
    }
}

/// The registry name of `tool` of `server`: `{server}__{tool}` with every
/// character outside `[a-zA-Z0-9_-]` replaced by `_`; names longer than 64
/// are cut and end in a hash of the full name so they stay unique and
/// stable.
pub fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("{server}__{tool}");
    let clean: String = full.chars().map(sanitize).collect();
    if clean.is_empty() || clean.len() > MAX_NAME_LEN {
        return hashed_name(&full);
    }
    clean
}

fn sanitize(c: char) -> char {
    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
        c
    } else {
        '_'
    }
}

/// At most 64 characters: a sanitized prefix, `_`, 8 hex digits of FNV-1a.
pub(super) fn hashed_name(full: &str) -> String {
    let hash = full.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let prefix: String = full.chars().map(sanitize).take(MAX_NAME_LEN - 9).collect();
    format!("{prefix}_{hash:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_api_safe() {
        assert_eq!(tool_name("everything", "echo"), "everything__echo");
        assert_eq!(
            tool_name("my server", "get.thing/v2"),
            "my_server__get_thing_v2"
        );
        let long = tool_name("server", &"x".repeat(100));
        assert_eq!(long.len(), MAX_NAME_LEN);
        assert!(
            long.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
        assert_ne!(long, tool_name("server", &"x".repeat(101)));
        assert_eq!(long, tool_name("server", &"x".repeat(100)));
    }
}
