//! The per-conversation lock that a turn's start and a change to the
//! conversation (`edit.rs`) both take, so that neither comes between the
//! other's look and write. A tokio mutex per conversation in use; an
//! entry goes once nobody holds or waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;
use toolwire_core::ConversationId;

/// One lock per conversation with a change or a turn start under way;
/// entries go once nobody holds or waits for them.
#[derive(Default)]
pub(crate) struct ConversationLocks {
    locks: Arc<Mutex<HashMap<ConversationId, Arc<tokio::sync::Mutex<()>>>>>,
}

impl ConversationLocks {
    /// Holds `conversation` until the returned guard drops.
    pub(crate) async fn hold(&self, conversation: ConversationId) -> Held {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(conversation).or_default().clone()
        };
        Held {
            guard: Some(lock.lock_owned().await),
            conversation,
            locks: self.locks.clone(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().map(|l| l.len()).unwrap_or(0)
    }
}

/// A held conversation lock.
pub(crate) struct Held {
    guard: Option<OwnedMutexGuard<()>>,
    conversation: ConversationId,
    locks: Arc<Mutex<HashMap<ConversationId, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.guard = None;
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map's own reference left: nobody holds or waits for it.
        if locks
            .get(&self.conversation)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.conversation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lock_is_exclusive_and_forgotten_once_released() {
        let locks = ConversationLocks::default();
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let held = locks.hold(a).await;
        // Another conversation is not held up.
        let other = locks.hold(b).await;
        assert_eq!(locks.len(), 2);
        assert!(
            futures::FutureExt::now_or_never(locks.hold(a)).is_none(),
            "a second holder waits"
        );
        drop(held);
        drop(other);
        assert_eq!(locks.len(), 0, "no entry outlives its holders");
        let again = locks.hold(a).await;
        assert_eq!(locks.len(), 1);
        drop(again);
    }
}
