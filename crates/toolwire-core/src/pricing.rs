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
    /// Cached prompt tokens; `input` when not given.
    #[serde(default)]
    pub cached_input: Option<f64>,
}

impl Price {
    /// The cost of `usage` at this price.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let fresh = usage.prompt_tokens - cached;
        let per = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
        per(fresh, self.input)
            + per(cached, self.cached_input.unwrap_or(self.input))
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
            },
        );
        t.0.insert(
            "gpt-4o-mini".into(),
            Price {
                input: 0.15,
                output: 0.6,
                cached_input: None,
            },
        );
        let u = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 100_000,
            cached_tokens: 400_000,
        };
        assert_eq!(
            t.cost("gpt-4o-2024-08-06", &u),
            Some(0.6 * 2.5 + 0.4 * 1.25 + 0.1 * 10.0)
        );
        assert_eq!(t.cost("gpt-4o-mini-2024", &u), Some(0.15 + 0.06));
        assert_eq!(t.cost("claude", &u), None);
    }
}
