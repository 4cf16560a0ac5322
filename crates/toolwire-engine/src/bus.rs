//! Persist, then publish: each event is appended to the store's log (which
//! gives it its sequence number), then sent to the conversation's
//! subscribers and observers. Subscribers hold a bounded broadcast
//! receiver: one that falls behind gets `Lagged` and resyncs from the
//! store's log; the turn never waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use toolwire_core::{AgentEvent, ConversationId, Message};
use toolwire_store::{Store, StoreError, StoredEvent};

/// Sees every event of every conversation, in order, after it is stored.
/// Must not block.
pub trait Observer: Send + Sync {
    fn on_event(&self, conversation: ConversationId, event: &StoredEvent);
}

pub(crate) struct EventBus {
    store: Arc<dyn Store>,
    capacity: usize,
    channels: Mutex<HashMap<ConversationId, broadcast::Sender<Arc<StoredEvent>>>>,
    observers: Mutex<Vec<Arc<dyn Observer>>>,
}

impl EventBus {
    pub(crate) fn new(store: Arc<dyn Store>, capacity: usize) -> Self {
        EventBus {
            store,
            capacity: capacity.max(1),
            channels: Mutex::new(HashMap::new()),
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
        let Ok(mut channels) = self.channels.lock() else {
            return;
        };
        let tx = channels.get(&conversation).cloned();
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
        // A channel nobody listens to any more is dropped; subscribing again
        // makes a new one.
        if tx.is_some_and(|tx| tx.receiver_count() == 0) {
            channels.remove(&conversation);
        }
    }

    pub(crate) fn subscribe(
        &self,
        conversation: ConversationId,
    ) -> broadcast::Receiver<Arc<StoredEvent>> {
        match self.channels.lock() {
            Ok(mut channels) => channels
                .entry(conversation)
                .or_insert_with(|| broadcast::channel(self.capacity).0)
                .subscribe(),
            // A poisoned lock only means another thread panicked while
            // holding it; a fresh channel still works.
            Err(_) => broadcast::channel(self.capacity).1,
        }
    }

    pub(crate) fn observe(&self, observer: Arc<dyn Observer>) {
        if let Ok(mut o) = self.observers.lock() {
            o.push(observer);
        }
    }
}
