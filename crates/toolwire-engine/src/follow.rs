//! Following a conversation's events: live from the bus, and from the
//! store's log when the subscription fell behind, each event once and in
//! order. Every front door reads events through a [`Follower`].

use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use toolwire_core::ConversationId;
use toolwire_store::StoredEvent;

use crate::bus::Subscription;
use crate::error::EngineError;

/// Stored events one [`Follower::next`] reads at most: a resume from far
/// back (or a long lag) is read a page at a time, not all at once.
pub(crate) const PAGE: u32 = 1_000;

/// Where a follower reads the events it missed (the engine, which a
/// follower keeps alive).
#[async_trait::async_trait]
pub(crate) trait EventLog: Send + Sync + std::fmt::Debug {
    /// At most `limit` of `conversation`'s stored events after `seq`.
    async fn events_since(
        &self,
        conversation: ConversationId,
        seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, EngineError>;
}

/// A conversation's events from some point on.
#[derive(Debug)]
pub struct Follower {
    log: Arc<dyn EventLog>,
    conversation: ConversationId,
    rx: Subscription,
    /// The last event handed out; stored events up to it are skipped.
    last_seq: u64,
    /// Whether `last_seq` says where the follow starts. A follow "from now
    /// on" does not know until its first event, or its first lag (see
    /// [`Follower::anchor`]); until then nothing is skipped.
    anchored: bool,
    /// Stored events to hand out before live ones (a resumed follow, a
    /// lag, or a backlog longer than a page).
    backlog: bool,
}

impl Follower {
    /// Follows `conversation` from now on: `rx` is its subscription.
    pub(crate) fn new(
        log: Arc<dyn EventLog>,
        conversation: ConversationId,
        rx: Subscription,
    ) -> Self {
        Follower {
            log,
            conversation,
            rx,
            last_seq: 0,
            anchored: false,
            backlog: false,
        }
    }

    /// Follows `conversation` from just after event `seq`: what was stored
    /// since comes first, then live events, none twice.
    pub(crate) fn after(
        log: Arc<dyn EventLog>,
        conversation: ConversationId,
        rx: Subscription,
        seq: u64,
    ) -> Self {
        Follower {
            last_seq: seq,
            anchored: true,
            backlog: true,
            ..Follower::new(log, conversation, rx)
        }
    }

    pub fn conversation(&self) -> ConversationId {
        self.conversation
    }

    /// The sequence number of the last event handed out.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The next events, in order (at most [`PAGE`] at once); `None` when
    /// the engine is gone.
    pub async fn next(&mut self) -> Result<Option<Vec<StoredEvent>>, EngineError> {
        loop {
            if self.backlog {
                // Subscribed first, then read: an event stored in between
                // is in both, and the live copy is skipped by its seq. The
                // flag is cleared only once the last page is read: should
                // the store fail, the next call reads again rather than
                // skip the gap.
                let missed = self.read_missed().await?;
                if missed.len() < PAGE as usize {
                    self.backlog = false;
                }
                if !missed.is_empty() {
                    return Ok(Some(missed));
                }
            }
            match self.rx.recv().await {
                // A gap: events another instance stored reached this one's
                // bus from a later point than this follow stands at (see
                // `bus.rs`). The log has them all.
                Ok(event) if self.anchored && event.seq > self.last_seq.saturating_add(1) => {
                    self.backlog = true;
                }
                Ok(event) if event.seq > self.last_seq => {
                    self.last_seq = event.seq;
                    self.anchored = true;
                    return Ok(Some(vec![(*event).clone()]));
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(lost)) => {
                    if !self.anchored && !self.anchor(lost).await {
                        return Ok(None);
                    }
                    self.backlog = true;
                }
                Err(RecvError::Closed) => return Ok(None),
            }
        }
    }

    /// Works out where a follow "from now on" started when it lagged
    /// before its first event, so that the store's log is read from there
    /// rather than from the conversation's start. After a lag the
    /// subscription resumes at the oldest event the bus still holds, `S`;
    /// the `lost` ones before it are the first this follow would have
    /// had. A conversation's events are numbered without gaps and
    /// published in order, so they are `S - lost ..= S - 1`, and the
    /// follow starts after `S - lost - 1`. `S` itself is read again from
    /// the store with the rest. `false` when the engine is gone.
    async fn anchor(&mut self, mut lost: u64) -> bool {
        loop {
            match self.rx.recv().await {
                Ok(first_kept) => {
                    self.last_seq = first_kept.seq.saturating_sub(lost.saturating_add(1));
                    self.anchored = true;
                    return true;
                }
                Err(RecvError::Lagged(more)) => lost = lost.saturating_add(more),
                // Not after a lag in practice: the bus still holds events.
                Err(RecvError::Closed) => return false,
            }
        }
    }

    /// The next page of stored events after the last one handed out.
    async fn read_missed(&mut self) -> Result<Vec<StoredEvent>, EngineError> {
        let missed = self
            .log
            .events_since(self.conversation, self.last_seq, PAGE)
            .await?;
        if let Some(last) = missed.last() {
            self.last_seq = last.seq;
            self.anchored = true;
        }
        Ok(missed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use toolwire_core::{AgentEvent, RunId};

    use super::*;
    use crate::{Engine, EngineConfig};
    use toolwire_providers::{Script, ScriptedProvider};
    use toolwire_tools::ToolRegistry;

    async fn engine(event_capacity: usize) -> (Engine, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("test.db").display());
        let store = toolwire_store::open(&url).await.unwrap();
        let script = Script::parse("steps:\n  - text: \"hello there, this is a reply\"\n").unwrap();
        let provider = Arc::new(ScriptedProvider::new(script, false));
        let config = EngineConfig {
            event_capacity,
            ..EngineConfig::default()
        };
        let engine = Engine::start(store, provider, ToolRegistry::default(), config)
            .await
            .unwrap();
        (engine, dir)
    }

    async fn stored_seqs(engine: &Engine, conversation: ConversationId) -> Vec<u64> {
        let events = engine
            .events_since(conversation, 0, u32::MAX)
            .await
            .unwrap();
        events.iter().map(|e| e.seq).collect()
    }

    /// Calls `next` until `until` was handed out; each batch's size too.
    async fn drain(follower: &mut Follower, until: u64) -> (Vec<u64>, Vec<usize>) {
        let (mut seqs, mut batches) = (Vec::new(), Vec::new());
        while follower.last_seq() < until {
            let batch = tokio::time::timeout(std::time::Duration::from_secs(10), follower.next())
                .await
                .expect("the next events")
                .unwrap()
                .expect("the engine runs");
            batches.push(batch.len());
            seqs.extend(batch.iter().map(|e| e.seq));
        }
        (seqs, batches)
    }

    #[tokio::test]
    async fn a_resume_reads_a_long_backlog_a_page_at_a_time() {
        let (engine, _dir) = engine(16).await;
        let conversation = engine.create_conversation(None).await.unwrap().id;
        let run_id = RunId::new();
        let events: Vec<AgentEvent> = (0..2_500)
            .map(|i| AgentEvent::TextDelta {
                run_id,
                text: i.to_string(),
            })
            .collect();
        engine
            .writer()
            .append_events(conversation, &events)
            .await
            .unwrap();
        let all = stored_seqs(&engine, conversation).await;
        let last = *all.last().unwrap();

        let mut follower = engine.follow_after(conversation, 0);
        let (seqs, batches) = drain(&mut follower, last).await;
        assert_eq!(seqs, all, "each once, in order");
        assert!(batches.iter().all(|&n| n <= PAGE as usize), "{batches:?}");
        assert_eq!(batches[..2], [PAGE as usize; 2]);
    }

    #[tokio::test]
    async fn a_follow_that_lags_before_its_first_event_reads_from_where_it_started() {
        // A bus of 2: every turn overflows it.
        let (engine, _dir) = engine(2).await;
        let conversation = engine.create_conversation(None).await.unwrap().id;
        engine.run(conversation, "before").await.unwrap();
        let before = stored_seqs(&engine, conversation).await;
        assert!(!before.is_empty());

        let mut follower = engine.follow(conversation);
        for _ in 0..3 {
            engine.run(conversation, "after").await.unwrap();
        }
        let all = stored_seqs(&engine, conversation).await;
        let since: Vec<u64> = all[before.len()..].to_vec();
        assert!(since.len() > 2, "the follower lagged: {since:?}");

        let (seqs, _) = drain(&mut follower, *all.last().unwrap()).await;
        assert_eq!(seqs, since, "nothing from before the follow, nothing twice");
    }
}
