//! The engine: conversations, turns and their control (cancel, interject,
//! edit, regenerate). One turn at a time per conversation.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolwire_core::{
    AgentEvent, ContentBlock, Conversation, ConversationId, Message, MessageId, Role, RunId,
    StopReason, TreeError, Usage, tree,
};
use toolwire_store::{Store, StoreError, StoredEvent};

use crate::bus::{EventBus, Observer, Subscription};
use crate::config::EngineConfig;
use crate::provider::Provider;
use crate::tools::ToolRegistry;
use crate::turn;

/// What the engine could not do.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("a turn is already running in conversation {0}; interject or cancel it")]
    TurnInProgress(ConversationId),
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
            Err(e) => TurnOutcome {
                run_id,
                conversation_id,
                reason: StopReason::Error,
                error: Some(format!("the turn task failed: {e}")),
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

/// Control of a running turn, shared with its task.
#[derive(Debug)]
pub(crate) struct ActiveTurn {
    pub(crate) run_id: RunId,
    pub(crate) cancel: CancellationToken,
    pub(crate) interjections: VecDeque<String>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) tools: ToolRegistry,
    pub(crate) config: EngineConfig,
    pub(crate) bus: EventBus,
    pub(crate) active: Mutex<HashMap<ConversationId, ActiveTurn>>,
}

/// The engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.inner.provider.model())
            .field("tools", &self.inner.tools)
            .finish()
    }
}

impl Engine {
    /// An engine over `store`. Runs left unfinished by a previous process
    /// are marked interrupted (and a `stopped` event says so).
    pub async fn start(
        store: Arc<dyn Store>,
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        config: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let bus = EventBus::new(store.clone(), config.event_capacity);
        for run in store.interrupt_unfinished_runs().await? {
            tracing::warn!(run = %run.id, conversation = %run.conversation_id, "turn was interrupted by a restart");
            bus.emit(
                run.conversation_id,
                AgentEvent::Stopped {
                    run_id: run.id,
                    reason: StopReason::Interrupted,
                    error: Some("the process stopped during this turn".into()),
                },
            )
            .await?;
        }
        Ok(Engine {
            inner: Arc::new(Inner {
                store,
                provider,
                tools,
                config,
                bus,
                active: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.inner.tools
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// A new conversation with the configured system prompt.
    pub async fn create_conversation(
        &self,
        title: Option<&str>,
    ) -> Result<Conversation, EngineError> {
        Ok(self
            .inner
            .store
            .create_conversation(&self.inner.config.system_prompt, title)
            .await?)
    }

    /// Live events of a conversation. On `Lagged`, read what was missed
    /// with [`Engine::events_since`].
    pub fn subscribe(&self, conversation: ConversationId) -> Subscription {
        self.inner.bus.subscribe(conversation)
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

    /// Whether a turn is running in `conversation`.
    pub fn is_running(&self, conversation: ConversationId) -> bool {
        self.inner
            .active
            .lock()
            .map(|a| a.contains_key(&conversation))
            .unwrap_or(false)
    }

    /// Starts a turn: `text` as a user message under `parent` (the active
    /// leaf by default).
    pub async fn send(
        &self,
        conversation: ConversationId,
        text: &str,
        parent: Option<MessageId>,
    ) -> Result<TurnHandle, EngineError> {
        let parent = match parent {
            Some(p) => p,
            None => {
                self.inner
                    .store
                    .conversation(conversation)
                    .await?
                    .active_leaf
            }
        };
        let user = user_message(conversation, parent, text);
        self.start_turn(conversation, turn::Start::User(user))
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
        let original = self.inner.store.message(id).await?;
        let sibling = tree::edited_sibling(&original, text)?;
        self.start_turn(original.conversation_id, turn::Start::User(sibling))
    }

    /// A new answer in place of assistant message `id` (a new sibling).
    pub async fn regenerate(&self, id: MessageId) -> Result<TurnHandle, EngineError> {
        let original = self.inner.store.message(id).await?;
        let parent = tree::regeneration_parent(&original)?;
        self.start_turn(original.conversation_id, turn::Start::From(parent))
    }

    /// Cancels the running turn; says whether there was one.
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

    /// A user message sent while a turn runs is queued for it; with no turn
    /// running it starts one. Nothing is lost in between: the queue and the
    /// end of a turn are decided under one lock.
    pub async fn interject(
        &self,
        conversation: ConversationId,
        text: &str,
    ) -> Result<Interjection, EngineError> {
        {
            let mut active = self
                .inner
                .active
                .lock()
                .map_err(|_| EngineError::TurnInProgress(conversation))?;
            if let Some(turn) = active.get_mut(&conversation) {
                turn.interjections.push_back(text.to_owned());
                return Ok(Interjection::Queued);
            }
        }
        Ok(Interjection::Started(
            self.send(conversation, text, None).await?,
        ))
    }

    fn start_turn(
        &self,
        conversation: ConversationId,
        start: turn::Start,
    ) -> Result<TurnHandle, EngineError> {
        let run_id = RunId::new();
        let cancel = CancellationToken::new();
        {
            let mut active = self
                .inner
                .active
                .lock()
                .map_err(|_| EngineError::TurnInProgress(conversation))?;
            if active.contains_key(&conversation) {
                return Err(EngineError::TurnInProgress(conversation));
            }
            active.insert(
                conversation,
                ActiveTurn {
                    run_id,
                    cancel: cancel.clone(),
                    interjections: VecDeque::new(),
                },
            );
        }
        let engine = self.clone();
        let join = tokio::spawn(async move {
            let outcome = turn::run(&engine.inner, conversation, run_id, start, cancel).await;
            engine.end_turn(conversation, run_id).await;
            outcome
        });
        Ok(TurnHandle {
            run_id,
            conversation_id: conversation,
            join,
        })
    }

    /// Forgets the finished turn; interjections that came too late for it
    /// start the next one.
    async fn end_turn(&self, conversation: ConversationId, run_id: RunId) {
        let late: Vec<String> = match self.inner.active.lock() {
            Ok(mut active) => match active.remove(&conversation) {
                Some(turn) if turn.run_id == run_id => turn.interjections.into_iter().collect(),
                Some(other) => {
                    active.insert(conversation, other);
                    Vec::new()
                }
                None => Vec::new(),
            },
            Err(_) => Vec::new(),
        };
        if !late.is_empty() {
            let text = late.join("\n\n");
            if let Err(e) = self.send(conversation, &text, None).await {
                tracing::error!(%conversation, error = %e, "could not start a turn for a late interjection");
            }
        }
    }
}

pub(crate) fn user_message(conversation: ConversationId, parent: MessageId, text: &str) -> Message {
    Message::new(
        conversation,
        Some(parent),
        Role::User,
        vec![ContentBlock::Text {
            text: text.to_owned(),
        }],
    )
}
