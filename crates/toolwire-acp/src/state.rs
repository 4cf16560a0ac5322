//! One open ACP session: its conversation, its tools and the editor side
//! of them, its permissions, and whether a prompt runs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::McpServer;
use toolwire_core::{ConversationId, TrackerConfig, TrackerMetrics};
use toolwire_engine::TurnOptions;
use toolwire_engine::watch::WatchHandle;
use toolwire_providers::ReasoningEffort;
use toolwire_tools::ToolRegistry;
use toolwire_tools::builtin;

use crate::modes::SessionMode;
use crate::policy::{self, Permissions, Policies};
use crate::{edits, terminal};

/// Takes one off `count`, never below zero (a prompt that counted itself
/// and was not queued after all, when the count was taken meanwhile).
pub(crate) fn uncount(count: &AtomicU64) {
    let _ = count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

/// One ACP session: its conversation and its tools.
#[derive(Clone)]
pub(crate) struct Session {
    pub(crate) conversation: ConversationId,
    pub(crate) tools: ToolRegistry,
    /// The editor terminals of running `run_command` calls.
    pub(crate) terminals: terminal::Terminals,
    /// The root of the built-in tools.
    pub(crate) cwd: PathBuf,
    /// The editor's other roots of the project (`additionalDirectories`),
    /// in the built-in tools' reach too.
    pub(crate) additional: Arc<[PathBuf]>,
    /// What edit previews read: the built-in tools' sandbox (the paths
    /// an edit preview may read) and the editor's buffers.
    pub(crate) edits: edits::EditView,
    /// The diffs of its edits that ran, for their calls' final updates.
    pub(crate) diffs: edits::Diffs,
    /// The session's "always" answers (stored, so a loaded session keeps
    /// them).
    pub(crate) permissions: Arc<Mutex<Permissions>>,
    /// Set by `session/cancel`; the running prompt answers `cancelled`.
    pub(crate) cancelled: Arc<AtomicBool>,
    /// A prompt is running (one at a time: a second is refused, and
    /// leaves the first one's cancel alone).
    pub(crate) prompting: Arc<AtomicBool>,
    /// The configured per-tool policies.
    pub(crate) policies: Policies,
    /// How its tool calls are sent (the settings, and what the client
    /// asked for).
    pub(crate) tracker: TrackerConfig,
    /// What its tool call updates cost, over all its prompts.
    pub(crate) metrics: Arc<Mutex<TrackerMetrics>>,
    /// The client's MCP servers, to open the session again once parked.
    pub(crate) mcp_servers: Arc<[McpServer]>,
    /// The agent's clock at its last use.
    pub(crate) last_used: Arc<AtomicU64>,
    /// `run_command`'s background tasks: a session with some running is
    /// not parked (parking would stop them).
    pub(crate) tasks: Arc<builtin::BackgroundTasks>,
    /// What the session has spent and whether it has a title, once its
    /// history was read (at its first prompt since it opened).
    pub(crate) tally: Arc<Mutex<Option<Tally>>>,
    /// Held by the running prompt: prompts that come meanwhile wait here,
    /// in order (`acp.prompt_while_running`).
    pub(crate) turns: Arc<tokio::sync::Mutex<()>>,
    /// Prompts that came and do not hold `turns` yet ([`Waiting`]).
    pub(crate) waiting: Arc<AtomicU64>,
    /// Prompts interjected into the running turn: it follows the turn
    /// they start should they come too late for it.
    pub(crate) interjected: Arc<AtomicU64>,
    /// Words interjected while the running prompt's turn is paused for
    /// the editor's permission answer: they join the turn that goes on
    /// after it.
    pub(crate) late_words: LateWords,
    /// Counts `session/cancel`s: a prompt waiting for its turn that sees
    /// it move was cancelled with the running one.
    pub(crate) cancels: Arc<AtomicU64>,
    /// The store's sequence number of the last event a prompt (or a turn
    /// the engine started itself) went past: what is at or before it was
    /// shown, or was not the editor's to see.
    pub(crate) shown_through: Arc<AtomicU64>,
    /// Shows the turns the engine starts itself (`woken`); stops with the
    /// session (its last clone).
    pub(crate) _woken: Arc<AbortOnDrop>,
    /// The model chosen for the session (`None`: the default).
    pub(crate) model: Arc<Mutex<Option<String>>>,
    /// The session's mode (shared with its `run_command`, which picks its
    /// sandbox by it at each call).
    pub(crate) mode: Arc<Mutex<SessionMode>>,
    /// Its MCP servers that connected (their prompts are commands).
    pub(crate) mcp: Arc<[Arc<toolwire_tools::mcp::McpServer>]>,
    /// The reasoning effort chosen for the session (`None`: the
    /// provider's default), and whether its model reasons at all (only
    /// then is the effort sent).
    pub(crate) effort: Arc<Mutex<Option<ReasoningEffort>>>,
    pub(crate) model_reasons: Arc<AtomicBool>,
    /// The watchers of `cwd` and the additional roots, telling this
    /// session's conversation only; they stop when the session (its last
    /// clone) goes.
    pub(crate) _watchers: Arc<[WatchHandle]>,
}

impl Session {
    /// The options of the session's turns: its tools, and the calls that
    /// wait for an answer under its policies and "always" answers. Given
    /// to every prompt, and to the engine for the turns it starts itself
    /// (set again whenever an "always" answer changes them).
    pub(crate) fn turn_options(&self) -> TurnOptions {
        TurnOptions {
            tools: Some(self.tools.clone()),
            require_approval: policy::require_approval(
                &self.tools,
                &self.policies,
                &self.permissions,
                self.mode(),
            ),
            model: self.model(),
            reasoning_effort: self
                .effort()
                .filter(|_| self.model_reasons.load(Ordering::SeqCst)),
            system_prompt: crate::roots::Roots::prompt(&self.additional),
            ..TurnOptions::default()
        }
    }

    /// The model chosen for the session, if any.
    pub(crate) fn model(&self) -> Option<String> {
        self.model.lock().ok().and_then(|m| m.clone())
    }

    pub(crate) fn mode(&self) -> SessionMode {
        self.mode.lock().map(|m| *m).unwrap_or_default()
    }

    pub(crate) fn set_mode(&self, mode: SessionMode) {
        if let Ok(mut m) = self.mode.lock() {
            *m = mode;
        }
    }

    pub(crate) fn effort(&self) -> Option<ReasoningEffort> {
        self.effort.lock().ok().and_then(|e| *e)
    }

    pub(crate) fn set_effort(&self, effort: Option<ReasoningEffort>) {
        if let Ok(mut e) = self.effort.lock() {
            *e = effort;
        }
    }

    pub(crate) fn set_model(&self, model: Option<String>) {
        if let Ok(mut m) = self.model.lock() {
            *m = model;
        }
    }

    /// Marks a prompt as running; `None` if one already is. The prompt
    /// runs while the guard lives.
    pub(crate) fn start_prompt(&self) -> Option<PromptGuard> {
        self.prompting
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| PromptGuard(self.prompting.clone()))
    }

    pub(crate) fn is_prompting(&self) -> bool {
        self.prompting.load(Ordering::SeqCst)
    }

    /// What the session's tool call updates have cost so far.
    pub(crate) fn metrics(&self) -> TrackerMetrics {
        self.metrics.lock().map(|m| *m).unwrap_or_default()
    }
}

/// What a session's history says, kept while it is open.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tally {
    pub spent: crate::usage::Spent,
    /// A prompt titled it.
    pub titled: bool,
}

/// Words a paused turn cannot take yet (the engine has no running turn
/// to add them to while it waits for answers), each under a ticket: the
/// running prompt hands them to the turn its answers start; a prompt
/// whose words were never handed over (the turn was cancelled, or did not
/// go on) withdraws them and runs them as a prompt of its own.
#[derive(Clone, Default)]
pub(crate) struct LateWords(Arc<Mutex<Kept>>);

/// The last ticket given, and the words kept under theirs.
#[derive(Default)]
struct Kept {
    last: u64,
    words: Vec<(u64, String)>,
}

impl LateWords {
    /// Keeps `text`; its ticket.
    pub(crate) fn add(&self, text: &str) -> u64 {
        let Ok(mut words) = self.0.lock() else {
            return 0;
        };
        words.last += 1;
        let ticket = words.last;
        words.words.push((ticket, text.to_owned()));
        ticket
    }

    /// All the words kept, in order, with their tickets, taken.
    pub(crate) fn take_all(&self) -> Vec<(u64, String)> {
        self.0
            .lock()
            .map(|mut w| w.words.drain(..).collect())
            .unwrap_or_default()
    }

    /// Keeps again words taken that could not be handed over.
    pub(crate) fn put_back(&self, ticket: u64, text: String) {
        if let Ok(mut words) = self.0.lock() {
            words.words.push((ticket, text));
        }
    }

    /// Takes back the words of `ticket`: false if they were handed over.
    pub(crate) fn withdraw(&self, ticket: u64) -> bool {
        let Ok(mut words) = self.0.lock() else {
            return false;
        };
        let before = words.words.len();
        words.words.retain(|(t, _)| *t != ticket);
        words.words.len() != before
    }
}

/// Aborts a task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Counts a prompt among the session's `waiting` ones while it lives.
pub(crate) struct Waiting(Arc<AtomicU64>);

impl Waiting {
    pub(crate) fn new(session: &Session) -> Self {
        session.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(session.waiting.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Clears a session's running prompt when the prompt ends, however.
pub(crate) struct PromptGuard(Arc<AtomicBool>);

impl Drop for PromptGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
