//! Cost of a model call from a per-model price table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::message::Usage;

/// US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// Prompt tokens.
    pub input: f64,
    /// Completion tokens.
    pub output: f64,
    /// Prompt tokens read from the cache; `input` when not given.
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Prompt tokens written to the cache; when not given,
    /// [`CACHE_WRITE_MARKUP`] × `input` (Anthropic's price for its
    /// 5-minute cache; OpenAI reports no writes, so it never applies there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

/// What a cache write costs against a plain input token when the price
/// does not say: Anthropic bills 5-minute cache writes at 1.25× input.
pub const CACHE_WRITE_MARKUP: f64 = 1.25;

impl Price {
    /// The cost of `usage` at this price: cache reads at `cached_input`,
    /// cache writes at `cache_write`, the rest of the prompt at `input`.
    pub fn cost(&self, usage: &Usage) -> f64 {
        // Counts a provider reported inconsistently never price more
        // tokens than the prompt had.
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let written = usage.cache_write_tokens.min(usage.prompt_tokens - cached);
        let fresh = usage.prompt_tokens - cached - written;
        let per = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
        per(fresh, self.input)
            + per(cached, self.cached_input.unwrap_or(self.input))
            + per(
                written,
                self.cache_write.unwrap_or(self.input * CACHE_WRITE_MARKUP),
            )
            + per(usage.completion_tokens, self.output)
    }
}

/// Prices by model name. A model matches its exact name, else the longest
/// name it starts with (`gpt-4o` prices `gpt-4o-2024-08-06`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable(pub BTreeMap<String, Price>);

impl PriceTable {
    /// The price of `model`: its exact name, else the longest name it starts with.
    pub fn price(&self, model: &str) -> Option<&Price> {
        self.0.get(model).or_else(|| {
            self.0
                .iter()
                .filter(|(name, _)| model.starts_with(name.as_str()))
                .max_by_key(|(name, _)| name.len())
                .map(|(_, p)| p)
        })
    }

    /// The cost of `usage` on `model`, if the model is priced.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        Some(self.price(model)?.cost(usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_and_cached_tokens() {
        let mut t = PriceTable::default();
        t.0.insert(
            "gpt-4o".into(),
            Price {
                input: 2.5,
                output: 10.0,
                cached_input: Some(1.25),
                cache_write: None,
            },
        );
        t.0.insert(
            "gpt-4o-mini".into(),
            Price {
                input: 0.15,
                output: 0.6,
                cached_input: None,
                cache_write: None,
            },
        );
        let u = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 100_000,
            cached_tokens: 400_000,
            cache_write_tokens: 0,
        };
        assert_eq!(
            t.cost("gpt-4o-2024-08-06", &u),
            Some(0.6 * 2.5 + 0.4 * 1.25 + 0.1 * 10.0)
        );
        assert_eq!(t.cost("gpt-4o-mini-2024", &u), Some(0.15 + 0.06));
        assert_eq!(t.cost("claude", &u), None);
    }

    fn claude() -> Price {
        Price {
            input: 3.0,
            output: 15.0,
            cached_input: Some(0.3),
            cache_write: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn cache_writes_cost_a_quarter_more_than_input_unless_priced() {
        // Anthropic: 1M prompt tokens of which 600k read, 300k written.
        let u = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 0,
            cached_tokens: 600_000,
            cache_write_tokens: 300_000,
        };
        assert!(close(claude().cost(&u), 0.1 * 3.0 + 0.6 * 0.3 + 0.3 * 3.75));
        let priced = Price {
            cache_write: Some(6.0),
            ..claude()
        };
        assert!(close(priced.cost(&u), 0.1 * 3.0 + 0.6 * 0.3 + 0.3 * 6.0));
    }

    #[test]
    fn inconsistent_counts_never_price_more_than_the_prompt() {
        // Reads and writes above the prompt count: the writes are cut to
        // what is left, nothing is priced twice and nothing underflows.
        let u = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 0,
            cached_tokens: 800_000,
            cache_write_tokens: 900_000,
        };
        assert!(close(claude().cost(&u), 0.8 * 0.3 + 0.2 * 3.75));
    }

    #[test]
    fn prices_without_cache_write_read_and_write_as_before() {
        let old: Price =
            serde_json::from_str(r#"{"input": 1.0, "output": 2.0, "cached_input": 0.5}"#).unwrap();
        assert_eq!(old.cache_write, None);
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("cache_write"), "{text}");
    }
}
