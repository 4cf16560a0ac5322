//! Notifications in the engine: one queue per conversation (the pure
//! queue of `toolwire_core::notification`), filled by sources (the file
//! watcher, background tasks, clients, reminder-mode interjections) and
//! drained when a tool completes, or when the next turn starts.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use toolwire_core::{Batch, ConversationId, Incoming, NotificationQueue, NotifyConfig};

/// How injected notifications reach the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InjectionMode {
    /// Appended to the result of the tool that completed (the default).
    #[default]
    Augment,
    /// A synthetic `_system_notification` call and its result after the
    /// step's results, one pair per block.
    SyntheticTool,
}

/// What a source's notifications do when no turn is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// They wait for the next tool result (or the next turn).
    #[default]
    Passive,
    /// They start a turn, as its input.
    Wake,
}

/// Notification settings.
#[derive(Debug, Clone)]
pub struct NotificationSettings {
    /// Off: nothing is queued, and the system prompt says nothing of them.
    pub enabled: bool,
    pub mode: InjectionMode,
    pub queue: NotifyConfig,
    /// Per source; a source not listed is passive.
    pub activation: HashMap<String, Activation>,
}

impl Default for NotificationSettings {
    fn default() -> Self {
        NotificationSettings {
            enabled: true,
            mode: InjectionMode::default(),
            queue: NotifyConfig::default(),
            activation: HashMap::new(),
        }
    }
}

impl NotificationSettings {
    pub fn activation(&self, source: &str) -> Activation {
        self.activation.get(source).copied().unwrap_or_default()
    }
}

/// The name of the tool that carries notifications in
/// [`InjectionMode::SyntheticTool`]; the model is told never to call it.
pub const NOTIFICATION_TOOL: &str = "_system_notification";

/// The queues of every conversation, and which conversations this engine
/// has worked on (those hear about workspace-wide events).
#[derive(Debug, Default)]
pub(crate) struct Hub {
    queues: Mutex<HashMap<ConversationId, NotificationQueue>>,
    attached: Mutex<HashSet<ConversationId>>,
}

impl Hub {
    /// Queues `event` for `conversation`; returns whether it was kept.
    pub(crate) fn push(
        &self,
        config: &NotifyConfig,
        conversation: ConversationId,
        event: Incoming,
    ) -> toolwire_core::notification::Admission {
        let now = tokio::time::Instant::now().into_std();
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues
            .entry(conversation)
            .or_insert_with(|| NotificationQueue::new(config.clone()))
            .push(event, now)
    }

    /// The next block for `conversation`, if anything waits.
    pub(crate) fn drain(&self, conversation: ConversationId) -> Option<Batch> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        // The queue stays, empty: its rate-limit buckets must outlive a
        // drain, or a storm would get a fresh burst after every block.
        queues.get_mut(&conversation)?.drain()
    }

    /// Whether anything waits for `conversation`.
    pub(crate) fn has_pending(&self, conversation: ConversationId) -> bool {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.get(&conversation).is_some_and(|q| !q.is_empty())
    }

    pub(crate) fn attach(&self, conversation: ConversationId) {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(conversation);
    }

    pub(crate) fn attached(&self) -> Vec<ConversationId> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect()
    }
}
