//! Notifications outlive their process: what waits for each conversation
//! (the queue, and the batches taken but not yet stored on a message) is
//! kept in the store, one document per engine instance and conversation,
//! rewritten as it changes by a task of the engine ([`Keeper`]). An engine
//! starting up takes over the documents of instances that are gone (the
//! same judgement as for their unfinished runs): their notifications wait
//! in its queues, first in line, for the next tool result or turn.
//!
//! A crash loses what changed since the keeper's last round of writes
//! (the next round starts 50 ms after one ends, or four times the round's
//! length if that is longer); a process that stops writes everything
//! first (`Engine::keep_notifications`). Taking over
//! writes the new owner's document before deleting the old one, so a crash
//! there, or two engines starting at once, may deliver a notification
//! twice, never lose it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use toolwire_core::{Batch, ConversationId, InstanceId, Notice, NotifyConfig};
use toolwire_store::{InstanceRecord, Store, StoreError};

use super::Hub;
use crate::instance;

const KIND: &str = "pending_notifications";

/// After a failed write, the keeper waits this long before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Between two rounds of writes at least this long, so that a storm of
/// events becomes one write per conversation per round, not one per
/// event…
const PACE: Duration = Duration::from_millis(50);

/// …and at least this many times as long as the round took, so that
/// keeping large queues (many idle conversations told of every file
/// change) takes at most a fifth of the store's time.
const PACE_FACTOR: u32 = 4;

/// One conversation's pending notifications, as one engine holds them.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    instance: InstanceId,
    conversation: ConversationId,
    notices: Vec<Notice>,
    #[serde(default)]
    dropped: Vec<(String, u64)>,
}

fn document_id(instance: InstanceId, conversation: ConversationId) -> String {
    format!("{instance}/{conversation}")
}

/// Writes what changed in `hub` since the last write, as instance `me`'s,
/// in one transaction. What could not be written is marked changed again.
pub(crate) async fn flush(store: &dyn Store, hub: &Hub, me: InstanceId) -> Result<(), StoreError> {
    let _one_writer = hub.keeping.lock().await;
    let changed = hub.take_changed();
    if changed.is_empty() {
        return Ok(());
    }
    // Read now, under the lock: a change after this is marked again.
    let documents: Result<Vec<_>, serde_json::Error> = changed
        .iter()
        .map(|&conversation| {
            let body = hub
                .snapshot(conversation)
                .map(|batch| {
                    serde_json::to_value(Kept {
                        instance: me,
                        conversation,
                        notices: batch.notices,
                        dropped: batch.dropped,
                    })
                })
                .transpose()?;
            Ok((document_id(me, conversation), body))
        })
        .collect();
    let written = match documents {
        Ok(documents) => store.write_documents(KIND, &documents).await,
        Err(e) => Err(StoreError::Corrupt(format!(
            "pending notifications cannot be stored: {e}"
        ))),
    };
    if written.is_err() {
        for conversation in changed {
            hub.changed(conversation);
        }
    }
    written
}

/// Takes over the pending notifications kept by instances that are gone:
/// they wait in `hub`, kept as `me`'s before the old documents go.
/// Returns how many conversations had some.
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
        let conversation = kept.conversation;
        let batch = Batch {
            notices: kept.notices,
            more_pending: 0,
            dropped: kept.dropped,
        };
        hub.restore(config, conversation, batch);
        taken.push((id, conversation));
    }
    adopt(store, hub, me, KIND, &taken, "pending notifications").await
}

/// Ends a take-over once what gone instances kept (`taken`: documents of
/// `kind` and their conversations) waits in `hub`: it is kept as `me`'s,
/// then their documents go, so that a crash in between delivers twice,
/// never loses. `what` names them in the logs. Returns how many
/// conversations had some.
pub(crate) async fn adopt(
    store: &dyn Store,
    hub: &Hub,
    me: &InstanceRecord,
    kind: &str,
    taken: &[(String, ConversationId)],
    what: &str,
) -> Result<usize, StoreError> {
    if taken.is_empty() {
        return Ok(0);
    }
    flush(store, hub, me.id).await?;
    for (id, conversation) in taken {
        if !store.delete_document(kind, id).await? {
            tracing::warn!(%conversation, "another engine took over the same {what}: they may come twice");
        }
    }
    tracing::info!(
        conversations = taken.len(),
        "took over the {what} of an engine that is gone"
    );
    Ok(taken.len())
}

/// The task that keeps the engine's pending notifications in the store
/// as they change; stopped when dropped (with the engine).
#[derive(Debug)]
pub(crate) struct Keeper {
    task: JoinHandle<()>,
}

impl Keeper {
    /// Starts keeping what waits in `hub` in `store`, as instance `me`'s.
    /// Weak: the task never keeps a dropped engine's hub alive.
    pub(crate) fn start(store: Arc<dyn Store>, hub: &Arc<Hub>, me: InstanceId) -> Keeper {
        let (signal, hub) = (hub.signal.clone(), Arc::downgrade(hub));
        let task = tokio::spawn(async move {
            loop {
                signal.notified().await;
                let Some(hub) = Weak::upgrade(&hub) else {
                    return;
                };
                let started = tokio::time::Instant::now();
                let written = flush(store.as_ref(), &hub, me).await;
                drop(hub);
                let pause = match written {
                    Ok(()) => PACE.max(started.elapsed() * PACE_FACTOR),
                    Err(e) => {
                        tracing::warn!(error = %e, "pending notifications could not be kept in the store; trying again");
                        RETRY_AFTER
                    }
                };
                tokio::time::sleep(pause).await;
            }
        });
        Keeper { task }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}
