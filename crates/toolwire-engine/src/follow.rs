//! Following a conversation's events: live from the bus, and from the
//! store's log when the subscription fell behind, each event once and in
//! order. Every front door reads events through a [`Follower`].

use tokio::sync::broadcast::error::RecvError;
use toolwire_core::ConversationId;
use toolwire_store::StoredEvent;

use crate::bus::Subscription;
use crate::engine::{Engine, EngineError};

/// A conversation's events from some point on.
#[derive(Debug)]
pub struct Follower {
    engine: Engine,
    conversation: ConversationId,
    rx: Subscription,
    /// The last event handed out; stored events up to it are skipped.
    last_seq: u64,
    /// Stored events to hand out before live ones (a resumed follow).
    backlog: bool,
}

impl Follower {
    /// Follows `conversation` from now on.
    pub(crate) fn new(engine: &Engine, conversation: ConversationId) -> Self {
        Follower {
            engine: engine.clone(),
            conversation,
            rx: engine.subscribe(conversation),
            last_seq: 0,
            backlog: false,
        }
    }

    /// Follows `conversation` from just after event `seq`: what was stored
    /// since comes first, then live events, none twice.
    pub(crate) fn after(engine: &Engine, conversation: ConversationId, seq: u64) -> Self {
        Follower {
            last_seq: seq,
            backlog: true,
            ..Follower::new(engine, conversation)
        }
    }

    pub fn conversation(&self) -> ConversationId {
        self.conversation
    }

    /// The sequence number of the last event handed out.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The next events, in order; `None` when the engine is gone.
    pub async fn next(&mut self) -> Result<Option<Vec<StoredEvent>>, EngineError> {
        loop {
            if self.backlog {
                // Subscribed first, then read: an event stored in between
                // is in both, and the live copy is skipped by its seq. The
                // flag is cleared only once read: should the store fail,
                // the next call reads again rather than skip the gap.
                let missed = self.read_missed().await?;
                self.backlog = false;
                if !missed.is_empty() {
                    return Ok(Some(missed));
                }
            }
            match self.rx.recv().await {
                Ok(event) if event.seq > self.last_seq => {
                    self.last_seq = event.seq;
                    return Ok(Some(vec![(*event).clone()]));
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => self.backlog = true,
                Err(RecvError::Closed) => return Ok(None),
            }
        }
    }

    async fn read_missed(&mut self) -> Result<Vec<StoredEvent>, EngineError> {
        let missed = self
            .engine
            .events_since(self.conversation, self.last_seq, u32::MAX)
            .await?;
        if let Some(last) = missed.last() {
            self.last_seq = last.seq;
        }
        Ok(missed)
    }
}
