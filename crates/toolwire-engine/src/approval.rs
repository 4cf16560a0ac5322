//! Paused turns in the store: one per conversation at most, kept as a
//! document so that it outlives the process.

use toolwire_core::{ConversationId, PendingApproval};
use toolwire_store::{Store, StoreError};

const KIND: &str = "pending_approval";

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
    let Some(doc) = store.document(KIND, &conversation.to_string()).await? else {
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
