//! The turn's hooks into [`crate::context`]: each step's request fitted
//! to its model's window (compacted first when it would pass
//! `compact_at`), on-demand compaction, and the budgets checked before
//! each model call.

use std::collections::HashSet;
use std::time::Instant;

use toolwire_core::{AgentEvent, ContentBlock, Message, Role, StopReason};
use toolwire_providers::ModelEntry;

use super::{Stop, Turn};
use crate::context::budget::{self, Budgets, Spent};
use crate::context::compact::{self, SummaryError};
use crate::context::tokens::{Counts, Family};
use crate::context::view::{self, View};

/// What a turn keeps for its window and budgets.
#[derive(Debug, Default)]
pub(super) struct Fit {
    counts: Counts,
    /// The conversation's spend before this turn, read once.
    conversation_before: Option<Spent>,
    /// Budgets warned about in this turn.
    warned: HashSet<(&'static str, &'static str)>,
}

/// What a compaction is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// The request would pass `compact_at`.
    Window,
    /// Someone asked for it.
    Asked,
    /// Someone asked for all of it to be summarised.
    AskedAll,
}

impl Turn<'_> {
    /// The path as this step sends it: the view of `path` (the latest
    /// compaction applied, large results cut), compacted first when its
    /// size passes the model's `compact_at` share. A compaction node is
    /// stored on the turn's branch and added to `path`. Refuses to send a
    /// request known to be over the window.
    pub(super) async fn fit(
        &mut self,
        path: &mut Vec<Message>,
        iteration: u32,
    ) -> Result<Vec<Message>, Stop> {
        let model = self.model;
        let family = Family::of(&model.info);
        let Some(window) = crate::context::window_of(&model.info) else {
            // Unknown window: no accounting, but compaction nodes apply.
            return Ok(view::compacted(path).messages);
        };
        let mut view = self.view_of(path, family, window);
        let size = self.size(&view, family, iteration);
        let compact_at = self.cx.config.context.compact_at_for(&model.info.name);
        if (size as f64) <= compact_at * window as f64 {
            return Ok(view.messages);
        }
        tracing::info!(conversation = %self.conversation, size, window, model = %model.info.name, "the request passes compact_at; compacting");
        if let Some(node) = self.compact(&view, size, Why::Window).await? {
            path.push(super::as_stored(&node));
            view = self.view_of(path, family, window);
        }
        let size = self.size(&view, family, iteration);
        if size > window {
            return Err(Stop::new(
                StopReason::Error,
                format!(
                    "the request is about {size} tokens, over model `{}`'s context window of \
                     {window}, and compaction cannot make it smaller (what is left is the newest \
                     messages); send a shorter message or start a new branch",
                    model.info.name
                ),
            ));
        }
        Ok(view.messages)
    }

    fn view_of(&mut self, path: &[Message], family: Family, window: u64) -> View {
        let share = self.cx.config.context.max_tool_result;
        let limit = (window as f64 * share) as u64;
        view::view(path, family, Some(limit), &mut self.fit.counts)
    }

    /// The request's size in tokens: the provider's count of the last
    /// request of this view (an assistant message's usage) plus what came
    /// after it, else a count of the whole.
    fn size(&mut self, view: &View, family: Family, iteration: u32) -> u64 {
        let m = &view.messages;
        let counted = (view.fresh_from..m.len()).rev().find_map(|i| {
            let u = m[i].usage.filter(|u| u.prompt_tokens > 0)?;
            (m[i].role == Role::Assistant).then_some((i, u))
        });
        let (base, from) = match counted {
            Some((i, u)) => (u.prompt_tokens + u.completion_tokens, i + 1),
            None => {
                let request = self.request(self.model, m[..1.min(m.len())].to_vec(), iteration);
                let fixed = self
                    .fit
                    .counts
                    .fixed(family, &request.system, &request.tools);
                (fixed, 1)
            }
        };
        base + m[from.min(m.len())..]
            .iter()
            .map(|msg| self.fit.counts.message(family, msg))
            .sum::<u64>()
    }

    /// Compacts the path now (an on-demand compaction): the stored node,
    /// or an error saying why there is nothing to compact.
    pub(super) async fn compact_now(&mut self, all: bool) -> Result<Message, Stop> {
        let mut path = self.take_path().await?;
        let family = Family::of(&self.model.info);
        let view = match crate::context::window_of(&self.model.info) {
            Some(window) => self.view_of(&path, family, window),
            None => view::compacted(&path),
        };
        let size = self.size(&view, family, 0);
        let why = if all { Why::AskedAll } else { Why::Asked };
        match self.compact(&view, size, why).await? {
            Some(node) => {
                path.push(super::as_stored(&node));
                self.give_path(path);
                Ok(node)
            }
            None => Err(Stop::new(
                StopReason::Error,
                "nothing to compact: the conversation holds only its newest messages",
            )),
        }
    }

    /// Summarises the older part of `view` (of `size` tokens) and stores
    /// the compaction node under the turn's leaf, in one transaction with
    /// its event. `None` when no cut fits the rules. A failed summarising
    /// call stores nothing and ends the turn with the reason.
    async fn compact(&mut self, view: &View, size: u64, why: Why) -> Result<Option<Message>, Stop> {
        let settings = &self.cx.config.context;
        let summariser: &ModelEntry = settings
            .summary_model
            .as_deref()
            .and_then(|name| self.cx.models.get(name))
            .unwrap_or(self.model);
        let family = Family::of(&self.model.info);
        let window = crate::context::window_of(&self.model.info);
        let keep = match (window, why) {
            (Some(w), _) => (w as f64 * settings.keep_recent) as u64,
            (None, _) => size / 4,
        };
        let plan = if why == Why::AskedAll {
            compact::plan_all(view)
        } else {
            compact::plan(view, family, &mut self.fit.counts, keep)
        };
        let Some(plan) = plan else {
            return Ok(None);
        };
        let covered = &view.messages[1..plan.keep];
        // The summariser's own window bounds what it reads.
        let budget = crate::context::window_of(&summariser.info)
            .or(window)
            .map_or(u64::MAX, |w| w * 6 / 10);
        let summary_family = Family::of(&summariser.info);
        let transcript = compact::transcript(covered, summary_family, budget);
        let started = Instant::now();
        let call = compact::summarise(
            summariser.provider.as_ref(),
            &transcript,
            self.turn_index.unwrap_or(0),
            self.cx.config.max_step_output_bytes,
        );
        let result = tokio::select! {
            r = call => r,
            _ = self.cancel.cancelled() => return Err(self.cancelled()),
        };
        let (summary, usage) = result.map_err(|e| {
            let e = match e {
                SummaryError::Provider(e) => e,
                other => other.to_string(),
            };
            Stop::new(
                StopReason::LlmApiError,
                format!(
                    "compaction failed: the summarising call to model `{}` failed: {e}. The \
                     conversation is as it was (nothing was removed); the request (about {size} \
                     tokens) is too close to the window to send as it is.",
                    summariser.info.name
                ),
            )
        })?;
        let through_index = view
            .messages
            .iter()
            .position(|m| m.id == plan.through)
            .unwrap_or(0);
        // The earlier summary (index 1, if any) is not a message of the
        // path: what it covered is counted from its node.
        let first = if view.compaction.is_some() { 2 } else { 1 };
        let covered_count = view.messages[first.min(through_index + 1)..=through_index].len()
            as u32
            + view
                .compaction
                .as_ref()
                .and_then(|n| match n.content.first() {
                    Some(ContentBlock::Compaction { covered, .. }) => Some(*covered),
                    _ => None,
                })
                .unwrap_or(0);
        let tokens_after = family.count(&summary);
        let mut node = Message::new(
            self.conversation,
            Some(self.leaf),
            Role::System,
            vec![ContentBlock::Compaction {
                summary,
                through: plan.through,
                covered: covered_count,
                tokens_before: size,
                tokens_after,
            }],
        );
        node.model = Some(summariser.info.name.clone());
        node.duration_ms = Some(started.elapsed().as_millis() as u64);
        if let Some(usage) = usage {
            node.usage = Some(usage);
            node.cost = match &summariser.info.price {
                Some(price) => Some(price.cost(&usage)),
                None => self.cx.config.prices.cost(&summariser.info.model, &usage),
            };
            self.usage += usage;
            if let Some(c) = node.cost {
                self.cost = Some(self.cost.unwrap_or(0.0) + c);
            }
        }
        let event = AgentEvent::ContextCompacted {
            run_id: self.run_id,
            message: node.clone(),
        };
        self.cx.bus.store_message(&node, vec![event]).await?;
        self.leaf = node.id;
        tracing::info!(conversation = %self.conversation, node = %node.id, covered = covered_count, tokens_before = size, tokens_after, "compacted");
        Ok(Some(node))
    }

    /// Before a model call: stops the turn when a budget is used up, and
    /// warns once per budget as it passes its `warn_at` share.
    pub(super) async fn check_budgets(&mut self) -> Result<(), Stop> {
        let budgets: Budgets = self.options.budgets.unwrap_or(self.cx.config.budgets);
        if !budgets.is_set() {
            return Ok(());
        }
        let conversation_before = match self.fit.conversation_before {
            Some(s) => s,
            None => {
                let s = if budgets.conversation.is_set() {
                    let messages = self.cx.store.messages(self.conversation).await?;
                    let mut s = Spent::default();
                    for m in &messages {
                        s.tokens += m.usage.map_or(0, |u| u.total());
                        s.cost += m.cost.unwrap_or(0.0);
                    }
                    // What this turn spent so far is counted as the turn's.
                    s.tokens = s.tokens.saturating_sub(self.usage.total());
                    s.cost = (s.cost - self.cost.unwrap_or(0.0)).max(0.0);
                    s
                } else {
                    Spent::default()
                };
                self.fit.conversation_before = Some(s);
                s
            }
        };
        let turn = Spent {
            tokens: self.usage.total(),
            cost: self.cost.unwrap_or(0.0),
        };
        let readings = budget::readings(
            &budgets,
            turn,
            conversation_before,
            self.options.agent_spent,
        );
        if let Some(over) = readings.iter().find(|r| r.used >= r.limit) {
            return Err(Stop::new(StopReason::BudgetExceeded, over.exceeded()));
        }
        for r in readings {
            if r.used >= budgets.warn_at * r.limit && self.fit.warned.insert(r.key()) {
                self.emit(AgentEvent::BudgetWarning {
                    run_id: self.run_id,
                    scope: r.scope.to_owned(),
                    measure: r.measure.to_owned(),
                    used: r.used,
                    limit: r.limit,
                })
                .await?;
            }
        }
        Ok(())
    }
}
