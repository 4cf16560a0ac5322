//! The `[context]` and `[budgets]` tables: keeping requests within their
//! model's window, and token and cost budgets.

use std::collections::HashMap;

use anyhow::{Result, bail};
use serde::Deserialize;
use toolwire_engine::context::{Budgets, ContextSettings, Limit};

/// `[context]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ContextFile {
    /// Share of the window past which a request is compacted first (0.8).
    compact_at: Option<f64>,
    /// Share of the window kept verbatim by a compaction (0.3).
    keep_recent: Option<f64>,
    /// Share of the window one tool result may take before the model is
    /// sent it cut (0.25).
    max_tool_result: Option<f64>,
    /// The registry model that writes summaries (default: the turn's).
    summary_model: Option<String>,
}

impl ContextFile {
    /// The engine's settings; `per_model` the `compact_at` of
    /// `[models.NAME]` tables.
    pub(super) fn settings(
        self,
        per_model: HashMap<String, f64>,
        models: &[String],
    ) -> Result<ContextSettings> {
        let defaults = ContextSettings::default();
        let settings = ContextSettings {
            compact_at: self.compact_at.unwrap_or(defaults.compact_at),
            compact_at_per_model: per_model,
            keep_recent: self.keep_recent.unwrap_or(defaults.keep_recent),
            max_tool_result: self.max_tool_result.unwrap_or(defaults.max_tool_result),
            summary_model: self.summary_model,
        };
        if let Err(e) = settings.validate() {
            bail!("[context] {e}");
        }
        if let Some(name) = &settings.summary_model
            && !models.contains(name)
        {
            bail!(
                "[context] summary_model = {name:?} is not one of the configured models ({})",
                models.join(", ")
            );
        }
        Ok(settings)
    }
}

/// `[budgets]`: `turn_max_tokens`, `turn_max_cost`, and the same for
/// `conversation_` and `agent_`; `warn_at` (0.8).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BudgetsFile {
    turn_max_tokens: Option<u64>,
    turn_max_cost: Option<f64>,
    conversation_max_tokens: Option<u64>,
    conversation_max_cost: Option<f64>,
    agent_max_tokens: Option<u64>,
    agent_max_cost: Option<f64>,
    warn_at: Option<f64>,
}

impl BudgetsFile {
    pub(super) fn budgets(self) -> Result<Budgets> {
        let defaults = Budgets::default();
        let warn_at = self.warn_at.unwrap_or(defaults.warn_at);
        if !(warn_at > 0.0 && warn_at <= 1.0) {
            bail!("[budgets] warn_at = {warn_at}: a share of the budget, above 0 and at most 1");
        }
        for (key, cost) in [
            ("turn_max_cost", self.turn_max_cost),
            ("conversation_max_cost", self.conversation_max_cost),
            ("agent_max_cost", self.agent_max_cost),
        ] {
            if let Some(c) = cost
                && !(c.is_finite() && c > 0.0)
            {
                bail!("[budgets] {key} = {c}: US dollars, above 0");
            }
        }
        Ok(Budgets {
            turn: Limit {
                max_tokens: self.turn_max_tokens,
                max_cost: self.turn_max_cost,
            },
            conversation: Limit {
                max_tokens: self.conversation_max_tokens,
                max_cost: self.conversation_max_cost,
            },
            agent: Limit {
                max_tokens: self.agent_max_tokens,
                max_cost: self.agent_max_cost,
            },
            warn_at,
        })
    }
}
