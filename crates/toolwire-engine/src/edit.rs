//! Changes to a conversation that are not turns: a fork from it, a new
//! active leaf, a new system prompt.
//!
//! **The rule, decided here once:** such a change is refused while a turn
//! runs in the conversation ([`EngineError::TurnInProgress`]; the live
//! view answers it with 409, as it always has), and no turn starts while
//! a change is being made (the start waits for the change's few store
//! writes). Both sides decide under the conversation's lock
//! (`keyed_locks.rs`), which a turn's start takes too, so there is no
//! check-then-write: a turn cannot begin between the look at what runs
//! and the write. Refused rather than waited for because a turn can last
//! minutes; a running turn writes on from the leaf and the root it began
//! with, and a fork never copies half of a step.

use toolwire_core::{ContentBlock, Conversation, ConversationId, MessageId};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::keyed_locks::Held;

impl Engine {
    /// Holds `conversation` for a change: no turn starts until the guard
    /// drops; refused if one runs.
    async fn hold_idle(
        &self,
        conversation: ConversationId,
    ) -> Result<Held<ConversationId>, EngineError> {
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
        Ok(self.writer().create_conversation(system, title).await?)
    }

    /// A new conversation holding the path to message `at` (its
    /// `forked_from`). Refused while a turn runs in `at`'s conversation.
    pub async fn fork(&self, at: MessageId) -> Result<Conversation, EngineError> {
        let conversation = self.store().message(at).await?.conversation_id;
        let _held = self.hold_idle(conversation).await?;
        Ok(self.writer().fork(at).await?)
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
        Ok(self.writer().set_active_leaf(conversation, leaf).await?)
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
        let updated = self.writer().update(&root).await;
        // Bumps the conversation's revision, which the next turn reads;
        // forgotten here too, as a turn may have read it just before.
        self.kept_paths().forget(conversation);
        Ok(updated?)
    }
}
