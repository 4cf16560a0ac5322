//! Identifiers. Newtypes so that a message id can never be passed where a
//! conversation id is meant.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A string that is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a valid {kind} id (expected a UUID)")]
pub struct InvalidId {
    /// Which id it should have been (`conversation`, `message` …).
    pub kind: &'static str,
    /// The string given.
    pub value: String,
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh, time-ordered (UUID v7) id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// When the id was made: its UUID v7 time, to the millisecond
            /// (`None` for an id of another version).
            pub fn made_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
                let (secs, nanos) = self.0.get_timestamp()?.to_unix();
                chrono::DateTime::from_timestamp(i64::try_from(secs).ok()?, nanos)
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self).map_err(|_| InvalidId {
                    kind: $kind,
                    value: s.chars().take(64).collect(),
                })
            }
        }
    };
}

uuid_id!(
    /// A conversation: one tree of messages.
    ConversationId,
    "conversation"
);
uuid_id!(
    /// A message (a node of a conversation tree).
    MessageId,
    "message"
);
uuid_id!(
    /// An agent (a configured assistant with its conversation).
    AgentId,
    "agent"
);
uuid_id!(
    /// One run of the tool loop (a turn).
    RunId,
    "run"
);
uuid_id!(
    /// One toolwire process's engine, as the store knows it: the owner of
    /// the runs it starts.
    InstanceId,
    "instance"
);

/// A tool call's id. Providers choose them (`call_…`, `toolu_…`), so it is
/// a string, unique within its assistant message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolCallId(pub String);

impl fmt::Display for ToolCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ToolCallId {
    fn from(s: &str) -> Self {
        ToolCallId(s.to_owned())
    }
}

impl From<String> for ToolCallId {
    fn from(s: String) -> Self {
        ToolCallId(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_knows_when_it_was_made() {
        let before = chrono::Utc::now() - chrono::TimeDelta::milliseconds(1);
        let made = MessageId::new().made_at().unwrap();
        let after = chrono::Utc::now();
        assert!(before <= made && made <= after, "{before} {made} {after}");
        assert_eq!(MessageId(Uuid::nil()).made_at(), None);
    }

    #[test]
    fn ids_are_time_ordered_and_round_trip() {
        let a = MessageId::new();
        let b = MessageId::new();
        assert!(a < b);
        assert_eq!(a.to_string().parse::<MessageId>().unwrap(), a);
        let err = "nope".parse::<ConversationId>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "`nope` is not a valid conversation id (expected a UUID)"
        );
    }
}
