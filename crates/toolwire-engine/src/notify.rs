//! Notifications in the engine: one queue per conversation (the pure
//! queue of `toolwire_core::notification`), filled by sources (the file
//! watcher, background tasks, clients, reminder-mode interjections) and
//! drained when a tool completes, or when the next turn starts. A drained
//! batch stays the hub's until the message carrying it is stored
//! ([`Hub::delivered`]) or it is put back ([`Hub::restore`]); what waits,
//! taken or not, is kept in the store as it changes ([`keep`]).

pub(crate) mod keep;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
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

/// Conversations that hear about workspace-wide events: the ones a turn ran
/// in most recently. A long-running server works on ever more of them,
/// and a file change is not news to a conversation left long ago.
pub(crate) const ATTACHED_MAX: usize = 4096;

/// Queues kept: beyond this, empty queues (their rate-limit state only)
/// are let go, those touched longest ago first. Above [`ATTACHED_MAX`], as
/// every attached conversation may have one.
pub(crate) const QUEUES_MAX: usize = 2 * ATTACHED_MAX;

/// The queues of every conversation, and which conversations this engine
/// has worked on (those hear about workspace-wide events).
#[derive(Debug, Default)]
pub(crate) struct Hub {
    queues: Mutex<Queues>,
    /// Each attached conversation with when it was last attached.
    attached: Mutex<Recent>,
    /// Conversations with a wake scheduled.
    waking: Mutex<HashSet<ConversationId>>,
    /// Conversations that got a waking notification while a turn ran: the
    /// turn's end wakes them if it did not deliver it.
    deferred: Mutex<HashSet<ConversationId>>,
    /// Conversations whose pending notifications changed since they were
    /// last kept in the store, and the signal that some did.
    changed: Mutex<HashSet<ConversationId>>,
    signal: Arc<tokio::sync::Notify>,
    /// Held while writing to the store, so that an older picture of a
    /// conversation's queue never lands after a newer one.
    keeping: tokio::sync::Mutex<()>,
}

/// Conversations with the tick each was last touched at.
#[derive(Debug, Default)]
struct Recent {
    tick: u64,
    at: HashMap<ConversationId, u64>,
    /// How many there may be before the next trim: a trim that could let
    /// few go is not tried again at once.
    trim_at: usize,
}

impl Recent {
    fn touch(&mut self, conversation: ConversationId) {
        self.tick += 1;
        self.at.insert(conversation, self.tick);
    }

    /// Forgets the least recently touched of those `can_go` allows to go,
    /// until at most `max` are left (or none can go). Returns whether it
    /// let any go.
    fn trim(&mut self, max: usize, mut can_go: impl FnMut(&ConversationId) -> bool) -> bool {
        if self.at.len() <= max.max(self.trim_at) {
            return false;
        }
        // Down to nine tenths at once, so that trimming is rare.
        let mut by_age: Vec<(u64, ConversationId)> = self
            .at
            .iter()
            .filter(|(c, _)| can_go(c))
            .map(|(c, t)| (*t, *c))
            .collect();
        by_age.sort_unstable();
        let excess = self.at.len() - max * 9 / 10;
        let before = self.at.len();
        for (_, conversation) in by_age.into_iter().take(excess) {
            self.at.remove(&conversation);
        }
        self.trim_at = self.at.len() + max / 10;
        self.at.len() < before
    }
}

#[derive(Debug, Default)]
struct Queues {
    by_conversation: HashMap<ConversationId, NotificationQueue>,
    /// Batches drained and not yet stored on a message, oldest first.
    taken: HashMap<ConversationId, Vec<Batch>>,
    recent: Recent,
}

impl Queues {
    /// Forgets `batch` among those taken for `conversation`.
    fn settle(&mut self, conversation: ConversationId, batch: &Batch) {
        if let Some(taken) = self.taken.get_mut(&conversation) {
            if let Some(at) = taken.iter().position(|b| b == batch) {
                taken.remove(at);
            }
            if taken.is_empty() {
                self.taken.remove(&conversation);
            }
        }
    }

    /// The queue of `conversation` (a new one if it has none), marked as
    /// used now.
    fn used(
        &mut self,
        config: &NotifyConfig,
        conversation: ConversationId,
    ) -> &mut NotificationQueue {
        self.recent.touch(conversation);
        self.by_conversation
            .entry(conversation)
            .or_insert_with(|| NotificationQueue::new(config.clone()))
    }
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
        let queues = &mut *queues;
        let admission = queues.used(config, conversation).push(event, now);
        self.changed(conversation);
        let by_conversation = &queues.by_conversation;
        let trimmed = queues.recent.trim(QUEUES_MAX, |c| {
            by_conversation.get(c).is_none_or(|q| q.is_empty())
        });
        if trimmed {
            let recent = &queues.recent.at;
            queues.by_conversation.retain(|c, _| recent.contains_key(c));
        }
        admission
    }

    /// The next block for `conversation`, if anything waits: taken, until
    /// [`Hub::delivered`] or [`Hub::restore`] says what became of it.
    pub(crate) fn drain(&self, conversation: ConversationId) -> Option<Batch> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        // The queue stays, empty: its rate-limit buckets must outlive a
        // drain, or a storm would get a fresh burst after every block.
        let batch = queues.by_conversation.get_mut(&conversation)?.drain()?;
        queues
            .taken
            .entry(conversation)
            .or_default()
            .push(batch.clone());
        Some(batch)
    }

    /// `batch`, drained for `conversation`, is stored on a message: it no
    /// longer waits anywhere.
    pub(crate) fn delivered(&self, conversation: ConversationId, batch: &Batch) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.settle(conversation, batch);
        self.changed(conversation);
    }

    /// Puts back `batch`, drained for `conversation` but not delivered (or
    /// kept by an engine that is gone), first in line.
    pub(crate) fn restore(
        &self,
        config: &NotifyConfig,
        conversation: ConversationId,
        batch: Batch,
    ) {
        let now = tokio::time::Instant::now().into_std();
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.settle(conversation, &batch);
        queues.used(config, conversation).restore(batch, now);
        self.changed(conversation);
    }

    /// Everything that waits for `conversation`, as one batch to keep:
    /// the batches taken and not yet stored, then the queue.
    pub(crate) fn snapshot(&self, conversation: ConversationId) -> Option<Batch> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let taken = queues.taken.get(&conversation).into_iter().flatten();
        let queued = queues
            .by_conversation
            .get(&conversation)
            .and_then(NotificationQueue::snapshot);
        let mut notices = Vec::new();
        let mut dropped: BTreeMap<String, u64> = BTreeMap::new();
        for batch in taken.chain(queued.as_ref()) {
            notices.extend(batch.notices.iter().cloned());
            for (source, n) in &batch.dropped {
                *dropped.entry(source.clone()).or_default() += n;
            }
        }
        (!notices.is_empty() || !dropped.is_empty()).then(|| Batch {
            notices,
            more_pending: 0,
            dropped: dropped.into_iter().collect(),
        })
    }

    /// Notes that what waits for `conversation` changed.
    fn changed(&self, conversation: ConversationId) {
        self.changed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(conversation);
        self.signal.notify_one();
    }

    /// The conversations changed since last asked.
    fn take_changed(&self) -> HashSet<ConversationId> {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether anything waits for `conversation`.
    pub(crate) fn has_pending(&self, conversation: ConversationId) -> bool {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues
            .by_conversation
            .get(&conversation)
            .is_some_and(|q| !q.is_empty())
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

    /// Notes that a waking notification for `conversation` came while a
    /// turn ran.
    pub(crate) fn defer_wake(&self, conversation: ConversationId) {
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(conversation);
    }

    /// Whether a waking notification came during the turn that just ended
    /// (forgotten once asked).
    pub(crate) fn take_deferred_wake(&self, conversation: ConversationId) -> bool {
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&conversation)
    }

    pub(crate) fn wake_done(&self, conversation: ConversationId) {
        self.waking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&conversation);
    }

    pub(crate) fn attach(&self, conversation: ConversationId) {
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        attached.touch(conversation);
        attached.trim(ATTACHED_MAX, |_| true);
    }

    pub(crate) fn attached(&self) -> Vec<ConversationId> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .at
            .keys()
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

    /// What is kept of a conversation's notifications: those queued and
    /// those taken for a message not stored yet, until it is.
    #[tokio::test]
    async fn a_taken_batch_is_kept_until_its_message_is_stored() {
        let (hub, config, conv) = (
            Hub::default(),
            NotifyConfig::default(),
            ConversationId::new(),
        );
        assert!(hub.snapshot(conv).is_none());
        hub.push(
            &config,
            conv,
            Incoming::text("ci", Priority::Normal, "first"),
        );
        assert_eq!(hub.take_changed(), HashSet::from([conv]));
        let taken = hub.drain(conv).unwrap();
        hub.push(
            &config,
            conv,
            Incoming::text("task", Priority::Normal, "second"),
        );
        assert_eq!(texts(&hub.snapshot(conv).unwrap()), ["first", "second"]);

        // Not stored: put back, and still kept.
        hub.restore(&config, conv, taken);
        assert_eq!(texts(&hub.snapshot(conv).unwrap()), ["first", "second"]);
        let taken = hub.drain(conv).unwrap();
        assert_eq!(texts(&taken), ["first", "second"]);
        hub.take_changed();
        hub.delivered(conv, &taken);
        assert_eq!(hub.take_changed(), HashSet::from([conv]), "to be written");
        assert!(hub.snapshot(conv).is_none(), "nothing left to keep");
    }

    /// A long-running engine forgets the conversations it worked on
    /// longest ago, and the empty queues touched longest ago, but never a
    /// queue with something waiting.
    #[tokio::test]
    async fn attached_conversations_and_queues_stay_bounded() {
        let (hub, config) = (Hub::default(), NotifyConfig::default());
        let first = ConversationId::new();
        hub.push(
            &config,
            first,
            Incoming::text("ci", Priority::Normal, "waiting"),
        );
        hub.attach(first);
        let mut latest = first;
        for _ in 0..QUEUES_MAX + 500 {
            latest = ConversationId::new();
            hub.attach(latest);
            hub.push(&config, latest, Incoming::text("ci", Priority::Normal, "x"));
            let batch = hub.drain(latest).unwrap();
            hub.delivered(latest, &batch);
        }
        let attached = hub.attached();
        assert!(attached.len() <= ATTACHED_MAX, "{}", attached.len());
        assert!(attached.contains(&latest));
        assert!(!attached.contains(&first));
        let queues = hub.queues.lock().unwrap().by_conversation.len();
        assert!(queues <= QUEUES_MAX, "{queues}");
        // The oldest queue still had something waiting: it stays.
        assert!(hub.has_pending(first));
        assert_eq!(texts(&hub.drain(first).unwrap()), ["waiting"]);
    }
}
