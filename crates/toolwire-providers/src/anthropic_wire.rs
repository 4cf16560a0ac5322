//! Anthropic's messages as sent: borrowing structs serialized straight
//! to the request's bytes, each block able to carry a prompt-cache
//! breakpoint ([`crate::prompt_cache`] places them).

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

/// A prompt-cache breakpoint: `{"type": "ephemeral"}`.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ephemeral {
    #[serde(rename = "type")]
    kind: &'static str,
}

impl Ephemeral {
    pub const MARK: Ephemeral = Ephemeral { kind: "ephemeral" };
}

/// One message as sent: its role and its blocks.
#[derive(Serialize)]
pub struct AnthropicMessage<'a> {
    pub role: &'static str,
    pub content: Vec<Block<'a>>,
}

/// A content block. Each may carry a prompt-cache breakpoint, written
/// after its other fields.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block<'a> {
    Text {
        text: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    },
    Image {
        source: ImageSource,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: ResultContent<'a>,
        is_error: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    },
}

impl Block<'_> {
    pub(crate) fn text(text: Cow<'_, str>) -> Block<'_> {
        Block::Text {
            text,
            cache_control: None,
        }
    }

    /// Its breakpoint, to set.
    pub(crate) fn cache_control(&mut self) -> &mut Option<Ephemeral> {
        match self {
            Block::Text { cache_control, .. }
            | Block::Image { cache_control, .. }
            | Block::ToolUse { cache_control, .. }
            | Block::ToolResult { cache_control, .. } => cache_control,
        }
    }

    /// Whether it may carry a breakpoint: an empty text block may not.
    pub(crate) fn markable(&self) -> bool {
        !matches!(self, Block::Text { text, .. } if text.is_empty())
    }
}

/// A tool result's content: a string, or blocks when it has images.
#[derive(Serialize)]
#[serde(untagged)]
pub enum ResultContent<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<Block<'a>>),
}

#[derive(Serialize)]
pub struct ImageSource {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub media_type: String,
    pub data: String,
}
