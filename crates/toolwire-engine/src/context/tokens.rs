//! Token counts before sending: OpenAI's BPEs (`tiktoken-rs`, whose
//! vocabulary files are compiled in, so it works offline) for OpenAI
//! models, an estimate from `cl100k_base` for the others.
//!
//! A request's size is mostly known from the provider: each assistant
//! message keeps the usage of the call that wrote it (its prompt is the
//! path before it). Counting here is only for what came after the last
//! such message (tool results, user messages) and for paths no provider
//! has counted yet, so a step counts one or two messages, not the path.

use std::borrow::Borrow;
use std::collections::HashMap;

use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};
use toolwire_core::{ContentBlock, Message, MessageId};
use toolwire_providers::ModelInfo;
use toolwire_tools::ToolSpec;

/// Tokens a chat API adds around each message (role, separators).
const PER_MESSAGE: u64 = 4;
/// Tokens around a tool call or result (ids, names, structure).
const PER_CALL: u64 = 12;
/// What an image costs, roughly (a 1024×1024 image is ~765 tokens on
/// OpenAI, ~1,400 on Anthropic): the larger, to stay under the window.
const PER_IMAGE: u64 = 1_500;

/// Which tokenizer counts a model's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// GPT-4o, 4.1, o-series, GPT-5 and unknown models.
    O200k,
    /// GPT-4, GPT-3.5.
    Cl100k,
    /// Claude: its tokenizer is not public. `cl100k_base` plus a fifth
    /// (Claude counts English and code 10–20% above it).
    Claude,
}

impl Family {
    /// The family of `model`, from its provider kind and id.
    pub fn of(model: &ModelInfo) -> Family {
        if model.provider == "anthropic" || model.model.starts_with("claude") {
            return Family::Claude;
        }
        match get_tokenizer(&model.model) {
            Some(Tokenizer::Cl100kBase) => Family::Cl100k,
            _ => Family::O200k,
        }
    }

    fn bpe(self) -> &'static CoreBPE {
        match self {
            Family::O200k => tiktoken_rs::o200k_base_singleton(),
            Family::Cl100k | Family::Claude => tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// Tokens of `text`.
    pub fn count(self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        let n = self.bpe().count_ordinary(text) as u64;
        match self {
            Family::Claude => n + n / 5,
            _ => n,
        }
    }

    /// Tokens of one message as a chat API counts it.
    pub fn message(self, m: &Message) -> u64 {
        let mut n = PER_MESSAGE;
        for block in &m.content {
            n += match block {
                ContentBlock::Text { text } => self.count(text),
                // Not sent back to the model.
                ContentBlock::Reasoning { .. } => 0,
                ContentBlock::ToolUse {
                    name, arguments, ..
                } => PER_CALL + self.count(name) + self.count(&arguments.to_string()),
                ContentBlock::ToolResult {
                    content, images, ..
                } => PER_CALL + self.count(content) + PER_IMAGE * images.len() as u64,
                ContentBlock::Image(_) => PER_IMAGE,
                ContentBlock::Notification { source, text, .. } => {
                    PER_CALL + self.count(source) + self.count(text)
                }
                ContentBlock::Compaction { summary, .. } => self.count(summary),
            };
        }
        n
    }

    /// Tokens of the tools' definitions.
    pub fn tools<T: Borrow<ToolSpec>>(self, tools: &[T]) -> u64 {
        tools
            .iter()
            .map(|t| {
                let t = t.borrow();
                PER_CALL
                    + self.count(&t.name)
                    + self.count(&t.description)
                    + self.count(&t.parameters.to_string())
            })
            .sum()
    }
}

/// Counts kept for a turn: each message counted once, the system prompt
/// and tools again only when they change.
#[derive(Debug, Default)]
pub struct Counts {
    messages: HashMap<(MessageId, Family), u64>,
    /// Whole tool results that may be cut, by message and block.
    results: HashMap<(MessageId, usize, Family), u64>,
    fixed: Option<(Family, String, usize, u64)>,
}

impl Counts {
    /// Tokens of message `m` (as it is sent: the view's, cut or not).
    pub fn message(&mut self, family: Family, m: &Message) -> u64 {
        *self
            .messages
            .entry((m.id, family))
            .or_insert_with(|| family.message(m))
    }

    /// Tokens of block `block` of message `id`, a tool result `text`.
    pub fn result(&mut self, family: Family, id: MessageId, block: usize, text: &str) -> u64 {
        *self
            .results
            .entry((id, block, family))
            .or_insert_with(|| family.count(text))
    }

    /// Tokens of the system prompt and the tools.
    pub fn fixed<T: Borrow<ToolSpec>>(&mut self, family: Family, system: &str, tools: &[T]) -> u64 {
        if let Some((f, s, n, tokens)) = &self.fixed
            && *f == family
            && s == system
            && *n == tools.len()
        {
            return *tokens;
        }
        let tokens = PER_MESSAGE + family.count(system) + family.tools(tools);
        self.fixed = Some((family, system.to_owned(), tools.len(), tokens));
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_follow_the_model() {
        let info = |provider: &str, model: &str| ModelInfo {
            provider: provider.into(),
            model: model.into(),
            ..ModelInfo::default()
        };
        assert_eq!(Family::of(&info("openai", "gpt-4o")), Family::O200k);
        assert_eq!(Family::of(&info("openai", "gpt-4")), Family::Cl100k);
        assert_eq!(
            Family::of(&info("anthropic", "claude-sonnet-4-5")),
            Family::Claude
        );
        assert_eq!(Family::of(&info("openai", "llama-3.1-8b")), Family::O200k);
    }

    #[test]
    fn counts_are_bpe_tokens() {
        assert_eq!(Family::O200k.count("hello world"), 2);
        assert_eq!(Family::O200k.count(""), 0);
        // Claude's estimate is above cl100k's count.
        let text = "fn main() { println!(\"hello\"); }".repeat(20);
        assert!(Family::Claude.count(&text) > Family::Cl100k.count(&text));
    }
}
