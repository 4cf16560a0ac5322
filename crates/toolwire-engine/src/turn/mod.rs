//! One turn of the tool loop: call the model ([`step`]), store its
//! message ([`assemble`]), run its tool calls ([`tools`]: concurrently,
//! bounded, each result stored as it completes), and go again until a
//! final answer, the step limit, cancellation or an error. Every step is
//! stored before it is published.
//!
//! A turn sees the engine only through its [`Context`]. A panic inside a
//! turn (a bug in toolwire, a provider or a tool adapter) must not leave
//! its conversation busy nor its run unfinished: the turn ends with an
//! error, stored as such, like any other end. The panic's text goes to the
//! server log only; clients get a generic message, since it may quote
//! anything the turn held.

mod assemble;
mod fit;
mod step;
mod tools;

use std::any::Any;
use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use toolwire_core::{
    AgentEvent, ContentBlock, ConversationId, Decision, InstanceId, Message, MessageId,
    PendingApproval, RunId, StopReason, ToolCallId, Usage,
};
use toolwire_providers::{ModelEntry, Models};
use toolwire_store::Store;
use toolwire_tools::{Notifier, ToolRegistry, ToolSpec};

use crate::bus::EventBus;
use crate::config::EngineConfig;
use crate::interjections::Interjections;
use crate::kept_paths::{KeptPaths, as_stored};
use crate::notify::Hub;
use crate::shutdown::Stopping;

pub(crate) use assemble::user_message;
use tools::PendingCall;

/// What a client is told about a turn that panicked.
pub(crate) const PANICKED: &str = "internal error in the turn: see the server log";

/// How one turn differs from the engine's defaults.
#[derive(Debug, Clone, Default)]
pub struct TurnOptions {
    /// Model calls before the turn stops with `max_steps`.
    pub max_steps: Option<u32>,
    /// The tools of this turn, in place of the engine's.
    pub tools: Option<ToolRegistry>,
    /// Tools the client runs: shown to the model (over a server tool of
    /// the same name); their calls wait for the client's result.
    pub client_tools: Vec<ToolSpec>,
    /// Server tools whose calls wait for a person's approval.
    pub require_approval: HashSet<String>,
    /// The client that started the turn, told to tools.
    pub client_id: Option<String>,
    /// The registry name of the model that answers (the default when
    /// `None`); a name the registry lacks is refused at the turn's start.
    pub model: Option<String>,
    /// How hard a reasoning model thinks (`None`: the provider's default).
    pub reasoning_effort: Option<toolwire_providers::ReasoningEffort>,
    /// The shape the model's answers must take (see
    /// `toolwire_providers::ModelRequest::response_format`).
    pub response_format: Option<serde_json::Value>,
    /// Budgets in place of the engine's (`EngineConfig::budgets`).
    pub budgets: Option<crate::context::Budgets>,
    /// What the agent this turn runs for spent before it, all its
    /// conversations together: the agent budget counts from it (none: no
    /// agent budget applies).
    pub agent_spent: Option<crate::context::Spent>,
    /// Renders the system prompt each step's model sees from the stored
    /// one (a front door's agent state, such as memory blocks, that can
    /// change between two steps); `None`: the stored prompt as it is.
    pub system_prompt: Option<Arc<dyn SystemPrompt>>,
    /// What the front door that starts this turn keeps of its run (its
    /// own record of the run, say), stored in the transaction that begins
    /// the run. For this turn only: the options the engine keeps for the
    /// turns it starts itself never carry it.
    pub run_records: Option<RunRecords>,
}

/// Documents `(kind, id, body)` a front door keeps of a run, made from
/// the run's id once the engine has chosen it: see
/// [`TurnOptions::run_records`].
#[derive(Clone)]
pub struct RunRecords(Arc<RunRecordsFn>);

type RunRecordsFn = dyn Fn(RunId) -> Vec<(String, String, serde_json::Value)> + Send + Sync;

impl RunRecords {
    pub fn new(
        make: impl Fn(RunId) -> Vec<(String, String, serde_json::Value)> + Send + Sync + 'static,
    ) -> Self {
        RunRecords(Arc::new(make))
    }

    fn make(&self, run: RunId) -> Vec<(String, String, serde_json::Value)> {
        (self.0)(run)
    }
}

impl std::fmt::Debug for RunRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunRecords")
    }
}

/// The system prompt of each model step, rendered from the conversation's
/// stored one just before the step's request is built: what it adds is
/// state of the door that starts the turn (which may change during the
/// turn, by a tool), never stored in the conversation.
#[async_trait::async_trait]
pub trait SystemPrompt: Send + Sync + std::fmt::Debug {
    /// The prompt the model sees, given the stored one. An error is
    /// logged and the stored prompt is used: a broken addition costs the
    /// addition, not the turn.
    async fn render(&self, stored: &str) -> Result<String, String>;
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    pub run_id: RunId,
    pub conversation_id: ConversationId,
    pub reason: StopReason,
    pub error: Option<String>,
    /// The final assistant message, on `end_turn`.
    pub final_message: Option<Message>,
    pub usage: Usage,
    pub cost: Option<f64>,
}

/// Control of a running turn, shared with its task.
#[derive(Debug)]
pub(crate) struct ActiveTurn {
    pub(crate) run_id: RunId,
    pub(crate) cancel: CancellationToken,
    pub(crate) interjections: VecDeque<String>,
    /// Words were queued after the turn was cancelled: the user spoke
    /// again, so the words start the next turn (words that all came
    /// before the cancel are only stored).
    pub(crate) spoken_after_cancel: bool,
}

/// The words waiting for `conversation`'s running turn (what
/// [`crate::interjections`] keeps).
pub(crate) fn queued(
    active: &Mutex<HashMap<ConversationId, ActiveTurn>>,
    conversation: ConversationId,
) -> Vec<String> {
    match active.lock() {
        Ok(active) => active
            .get(&conversation)
            .map(|turn| turn.interjections.iter().cloned().collect())
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// How a turn begins.
pub(crate) enum Start {
    /// With a new user message (its parent set); `revision` is the
    /// conversation's, when the turn's start read it (with the leaf the
    /// message goes under): then a path kept since the last turn may
    /// serve (see [`crate::kept_paths`]).
    User {
        message: Message,
        revision: Option<u64>,
    },
    /// From an existing message (regeneration).
    From(MessageId),
    /// Going on after a pause: the answers to its waiting calls, then
    /// (optionally) a new user message.
    Resume {
        pending: PendingApproval,
        decisions: HashMap<ToolCallId, Decision>,
        then: Option<String>,
    },
    /// Compacting the path to this leaf now (on demand), without a
    /// model step: the turn ends with the compaction node. `all`: every
    /// message after the root is summarised, none kept verbatim.
    Compact { leaf: MessageId, all: bool },
    /// Ending a pause without going on: its calls are answered as not run
    /// and the turn stops as cancelled.
    Abandon {
        pending: PendingApproval,
        reason: String,
    },
}

impl Start {
    pub(crate) fn user(message: Message, revision: Option<u64>) -> Self {
        Start::User { message, revision }
    }
}

/// Why the loop stops early.
struct Stop {
    reason: StopReason,
    error: Option<String>,
}

impl Stop {
    /// The engine stopped (SIGTERM or Ctrl-C) before the turn ended.
    fn shutdown() -> Self {
        Stop::new(
            StopReason::Interrupted,
            "interrupted by shutdown: toolwire stopped before the turn ended; \
             what was stored is kept, send a message to go on",
        )
    }

    fn paused() -> Self {
        Stop {
            reason: StopReason::RequiresApproval,
            error: None,
        }
    }
}

impl Stop {
    fn new(reason: StopReason, error: impl Into<String>) -> Self {
        Stop {
            reason,
            error: Some(error.into()),
        }
    }
}

impl From<toolwire_store::StoreError> for Stop {
    fn from(e: toolwire_store::StoreError) -> Self {
        Stop::new(StopReason::Error, format!("store: {e}"))
    }
}

/// What a turn uses of the engine.
pub(crate) struct Context<'a> {
    pub(crate) store: &'a dyn Store,
    pub(crate) models: &'a Models,
    /// The engine's tools, unless the turn's options name others.
    pub(crate) tools: &'a ToolRegistry,
    pub(crate) config: &'a EngineConfig,
    pub(crate) bus: &'a EventBus,
    pub(crate) notifications: &'a Hub,
    /// The running turns, for this turn's interjections.
    pub(crate) active: &'a Mutex<HashMap<ConversationId, ActiveTurn>>,
    /// Keeps the words queued in `active` in the store.
    pub(crate) interjections: &'a Interjections,
    /// The owner of the runs this engine starts.
    pub(crate) instance: InstanceId,
    /// Given to every tool call.
    pub(crate) notifier: &'a Notifier,
    pub(crate) stopping: &'a Stopping,
    /// Paths kept between turns: taken at a turn's start, given back at
    /// its end.
    pub(crate) kept_paths: &'a KeptPaths,
}

struct Turn<'a> {
    cx: &'a Context<'a>,
    /// The model that answers this turn's steps.
    model: &'a ModelEntry,
    conversation: ConversationId,
    run_id: RunId,
    cancel: CancellationToken,
    /// The newest stored node of this turn.
    leaf: MessageId,
    /// The path to `leaf` as stored, when the turn has it (kept from the
    /// last turn, or read by a step and grown by what the turn stored
    /// since): a step reads the store only when its last message is not
    /// `leaf`. See [`Turn::on_path`].
    path: Vec<Message>,
    /// The conversation's revision the turn's start read: the path is
    /// kept for the next turn only with it.
    revision: Option<u64>,
    /// The system prompt the last step's model saw (rendered), for the
    /// path the step's tools are given.
    seen_root: Option<Message>,
    usage: Usage,
    cost: Option<f64>,
    /// Which of the conversation's turns this is (for scripted models).
    turn_index: Option<usize>,
    /// Model calls made before this run (a run that goes on after a pause
    /// continues the paused run's count).
    iterations_before: u32,
    options: TurnOptions,
    /// Told once the turn's first step is stored (or cannot be).
    begun: Option<oneshot::Sender<Result<(), String>>>,
    /// The bytes of the images its steps sent, by SHA-256: each read from
    /// the store once per turn.
    blobs: HashMap<String, Arc<[u8]>>,
    /// Token counts and budget state (`fit.rs`).
    fit: fit::Fit,
    /// The final step's message and its events, not stored yet: stored
    /// with the run's end, in one transaction, once the turn is over.
    closing: Option<(Message, Vec<AgentEvent>)>,
}

/// Runs a turn to its end: stores how it ended and publishes it, whether
/// it ended, stopped, failed or panicked.
pub(crate) async fn run(
    cx: &Context<'_>,
    conversation: ConversationId,
    run_id: RunId,
    start: Start,
    cancel: CancellationToken,
    options: TurnOptions,
    begun: oneshot::Sender<Result<(), String>>,
) -> TurnOutcome {
    let model = options
        .model
        .as_deref()
        .and_then(|name| cx.models.get(name))
        .unwrap_or_else(|| cx.models.default_entry());
    let mut turn = Turn {
        cx,
        model,
        conversation,
        run_id,
        cancel,
        leaf: MessageId::new(),
        path: Vec::new(),
        revision: None,
        seen_root: None,
        usage: Usage::default(),
        cost: None,
        turn_index: None,
        iterations_before: 0,
        options,
        begun: Some(begun),
        blobs: HashMap::new(),
        fit: fit::Fit::default(),
        closing: None,
    };
    // A panicked turn's state is not trusted: only the store is read after.
    let mut panicked = false;
    let result = match AssertUnwindSafe(turn.run(start)).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => {
            panicked = true;
            tracing::error!(%conversation, run = %run_id, panic = %panic_text(payload.as_ref()), "a turn panicked; it ends with an error");
            // What it had counted goes with it, as with a task that died.
            (turn.usage, turn.cost) = (Usage::default(), None);
            Err(Stop::new(StopReason::Error, PANICKED))
        }
    };
    if let (Some(begun), Err(stop)) = (turn.begun.take(), &result) {
        let _ = begun.send(Err(stop
            .error
            .clone()
            .unwrap_or_else(|| stop.reason.as_str().to_owned())));
    }
    let (mut reason, mut error, mut final_message) = match result {
        Ok(final_message) => (StopReason::EndTurn, None, Some(final_message)),
        Err(stop) => (stop.reason, stop.error, None),
    };
    match (&error, reason) {
        (Some(e), StopReason::Error | StopReason::LlmApiError) => {
            tracing::warn!(%conversation, run = %run_id, reason = reason.as_str(), error = %e, "turn failed");
        }
        (Some(e), _) => {
            tracing::info!(%conversation, run = %run_id, reason = reason.as_str(), detail = %e, "turn stopped");
        }
        (None, _) => {}
    }
    // The final step's message, its events and the run's end in one
    // transaction; should that fail (nothing of it is stored then), the
    // message is stored on its own (a failure there fails the turn, as it
    // does a step whose message cannot be stored) and the run's end after.
    let mut ended = false;
    // Whether the turn's path ends with what is stored (the final answer
    // included): only then is it kept for the next turn.
    let mut path_stored = !panicked;
    if let Some((message, mut events)) = turn.closing.take() {
        events.push(AgentEvent::Stopped {
            run_id,
            reason,
            error: error.clone(),
        });
        let together = cx
            .bus
            .finish_run_with_message(run_id, reason, error.as_deref(), &message, &mut events)
            .await;
        if let Err(e) = together {
            tracing::warn!(run = %run_id, error = %e, "could not store the turn's end with its answer; storing them apart");
            events.pop();
            if let Err(e) = cx.bus.store_message(&message, events).await {
                let stop = Stop::from(e);
                tracing::warn!(%conversation, run = %run_id, error = ?stop.error, "turn failed");
                (reason, error, final_message) = (stop.reason, stop.error, None);
                path_stored = false;
            }
        } else {
            ended = true;
        }
    }
    if !ended {
        finish(cx, conversation, run_id, reason, error.as_deref()).await;
    }
    if path_stored {
        turn.keep_path().await;
    }
    TurnOutcome {
        run_id,
        conversation_id: conversation,
        reason,
        error,
        final_message,
        usage: turn.usage,
        cost: turn.cost,
    }
}

/// Records how run `run_id` ended and publishes its end: in one
/// transaction, or, should that fail (nothing of it is stored then), each
/// on its own, so that one failing does not keep the other from being
/// stored.
async fn finish(
    cx: &Context<'_>,
    conversation: ConversationId,
    run_id: RunId,
    reason: StopReason,
    error: Option<&str>,
) {
    let stopped = AgentEvent::Stopped {
        run_id,
        reason,
        error: error.map(str::to_owned),
    };
    let together = cx
        .bus
        .finish_run(conversation, run_id, reason, error, vec![stopped.clone()])
        .await;
    if together.is_err() {
        if let Err(e) = cx.store.finish_run(run_id, reason, error).await {
            tracing::error!(run = %run_id, error = %e, "could not record the end of the turn");
        }
        if let Err(e) = cx.bus.emit(conversation, stopped).await {
            tracing::error!(run = %run_id, error = %e, "could not publish the end of the turn");
        }
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

impl Turn<'_> {
    async fn run(&mut self, start: Start) -> Result<Message, Stop> {
        let records = self
            .options
            .run_records
            .take()
            .map(|r| r.make(self.run_id))
            .unwrap_or_default();
        let records: Vec<(&str, &str, &serde_json::Value)> = records
            .iter()
            .map(|(kind, id, body)| (kind.as_str(), id.as_str(), body))
            .collect();
        // A new user message begins the run in the same transaction.
        if !matches!(start, Start::User { .. }) {
            self.cx
                .store
                .start_run(self.run_id, self.conversation, self.cx.instance)
                .await?;
            if !records.is_empty() {
                self.cx.store.put_documents(&records).await?;
            }
        }
        let mut resumed = None;
        match start {
            Start::Resume {
                pending,
                decisions,
                then,
            } => {
                resumed = Some(self.resume(pending, decisions, then).await?);
                self.begin();
            }
            Start::Abandon { pending, reason } => {
                self.begin();
                self.abandon(pending, &reason).await?;
                return Err(Stop::new(StopReason::Cancelled, reason));
            }
            Start::User {
                message: mut user,
                revision,
            } => {
                self.leaf = user.id;
                self.revision = revision;
                // What waited since the last turn comes with its message.
                let (injected, batch) = self.take_notifications(&mut user).unzip();
                if user.content.is_empty() {
                    user.content.push(ContentBlock::Text {
                        text: "(woken by a notification)".into(),
                    });
                }
                let mut events = vec![AgentEvent::TurnStarted {
                    run_id: self.run_id,
                    conversation_id: self.conversation,
                    message: user.clone(),
                }];
                events.extend(injected);
                let stored = self
                    .cx
                    .bus
                    .start_run_with_message(self.run_id, self.cx.instance, &user, events, &records)
                    .await;
                if stored.is_err() {
                    // The run is recorded all the same, so that it ends
                    // with the error as any run does.
                    let _ = self
                        .cx
                        .store
                        .start_run(self.run_id, self.conversation, self.cx.instance)
                        .await;
                }
                self.settle(batch, stored)?;
                // The path to its parent, if kept and still what the
                // store holds: this turn reads none of it.
                if let (Some(revision), Some(parent)) = (revision, user.parent_id) {
                    let kept = self.cx.kept_paths.take(self.conversation, parent, revision);
                    if let Some(kept) = &kept {
                        self.check_kept(kept).await;
                    }
                    self.path = kept.unwrap_or_default();
                }
                self.on_path(&user);
                self.begin();
            }
            Start::Compact { leaf, all } => {
                self.leaf = leaf;
                self.begin();
                return self.compact_now(all).await;
            }
            Start::From(id) => {
                self.leaf = id;
                self.cx.store.set_active_leaf(self.conversation, id).await?;
                self.begin();
            }
        }
        if let Some((calls, then)) = resumed {
            self.run_tools(self.iterations_before, calls).await?;
            // Stored even when the turn stops here: the client was told
            // its message was taken.
            if let Some(text) = then {
                let user = user_message(self.conversation, self.leaf, &text);
                let event = AgentEvent::UserInterjection {
                    run_id: self.run_id,
                    message: user.clone(),
                };
                self.cx.bus.store_message(&user, vec![event]).await?;
                self.on_path(&user);
            }
            if self.stopped() {
                return Err(self.cancelled());
            }
        }
        let max_steps = self.options.max_steps.unwrap_or(self.cx.config.max_steps);
        for step in 1..=max_steps {
            let iteration = self.iterations_before + step;
            self.check_budgets().await?;
            let (assistant, calls) = self.model_step(iteration).await?;
            if calls.is_empty() {
                return Ok(assistant);
            }
            if calls.iter().any(|c| c.gate.is_some()) {
                self.pause(assistant.id, iteration, calls).await?;
                return Err(Stop::paused());
            }
            let calls = calls.into_iter().map(PendingCall::from_gated).collect();
            self.run_tools(iteration, calls).await?;
            if self.stopped() {
                return Err(self.cancelled());
            }
        }
        Err(Stop::new(
            StopReason::MaxSteps,
            format!("stopped after {max_steps} model calls (max_steps)"),
        ))
    }

    /// `message`, just stored under the turn's leaf, becomes its leaf
    /// (and the end of its path).
    fn on_path(&mut self, message: &Message) {
        self.leaf = message.id;
        self.extend_path(message);
    }

    /// Adds `message`, just stored, to the turn's path if it goes on from
    /// the path's end; else the path is dropped (the next step reads it).
    fn extend_path(&mut self, message: &Message) {
        match self.path.last() {
            Some(last) if Some(last.id) == message.parent_id => {
                self.path.push(as_stored(message));
            }
            _ => self.path.clear(),
        }
    }

    /// The path to the turn's leaf, taken from the turn (the caller gives
    /// it back, see [`Turn::give_path`]) or read from the store.
    async fn take_path(&mut self) -> Result<Vec<Message>, Stop> {
        if self.path.last().is_some_and(|m| m.id == self.leaf) {
            return Ok(std::mem::take(&mut self.path));
        }
        self.path.clear();
        Ok(self.cx.store.path_to(self.leaf).await?)
    }

    /// Gives back a path taken by [`Turn::take_path`] (grown by what the
    /// turn stored since).
    fn give_path(&mut self, path: Vec<Message>) {
        self.path = path;
    }

    /// The path the turn's tools are given: the turn's, with the system
    /// prompt as the last step's model saw it.
    async fn tools_path(&mut self) -> Result<Arc<[Message]>, Stop> {
        let path = self.take_path().await?;
        let mut shared = path.clone();
        self.give_path(path);
        if let (Some(root), Some(first)) = (&self.seen_root, shared.first_mut()) {
            first.clone_from(root);
        }
        Ok(shared.into())
    }

    /// Keeps the path for the conversation's next turn, if the turn's
    /// start read the conversation's revision and the path ends at the
    /// turn's leaf.
    async fn keep_path(&mut self) {
        let Some(revision) = self.revision else {
            return;
        };
        if self.path.last().is_some_and(|m| m.id == self.leaf) {
            let path = std::mem::take(&mut self.path);
            self.check_kept(&path).await;
            self.cx.kept_paths.keep(self.conversation, revision, path);
        }
    }

    /// In debug builds (every test), a kept path is compared with the
    /// store's read of it, as it is kept and as it is given to a turn.
    async fn check_kept(&self, path: &[Message]) {
        if cfg!(debug_assertions)
            && let Some(leaf) = path.last().map(|m| m.id)
            && let Ok(read) = self.cx.store.path_to(leaf).await
        {
            debug_assert!(
                read == path,
                "the kept path to {leaf} differs from the store's:\n kept {path:#?}\n read {read:#?}"
            );
        }
    }

    /// Tells the front door that the turn's first step is stored.
    fn begin(&mut self) {
        if let Some(begun) = self.begun.take() {
            let _ = begun.send(Ok(()));
        }
    }

    /// Whether the turn is to stop at this step's end: cancelled by the
    /// user, or the engine is shutting down.
    fn stopped(&self) -> bool {
        self.cancel.is_cancelled() || self.cx.stopping.is_stopping()
    }

    /// Why a cancelled turn stopped.
    fn cancelled(&self) -> Stop {
        if self.cx.stopping.is_stopping() {
            Stop::shutdown()
        } else {
            Stop::new(StopReason::Cancelled, "cancelled by the user")
        }
    }

    async fn emit(&self, event: AgentEvent) -> Result<(), Stop> {
        self.cx.bus.emit(self.conversation, event).await?;
        Ok(())
    }
}
