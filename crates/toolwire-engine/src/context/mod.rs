//! The context window: what a request holds, measured before it is sent
//! ([`tokens`]), the path as a request sends it ([`view`]: the latest
//! compaction node's summary in place of what it covers, oversized tool
//! results cut), compaction ([`compact`]: which messages a summary
//! covers and the summarising call) and budgets ([`budget`]).
//!
//! Invariants: nothing stored is changed or removed: a compaction is a
//! new node of the tree (one transaction, with its event), and a branch
//! from before it sends the original messages. A tool call and its result
//! are never separated by a cut. A request is never sent knowingly over
//! the model's window.

pub mod budget;
pub mod compact;
pub mod tokens;
pub mod view;

use std::collections::HashMap;

use toolwire_providers::ModelInfo;

pub use budget::{Budgets, Limit, Spent};
pub use compact::SUMMARY_SYSTEM;
pub use tokens::Family;
pub use view::SUMMARY_INTRO;

/// How the engine keeps requests within their model's window.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextSettings {
    /// Share of the window past which a request is compacted before it
    /// is sent (config `compact_at`, 0.8).
    pub compact_at: f64,
    /// Per registry model, in place of `compact_at`.
    pub compact_at_per_model: HashMap<String, f64>,
    /// Share of the window the newest messages may take that a
    /// compaction keeps verbatim (`keep_recent`, 0.3).
    pub keep_recent: f64,
    /// Share of the window one tool result may take before the model is
    /// sent it cut (`max_tool_result`, 0.25).
    pub max_tool_result: f64,
    /// The registry model that writes summaries; the turn's own when
    /// `None` (`summary_model`).
    pub summary_model: Option<String>,
}

impl Default for ContextSettings {
    fn default() -> Self {
        ContextSettings {
            compact_at: 0.8,
            compact_at_per_model: HashMap::new(),
            keep_recent: 0.3,
            max_tool_result: 0.25,
            summary_model: None,
        }
    }
}

impl ContextSettings {
    /// The `compact_at` share for registry model `name`.
    pub fn compact_at_for(&self, name: &str) -> f64 {
        self.compact_at_per_model
            .get(name)
            .copied()
            .unwrap_or(self.compact_at)
    }

    /// Checks the shares: each in (0, 1], `keep_recent` below
    /// `compact_at` (else a compaction would not make room).
    pub fn validate(&self) -> Result<(), String> {
        let share = |name: &str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(format!(
                    "{name} = {v}: a share of the window, above 0 and at most 1"
                ))
            }
        };
        share("compact_at", self.compact_at)?;
        share("keep_recent", self.keep_recent)?;
        share("max_tool_result", self.max_tool_result)?;
        for (model, v) in &self.compact_at_per_model {
            share(&format!("models.{model}.compact_at"), *v)?;
        }
        if self.keep_recent >= self.compact_at {
            return Err(format!(
                "keep_recent = {} must be below compact_at = {}: a compaction keeps less than it starts from",
                self.keep_recent, self.compact_at
            ));
        }
        Ok(())
    }
}

/// The window of `model`: its registry entry's `context_window`, else
/// the known window of its model id (OpenAI's models from `tiktoken-rs`'s
/// table, Claude's 200,000), else unknown (no accounting).
pub fn window_of(model: &ModelInfo) -> Option<u64> {
    if let Some(w) = model.context_window {
        return Some(w);
    }
    match model.provider.as_str() {
        "anthropic" => model.model.starts_with("claude").then_some(200_000),
        "openai" | "openai-responses" => {
            tiktoken_rs::model::get_context_size(&model.model).map(|w| w as u64)
        }
        _ => None,
    }
}
