//! The editor's context meter and thread title: a `usage_update` after each
//! model call of a turn (the tokens that call had in context, the model's
//! context window from the registry, the session's cost so far from the
//! model's price), and the turn's tokens in `PromptResponse.usage`. (The
//! title a first prompt gives is `sessions::title_of`.)

use agent_client_protocol::v1::schema::{self as acp, Cost, UsageUpdate};
use toolwire_core::{Message, Role, Usage};
use toolwire_engine::Engine;

/// What a session has spent, known once its history was read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spent {
    /// US dollars over the session's priced model calls; `None` while no
    /// call was priced.
    pub cost: Option<f64>,
}

impl Spent {
    /// What the model calls of `history` (a branch) cost.
    pub(crate) fn of(history: &[Message]) -> Self {
        let cost = history
            .iter()
            .filter_map(|m| m.cost)
            .fold(None, |total: Option<f64>, c| Some(total.unwrap_or(0.0) + c));
        Spent { cost }
    }
}

/// One prompt's counting: the turn's tokens, and the session's cost as it
/// grows.
pub(crate) struct Meter {
    /// The context window of each registry model.
    windows: Vec<(String, Option<u64>)>,
    /// The window of the model the session uses (for a step that does not
    /// name its model).
    window: Option<u64>,
    spent: Spent,
    turn: Usage,
}

impl Meter {
    pub(crate) fn new(engine: &Engine, model: Option<&str>, spent: Spent) -> Self {
        let models = engine.models();
        let window = model
            .and_then(|name| models.get(name))
            .unwrap_or_else(|| models.default_entry())
            .info
            .context_window;
        Meter {
            windows: models
                .iter()
                .map(|e| (e.info.name.clone(), e.info.context_window))
                .collect(),
            window,
            spent,
            turn: Usage::default(),
        }
    }

    /// Counts the model call that wrote `message`; the `usage_update` to
    /// send, when the call reported its tokens and the model's context
    /// window is known.
    pub(crate) fn step(&mut self, message: &Message) -> Option<UsageUpdate> {
        let usage = message.usage?;
        self.turn.prompt_tokens += usage.prompt_tokens;
        self.turn.completion_tokens += usage.completion_tokens;
        self.turn.cached_tokens += usage.cached_tokens;
        self.turn.cache_write_tokens += usage.cache_write_tokens;
        if let Some(cost) = message.cost {
            self.spent.cost = Some(self.spent.cost.unwrap_or(0.0) + cost);
        }
        let window = match &message.model {
            Some(name) => self
                .windows
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, w)| *w)
                .or(self.window),
            None => self.window,
        }?;
        // What the next call starts from: this call's prompt and answer.
        let used = usage.prompt_tokens + usage.completion_tokens;
        let update = UsageUpdate::new(used, window);
        Some(match self.spent.cost {
            Some(cost) => update.cost(Cost::new(cost, "USD")),
            None => update,
        })
    }

    /// What the session has spent, this prompt included.
    pub(crate) fn spent(&self) -> Spent {
        self.spent
    }

    /// The prompt's tokens (`PromptResponse.usage`); `None` when no model
    /// call reported any.
    pub(crate) fn turn_usage(&self) -> Option<acp::Usage> {
        let t = &self.turn;
        if t.total() == 0 {
            return None;
        }
        let nonzero = |n: u64| (n > 0).then_some(n);
        Some(
            acp::Usage::new(t.total(), t.prompt_tokens, t.completion_tokens)
                .cached_read_tokens(nonzero(t.cached_tokens))
                .cached_write_tokens(nonzero(t.cache_write_tokens)),
        )
    }
}

/// Whether `history` (a branch) has a user message: a session that has
/// none is titled by the prompt it gets.
pub(crate) fn has_user_message(history: &[Message]) -> bool {
    history.iter().any(|m| m.role == Role::User)
}
