//! Notifications in the engine: one queue per conversation (the pure
//! queue of `toolwire_core::notification`), filled by sources (the file
//! watcher, background tasks, clients, reminder-mode interjections) and
//! drained when a tool completes, or when the next turn starts.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

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
    /// Conversations with a wake scheduled.
    waking: Mutex<HashSet<ConversationId>>,
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

    /// Schedules a wake; false if one is already scheduled.
    pub(crate) fn schedule_wake(&self, conversation: ConversationId) -> bool {
        self.waking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(conversation)
    }

    /// Runs `wake` once `window` has passed, unless a wake is already
    /// scheduled for `conversation`: that one delivers what arrives
    /// meanwhile, so everything inside the window joins one turn. `wake`
    /// calls [`Hub::wake_done`] first. Returns whether this call scheduled
    /// it.
    pub(crate) fn wake_after<F>(
        &self,
        conversation: ConversationId,
        window: Duration,
        wake: F,
    ) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if !self.schedule_wake(conversation) {
            return false;
        }
        // The deadline is taken now, not when the task is first polled.
        let deadline = tokio::time::Instant::now() + window;
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            wake.await;
        });
        true
    }

    pub(crate) fn wake_done(&self, conversation: ConversationId) {
        self.waking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&conversation);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use toolwire_core::notification::Admission;
    use toolwire_core::{FileChange, Priority};

    use super::*;

    fn texts(batch: &Batch) -> Vec<&str> {
        batch.notices.iter().map(|n| n.text.as_str()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_coalescing_window_runs_on_tokios_clock() {
        let (hub, config, conv) = (
            Hub::default(),
            NotifyConfig::default(),
            ConversationId::new(),
        );
        let file = |p: &str| Incoming::file("file_watcher", p, FileChange::Modified);
        assert_eq!(hub.push(&config, conv, file("src/a.rs")), Admission::Queued);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(
            hub.push(&config, conv, file("src/b.rs")),
            Admission::Coalesced
        );
        // Past two seconds after the line's first event: a new line.
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(hub.push(&config, conv, file("src/c.rs")), Admission::Queued);
        let batch = hub.drain(conv).unwrap();
        assert_eq!(
            texts(&batch),
            [
                "Multiple files modified: src/a.rs, src/b.rs",
                "File modified: src/c.rs"
            ]
        );
        assert!(hub.drain(conv).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_refills_on_tokios_clock() {
        let config = NotifyConfig {
            burst: 3,
            per_second: 1.0,
            ..NotifyConfig::default()
        };
        let (hub, conv) = (Hub::default(), ConversationId::new());
        let ci = |t: &str| Incoming::text("ci", Priority::Normal, t);
        let kept = (0..10)
            .filter(|i| hub.push(&config, conv, ci(&format!("event {i}"))) != Admission::Dropped)
            .count();
        assert_eq!(kept, 3, "the burst, then nothing");
        // Draining does not refill the bucket: only time does.
        let first = hub.drain(conv).unwrap();
        assert_eq!(texts(&first), ["event 0; event 1; event 2"]);
        assert_eq!(first.dropped, [("ci".to_owned(), 7)]);
        assert_eq!(hub.push(&config, conv, ci("too soon")), Admission::Dropped);
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(
            hub.push(&config, conv, ci("a second later")),
            Admission::Queued
        );
        let second = hub.drain(conv).unwrap();
        assert_eq!(texts(&second), ["a second later"]);
        assert_eq!(second.dropped, [("ci".to_owned(), 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_comes_as_the_window_closes_with_what_came_inside_it() {
        let hub = std::sync::Arc::new(Hub::default());
        let (config, conv) = (NotifyConfig::default(), ConversationId::new());
        let window = config.coalesce_window;
        let diagnostic = |t: &str| Incoming::text("diagnostics", Priority::High, t);
        let start = tokio::time::Instant::now();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        hub.push(&config, conv, diagnostic("E0308 in src/lib.rs"));
        let waking = hub.clone();
        assert!(hub.wake_after(conv, window, async move {
            waking.wake_done(conv);
            let _ = tx.send((start.elapsed(), waking.drain(conv)));
        }));
        tokio::time::advance(Duration::from_millis(1_500)).await;
        hub.push(&config, conv, diagnostic("E0425 in src/main.rs"));
        assert!(
            !hub.wake_after(conv, window, async {}),
            "the scheduled wake delivers it"
        );
        tokio::time::advance(Duration::from_millis(499)).await;
        tokio::task::yield_now().await;
        assert!(rx.try_recv().is_err(), "not before the window closes");
        tokio::time::advance(Duration::from_millis(1)).await;
        let (at, batch) = rx.await.unwrap();
        assert_eq!(at, window);
        assert_eq!(
            texts(&batch.unwrap()),
            ["E0308 in src/lib.rs; E0425 in src/main.rs"],
            "one source inside the window: one line"
        );
        // Woken, the next notification schedules a new wake.
        assert!(hub.wake_after(conv, window, async {}));
    }

    #[tokio::test(start_paused = true)]
    async fn one_wake_is_scheduled_at_a_time() {
        let (hub, conv) = (Hub::default(), ConversationId::new());
        assert!(hub.schedule_wake(conv));
        assert!(
            !hub.schedule_wake(conv),
            "the scheduled one will deliver both"
        );
        hub.wake_done(conv);
        assert!(hub.schedule_wake(conv));
    }
}
