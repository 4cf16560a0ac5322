//! Changes to a conversation that are not turns: a fork from it, a new
//! active leaf, a new system prompt.
//!
//! **The rule, decided here once:** such a change is refused while a turn
//! runs in the conversation ([`EngineError::TurnInProgress`]; the live
//! view answers it with 409, as it always has), and no turn starts while
//! a change is being made (the start waits for the change's few store
//! writes). Both sides decide under the conversation's lock
//! ([`ConversationLocks`]), which a turn's start takes too, so there is no
//! check-then-write: a turn cannot begin between the look at what runs
//! and the write. Refused rather than waited for because a turn can last
//! minutes; a running turn writes on from the leaf and the root it began
//! with, and a fork never copies half of a step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;
use toolwire_core::{ContentBlock, Conversation, ConversationId, MessageId};

use crate::engine::{Engine, EngineError};

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

impl Engine {
    /// Holds `conversation` for a change: no turn starts until the guard
    /// drops; refused if one runs.
    async fn hold_idle(&self, conversation: ConversationId) -> Result<Held, EngineError> {
        let held = self.conversation_locks().hold(conversation).await;
        if self.is_running(conversation) {
            return Err(EngineError::TurnInProgress(conversation));
        }
        Ok(held)
    }

    /// A new conversation with `system` as its system prompt (the
    /// configured one: [`Engine::create_conversation`]).
    pub async fn create_conversation_with(
        &self,
        system: &str,
        title: Option<&str>,
    ) -> Result<Conversation, EngineError> {
        Ok(self.store().create_conversation(system, title).await?)
    }

    /// A new conversation holding the path to message `at` (its
    /// `forked_from`). Refused while a turn runs in `at`'s conversation.
    pub async fn fork(&self, at: MessageId) -> Result<Conversation, EngineError> {
        let conversation = self.store().message(at).await?.conversation_id;
        let _held = self.hold_idle(conversation).await?;
        Ok(self.store().fork(at).await?)
    }

    /// Makes `leaf` the branch the conversation's next turn goes on from.
    /// Refused while a turn runs there: it writes on from the leaf it has,
    /// and would hang its next message on a branch the user left.
    pub async fn set_active_leaf(
        &self,
        conversation: ConversationId,
        leaf: MessageId,
    ) -> Result<(), EngineError> {
        let _held = self.hold_idle(conversation).await?;
        Ok(self.store().set_active_leaf(conversation, leaf).await?)
    }

    /// Rewrites the conversation's root: the system prompt the model sees
    /// on every branch (none when `system` is empty). Refused while a turn
    /// runs there, so that no turn changes prompt between two steps.
    pub async fn set_system_prompt(
        &self,
        conversation: ConversationId,
        system: &str,
    ) -> Result<(), EngineError> {
        let _held = self.hold_idle(conversation).await?;
        let root_id = self.store().conversation(conversation).await?.root_id;
        let mut root = self.store().message(root_id).await?;
        root.content = if system.is_empty() {
            Vec::new()
        } else {
            vec![ContentBlock::Text {
                text: system.to_owned(),
            }]
        };
        Ok(self.store().update(&root).await?)
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
