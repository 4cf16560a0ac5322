//! Persist, then publish: each event is appended to the store's log (which
//! gives it its sequence number), then sent to the conversation's
//! subscribers and observers. Subscribers hold a bounded broadcast
//! receiver: one that falls behind gets `Lagged` and resyncs from the
//! store's log; the turn never waits for it.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::broadcast;
use toolwire_core::{AgentEvent, ConversationId, Message};
use toolwire_store::{Store, StoreError, StoredEvent};

/// Sees every event of every conversation, in order, after it is stored.
/// Must not block.
pub trait Observer: Send + Sync {
    fn on_event(&self, conversation: ConversationId, event: &StoredEvent);
}

type Channels = Mutex<HashMap<ConversationId, broadcast::Sender<Arc<StoredEvent>>>>;

pub(crate) struct EventBus {
    store: Arc<dyn Store>,
    capacity: usize,
    channels: Arc<Channels>,
    observers: Mutex<Vec<Arc<dyn Observer>>>,
}

impl EventBus {
    pub(crate) fn new(store: Arc<dyn Store>, capacity: usize) -> Self {
        EventBus {
            store,
            capacity: capacity.max(1),
            channels: Arc::new(Mutex::new(HashMap::new())),
            observers: Mutex::new(Vec::new()),
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

    fn publish(&self, conversation: ConversationId, seqs: Vec<u64>, events: Vec<AgentEvent>) {
        let observers: Vec<Arc<dyn Observer>> =
            self.observers.lock().map(|o| o.clone()).unwrap_or_default();
        // Cloned so that the lock is not held while observers run.
        let tx = match self.channels.lock() {
            Ok(channels) => channels.get(&conversation).cloned(),
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
    }

    pub(crate) fn subscribe(&self, conversation: ConversationId) -> Subscription {
        let rx = match self.channels.lock() {
            Ok(mut channels) => channels
                .entry(conversation)
                .or_insert_with(|| broadcast::channel(self.capacity).0)
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
            .is_some_and(|tx| tx.receiver_count() <= 1)
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
