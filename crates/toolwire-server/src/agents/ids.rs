//! Record ids, in Letta's style: a kind prefix and a UUID (`agent-…`, `tool-…`,
//! `message-…`), parsed back with an error that names what was wrong.

use toolwire_core::MessageId;
use uuid::Uuid;

use crate::error::ApiError;

/// A new id of `kind` (`agent`, `tool`).
pub fn new_id(kind: &str) -> String {
    format!("{kind}-{}", Uuid::now_v7())
}

/// A stable id for a tool that is not stored (built-in or MCP): the same
/// name gives the same id across restarts.
pub fn stable_tool_id(name: &str) -> String {
    format!(
        "tool-{}",
        Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("toolwire:{name}").as_bytes())
    )
}

pub fn message_id(id: MessageId) -> String {
    format!("message-{}", id.0)
}

/// Reads `message-<uuid>` (or a bare UUID).
pub fn parse_message_id(text: &str) -> Result<MessageId, ApiError> {
    let uuid = text.strip_prefix("message-").unwrap_or(text);
    Uuid::parse_str(uuid).map(MessageId).map_err(|_| {
        ApiError::bad_request(format!("`{text}` is not a message id (message-<uuid>)"))
    })
}

/// Checks that `text` is an id of `kind`, so that a hostile or mistyped
/// id is refused before it reaches the store.
pub fn check_id(kind: &str, text: &str) -> Result<(), ApiError> {
    let ok = text
        .strip_prefix(kind)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|uuid| Uuid::parse_str(uuid).is_ok());
    if ok {
        Ok(())
    } else {
        Err(ApiError::not_found(kind, text))
    }
}
