//! Messages and their content blocks.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{ConversationId, MessageId, ToolCallId};
use crate::image::BlobRef;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The system prompt. A conversation's root is its system message.
    System,
    /// A person (or a client speaking for one).
    User,
    /// The model.
    Assistant,
    /// Tool results.
    Tool,
}

impl Role {
    /// The name it is stored and sent under.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// The role named `s`, if any.
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

/// How urgent a notification is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Can wait for a quiet moment.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Worth telling the model at once.
    High,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning, kept apart from its answer.
    Reasoning {
        /// The reasoning text.
        text: String,
    },
    /// A tool call the model made.
    ToolUse {
        /// The call's id, as the model gave it.
        id: ToolCallId,
        /// The MCP server the tool belongs to, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<String>,
        /// The tool's name.
        name: String,
        /// The arguments, a JSON object.
        arguments: Value,
    },
    /// The result of a tool call.
    ToolResult {
        /// The call this answers.
        tool_use_id: ToolCallId,
        /// The result's text, as the model reads it.
        content: String,
        /// Whether the tool failed (the content is then its error).
        #[serde(default)]
        is_error: bool,
        /// Images the tool returned (a screenshot, an image file read),
        /// stored once by hash; the model sees them after the text.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<BlobRef>,
    },
    /// An image (a user's, or one an interjection carried), stored once
    /// by hash: `{"type":"image","media_type":…,"sha256":…,"bytes_len":…}`.
    Image(BlobRef),
    /// A compaction node's summary: on its branch, requests send it in
    /// place of the path from the root's child through `through` (the
    /// messages stay stored; a branch from before the node sends them).
    Compaction {
        /// The summary, as the model reads it.
        summary: String,
        /// The last message of the path it covers.
        through: MessageId,
        /// How many messages of the path it covers.
        covered: u32,
        /// Tokens of the request before compaction.
        tokens_before: u64,
        /// Tokens of the summary.
        tokens_after: u64,
    },
    /// A notification delivered to the model.
    Notification {
        /// Who reported it (a watcher, a task, a client).
        source: String,
        /// How urgent it is.
        #[serde(default)]
        priority: Priority,
        /// The notification as the model reads it.
        text: String,
    },
}

/// The result of a call that toolwire stopped before it finished: stored
/// at recovery, and sent in its place should a path still lack one.
pub const NOT_RUN_AFTER_STOP: &str = "Not run: toolwire stopped before this call finished.";

/// Token counts of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every token of the request: those read from the provider's cache
    /// and those written to it included. OpenAI counts its prompt tokens
    /// this way; Anthropic's `input_tokens` leaves both out, and its
    /// decoder adds them back, so the number means one thing everywhere.
    pub prompt_tokens: u64,
    /// Tokens the model wrote.
    pub completion_tokens: u64,
    /// Prompt tokens read from the provider's cache (part of
    /// `prompt_tokens`).
    pub cached_tokens: u64,
    /// Prompt tokens written to the provider's cache (part of
    /// `prompt_tokens`; Anthropic reports them, OpenAI caches without
    /// saying). Absent from rows and events stored before it was counted.
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Prompt and completion tokens together.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, rhs: Self) {
        self.prompt_tokens += rhs.prompt_tokens;
        self.completion_tokens += rhs.completion_tokens;
        self.cached_tokens += rhs.cached_tokens;
        self.cache_write_tokens += rhs.cache_write_tokens;
    }
}

/// Whether a message is whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Whole.
    #[default]
    Complete,
    /// The turn that wrote it stopped before it could finish (a crash, a
    /// broken stream): what was received is kept.
    Interrupted,
    /// The model call or tool that wrote it failed.
    Error,
}

impl MessageStatus {
    /// The name it is stored and sent under.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Complete => "complete",
            MessageStatus::Interrupted => "interrupted",
            MessageStatus::Error => "error",
        }
    }

    /// The status named `s`, if any.
    pub fn parse(s: &str) -> Option<MessageStatus> {
        Some(match s {
            "complete" => MessageStatus::Complete,
            "interrupted" => MessageStatus::Interrupted,
            "error" => MessageStatus::Error,
            _ => return None,
        })
    }
}

/// A node of a conversation tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The message's id.
    pub id: MessageId,
    /// The conversation it belongs to.
    pub conversation_id: ConversationId,
    /// `None` only for the conversation's root.
    pub parent_id: Option<MessageId>,
    /// Who wrote it.
    pub role: Role,
    /// What it says, block by block.
    pub content: Vec<ContentBlock>,
    /// Tokens of the model call that wrote it (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// In US dollars, from the price table, when the model is priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// The model that wrote an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Wall time the message took to produce (model call or tool run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Whether it is whole.
    #[serde(default)]
    pub status: MessageStatus,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl Message {
    /// A new message under `parent`, with a fresh id and the current time.
    pub fn new(
        conversation_id: ConversationId,
        parent_id: Option<MessageId>,
        role: Role,
        content: Vec<ContentBlock>,
    ) -> Self {
        Message {
            id: MessageId::new(),
            conversation_id,
            parent_id,
            role,
            content,
            usage: None,
            cost: None,
            model: None,
            duration_ms: None,
            status: MessageStatus::Complete,
            created_at: Utc::now(),
        }
    }

    /// All text blocks joined.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The compaction this message is, if it is a compaction node: its
    /// summary and the last message it covers.
    pub fn compaction(&self) -> Option<(&str, MessageId)> {
        self.content.iter().find_map(|b| match b {
            ContentBlock::Compaction {
                summary, through, ..
            } => Some((summary.as_str(), *through)),
            _ => None,
        })
    }

    /// Every image the message refers to, in order (its own and its tool
    /// results').
    pub fn images(&self) -> impl Iterator<Item = &BlobRef> {
        self.content.iter().flat_map(|b| match b {
            ContentBlock::Image(image) => std::slice::from_ref(image),
            ContentBlock::ToolResult { images, .. } => images.as_slice(),
            _ => &[],
        })
    }

    /// The tool calls of an assistant message, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&ToolCallId, Option<&str>, &str, &Value)> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse {
                id,
                server,
                name,
                arguments,
            } => Some((id, server.as_deref(), name.as_str(), arguments)),
            _ => None,
        })
    }

    /// A one-line summary for lists and trees.
    pub fn summary(&self, max_chars: usize) -> String {
        let mut s = String::new();
        for block in &self.content {
            let piece = match block {
                ContentBlock::Text { text } | ContentBlock::Reasoning { text } => text.clone(),
                ContentBlock::ToolUse { name, .. } => format!("[{name}]"),
                ContentBlock::ToolResult {
                    content, images, ..
                } => {
                    let mut s = content.clone();
                    for image in images {
                        s.push(' ');
                        s.push_str(&image.mention());
                    }
                    s
                }
                ContentBlock::Image(image) => image.mention(),
                ContentBlock::Notification { source, text, .. } => format!("[{source}] {text}"),
                ContentBlock::Compaction {
                    summary, covered, ..
                } => format!("[compaction of {covered} messages] {summary}"),
            };
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(&piece);
            if s.chars().count() > max_chars {
                break;
            }
        }
        let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
        match one_line.char_indices().nth(max_chars) {
            Some((cut, _)) => format!("{}…", &one_line[..cut]),
            None => one_line,
        }
    }
}
