//! What a tool call's last live update left the editor showing, where a
//! replay could not work it out from the stored messages again: an edit's
//! diff (read from the file before the edit ran) and the locations a tool
//! reported while it ran. Kept as store records (kind [`KIND`], one per
//! call), written after each prompt through the engine and read by
//! `session/load`, so a reloaded thread shows an edit as its diff, not as
//! "wrote 18 bytes".

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolwire_core::{
    ContentBlock, ConversationId, Location, Message, MessageId, Role, ToolCallContent, ToolCallId,
};
use toolwire_engine::Engine;

/// The kind of the records (id: `{assistant message id}/{call id}`: a
/// call id is unique only within its message).
const KIND: &str = "acp_call_view";

/// The views of a branch's calls, by their message and id.
pub(crate) type Views = HashMap<(MessageId, ToolCallId), CallView>;

/// A call's final view, as the editor was last sent it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct CallView {
    /// The content, when it showed a diff (otherwise the result replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ToolCallContent>>,
    /// The locations, when the tool moved them while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locations: Option<Vec<Location>>,
    /// The raw output, when the result went there (beside a diff the
    /// permission request showed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<Value>,
}

fn record_id(message: MessageId, call: &ToolCallId) -> String {
    format!("{message}/{}", call.0)
}

/// Stores the views of `conversation`'s calls (a failure is logged: the
/// replay then shows the result text, as before).
pub(crate) async fn save(
    engine: &Engine,
    conversation: ConversationId,
    views: Vec<(MessageId, ToolCallId, CallView)>,
) {
    if views.is_empty() {
        return;
    }
    let changes: Vec<(String, Option<Value>)> = views
        .iter()
        .filter_map(|(message, id, view)| {
            let body = serde_json::to_value(view).ok()?;
            Some((record_id(*message, id), Some(body)))
        })
        .collect();
    if let Err(e) = engine.write_records(KIND, &changes).await {
        tracing::warn!(%conversation, error = %e, "storing the tool calls' final views");
    }
}

/// The stored views of the calls on `branch`.
pub(crate) async fn load(engine: &Engine, branch: &[Message]) -> Views {
    let mut views = HashMap::new();
    let calls = branch
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| m.content.iter().map(move |block| (m.id, block)))
        .filter_map(|(message, block)| match block {
            ContentBlock::ToolUse { id, .. } => Some((message, id.clone())),
            _ => None,
        })
        // Collected: no borrow of the branch lives across the reads.
        .collect::<Vec<_>>();
    for (message, id) in calls {
        match engine
            .store()
            .document(KIND, &record_id(message, &id))
            .await
        {
            Ok(Some(doc)) => match serde_json::from_value(doc.body) {
                Ok(view) => {
                    views.insert((message, id.clone()), view);
                }
                Err(e) => tracing::warn!(call = %id.0, error = %e, "a stored call view"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(call = %id.0, error = %e, "reading a call's view"),
        }
    }
    views
}
