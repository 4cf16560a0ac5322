//! Persist, then publish: each event is appended to the store's log (which
//! gives it its sequence number), then sent to the conversation's
//! subscribers and observers. Subscribers hold a bounded broadcast
//! receiver: one that falls behind gets `Lagged` and resyncs from the
//! store's log; the turn never waits for it.
//!
//! With instances sharing a database, each publish is also announced to
//! the others (`toolwire_store::cluster`), and events another instance
//! stored are read from the log and published here ([`EventBus::publish_remote`])
//! to the conversation's local subscribers, in order, none twice.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::sync::broadcast;
use toolwire_core::{AgentEvent, ConversationId, InstanceId, Message, RunId, StopReason};
use toolwire_store::cluster::Cluster;
use toolwire_store::{Store, StoreError, StoredEvent};

/// Sees every event of every conversation, in order, after it is stored.
/// Must not block.
pub trait Observer: Send + Sync {
    fn on_event(&self, conversation: ConversationId, event: &StoredEvent);

    /// Another instance on the same database stored `conversation`'s
    /// events up to `seq` (they reach [`Observer::on_event`] only while
    /// this instance has a follower of the conversation).
    fn on_remote(&self, conversation: ConversationId, seq: u64) {
        let _ = (conversation, seq);
    }
}

/// A conversation's live channel and the last seq sent on it (0: none
/// yet), so that events read from the log for another instance's turn
/// follow on without a gap or a repeat.
struct Channel {
    tx: broadcast::Sender<Arc<StoredEvent>>,
    published: u64,
}

type Channels = Mutex<HashMap<ConversationId, Channel>>;

pub(crate) struct EventBus {
    store: Arc<dyn Store>,
    capacity: usize,
    channels: Arc<Channels>,
    observers: Mutex<Vec<Arc<dyn Observer>>>,
    /// Told of every publish when other instances share the database.
    cluster: OnceLock<Arc<dyn Cluster>>,
}

impl EventBus {
    pub(crate) fn new(store: Arc<dyn Store>, capacity: usize) -> Self {
        EventBus {
            store,
            capacity: capacity.max(1),
            channels: Arc::new(Mutex::new(HashMap::new())),
            observers: Mutex::new(Vec::new()),
            cluster: OnceLock::new(),
        }
    }

    /// Announces every publish from now on to the other instances.
    pub(crate) fn set_cluster(&self, cluster: Arc<dyn Cluster>) {
        if cluster.shared() {
            let _ = self.cluster.set(cluster);
        }
    }

    /// Stores `event`, then publishes it.
    pub(crate) async fn emit(
        &self,
        conversation: ConversationId,
        event: AgentEvent,
    ) -> Result<(), StoreError> {
        self.emit_all(conversation, vec![event]).await
    }

    /// Stores `events` in one transaction, then publishes them in order.
    pub(crate) async fn emit_all(
        &self,
        conversation: ConversationId,
        events: Vec<AgentEvent>,
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let seqs = self.store.append_events(conversation, &events).await?;
        self.publish(conversation, seqs, events);
        Ok(())
    }

    /// Stores `message` and the `events` announcing it in one transaction,
    /// then publishes the events.
    pub(crate) async fn store_message(
        &self,
        message: &Message,
        events: Vec<AgentEvent>,
    ) -> Result<(), StoreError> {
        let seqs = self.store.append_with_events(message, &events).await?;
        self.publish(message.conversation_id, seqs, events);
        Ok(())
    }

    /// Begins run `run_id` (run by `owner`) with `message` and the
    /// `events` announcing it, and stores the front door's `documents` of
    /// the run, in one transaction; then publishes the events.
    pub(crate) async fn start_run_with_message(
        &self,
        run_id: RunId,
        owner: InstanceId,
        message: &Message,
        events: Vec<AgentEvent>,
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> Result<(), StoreError> {
        let seqs = self
            .store
            .start_run_with_message(run_id, owner, message, &events, documents)
            .await?;
        self.publish(message.conversation_id, seqs, events);
        Ok(())
    }

    /// Records how run `run_id` ended and stores `events` (its
    /// announcement) in one transaction, then publishes them.
    pub(crate) async fn finish_run(
        &self,
        conversation: ConversationId,
        run_id: RunId,
        reason: StopReason,
        error: Option<&str>,
        events: Vec<AgentEvent>,
    ) -> Result<(), StoreError> {
        let seqs = self
            .store
            .finish_run_with_events(run_id, reason, error, conversation, &events)
            .await?;
        self.publish(conversation, seqs, events);
        Ok(())
    }

    /// Stores run `run_id`'s final `message` with `events` (its
    /// announcements, then the run's end) and records how the run ended,
    /// in one transaction; then publishes the events in order (taken out
    /// of `events`, which keeps them when nothing was stored).
    pub(crate) async fn finish_run_with_message(
        &self,
        run_id: RunId,
        reason: StopReason,
        error: Option<&str>,
        message: &Message,
        events: &mut Vec<AgentEvent>,
    ) -> Result<(), StoreError> {
        let seqs = self
            .store
            .finish_run_with_message(run_id, reason, error, message, events)
            .await?;
        self.publish(message.conversation_id, seqs, std::mem::take(events));
        Ok(())
    }

    fn publish(&self, conversation: ConversationId, seqs: Vec<u64>, events: Vec<AgentEvent>) {
        let last = seqs.last().copied();
        let observers: Vec<Arc<dyn Observer>> =
            self.observers.lock().map(|o| o.clone()).unwrap_or_default();
        // Cloned so that the lock is not held while observers run.
        let tx = match self.channels.lock() {
            Ok(mut channels) => channels.get_mut(&conversation).map(|c| {
                c.published = c.published.max(last.unwrap_or(0));
                c.tx.clone()
            }),
            Err(_) => None,
        };
        for (seq, event) in seqs.into_iter().zip(events) {
            let stored = Arc::new(StoredEvent { seq, event });
            for o in &observers {
                o.on_event(conversation, &stored);
            }
            if let Some(tx) = &tx {
                // No receiver is not an error: nobody is watching.
                let _ = tx.send(stored);
            }
        }
        if let (Some(cluster), Some(last)) = (self.cluster.get(), last) {
            cluster.announce(conversation, last);
        }
    }

    /// Where the local channel of `conversation` stands (the last seq sent
    /// on it), or `None` when nobody here follows it.
    pub(crate) fn followed_from(&self, conversation: ConversationId) -> Option<u64> {
        let channels = self.channels.lock().ok()?;
        channels.get(&conversation).map(|c| c.published)
    }

    /// Sets where the remote events of a channel that never carried any
    /// start: just after `seq` (when it still stands at 0).
    pub(crate) fn start_remote_at(&self, conversation: ConversationId, seq: u64) {
        if let Ok(mut channels) = self.channels.lock()
            && let Some(c) = channels.get_mut(&conversation)
            && c.published == 0
        {
            c.published = seq;
        }
    }

    /// Publishes events another instance stored (read from the log, in
    /// order): those after the channel's last seq, to its subscribers and
    /// the observers. Not announced again.
    pub(crate) fn publish_remote(&self, conversation: ConversationId, events: Vec<StoredEvent>) {
        let observers: Vec<Arc<dyn Observer>> =
            self.observers.lock().map(|o| o.clone()).unwrap_or_default();
        let (tx, fresh) = {
            let Ok(mut channels) = self.channels.lock() else {
                return;
            };
            let Some(channel) = channels.get_mut(&conversation) else {
                return;
            };
            let from = channel.published;
            let fresh: Vec<StoredEvent> = events.into_iter().filter(|e| e.seq > from).collect();
            if let Some(last) = fresh.last() {
                channel.published = last.seq;
            }
            (channel.tx.clone(), fresh)
        };
        for event in fresh {
            let stored = Arc::new(event);
            for o in &observers {
                o.on_event(conversation, &stored);
            }
            let _ = tx.send(stored);
        }
    }

    /// Tells the observers that another instance stored `conversation`'s
    /// events up to `seq`.
    pub(crate) fn remote_seq(&self, conversation: ConversationId, seq: u64) {
        let observers: Vec<Arc<dyn Observer>> =
            self.observers.lock().map(|o| o.clone()).unwrap_or_default();
        for o in &observers {
            o.on_remote(conversation, seq);
        }
    }

    /// The conversations followed here.
    pub(crate) fn followed(&self) -> Vec<ConversationId> {
        self.channels
            .lock()
            .map(|c| c.keys().copied().collect())
            .unwrap_or_default()
    }

    pub(crate) fn subscribe(&self, conversation: ConversationId) -> Subscription {
        let rx = match self.channels.lock() {
            Ok(mut channels) => channels
                .entry(conversation)
                .or_insert_with(|| Channel {
                    tx: broadcast::channel(self.capacity).0,
                    published: 0,
                })
                .tx
                .subscribe(),
            // A poisoned lock only means another thread panicked while
            // holding it; a fresh channel still works.
            Err(_) => broadcast::channel(self.capacity).1,
        };
        Subscription {
            rx,
            conversation,
            channels: Arc::downgrade(&self.channels),
        }
    }

    pub(crate) fn observe(&self, observer: Arc<dyn Observer>) {
        if let Ok(mut o) = self.observers.lock() {
            o.push(observer);
        }
    }
}

/// A conversation's live events: a bounded broadcast receiver (use it as
/// one: `recv`, `try_recv`). When the last subscription of a conversation
/// is dropped its channel goes too, so an idle conversation costs nothing.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Arc<StoredEvent>>,
    conversation: ConversationId,
    channels: Weak<Channels>,
}

impl Deref for Subscription {
    type Target = broadcast::Receiver<Arc<StoredEvent>>;

    fn deref(&self) -> &Self::Target {
        &self.rx
    }
}

impl DerefMut for Subscription {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.rx
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(channels) = self.channels.upgrade() else {
            return;
        };
        let Ok(mut channels) = channels.lock() else {
            return;
        };
        // Under the lock no one can subscribe meanwhile. Our own receiver
        // still counts, so the channel is unused when only it is left. (A
        // channel is only removed here, so while this subscription lives
        // the map holds its channel.)
        if channels
            .get(&self.conversation)
            .is_some_and(|c| c.tx.receiver_count() <= 1)
        {
            channels.remove(&self.conversation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel_count(bus: &EventBus) -> usize {
        bus.channels.lock().map(|c| c.len()).unwrap_or(usize::MAX)
    }

    #[tokio::test]
    async fn a_channel_lives_as_long_as_its_subscriptions() {
        let store = toolwire_store::open("sqlite::memory:").await.unwrap();
        let bus = EventBus::new(store.clone(), 4);
        let conv = store.create_conversation("", None).await.unwrap();
        let a = bus.subscribe(conv.id);
        let mut b = bus.subscribe(conv.id);
        assert_eq!(channel_count(&bus), 1);
        drop(a);
        assert_eq!(channel_count(&bus), 1, "b still listens");
        let event = AgentEvent::Stopped {
            run_id: toolwire_core::RunId::new(),
            reason: toolwire_core::StopReason::EndTurn,
            error: None,
        };
        bus.emit(conv.id, event.clone()).await.unwrap();
        assert_eq!(b.recv().await.unwrap().event, event);
        drop(b);
        assert_eq!(channel_count(&bus), 0, "no subscriber, no channel");
        // Publishing with nobody listening stores the event all the same.
        bus.emit(conv.id, event).await.unwrap();
        assert_eq!(store.events_since(conv.id, 0, 10).await.unwrap().len(), 2);
    }
}
