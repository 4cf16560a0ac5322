//! Following a conversation's events: live from the engine's broadcast,
//! and from the store's log when the receiver fell behind, each event once.

use anyhow::Result;
use tokio::sync::broadcast::error::RecvError;
use toolwire_core::ConversationId;
use toolwire_engine::{Engine, Subscription};
use toolwire_store::StoredEvent;

pub struct Follower {
    conversation: ConversationId,
    rx: Subscription,
    last_seq: u64,
}

impl Follower {
    /// Follows `conversation` from now on.
    pub fn new(engine: &Engine, conversation: ConversationId) -> Self {
        Follower {
            conversation,
            rx: engine.subscribe(conversation),
            last_seq: 0,
        }
    }

    pub fn conversation(&self) -> ConversationId {
        self.conversation
    }

    /// The next events, in order; `None` when the engine is gone.
    pub async fn next(&mut self, engine: &Engine) -> Result<Option<Vec<StoredEvent>>> {
        loop {
            match self.rx.recv().await {
                Ok(event) if event.seq > self.last_seq => {
                    self.last_seq = event.seq;
                    return Ok(Some(vec![(*event).clone()]));
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => {
                    let missed = engine
                        .events_since(self.conversation, self.last_seq, u32::MAX)
                        .await?;
                    if let Some(last) = missed.last() {
                        self.last_seq = last.seq;
                    }
                    return Ok(Some(missed));
                }
                Err(RecvError::Closed) => return Ok(None),
            }
        }
    }
}
