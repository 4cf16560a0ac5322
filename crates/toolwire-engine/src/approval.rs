//! Paused turns in the store: one per conversation at most, kept as a
//! document so that it outlives the process; and, once answered, the
//! answers (one document per paused message), for the history.

use toolwire_core::{ConversationId, Decision, PendingApproval, ResolvedApproval, ToolCallId};
use toolwire_store::{Document, Store, StoreError};

pub(crate) const KIND: &str = "pending_approval";

pub(crate) async fn save(store: &dyn Store, pending: &PendingApproval) -> Result<(), StoreError> {
    let body = serde_json::to_value(pending)
        .map_err(|e| StoreError::Corrupt(format!("a pending approval cannot be stored: {e}")))?;
    store
        .put_document(KIND, &pending.conversation_id.to_string(), &body)
        .await
}

pub(crate) async fn load(
    store: &dyn Store,
    conversation: ConversationId,
) -> Result<Option<PendingApproval>, StoreError> {
    let doc = store.document(KIND, &conversation.to_string()).await?;
    read(conversation, doc)
}

/// The paused turn `doc` holds (the document of kind [`KIND`] named by
/// `conversation`), if there is one.
pub(crate) fn read(
    conversation: ConversationId,
    doc: Option<Document>,
) -> Result<Option<PendingApproval>, StoreError> {
    let Some(doc) = doc else {
        return Ok(None);
    };
    serde_json::from_value(doc.body).map(Some).map_err(|e| {
        StoreError::Corrupt(format!(
            "the pending approval of conversation {conversation}: {e}"
        ))
    })
}

/// Removes the pause; says whether it was still there (so that only one
/// of two racing answers goes on with it).
pub(crate) async fn take(
    store: &dyn Store,
    conversation: ConversationId,
) -> Result<bool, StoreError> {
    store.delete_document(KIND, &conversation.to_string()).await
}

/// The kind of a conversation's answered pauses (so that one conversation's
/// are listed without reading the others').
fn resolved_kind(conversation: ConversationId) -> String {
    format!("approval_resolved:{conversation}")
}

/// Keeps how `pending` was answered.
pub(crate) async fn record(
    store: &dyn Store,
    pending: PendingApproval,
    decisions: Vec<(ToolCallId, Decision)>,
) -> Result<(), StoreError> {
    let resolved = ResolvedApproval {
        pending,
        decisions,
        resolved_at: chrono::Utc::now(),
    };
    let body = serde_json::to_value(&resolved)
        .map_err(|e| StoreError::Corrupt(format!("an approval cannot be stored: {e}")))?;
    store
        .put_document(
            &resolved_kind(resolved.pending.conversation_id),
            &resolved.pending.message_id.to_string(),
            &body,
        )
        .await
}

/// The conversation's answered pauses, oldest first.
pub(crate) async fn resolved(
    store: &dyn Store,
    conversation: ConversationId,
) -> Result<Vec<ResolvedApproval>, StoreError> {
    store
        .documents(&resolved_kind(conversation))
        .await?
        .into_iter()
        .map(|doc| {
            serde_json::from_value(doc.body).map_err(|e| {
                StoreError::Corrupt(format!(
                    "an answered approval of conversation {conversation}: {e}"
                ))
            })
        })
        .collect()
}
