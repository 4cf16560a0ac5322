//! Anthropic's prompt cache, simulated for the mock model server: the
//! usage a real Anthropic API would report for a request, computed from
//! the request's own `cache_control` breakpoints and what earlier
//! requests to the same cache wrote.
//!
//! The rules are Anthropic's: the request is read as tools, then system,
//! then messages, block by block; a breakpoint writes the prefix up to
//! and including its block (if it is at least the minimum length); a
//! later request reads back the longest prefix it shares with a written
//! one, found at one of its breakpoints or up to 20 blocks before one.
//! `cache_control` itself is not part of the prefix. Tokens are estimated
//! as a block's JSON bytes / 4. The cache lives as long as the value
//! (the five-minute lifetime never runs out in a test).

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use serde_json::{Value, json};

/// Blocks before a breakpoint where Anthropic still looks for a hit.
pub const LOOKBACK_BLOCKS: usize = 20;

/// The cache of one mock server.
pub struct PromptCache {
    min_tokens: u64,
    written: Mutex<HashSet<u64>>,
}

/// A request's prompt tokens as Anthropic splits them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheUsage {
    /// Neither read from nor written to the cache.
    pub input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
}

impl CacheUsage {
    /// Every prompt token.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens
    }

    /// The `usage` object of `message_start`.
    pub fn json(&self) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "output_tokens": 1,
        })
    }
}

/// One block of the prompt: the hash of the prefix through it, the
/// prompt's tokens through it, and whether it is a breakpoint.
struct Block {
    prefix: u64,
    tokens: u64,
    breakpoint: bool,
}

impl PromptCache {
    /// A cache that writes prefixes of at least `min_tokens` (Anthropic:
    /// 1,024 for Sonnet and Opus).
    pub fn new(min_tokens: u64) -> PromptCache {
        PromptCache {
            min_tokens,
            written: Mutex::new(HashSet::new()),
        }
    }

    /// What Anthropic would report for `body`, and the cache after it.
    pub fn usage(&self, body: &Value) -> CacheUsage {
        let blocks = blocks(body);
        let total = blocks.last().map_or(0, |b| b.tokens);
        let mut written = self.written.lock().unwrap();
        let breakpoints: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].breakpoint)
            .collect();
        let read = breakpoints
            .iter()
            .flat_map(|&b| b.saturating_sub(LOOKBACK_BLOCKS)..=b)
            .filter(|&i| written.contains(&blocks[i].prefix))
            .map(|i| blocks[i].tokens)
            .max()
            .unwrap_or(0);
        let mut write_to = read;
        for &b in &breakpoints {
            if blocks[b].tokens >= self.min_tokens {
                written.insert(blocks[b].prefix);
                write_to = write_to.max(blocks[b].tokens);
            }
        }
        let creation = write_to - read;
        CacheUsage {
            input_tokens: total - read - creation,
            cache_read_input_tokens: read,
            cache_creation_input_tokens: creation,
        }
    }
}

/// The prompt's blocks in Anthropic's order: tools, system, messages.
fn blocks(body: &Value) -> Vec<Block> {
    let mut parts: Vec<(&str, &Value)> = Vec::new();
    for tool in body["tools"].as_array().into_iter().flatten() {
        parts.push(("tool", tool));
    }
    match &body["system"] {
        Value::Array(system) => parts.extend(system.iter().map(|b| ("system", b))),
        Value::Null => {}
        system => parts.push(("system", system)),
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or("");
        match &message["content"] {
            Value::Array(content) => parts.extend(content.iter().map(|b| (role, b))),
            content => parts.push((role, content)),
        }
    }
    let mut prefix = 0u64;
    let mut tokens = 0u64;
    parts
        .into_iter()
        .map(|(kind, block)| {
            let mut bare = block.clone();
            let breakpoint = bare
                .as_object_mut()
                .and_then(|o| o.remove("cache_control"))
                .is_some();
            let text = bare.to_string();
            let mut h = DefaultHasher::new();
            (prefix, kind, &text).hash(&mut h);
            prefix = h.finish();
            tokens += (text.len() as u64).div_ceil(4);
            Block {
                prefix,
                tokens,
                breakpoint,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, marked: bool) -> Value {
        let mut b = json!({"type": "text", "text": "x".repeat(n)});
        if marked {
            b["cache_control"] = json!({"type": "ephemeral"});
        }
        b
    }

    fn request(blocks: Vec<Value>) -> Value {
        json!({"messages": [{"role": "user", "content": blocks}]})
    }

    #[test]
    fn a_marked_prefix_is_written_then_read() {
        let cache = PromptCache::new(100);
        let first = cache.usage(&request(vec![text(4000, true)]));
        assert_eq!(first.cache_read_input_tokens, 0);
        assert_eq!(first.cache_creation_input_tokens, first.total());
        let second = cache.usage(&request(vec![text(4000, false), text(400, true)]));
        assert_eq!(second.cache_read_input_tokens, first.total());
        assert_eq!(
            second.cache_creation_input_tokens,
            second.total() - first.total()
        );
        assert_eq!(second.input_tokens, 0);
    }

    #[test]
    fn nothing_is_read_without_a_breakpoint_or_beyond_the_lookback() {
        let cache = PromptCache::new(100);
        cache.usage(&request(vec![text(4000, true)]));
        // Same prefix, no breakpoint at all: nothing read, nothing written.
        let unmarked = cache.usage(&request(vec![text(4000, false), text(400, false)]));
        assert_eq!(unmarked.cache_read_input_tokens, 0);
        assert_eq!(unmarked.input_tokens, unmarked.total());
        // The written prefix 21 blocks before the only breakpoint.
        let mut far = vec![text(4000, false)];
        far.extend((0..21).map(|_| text(8, false)));
        far.last_mut().unwrap()["cache_control"] = json!({"type": "ephemeral"});
        assert_eq!(cache.usage(&request(far)).cache_read_input_tokens, 0);
    }

    #[test]
    fn short_prefixes_are_not_cached_and_changes_break_the_prefix() {
        let cache = PromptCache::new(1024);
        cache.usage(&request(vec![text(400, true)]));
        let again = cache.usage(&request(vec![text(400, true)]));
        assert_eq!(again.cache_read_input_tokens, 0, "under the minimum");
        cache.usage(&request(vec![text(8000, true)]));
        let changed = cache.usage(&request(vec![text(8001, true)]));
        assert_eq!(changed.cache_read_input_tokens, 0, "one byte more");
    }
}
