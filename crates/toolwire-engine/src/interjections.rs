//! Interjections outlive their process: the words queued for a running
//! turn and not yet stored on a message are kept in the store, one
//! document per engine instance and conversation, written before
//! `Engine::interject` answers and written again once the turn has stored
//! them (removed when none wait). An engine that takes over a gone
//! instance's runs takes its waiting words too: they wait as the user's
//! notification for the conversation's next tool result or turn, as words
//! that reach a paused turn do.
//!
//! A crash between storing words on a message and writing the document
//! again may deliver them twice, never lose them. Turns nobody interjects
//! into never write here.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolwire_core::notification::USER_SOURCE;
use toolwire_core::{ConversationId, Incoming, InstanceId, NotifyConfig, Priority};
use toolwire_store::{InstanceRecord, Store, StoreError};

use crate::instance;
use crate::notify::{Hub, keep};

const KIND: &str = "pending_interjections";

/// The words one engine holds for one conversation's running turn.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    instance: InstanceId,
    conversation: ConversationId,
    words: Vec<String>,
}

/// Keeps an engine's queued interjections in the store.
pub(crate) struct Interjections {
    store: Arc<dyn Store>,
    me: InstanceId,
    /// One write at a time, each of the state it read under this lock:
    /// the last write is of the newest state.
    writing: tokio::sync::Mutex<()>,
}

impl Interjections {
    pub(crate) fn new(store: Arc<dyn Store>, me: InstanceId) -> Interjections {
        Interjections {
            store,
            me,
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// Writes the words `waiting` reads (under the one-writer lock, so
    /// the last write is of the newest state) as `conversation`'s; none:
    /// the document goes.
    pub(crate) async fn keep(
        &self,
        conversation: ConversationId,
        waiting: impl FnOnce() -> Vec<String>,
    ) -> Result<(), StoreError> {
        let _one_writer = self.writing.lock().await;
        let words = waiting();
        let body =
            if words.is_empty() {
                None
            } else {
                let kept = Kept {
                    instance: self.me,
                    conversation,
                    words,
                };
                Some(serde_json::to_value(kept).map_err(|e| {
                    StoreError::Corrupt(format!("interjections cannot be stored: {e}"))
                })?)
            };
        let id = format!("{}/{conversation}", self.me);
        self.store.write_documents(KIND, &[(id, body)]).await
    }

    /// [`Interjections::keep`], a failure logged: the words still wait in
    /// memory for the turn.
    pub(crate) async fn keep_or_warn(
        &self,
        conversation: ConversationId,
        waiting: impl FnOnce() -> Vec<String>,
    ) {
        if let Err(e) = self.keep(conversation, waiting).await {
            tracing::warn!(%conversation, error = %e, "queued interjections could not be kept in the store");
        }
    }
}

/// Takes over the words that instances now gone kept: each conversation's
/// wait in `hub` as the user's notification (kept as `me`'s before the old
/// documents go). Returns how many conversations had some.
pub(crate) async fn take_over(
    store: &dyn Store,
    hub: &Hub,
    config: &NotifyConfig,
    me: &InstanceRecord,
    stale_after: Duration,
) -> Result<usize, StoreError> {
    let mut taken = Vec::new();
    let gone = instance::kept_by_gone(store, KIND, me, stale_after, |k: &Kept| k.instance).await?;
    for (id, kept) in gone {
        let text = kept.words.join("\n\n");
        hub.push(
            config,
            kept.conversation,
            Incoming::text(USER_SOURCE, Priority::High, text),
        );
        taken.push((id, kept.conversation));
    }
    keep::adopt(store, hub, me, KIND, &taken, "interjections").await
}
