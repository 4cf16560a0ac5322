//! Budgets: maximum tokens and cost per turn, per conversation and per
//! agent. A turn checks them before each model call, so the step that
//! crosses a limit is finished (its tools run, its results stored) and
//! the next call is not made; a warning goes out once per turn as a
//! budget passes its `warn_at` share.

use serde::{Deserialize, Serialize};

/// Limits of one scope; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    /// Prompt and completion tokens together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// US dollars, from the price table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
}

impl Limit {
    /// Whether it limits anything.
    pub fn is_set(&self) -> bool {
        self.max_tokens.is_some() || self.max_cost.is_some()
    }
}

/// The budgets a turn runs under.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budgets {
    #[serde(default)]
    pub turn: Limit,
    #[serde(default)]
    pub conversation: Limit,
    /// Counted from [`crate::TurnOptions::agent_spent`], which the front
    /// door that knows the agent gives (none: no agent limit).
    #[serde(default)]
    pub agent: Limit,
    /// Share of a limit at which a warning event goes out (0.8).
    #[serde(default = "default_warn_at")]
    pub warn_at: f64,
}

fn default_warn_at() -> f64 {
    0.8
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            turn: Limit::default(),
            conversation: Limit::default(),
            agent: Limit::default(),
            warn_at: default_warn_at(),
        }
    }
}

impl Budgets {
    /// Whether any limit is set.
    pub fn is_set(&self) -> bool {
        self.turn.is_set() || self.conversation.is_set() || self.agent.is_set()
    }
}

/// What was spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub tokens: u64,
    pub cost: f64,
}

impl std::ops::Add for Spent {
    type Output = Spent;
    fn add(self, o: Spent) -> Spent {
        Spent {
            tokens: self.tokens + o.tokens,
            cost: self.cost + o.cost,
        }
    }
}

/// One limit's state.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// `turn`, `conversation` or `agent`.
    pub scope: &'static str,
    /// `tokens` or `cost`.
    pub measure: &'static str,
    pub used: f64,
    pub limit: f64,
}

impl Reading {
    /// Why the turn stops, naming the budget.
    pub fn exceeded(&self) -> String {
        let scope = match self.scope {
            "turn" => "the turn's",
            "conversation" => "the conversation's",
            _ => "the agent's",
        };
        match self.measure {
            "tokens" => format!(
                "budget exceeded: {scope} token budget ({} tokens) is used up ({} tokens spent)",
                self.limit, self.used
            ),
            _ => format!(
                "budget exceeded: {scope} cost budget (${:.4}) is used up (${:.4} spent)",
                self.limit, self.used
            ),
        }
    }

    /// A key for "warned once".
    pub fn key(&self) -> (&'static str, &'static str) {
        (self.scope, self.measure)
    }
}

/// Each set limit with what is spent against it: the turn's spend, the
/// conversation's before the turn and the agent's before the turn.
pub fn readings(
    budgets: &Budgets,
    turn: Spent,
    conversation_before: Spent,
    agent_before: Option<Spent>,
) -> Vec<Reading> {
    let mut out = Vec::new();
    let mut add = |scope: &'static str, limit: &Limit, spent: Spent| {
        if let Some(max) = limit.max_tokens {
            out.push(Reading {
                scope,
                measure: "tokens",
                used: spent.tokens as f64,
                limit: max as f64,
            });
        }
        if let Some(max) = limit.max_cost {
            out.push(Reading {
                scope,
                measure: "cost",
                used: spent.cost,
                limit: max,
            });
        }
    };
    add("turn", &budgets.turn, turn);
    add(
        "conversation",
        &budgets.conversation,
        conversation_before + turn,
    );
    if let Some(before) = agent_before {
        add("agent", &budgets.agent, before + turn);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scope_is_read_against_its_own_spend() {
        let budgets = Budgets {
            turn: Limit {
                max_tokens: Some(100),
                max_cost: None,
            },
            conversation: Limit {
                max_tokens: None,
                max_cost: Some(1.0),
            },
            agent: Limit {
                max_tokens: Some(1000),
                max_cost: None,
            },
            warn_at: 0.8,
        };
        let turn = Spent {
            tokens: 50,
            cost: 0.1,
        };
        let r = readings(
            &budgets,
            turn,
            Spent {
                tokens: 10,
                cost: 0.5,
            },
            Some(Spent {
                tokens: 900,
                cost: 0.0,
            }),
        );
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].used, r[0].limit), (50.0, 100.0));
        assert!((r[1].used - 0.6).abs() < 1e-9);
        assert_eq!(r[2].used, 950.0);
        assert!(r[2].exceeded().contains("the agent's token budget"));
        // No agent spend given: no agent reading.
        assert_eq!(readings(&budgets, turn, Spent::default(), None).len(), 2);
    }
}
