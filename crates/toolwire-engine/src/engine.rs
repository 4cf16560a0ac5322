//! The engine: conversations, turns and their control (cancel, interject,
//! edit, regenerate). One turn at a time per conversation.

mod cluster;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolwire_core::notification::{Admission, USER_SOURCE};
use toolwire_core::{
    AgentEvent, BlobRef, ContentBlock, Conversation, ConversationId, Decision, Gate, Incoming,
    Message, MessageId, PendingApproval, Priority, ResolvedApproval, Role, RunId, StopReason,
    ToolCallId, Usage, tree,
};
use toolwire_store::cluster::{Cluster, Command};
use toolwire_store::{InstanceRecord, Store, StoreRead, StoredEvent};

use crate::approval;
use crate::bus::{EventBus, Observer, Subscription};
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::follow::{EventLog, Follower};
use crate::instance::{self, Registration};
use crate::interjections::{self, Interjections};
use crate::kept_paths::KeptPaths;
use crate::keyed_locks::{Held, KeyedLocks};
use crate::notify::keep::{self, Keeper};
use crate::notify::{Activation, Hub};
use crate::remembered::{OwnRuns, Remembered};
use crate::shutdown::{ShutdownReport, Stopping};
use crate::turn::{self, ActiveTurn, TurnOptions, TurnOutcome, user_message};
use cluster::Feeds;
use toolwire_providers::{ModelEntry, Models};
use toolwire_tools::{NotificationSink, Notifier, ToolRegistry};

/// What became of a notification.
#[derive(Debug)]
pub enum Notified {
    /// Queued (or joined a queued line) for the next tool result or turn.
    Queued,
    /// Over its source's rate, or notifications are off: counted, not kept.
    Dropped,
    /// Its source wakes the agent and no turn runs: a turn starts once the
    /// coalescing window has passed (so what comes meanwhile joins it).
    Waking,
}

/// What became of answers to waiting calls.
#[derive(Debug)]
pub enum Responded {
    /// The turn goes on.
    Started(TurnHandle),
    /// Nothing waits, and every answered call already has its result: the
    /// same answers were applied before.
    AlreadyApplied,
}

/// A running turn.
#[derive(Debug)]
pub struct TurnHandle {
    pub run_id: RunId,
    pub conversation_id: ConversationId,
    join: JoinHandle<TurnOutcome>,
}

impl TurnHandle {
    /// Waits for the turn to end.
    pub async fn wait(self) -> TurnOutcome {
        let (run_id, conversation_id) = (self.run_id, self.conversation_id);
        match self.join.await {
            Ok(outcome) => outcome,
            // A panic is caught inside the task (`turn::run`); what is left
            // is a task aborted with the runtime. Its text stays in the log.
            Err(e) => TurnOutcome {
                run_id,
                conversation_id,
                reason: StopReason::Error,
                error: {
                    tracing::error!(run = %run_id, error = %e, "a turn's task ended abnormally");
                    Some(turn::PANICKED.to_owned())
                },
                final_message: None,
                usage: Usage::default(),
                cost: None,
            },
        }
    }
}

/// What became of an interjection.
#[derive(Debug)]
pub enum Interjection {
    /// Queued for the running turn.
    Queued,
    /// No turn was running: it started one.
    Started(TurnHandle),
}

struct Inner {
    store: Arc<dyn Store>,
    models: Models,
    tools: ToolRegistry,
    config: EngineConfig,
    bus: EventBus,
    notifications: Arc<Hub>,
    active: Mutex<HashMap<ConversationId, ActiveTurn>>,
    /// Each conversation's options, for the turns the engine starts itself.
    remembered: Remembered,
    /// The runs of those turns.
    own_runs: OwnRuns,
    /// The owner of the runs this engine starts; its heartbeat stops when
    /// the engine goes.
    instance: Registration,
    /// Given to every tool call: notifications sent after the call (a
    /// background task's end) reach [`Engine::notify`].
    notifier: Notifier,
    /// Keeps `notifications` in the store as they change.
    _keeper: Keeper,
    /// Keeps the words queued in `active` in the store.
    interjections: Interjections,
    /// Set once the engine stops taking turns; counts the running ones.
    stopping: Stopping,
    /// Held by a turn's start and by a change to a conversation (`edit`).
    edits: KeyedLocks<ConversationId>,
    /// The other instances on the database: a turn runs only with its
    /// conversation's lease, held while the conversation is in `active`.
    cluster: Arc<dyn Cluster>,
    feeds: Feeds,
    _cluster_tasks: cluster::Tasks,
    /// Each conversation's path as its last turn here left it.
    kept_paths: KeptPaths,
}

impl Inner {
    /// What a turn uses of the engine.
    fn turn_context(&self) -> turn::Context<'_> {
        turn::Context {
            store: self.store.as_ref(),
            models: &self.models,
            tools: &self.tools,
            config: &self.config,
            bus: &self.bus,
            notifications: &self.notifications,
            active: &self.active,
            interjections: &self.interjections,
            instance: self.instance.record().id,
            notifier: &self.notifier,
            stopping: &self.stopping,
            kept_paths: &self.kept_paths,
        }
    }
}

/// The engine as a tool's [`NotificationSink`]: a weak reference, so that
/// a background task never keeps a dropped engine alive.
struct EngineSink(Weak<Inner>);

#[async_trait::async_trait]
impl NotificationSink for EngineSink {
    async fn notify(&self, conversation: ConversationId, event: Incoming) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let source = event.source().to_owned();
        if let Err(e) = (Engine { inner }).notify(conversation, event).await {
            tracing::warn!(%conversation, %source, error = %e, "a notification was lost");
        }
    }
}

/// The engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// An [`Engine`] that does not keep it alive: for what the engine itself
/// holds (a turn's options, a tool) and must reach it back.
#[derive(Clone)]
pub struct WeakEngine(Weak<Inner>);

impl WeakEngine {
    /// The engine, unless it has been dropped.
    pub fn upgrade(&self) -> Option<Engine> {
        self.0.upgrade().map(|inner| Engine { inner })
    }
}

impl std::fmt::Debug for WeakEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakEngine")
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.inner.models.default_entry().info.name)
            .field("tools", &self.inner.tools)
            .finish()
    }
}

impl Engine {
    /// An engine over `store`, registered in it as a new instance (this
    /// host and process) that owns the runs it starts. Unfinished runs
    /// whose owner is gone (its process exited, or it stopped sending
    /// heartbeats) are marked interrupted, and a `stopped` event says so;
    /// runs of other live processes on the same database are left alone.
    pub async fn start(
        store: Arc<dyn Store>,
        models: impl Into<Models>,
        tools: ToolRegistry,
        config: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let models = models.into();
        let bus = EventBus::new(store.clone(), config.event_capacity);
        let instance = Registration::register(&store, config.heartbeat_interval).await?;
        let cluster = store.cluster(instance.record().id).await?;
        bus.set_cluster(cluster.clone());
        instance::interrupt_orphaned_runs(
            store.as_ref(),
            &bus,
            instance.record(),
            config.stale_owner_after,
        )
        .await?;
        let notifications = Arc::new(Hub::default());
        if config.notifications.enabled {
            take_over_waiting(
                store.as_ref(),
                &notifications,
                &config.notifications.queue,
                instance.record(),
                config.stale_owner_after,
            )
            .await?;
        }
        let keeper = Keeper::start(store.clone(), &notifications, instance.record().id);
        let interjections = Interjections::new(store.clone(), instance.record().id);
        let sweep_every = config.heartbeat_interval;
        let inner = Arc::new_cyclic(|weak| Inner {
            store,
            models,
            tools,
            config,
            bus,
            notifications,
            active: Mutex::new(HashMap::new()),
            remembered: Remembered::default(),
            own_runs: OwnRuns::default(),
            instance,
            notifier: Notifier::new(Arc::new(EngineSink(weak.clone()))),
            _keeper: keeper,
            interjections,
            stopping: Stopping::default(),
            edits: KeyedLocks::default(),
            _cluster_tasks: cluster::start(WeakEngine(weak.clone()), &cluster, sweep_every),
            kept_paths: KeptPaths::default(),
            cluster,
            feeds: Feeds::default(),
        });
        Ok(Engine { inner })
    }

    /// Writes to the store what changed in the pending notifications and
    /// is not kept yet (the engine does so on its own as they change;
    /// call this before the process exits).
    pub async fn keep_notifications(&self) -> Result<(), EngineError> {
        let me = self.inner.instance.record().id;
        keep::flush(self.inner.store.as_ref(), &self.inner.notifications, me).await?;
        Ok(())
    }

    /// Stops the engine taking turns (each start is refused with
    /// [`EngineError::ShuttingDown`] from now on) and lets the running
    /// ones reach their next stored step: a model step runs to its stored
    /// message, running tools to their stored results; calls not started
    /// are answered as not run, and each turn ends as `interrupted`. What
    /// still runs after `grace` is cancelled: the model's partial message
    /// is stored marked interrupted, tools get `tool_cancel_grace` to stop.
    /// Words interjected into a turn that ends now are stored as a user
    /// message, not dropped.
    pub async fn shutdown(&self, grace: std::time::Duration) -> ShutdownReport {
        let stopping = &self.inner.stopping;
        stopping.stop();
        let running = stopping.running();
        let mut report = ShutdownReport {
            running,
            ..ShutdownReport::default()
        };
        if stopping.settled(grace).await {
            return report;
        }
        report.cut = stopping.running();
        if let Ok(active) = self.inner.active.lock() {
            for turn in active.values() {
                turn.cancel.cancel();
            }
        }
        // A cancelled step stores what it has at once; tools get their own
        // grace, and the store a moment more.
        let bound = self.inner.config.tool_cancel_grace + std::time::Duration::from_secs(5);
        stopping.settled(bound).await;
        report.left = stopping.running();
        report
    }

    /// Whether the engine has stopped taking turns.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.is_stopping()
    }

    /// This engine's instance as the store knows it: the owner of the runs
    /// it starts.
    pub fn instance(&self) -> &InstanceRecord {
        self.inner.instance.record()
    }

    /// A handle that does not keep the engine alive.
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.inner))
    }

    /// The store, to read: every change goes through the engine's own
    /// methods, which decide it against the turns that run.
    pub fn store(&self) -> &dyn StoreRead {
        self.inner.store.as_ref()
    }

    /// The store, to write: for the engine's own changes (`edit`,
    /// `records`).
    pub(crate) fn writer(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub(crate) fn bus(&self) -> &EventBus {
        &self.inner.bus
    }

    pub(crate) fn cluster(&self) -> &Arc<dyn Cluster> {
        &self.inner.cluster
    }

    pub(crate) fn feeds(&self) -> &Feeds {
        &self.inner.feeds
    }

    /// Takes over the pending notifications and queued interjections of
    /// instances that are gone.
    pub(crate) async fn take_over_notifications(&self) -> Result<(), EngineError> {
        if self.inner.config.notifications.enabled {
            take_over_waiting(
                self.inner.store.as_ref(),
                &self.inner.notifications,
                &self.inner.config.notifications.queue,
                self.inner.instance.record(),
                self.inner.config.stale_owner_after,
            )
            .await?;
        }
        Ok(())
    }

    /// Looks once for turns whose instance is gone (instances sharing a
    /// database do so every heartbeat): each is marked interrupted, once,
    /// and pending notifications of gone instances are taken over.
    /// Returns how many runs it interrupted.
    pub async fn sweep_gone_instances(&self) -> Result<usize, EngineError> {
        cluster::sweep(self).await
    }

    /// Gives back the lease of `conversation`, whose entry left `active`.
    fn release(&self, conversation: ConversationId) {
        self.inner.cluster.release(conversation);
    }

    pub(crate) fn conversation_locks(&self) -> &KeyedLocks<ConversationId> {
        &self.inner.edits
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.inner.tools
    }

    /// The model id the default model's provider calls.
    pub fn model(&self) -> &str {
        self.inner.models.default_entry().provider.model()
    }

    /// The models turns may name ([`TurnOptions::model`]).
    pub fn models(&self) -> &Models {
        &self.inner.models
    }

    /// The model a turn with `options` is answered by: the one it names,
    /// else the default.
    pub fn model_for(&self, options: &TurnOptions) -> Result<&ModelEntry, EngineError> {
        match &options.model {
            None => Ok(self.inner.models.default_entry()),
            Some(name) => self
                .inner
                .models
                .get(name)
                .ok_or_else(|| EngineError::UnknownModel(name.clone())),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// A new conversation with the configured system prompt.
    pub async fn create_conversation(
        &self,
        title: Option<&str>,
    ) -> Result<Conversation, EngineError> {
        self.create_conversation_with(&self.inner.config.system_prompt, title)
            .await
    }

    /// Live events of a conversation. On `Lagged`, read what was missed
    /// with [`Engine::events_since`].
    pub fn subscribe(&self, conversation: ConversationId) -> Subscription {
        self.inner.bus.subscribe(conversation)
    }

    /// Follows the conversation's events from now on, each once, in order
    /// (a subscription that resyncs from the store when it falls behind).
    pub fn follow(&self, conversation: ConversationId) -> Follower {
        Follower::new(
            Arc::new(self.clone()),
            conversation,
            self.subscribe(conversation),
        )
    }

    /// Follows the conversation's events from just after `seq` (stored
    /// ones first).
    pub fn follow_after(&self, conversation: ConversationId, seq: u64) -> Follower {
        Follower::after(
            Arc::new(self.clone()),
            conversation,
            self.subscribe(conversation),
            seq,
        )
    }

    /// Stored events after `seq`.
    pub async fn events_since(
        &self,
        conversation: ConversationId,
        seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, EngineError> {
        Ok(self
            .inner
            .store
            .events_since(conversation, seq, limit)
            .await?)
    }

    /// Registers an observer of every event.
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        self.inner.bus.observe(observer);
    }

    /// Tells the agent of `conversation` about `event`: it arrives with the
    /// next tool result (or at the next turn's start). A source that wakes
    /// the agent starts a turn when none runs.
    pub async fn notify(
        &self,
        conversation: ConversationId,
        event: Incoming,
    ) -> Result<Notified, EngineError> {
        if !self.inner.config.notifications.enabled {
            return Ok(Notified::Dropped);
        }
        // Checked first, so that a bad id is an error, not a queue.
        self.inner.store.conversation(conversation).await?;
        // A turn another instance runs delivers it with its next result.
        if let Some(owner) = self.remote_turn_owner(conversation).await? {
            let command = cluster::notify_command(conversation, event);
            self.inner.cluster.send(owner, &command).await?;
            return Ok(Notified::Queued);
        }
        self.notify_here(conversation, event).await
    }

    /// The instance running `conversation`'s turn, when it is another one.
    async fn remote_turn_owner(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<toolwire_core::InstanceId>, EngineError> {
        if !self.inner.cluster.shared() || self.is_running(conversation) {
            return Ok(None);
        }
        let me = self.inner.instance.record().id;
        Ok(self
            .inner
            .cluster
            .turn_owner(conversation)
            .await?
            .filter(|owner| *owner != me))
    }

    /// [`Engine::notify`] for this instance's queues.
    pub(crate) async fn notify_here(
        &self,
        conversation: ConversationId,
        event: Incoming,
    ) -> Result<Notified, EngineError> {
        let settings = &self.inner.config.notifications;
        if !settings.enabled {
            return Ok(Notified::Dropped);
        }
        let wake = settings.activation(event.source()) == Activation::Wake;
        let admission = self
            .inner
            .notifications
            .push(&settings.queue, conversation, event);
        if admission == Admission::Dropped {
            return Ok(Notified::Dropped);
        }
        if !wake {
            return Ok(Notified::Queued);
        }
        if !self.is_running(conversation) {
            self.wake_soon(conversation);
            return Ok(Notified::Waking);
        }
        // The running turn delivers it with its next tool result; if it
        // ends first, its end wakes the agent. The turn may have ended
        // between the check and the note: then wake now.
        self.inner.notifications.defer_wake(conversation);
        if !self.is_running(conversation)
            && self.inner.notifications.take_deferred_wake(conversation)
        {
            self.wake_soon(conversation);
            return Ok(Notified::Waking);
        }
        Ok(Notified::Queued)
    }

    /// Starts a turn for what waits after the coalescing window, unless one
    /// is already scheduled (see [`Engine::wake`]).
    fn wake_soon(&self, conversation: ConversationId) {
        let engine = self.clone();
        self.inner.notifications.wake_after(
            conversation,
            self.inner.config.notifications.queue.coalesce_window,
            async move {
                engine.inner.notifications.wake_done(conversation);
                if let Err(e) = engine.wake(conversation).await {
                    tracing::warn!(%conversation, error = %e, "could not wake the agent");
                }
            },
        );
    }

    /// Starts a turn whose input is what waits, unless a turn runs (it
    /// delivers them), the conversation waits for approvals, or nothing
    /// waits any more. Fails closed: with no options remembered for the
    /// conversation (after a restart, or once forgotten) it starts nothing,
    /// as the defaults would offer every tool with no approvals; what waits
    /// stays queued for the next turn a front door starts.
    async fn wake(&self, conversation: ConversationId) -> Result<(), EngineError> {
        if self.is_running(conversation)
            || !self.inner.notifications.has_pending(conversation)
            || self.pending_approval(conversation).await?.is_some()
        {
            return Ok(());
        }
        let Some(options) = self.inner.remembered.get(conversation) else {
            tracing::debug!(
                %conversation,
                "no options remembered for the conversation: not waking it, its notifications stay queued"
            );
            return Ok(());
        };
        let (leaf, revision) = self.leaf_and_revision(conversation).await?;
        // The turn's user message carries the notifications (drained when
        // the turn stores it).
        let user = Message::new(conversation, Some(leaf), Role::User, Vec::new());
        match self
            .start_turn(
                conversation,
                turn::Start::user(user, Some(revision)),
                options,
                Origin::Engine,
            )
            .await
        {
            Ok(_) | Err(EngineError::TurnInProgress(_) | EngineError::ShuttingDown) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Tells every conversation this engine has run a turn in about
    /// `event` (workspace-wide events: file changes). Passive: it never
    /// starts a turn.
    pub fn notify_attached(&self, event: Incoming) {
        let settings = &self.inner.config.notifications;
        if !settings.enabled {
            return;
        }
        for conversation in self.inner.notifications.attached() {
            self.inner
                .notifications
                .push(&settings.queue, conversation, event.clone());
        }
    }

    /// Whether notifications wait for `conversation`.
    pub fn has_pending_notifications(&self, conversation: ConversationId) -> bool {
        self.inner.notifications.has_pending(conversation)
    }

    /// Whether a turn is running in `conversation`.
    pub fn is_running(&self, conversation: ConversationId) -> bool {
        self.running_run(conversation).is_some()
    }

    /// Whether this engine started run `run` itself (a wake, an
    /// interjection with no turn running, a compaction, the end of a
    /// paused turn), not a front door; among its most recent such runs.
    pub fn started_itself(&self, run: RunId) -> bool {
        self.inner.own_runs.contains(run)
    }

    /// The run of the turn running in `conversation` here, if one is.
    pub fn running_run(&self, conversation: ConversationId) -> Option<RunId> {
        self.inner
            .active
            .lock()
            .ok()
            .and_then(|a| a.get(&conversation).map(|t| t.run_id))
    }

    /// Starts a turn: `text` as a user message under `parent` (the active
    /// leaf by default).
    pub async fn send(
        &self,
        conversation: ConversationId,
        text: &str,
        parent: Option<MessageId>,
    ) -> Result<TurnHandle, EngineError> {
        self.send_with(conversation, text, parent, TurnOptions::default())
            .await
    }

    /// [`Engine::send`] with this turn's options. Refused while the
    /// message it would answer has calls waiting.
    pub async fn send_with(
        &self,
        conversation: ConversationId,
        text: &str,
        parent: Option<MessageId>,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        self.send_from(conversation, text, parent, options, Origin::FrontDoor)
            .await
    }

    /// [`Engine::send_with`] with a user message of any content: text and
    /// images (stored first with [`Engine::put_image`]).
    pub async fn send_content_with(
        &self,
        conversation: ConversationId,
        content: Vec<ContentBlock>,
        parent: Option<MessageId>,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        self.send_blocks(conversation, content, parent, options, Origin::FrontDoor)
            .await
    }

    /// Stores an image a front door was given (a user's upload) once, by
    /// the SHA-256 of its bytes, and gives the reference a message holds.
    /// Refused, with nothing stored, over [`toolwire_core::MAX_IMAGE_BYTES`]
    /// or when the bytes are not a PNG, JPEG, GIF or WebP (`declared`, the
    /// type the sender named, only words the error: the type stored is
    /// the one the bytes show).
    pub async fn put_image(
        &self,
        bytes: &[u8],
        declared: Option<&str>,
    ) -> Result<BlobRef, EngineError> {
        let media_type = toolwire_core::image::check_image(bytes, declared)?;
        Ok(self.inner.store.put_blob(media_type, bytes).await?)
    }

    async fn send_from(
        &self,
        conversation: ConversationId,
        text: &str,
        parent: Option<MessageId>,
        options: TurnOptions,
        origin: Origin,
    ) -> Result<TurnHandle, EngineError> {
        let content = vec![ContentBlock::Text {
            text: text.to_owned(),
        }];
        self.send_blocks(conversation, content, parent, options, origin)
            .await
    }

    async fn send_blocks(
        &self,
        conversation: ConversationId,
        content: Vec<ContentBlock>,
        parent: Option<MessageId>,
        options: TurnOptions,
        origin: Origin,
    ) -> Result<TurnHandle, EngineError> {
        // The leaf is read under the lock the turn starts under, so that
        // no change of it (`edit`) comes between.
        let editing = self.inner.edits.hold(conversation).await;
        // A parent chosen by the caller comes without the conversation's
        // revision: the turn reads its path from the store.
        let (parent, revision, pending) = match parent {
            Some(p) => (p, None, self.pending_approval(conversation).await?),
            None => {
                let (leaf, revision, pending) = self.leaf_and_pending(conversation).await?;
                (leaf, Some(revision), pending)
            }
        };
        if let Some(pending) = pending
            && pending.message_id == parent
        {
            return Err(EngineError::ApprovalPending {
                conversation,
                message_id: pending.message_id,
            });
        }
        let user = Message::new(conversation, Some(parent), Role::User, content);
        self.start_turn_held(
            editing,
            conversation,
            turn::Start::user(user, revision),
            options,
            origin,
        )
        .await
    }

    /// Compacts `conversation`'s active branch now: the older part of the
    /// path is summarised by a model call and stored as a compaction node
    /// under the active leaf (which becomes the new active leaf); later
    /// turns on that branch send the summary plus the newest messages
    /// (those within `keep_recent` of the window) verbatim. Nothing is
    /// removed: a branch from before the node sends the originals.
    ///
    /// Runs as a turn of its own (a run, `TurnStarted` not sent, a
    /// [`toolwire_core::AgentEvent::ContextCompacted`] then `Stopped`):
    /// `options.model` names the model whose window and provider are used
    /// (the default when `None`; `context.summary_model` writes the
    /// summary when set). Wait on the handle: `end_turn` with the node as
    /// `final_message`; `error` when there is nothing to compact (only
    /// the newest messages) or the summarising call failed (nothing is
    /// stored then). Refused while a turn runs
    /// ([`EngineError::TurnInProgress`]) or calls wait for answers
    /// ([`EngineError::ApprovalPending`]).
    ///
    /// Started under the lock a turn starts under, so that the leaf it
    /// compacts is the one the next turn continues. (Letta's
    /// `POST /v1/agents/{id}/summarize`, ACP's `/compact` and the live
    /// page's button all come here.)
    pub async fn compact(
        &self,
        conversation: ConversationId,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        self.compact_scoped(conversation, options, false).await
    }

    /// As [`Engine::compact`], but the summary covers every message after
    /// the root, none kept verbatim (Letta's compaction `mode: all`): the
    /// next request sends the system prompt, the summary and what comes
    /// after. `error` when only an earlier summary is there to cover.
    pub async fn compact_all(
        &self,
        conversation: ConversationId,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        self.compact_scoped(conversation, options, true).await
    }

    async fn compact_scoped(
        &self,
        conversation: ConversationId,
        options: TurnOptions,
        all: bool,
    ) -> Result<TurnHandle, EngineError> {
        let editing = self.inner.edits.hold(conversation).await;
        let (leaf, _, pending) = self.leaf_and_pending(conversation).await?;
        // Its calls wait for answers: a node after them would come
        // between the calls and their results.
        if let Some(pending) = pending
            && pending.message_id == leaf
        {
            return Err(EngineError::ApprovalPending {
                conversation,
                message_id: pending.message_id,
            });
        }
        self.start_turn_held(
            editing,
            conversation,
            turn::Start::Compact { leaf, all },
            options,
            Origin::Engine,
        )
        .await
    }

    /// The options of the turns this engine starts itself in
    /// `conversation` (a wake, an interjection with no turn running):
    /// those of the conversation's last turn started through `send_with`,
    /// `edit_with`, `regenerate_with` or `respond`, or set here. Kept in
    /// memory, for a bounded number of conversations: after a restart (or
    /// once forgotten) a wake starts no turn (its notifications wait for
    /// the next turn a front door starts), and an interjection's turn gets
    /// the default options, until a front door starts a turn or sets them
    /// again.
    pub fn set_conversation_options(&self, conversation: ConversationId, options: TurnOptions) {
        self.inner.remembered.set(conversation, options);
    }

    /// Forgets the options remembered for `conversation` (its session is
    /// gone): the turns the engine starts there get the defaults.
    pub fn forget_conversation_options(&self, conversation: ConversationId) {
        self.inner.remembered.forget(conversation);
    }

    /// The options the engine's own turns in `conversation` get.
    pub fn conversation_options(&self, conversation: ConversationId) -> TurnOptions {
        self.inner.remembered.get(conversation).unwrap_or_default()
    }

    async fn active_leaf(&self, conversation: ConversationId) -> Result<MessageId, EngineError> {
        Ok(self
            .inner
            .store
            .conversation(conversation)
            .await?
            .active_leaf)
    }

    /// The conversation's active leaf and its revision (see
    /// [`crate::kept_paths`]).
    async fn leaf_and_revision(
        &self,
        conversation: ConversationId,
    ) -> Result<(MessageId, u64), EngineError> {
        let read = self.inner.store.conversation(conversation).await?;
        Ok((read.active_leaf, read.revision))
    }

    /// The conversation's active leaf, its revision and its paused turn
    /// (if one waits for answers), in one read.
    async fn leaf_and_pending(
        &self,
        conversation: ConversationId,
    ) -> Result<(MessageId, u64, Option<PendingApproval>), EngineError> {
        let (read, doc) = self
            .inner
            .store
            .conversation_and_document(conversation, approval::KIND, &conversation.to_string())
            .await?;
        Ok((
            read.active_leaf,
            read.revision,
            approval::read(conversation, doc)?,
        ))
    }

    /// What this engine keeps of its conversations' paths.
    pub(crate) fn kept_paths(&self) -> &KeptPaths {
        &self.inner.kept_paths
    }

    /// The path this engine keeps for `conversation`'s next turn (the
    /// path to its last message, as the store holds it), if any: for
    /// tests, which compare it with the store's.
    #[doc(hidden)]
    pub fn kept_path(&self, conversation: ConversationId) -> Option<Vec<Message>> {
        self.inner.kept_paths.peek(conversation)
    }

    /// The conversation's paused turn, if one waits for answers.
    pub async fn pending_approval(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<PendingApproval>, EngineError> {
        Ok(approval::load(self.inner.store.as_ref(), conversation).await?)
    }

    /// The conversation's answered pauses (each with its answers), oldest
    /// first.
    pub async fn resolved_approvals(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<ResolvedApproval>, EngineError> {
        Ok(approval::resolved(self.inner.store.as_ref(), conversation).await?)
    }

    /// Answers the waiting calls of the paused turn (every one of them,
    /// once), then goes on with the turn; `then` is a user message to add
    /// after the results.
    pub async fn respond(
        &self,
        conversation: ConversationId,
        decisions: Vec<(ToolCallId, Decision)>,
        then: Option<String>,
        options: TurnOptions,
    ) -> Result<Responded, EngineError> {
        let Some(pending) = self.pending_approval(conversation).await? else {
            return if !decisions.is_empty() && self.all_answered(conversation, &decisions).await? {
                Ok(Responded::AlreadyApplied)
            } else {
                Err(EngineError::NothingPending(conversation))
            };
        };
        let expected = pending.waiting_ids();
        let received: Vec<ToolCallId> = decisions.iter().map(|(id, _)| id.clone()).collect();
        let mut answers = HashMap::new();
        let mut valid = true;
        for (id, decision) in decisions {
            // An answer for a call that does not wait, or a second answer.
            valid &= expected.contains(&id) && !answers.contains_key(&id);
            answers.insert(id, decision);
        }
        if !valid || answers.len() != expected.len() {
            return Err(EngineError::ApprovalMismatch { expected, received });
        }
        // A client tool's answer is its result (or a denial): approving it
        // would run it on the server, which has no such tool to run.
        if let Some(call) = pending.waiting().find(|c| {
            c.gate == Some(Gate::Client)
                && matches!(answers.get(&c.call.id), Some(Decision::Approve))
        }) {
            return Err(EngineError::ClientToolApproved(call.call.id.clone()));
        }
        let start = turn::Start::Resume {
            pending,
            decisions: answers,
            then,
        };
        Ok(Responded::Started(
            self.start_turn(conversation, start, options, Origin::FrontDoor)
                .await?,
        ))
    }

    /// Ends the paused turn without going on: its calls are answered as
    /// not run, with `reason`. Says whether a turn was paused.
    pub async fn abandon_pending(
        &self,
        conversation: ConversationId,
        reason: &str,
    ) -> Result<Option<TurnHandle>, EngineError> {
        let Some(pending) = self.pending_approval(conversation).await? else {
            return Ok(None);
        };
        let start = turn::Start::Abandon {
            pending,
            reason: reason.to_owned(),
        };
        // It calls no model; the conversation's options are what a late
        // interjection's turn falls back to.
        Ok(Some(
            self.start_turn(
                conversation,
                start,
                self.conversation_options(conversation),
                Origin::Engine,
            )
            .await?,
        ))
    }

    /// Whether every call in `decisions` has a result on the active branch.
    async fn all_answered(
        &self,
        conversation: ConversationId,
        decisions: &[(ToolCallId, Decision)],
    ) -> Result<bool, EngineError> {
        let leaf = self.active_leaf(conversation).await?;
        let path = self.inner.store.path_to(leaf).await?;
        let answered = crate::recover::answered(&path);
        Ok(decisions.iter().all(|(id, _)| answered.contains(id)))
    }

    /// Sends and waits for the end of the turn.
    pub async fn run(
        &self,
        conversation: ConversationId,
        text: &str,
    ) -> Result<TurnOutcome, EngineError> {
        Ok(self.send(conversation, text, None).await?.wait().await)
    }

    /// Edits user message `id` (a new sibling) and runs a turn from it.
    pub async fn edit(&self, id: MessageId, text: &str) -> Result<TurnHandle, EngineError> {
        self.edit_with(id, text, TurnOptions::default()).await
    }

    /// [`Engine::edit`] with this turn's options.
    pub async fn edit_with(
        &self,
        id: MessageId,
        text: &str,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        let original = self.inner.store.message(id).await?;
        let sibling = tree::edited_sibling(&original, text)?;
        self.start_turn(
            original.conversation_id,
            turn::Start::user(sibling, None),
            options,
            Origin::FrontDoor,
        )
        .await
    }

    /// A new answer in place of assistant message `id` (a new sibling).
    pub async fn regenerate(&self, id: MessageId) -> Result<TurnHandle, EngineError> {
        self.regenerate_with(id, TurnOptions::default()).await
    }

    /// [`Engine::regenerate`] with this turn's options.
    pub async fn regenerate_with(
        &self,
        id: MessageId,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        let original = self.inner.store.message(id).await?;
        let parent = tree::regeneration_parent(&original)?;
        self.start_turn(
            original.conversation_id,
            turn::Start::From(parent),
            options,
            Origin::FrontDoor,
        )
        .await
    }

    /// Cancels the turn running in `conversation` on this instance or, on
    /// a shared database, on the instance that runs it (asked through the
    /// database); says whether a turn was running.
    pub async fn cancel_anywhere(&self, conversation: ConversationId) -> Result<bool, EngineError> {
        if self.cancel(conversation) {
            return Ok(true);
        }
        let Some(owner) = self.remote_turn_owner(conversation).await? else {
            return Ok(false);
        };
        self.inner
            .cluster
            .send(owner, &Command::Cancel { conversation })
            .await?;
        Ok(true)
    }

    /// Cancels every turn running on this instance; says how many.
    pub(crate) fn cancel_all(&self) -> usize {
        let Ok(active) = self.inner.active.lock() else {
            return 0;
        };
        for turn in active.values() {
            turn.cancel.cancel();
        }
        active.len()
    }

    /// Cancels the turn running here; says whether there was one. (A turn
    /// another instance runs: [`Engine::cancel_anywhere`].)
    pub fn cancel(&self, conversation: ConversationId) -> bool {
        let active = self.inner.active.lock();
        match active.ok().as_ref().and_then(|a| a.get(&conversation)) {
            Some(turn) => {
                turn.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Cancels run `run` if it is the turn running in `conversation`;
    /// says whether it was (another run, or none, is left alone).
    pub fn cancel_run(&self, conversation: ConversationId, run: RunId) -> bool {
        let active = self.inner.active.lock();
        match active.ok().as_ref().and_then(|a| a.get(&conversation)) {
            Some(turn) if turn.run_id == run => {
                turn.cancel.cancel();
                true
            }
            _ => false,
        }
    }

    /// A user message sent while a turn runs is queued for it; with no turn
    /// running it starts one, with the conversation's options (see
    /// [`Engine::set_conversation_options`]). Nothing is lost in between:
    /// the queue and the end of a turn are decided under one lock.
    pub async fn interject(
        &self,
        conversation: ConversationId,
        text: &str,
    ) -> Result<Interjection, EngineError> {
        // A turn that starts between the look and the start takes the
        // words: the next look finds it (bounded, should turns keep
        // ending just then).
        let mut attempts = 0;
        loop {
            if self.queue_interjection(conversation, text).await? {
                return Ok(Interjection::Queued);
            }
            let options = self.conversation_options(conversation);
            match self
                .send_from(conversation, text, None, options, Origin::Engine)
                .await
            {
                Ok(handle) => return Ok(Interjection::Started(handle)),
                Err(EngineError::TurnInProgress(_)) if attempts < 8 => {
                    attempts += 1;
                    // Another instance's turn takes them.
                    if let Some(owner) = self.remote_turn_owner(conversation).await? {
                        let command = Command::Interject {
                            conversation,
                            text: text.to_owned(),
                        };
                        self.inner.cluster.send(owner, &command).await?;
                        return Ok(Interjection::Queued);
                    }
                    if self.inner.cluster.shared() {
                        // Its lease is taken and its run not stored yet
                        // (or just finished): look again shortly.
                        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Words for the turn this instance runs in `conversation`, queued as
    /// [`interject`](Self::interject) queues them (`true`). With no such
    /// turn nothing starts (`false`): the caller sends them as its own
    /// message, in its own turn, whose start it follows. A turn paused for
    /// approval is [`EngineError::ApprovalPending`].
    pub async fn interject_running(
        &self,
        conversation: ConversationId,
        text: &str,
    ) -> Result<bool, EngineError> {
        if self.queue_interjection(conversation, text).await? {
            return Ok(true);
        }
        let (leaf, _, pending) = self.leaf_and_pending(conversation).await?;
        match pending {
            Some(pending) if pending.message_id == leaf => Err(EngineError::ApprovalPending {
                conversation,
                message_id: pending.message_id,
            }),
            _ => Ok(false),
        }
    }

    /// Queues `text` for the turn this instance runs in `conversation`,
    /// kept in the store before it returns (a crash from then on loses no
    /// word); `false` when no turn runs here.
    async fn queue_interjection(
        &self,
        conversation: ConversationId,
        text: &str,
    ) -> Result<bool, EngineError> {
        let queued = {
            let mut active = self
                .inner
                .active
                .lock()
                .map_err(|_| EngineError::TurnInProgress(conversation))?;
            match active.get_mut(&conversation) {
                Some(turn) => {
                    turn.interjections.push_back(text.to_owned());
                    turn.spoken_after_cancel |= turn.cancel.is_cancelled();
                    true
                }
                None => false,
            }
        };
        if queued {
            self.keep_interjections(conversation).await;
        }
        Ok(queued)
    }

    /// Writes what waits for `conversation`'s turn to the store.
    async fn keep_interjections(&self, conversation: ConversationId) {
        let active = &self.inner.active;
        self.inner
            .interjections
            .keep_or_warn(conversation, || turn::queued(active, conversation))
            .await;
    }

    async fn start_turn(
        &self,
        conversation: ConversationId,
        start: turn::Start,
        options: TurnOptions,
        origin: Origin,
    ) -> Result<TurnHandle, EngineError> {
        // Not while a change to the conversation is being made (`edit`).
        let editing = self.inner.edits.hold(conversation).await;
        self.start_turn_held(editing, conversation, start, options, origin)
            .await
    }

    async fn start_turn_held(
        &self,
        editing: Held<ConversationId>,
        conversation: ConversationId,
        start: turn::Start,
        options: TurnOptions,
        origin: Origin,
    ) -> Result<TurnHandle, EngineError> {
        self.model_for(&options)?;
        let run_id = RunId::new();
        let cancel = CancellationToken::new();
        if self.inner.cluster.shared() {
            // Another instance may run a turn here: the lease decides. An
            // entry in `active` appears only under `editing` (held) or by
            // a hand-over from an entry already there, so looking first
            // and inserting after the lease leaves nothing between.
            if self.is_running(conversation) {
                return Err(EngineError::TurnInProgress(conversation));
            }
            if !self.inner.cluster.try_lease(conversation).await? {
                return Err(EngineError::TurnInProgress(conversation));
            }
            // A run left unfinished here has lost its instance (no one
            // else holds the lease): interrupted before the new turn.
            if let Err(e) = cluster::recover_conversation(self, conversation).await {
                self.release(conversation);
                return Err(e);
            }
        }
        {
            let mut active = match self.inner.active.lock() {
                Ok(active) => active,
                Err(_) => {
                    self.release(conversation);
                    return Err(EngineError::TurnInProgress(conversation));
                }
            };
            if active.contains_key(&conversation) {
                self.release(conversation);
                return Err(EngineError::TurnInProgress(conversation));
            }
            // Under the lock, so that no turn starts once `shutdown` has
            // looked at what runs.
            if self.inner.stopping.is_stopping() {
                self.release(conversation);
                return Err(EngineError::ShuttingDown);
            }
            active.insert(
                conversation,
                ActiveTurn {
                    run_id,
                    cancel: cancel.clone(),
                    interjections: VecDeque::new(),
                    spoken_after_cancel: false,
                },
            );
            // Under the lock that decides which turn runs, so that a wake
            // never reads options older than the turn that ran last.
            match origin {
                Origin::FrontDoor => self.inner.remembered.set(conversation, options.clone()),
                Origin::Engine => self.inner.own_runs.note(run_id),
            }
        }
        drop(editing);
        self.spawn_turn(conversation, run_id, cancel, start, options)
            .await
    }

    /// Runs a turn whose entry in `active` is set, and returns once its
    /// first step is stored: a front door acknowledges a message only
    /// after that, so that nothing it answered as accepted is lost.
    ///
    /// Boxed, with its type spelt out: a turn's end may start the next
    /// turn, and the compiler cannot prove a future that contains itself
    /// `Send`.
    fn spawn_turn(
        &self,
        conversation: ConversationId,
        run_id: RunId,
        cancel: CancellationToken,
        start: turn::Start,
        options: TurnOptions,
    ) -> futures::future::BoxFuture<'_, Result<TurnHandle, EngineError>> {
        Box::pin(self.spawn_turn_inner(conversation, run_id, cancel, start, options))
    }

    async fn spawn_turn_inner(
        &self,
        conversation: ConversationId,
        run_id: RunId,
        cancel: CancellationToken,
        start: turn::Start,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        self.inner.notifications.attach(conversation);
        let engine = self.clone();
        // What the next turns get, should the engine start them itself.
        let fallback = TurnOptions {
            run_records: None,
            ..options.clone()
        };
        let guard = self.inner.stopping.enter();
        let (begun, started) = tokio::sync::oneshot::channel();
        let join = tokio::spawn(async move {
            let cx = engine.inner.turn_context();
            let outcome = turn::run(&cx, conversation, run_id, start, cancel, options, begun).await;
            engine.end_turn(conversation, run_id, fallback).await;
            drop(guard);
            outcome
        });
        let handle = TurnHandle {
            run_id,
            conversation_id: conversation,
            join,
        };
        match started.await {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(error)) => {
                handle.wait().await;
                Err(EngineError::NotStarted(error))
            }
            Err(_) => {
                let outcome = handle.wait().await;
                Err(EngineError::NotStarted(
                    outcome
                        .error
                        .unwrap_or_else(|| "the turn task ended".into()),
                ))
            }
        }
    }

    /// Forgets the finished turn. Words that came too late for it start
    /// the next one, with the conversation's options (the finished turn's,
    /// should they have been forgotten meanwhile); until that turn holds
    /// the conversation, the finished one's entry stays, so that words
    /// sent meanwhile queue behind them: stored in order of arrival.
    async fn end_turn(&self, conversation: ConversationId, run_id: RunId, options: TurnOptions) {
        let late = match self.inner.active.lock() {
            Ok(mut active) => match active.get(&conversation) {
                Some(turn) if turn.run_id == run_id && turn.interjections.is_empty() => {
                    active.remove(&conversation);
                    self.release(conversation);
                    false
                }
                Some(turn) => turn.run_id == run_id,
                None => false,
            },
            Err(_) => false,
        };
        // Asked whatever happens next, so that it is not left set.
        let deferred_wake = self.inner.notifications.take_deferred_wake(conversation);
        if late {
            self.hand_over(conversation, run_id, options).await;
        } else if deferred_wake {
            // A waking notification came while the turn ran.
            self.wake_soon(conversation);
        }
    }

    /// Takes the words queued for finished turn `run_id` (all of them,
    /// under the lock) and, in the same hold, gives the conversation to the
    /// turn they start; when they all came before the turn was cancelled
    /// they are only stored.
    async fn hand_over(&self, conversation: ConversationId, run_id: RunId, options: TurnOptions) {
        let options = self.inner.remembered.get(conversation).unwrap_or(options);
        let read = self.leaf_and_revision(conversation).await;
        let revision = read.as_ref().ok().map(|(_, revision)| *revision);
        let leaf = read.map(|(leaf, _)| leaf);
        let pending = match &leaf {
            Ok(_) => self.pending_approval(conversation).await,
            Err(_) => Ok(None),
        };
        let cancel = CancellationToken::new();
        let next = RunId::new();
        let (words, started) = {
            let Ok(mut active) = self.inner.active.lock() else {
                return;
            };
            // Under the lock, as in `start_turn`: no turn starts once
            // `shutdown` has looked at what runs.
            let stopping = self.inner.stopping.is_stopping();
            // A cancel (even one that came as the turn was ending) stops
            // what the words before it would have gone on to; words that
            // came after it go on.
            let (words, cancelled) = match active.get_mut(&conversation) {
                Some(turn) if turn.run_id == run_id => (
                    turn.interjections.drain(..).collect::<Vec<String>>(),
                    turn.cancel.is_cancelled() && !turn.spoken_after_cancel,
                ),
                _ => (Vec::new(), false),
            };
            let go_on = !stopping
                && !cancelled
                && matches!((&leaf, &pending), (Ok(l), Ok(p)) if p.as_ref().is_none_or(|p| p.message_id != *l));
            if go_on && !words.is_empty() {
                active.insert(
                    conversation,
                    ActiveTurn {
                        run_id: next,
                        cancel: cancel.clone(),
                        interjections: VecDeque::new(),
                        spoken_after_cancel: false,
                    },
                );
                (words, true)
            } else {
                if active.remove(&conversation).is_some() {
                    self.release(conversation);
                }
                (words, false)
            }
        };
        if words.is_empty() {
            return;
        }
        let text = words.join("\n\n");
        let handled = match (leaf, pending) {
            (Ok(leaf), Ok(_)) if started => {
                let user = user_message(conversation, leaf, &text);
                match self
                    .spawn_turn(
                        conversation,
                        next,
                        cancel,
                        turn::Start::user(user, revision),
                        options,
                    )
                    .await
                {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::error!(%conversation, error = %e, "could not start a turn for a late interjection");
                        false
                    }
                }
            }
            // The turn paused for answers: the words wait as the user's
            // notification, for the next tool result (the first call run
            // once the pause is answered) or the next turn's start.
            (Ok(_), Ok(Some(_))) => {
                self.inner.notifications.push(
                    &self.inner.config.notifications.queue,
                    conversation,
                    Incoming::text(USER_SOURCE, Priority::High, text),
                );
                tracing::info!(%conversation, "a late interjection waits for the paused turn");
                match self.keep_notifications().await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(%conversation, error = %e, "a late interjection could not be kept as a notification");
                        false
                    }
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(%conversation, error = %e, "could not start a turn for a late interjection");
                false
            }
            // Stopping, or the turn was cancelled: the words are stored,
            // answered by no model; the next message goes on from them.
            (Ok(leaf), Ok(None)) => {
                let user = user_message(conversation, leaf, &text);
                let event = AgentEvent::UserInterjection {
                    run_id,
                    message: user.clone(),
                };
                match self.inner.bus.store_message(&user, vec![event]).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::error!(%conversation, error = %e, "a late interjection could not be stored");
                        false
                    }
                }
            }
        };
        // Words not handled stay kept, for whoever takes this instance's
        // place.
        if handled {
            self.keep_interjections(conversation).await;
        }
    }
}

#[async_trait::async_trait]
impl EventLog for Engine {
    async fn events_since(
        &self,
        conversation: ConversationId,
        seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, EngineError> {
        Engine::events_since(self, conversation, seq, limit).await
    }
}

/// Who starts a turn: a front door's options are remembered as the
/// conversation's; the engine's own turns only use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    FrontDoor,
    Engine,
}

/// Takes over what instances now gone kept waiting: their pending
/// notifications, then their queued interjections (which wait as
/// notifications).
async fn take_over_waiting(
    store: &dyn Store,
    hub: &Hub,
    config: &toolwire_core::NotifyConfig,
    me: &InstanceRecord,
    stale_after: std::time::Duration,
) -> Result<(), EngineError> {
    keep::take_over(store, hub, config, me, stale_after).await?;
    interjections::take_over(store, hub, config, me, stale_after).await?;
    Ok(())
}
