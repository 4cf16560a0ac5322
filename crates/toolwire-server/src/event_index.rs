//! Where each conversation's event log stands (its last sequence number)
//! and where its latest run began, kept up to date by observing the
//! engine's events, so that a socket's snapshot does not read the whole
//! log. A conversation with no event since start-up is read from the store
//! once.

use std::collections::HashMap;
use std::sync::Mutex;

use toolwire_core::{AgentEvent, ConversationId, RunId};
use toolwire_engine::{Engine, EngineError, Observer};
use toolwire_store::StoredEvent;

/// Events read per query when the log is scanned.
const PAGE: u32 = 10_000;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    last_seq: u64,
    /// The last event observed here: all before it were, when it follows
    /// the one before (another instance's events are observed only while
    /// this one follows the conversation, from wherever that began).
    seen: u64,
    /// The latest run and the seq of its first event (`None`: seen from
    /// a later one).
    run: Option<(RunId, Option<u64>)>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct EventIndex {
    conversations: Mutex<HashMap<ConversationId, Entry>>,
}

impl Observer for EventIndex {
    fn on_event(&self, conversation: ConversationId, event: &StoredEvent) {
        let Ok(mut map) = self.conversations.lock() else {
            return;
        };
        let entry = map.entry(conversation).or_default();
        entry.last_seq = entry.last_seq.max(event.seq);
        let run_id = event.event.run_id();
        if entry.run.is_none_or(|(run, _)| run != run_id) {
            // A run's first event only if nothing before it went unseen
            // (or it is the start of a turn); else the log tells, when
            // asked.
            let first = matches!(event.event, AgentEvent::TurnStarted { .. })
                || (entry.seen > 0 && event.seq == entry.seen + 1);
            entry.run = Some((run_id, first.then_some(event.seq)));
        }
        entry.seen = event.seq;
    }

    /// Another instance's events: the log stands further on. (Its runs
    /// are found in the log when asked for.)
    fn on_remote(&self, conversation: ConversationId, seq: u64) {
        let Ok(mut map) = self.conversations.lock() else {
            return;
        };
        if let Some(entry) = map.get_mut(&conversation) {
            entry.last_seq = entry.last_seq.max(seq);
        }
    }
}

impl EventIndex {
    fn get(&self, conversation: ConversationId) -> Option<Entry> {
        self.conversations
            .lock()
            .ok()
            .and_then(|map| map.get(&conversation).copied())
    }

    /// The conversation's last stored event (0: none). May lag the store
    /// by events not published yet; a follower from it reads those.
    pub async fn last_seq(
        &self,
        engine: &Engine,
        conversation: ConversationId,
    ) -> Result<u64, EngineError> {
        if let Some(entry) = self.get(conversation) {
            return Ok(entry.last_seq);
        }
        let mut last = 0;
        loop {
            let page = engine.events_since(conversation, last, PAGE).await?;
            match page.last() {
                Some(event) => last = event.seq,
                None => break,
            }
        }
        if let Ok(mut map) = self.conversations.lock() {
            let entry = map.entry(conversation).or_default();
            entry.last_seq = entry.last_seq.max(last);
            last = entry.last_seq;
        }
        Ok(last)
    }

    /// The seq of run `run_id`'s first event, if it has one.
    pub async fn run_start(
        &self,
        engine: &Engine,
        conversation: ConversationId,
        run_id: RunId,
    ) -> Result<Option<u64>, EngineError> {
        if let Some((run, Some(first))) = self.get(conversation).and_then(|e| e.run)
            && run == run_id
        {
            return Ok(Some(first));
        }
        // A run of before start-up (a paused turn's): the log tells.
        let mut after = 0;
        loop {
            let page = engine.events_since(conversation, after, PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(None);
            };
            after = last.seq;
            if let Some(first) = page.iter().find(|e| e.event.run_id() == run_id) {
                return Ok(Some(first.seq));
            }
        }
    }
}
