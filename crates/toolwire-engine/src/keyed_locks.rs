//! Locks by key, made as they are asked for and forgotten once nobody
//! holds or waits for them. The engine holds a conversation's while a
//! turn starts and while a change is made to it (`edit.rs`), so neither
//! comes between the other's look and write; a front door may keep its
//! own (the server's per-agent locks).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

type Map<K> = Arc<Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>>;

/// One lock per key in use.
pub struct KeyedLocks<K> {
    locks: Map<K>,
}

impl<K> Default for KeyedLocks<K> {
    fn default() -> Self {
        KeyedLocks {
            locks: Arc::default(),
        }
    }
}

impl<K: Eq + Hash + Clone> KeyedLocks<K> {
    /// Holds `key` until the returned guard drops. A lock poisoned by a
    /// panic still serialises everyone who gets it from then on.
    pub async fn hold(&self, key: K) -> Held<K> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            locks.entry(key.clone()).or_default().clone()
        };
        Held {
            guard: Some(lock.lock_owned().await),
            key,
            locks: self.locks.clone(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().map(|l| l.len()).unwrap_or(0)
    }
}

/// A held lock of a [`KeyedLocks`].
pub struct Held<K: Eq + Hash> {
    guard: Option<OwnedMutexGuard<()>>,
    key: K,
    locks: Map<K>,
}

impl<K: Eq + Hash> Drop for Held<K> {
    fn drop(&mut self) {
        self.guard = None;
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        // Only the map's own reference left: nobody holds or waits for it.
        if locks
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwire_core::ConversationId;

    #[tokio::test]
    async fn a_lock_is_exclusive_and_forgotten_once_released() {
        let locks = KeyedLocks::default();
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
