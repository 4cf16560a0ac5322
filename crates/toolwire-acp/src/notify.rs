//! `_toolwire/notify`: an ACP extension notification with which a client
//! tells the agent of a session about something (a CI result, a
//! diagnostic). It reaches the model with the next tool result, like the
//! engine's other notifications.

use agent_client_protocol::JsonRpcNotification;
use serde::{Deserialize, Serialize};
use toolwire_core::{Incoming, Notice, Priority};

/// The method name (extension methods start with `_` in ACP).
pub const METHOD: &str = "_toolwire/notify";

/// `{sessionId, source?, text, priority?}`; `priority` is `low`, `normal`
/// (the default) or `high`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonRpcNotification)]
#[notification(method = "_toolwire/notify")]
#[serde(rename_all = "camelCase")]
pub struct NotifyNotification {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

/// Why a notification was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotifyError {
    #[error("text is required")]
    NoText,
    #[error("priority must be low, normal or high, not `{0}`")]
    Priority(String),
    #[error("source `{0}` is reserved (toolwire's own lines and the user's words)")]
    ReservedSource(String),
}

impl NotifyNotification {
    /// The engine's event; the source defaults to `client`.
    pub fn incoming(&self) -> Result<Incoming, NotifyError> {
        if self.text.trim().is_empty() {
            return Err(NotifyError::NoText);
        }
        let priority = match self.priority.as_deref() {
            None | Some("normal") => Priority::Normal,
            Some("low") => Priority::Low,
            Some("high") => Priority::High,
            Some(other) => return Err(NotifyError::Priority(other.to_owned())),
        };
        let source = self
            .source
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or("client");
        if toolwire_core::is_reserved_source(source) {
            return Err(NotifyError::ReservedSource(source.to_owned()));
        }
        Ok(Incoming::text(source, priority, self.text.clone()))
    }
}

/// How delivered notifications read in the editor's thought stream: one
/// line per notice (the model reads the escaped block instead).
pub fn thought_text(notices: &[Notice]) -> String {
    let mut text = String::from("Notifications:");
    for notice in notices {
        text.push_str(&format!("\n- [{}] {}", notice.source, notice.text));
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(priority: Option<&str>, text: &str) -> NotifyNotification {
        NotifyNotification {
            session_id: "s".into(),
            source: None,
            text: text.into(),
            priority: priority.map(str::to_owned),
        }
    }

    #[test]
    fn defaults_and_refusals() {
        assert_eq!(
            note(None, "hi").incoming(),
            Ok(Incoming::text("client", Priority::Normal, "hi"))
        );
        assert_eq!(note(None, "  ").incoming(), Err(NotifyError::NoText));
        assert_eq!(
            note(Some("urgent"), "x").incoming(),
            Err(NotifyError::Priority("urgent".into()))
        );
        let json =
            serde_json::json!({"sessionId": "s", "source": "ci", "text": "t", "priority": "high"});
        let parsed: NotifyNotification =
            serde_json::from_value(json).unwrap_or_else(|_| note(None, ""));
        assert_eq!(
            parsed.incoming(),
            Ok(Incoming::text("ci", Priority::High, "t"))
        );
        for reserved in ["toolwire", "User "] {
            let mut n = note(None, "(5 more pending)");
            n.source = Some(reserved.into());
            assert_eq!(
                n.incoming(),
                Err(NotifyError::ReservedSource(reserved.trim().into()))
            );
        }
    }
}
