//! The configured per-tool policies and a session's "always" answers
//! (stored through the engine, so a loaded session keeps them): which
//! tools' calls wait for an answer.
//!
//! A call runs at once when its tool's policy is `allow` (by default the
//! read-only tools: read_file, list_dir, search, update_plan and MCP tools
//! annotated `readOnlyHint`) or the user answered "always allow" for the
//! tool in this session; it is rejected without asking when the policy is
//! `deny` or the user answered "always reject"; otherwise the editor is
//! asked (`permissions.rs`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;

use serde::Deserialize;
use toolwire_core::{ConversationId, ToolKind, kind_of};
use toolwire_engine::Engine;
use toolwire_tools::ToolRegistry;

use crate::modes::SessionMode;

/// The kind of the store documents that keep a session's "always"
/// answers (id: the conversation id).
const PERMISSIONS_KIND: &str = "acp_permissions";

/// What happens to a tool's calls, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Run without asking.
    Allow,
    /// Ask the editor each time (until an "always" answer).
    Ask,
    /// Reject without asking; the model is told.
    Deny,
}

/// The configured policies, by tool name; tools not named follow the
/// default (read-only tools allow, the others ask).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policies(pub BTreeMap<String, Policy>);

impl Policies {
    pub fn of(&self, tool: &str, read_only: bool) -> Policy {
        match self.0.get(tool) {
            Some(policy) => *policy,
            None if read_only => Policy::Allow,
            None => Policy::Ask,
        }
    }
}

/// A session's "always" answers, per tool name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Permissions {
    /// Tools that run without asking.
    pub allow: BTreeSet<String>,
    /// Tools whose calls are rejected without asking.
    pub reject: BTreeSet<String>,
}

impl Permissions {
    /// The stored answers of `conversation` (none if there are none or
    /// they cannot be read).
    pub(crate) async fn load(engine: &Engine, conversation: ConversationId) -> Self {
        match engine
            .store()
            .document(PERMISSIONS_KIND, &conversation.to_string())
            .await
        {
            Ok(Some(doc)) => {
                let names = |key: &str| -> BTreeSet<String> {
                    doc.body
                        .get(key)
                        .and_then(|v| v.as_array())
                        .map(|items| {
                            items
                                .iter()
                                .filter_map(|v| v.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                Permissions {
                    allow: names("allow"),
                    reject: names("reject"),
                }
            }
            Ok(None) => Permissions::default(),
            Err(e) => {
                tracing::warn!(error = %e, "reading stored ACP permissions");
                Permissions::default()
            }
        }
    }

    pub(crate) async fn save(&self, engine: &Engine, conversation: ConversationId) {
        let body = serde_json::json!({"allow": self.allow, "reject": self.reject});
        if let Err(e) = engine
            .put_record(PERMISSIONS_KIND, &conversation.to_string(), &body)
            .await
        {
            tracing::warn!(error = %e, "storing ACP permissions");
        }
    }
}

/// The tools among `tools` whose calls wait (to be asked about, or to be
/// rejected without asking): all but those that may run at once under
/// `policies` and the session's "always" answers.
pub(crate) fn require_approval(
    tools: &ToolRegistry,
    policies: &Policies,
    permissions: &Mutex<Permissions>,
    mode: SessionMode,
) -> HashSet<String> {
    let allowed = permissions
        .lock()
        .map(|p| p.allow.clone())
        .unwrap_or_default();
    tools
        .specs()
        .into_iter()
        .filter(
            |spec| match effective(policies, mode, &spec.name, spec.read_only) {
                Policy::Deny => true,
                Policy::Ask => !allowed.contains(&spec.name),
                Policy::Allow => false,
            },
        )
        .map(|spec| spec.name.clone())
        .collect()
}

/// The policy of `tool` in `mode`: read-only mode denies every tool that
/// is not read-only — but a command tool the configuration allows
/// outright, which runs under the read-only sandbox; accept-edits allows
/// edits and full-access everything the configuration would ask about. A
/// configured `deny` holds in every mode.
pub(crate) fn effective(
    policies: &Policies,
    mode: SessionMode,
    tool: &str,
    read_only: bool,
) -> Policy {
    let configured = policies.of(tool, read_only);
    let confined_command =
        kind_of(tool) == ToolKind::Execute && policies.0.get(tool) == Some(&Policy::Allow);
    if configured == Policy::Deny || (mode.refuses_writes() && !read_only && !confined_command) {
        return Policy::Deny;
    }
    if configured == Policy::Ask && mode.runs_unasked(tool) {
        return Policy::Allow;
    }
    configured
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_tools_are_allowed_unless_configured() {
        let mut policies = Policies::default();
        assert_eq!(policies.of("read_file", true), Policy::Allow);
        assert_eq!(policies.of("run_command", false), Policy::Ask);
        policies.0.insert("run_command".into(), Policy::Allow);
        policies.0.insert("read_file".into(), Policy::Deny);
        assert_eq!(policies.of("run_command", false), Policy::Allow);
        assert_eq!(policies.of("read_file", true), Policy::Deny);
    }

    #[test]
    fn modes_decide_over_ask_but_never_over_a_configured_deny() {
        let mut policies = Policies::default();
        let of = |p: &Policies, mode, tool, ro| effective(p, mode, tool, ro);
        assert_eq!(
            of(&policies, SessionMode::ReadOnly, "write_file", false),
            Policy::Deny
        );
        assert_eq!(
            of(&policies, SessionMode::ReadOnly, "read_file", true),
            Policy::Allow
        );
        assert_eq!(
            of(&policies, SessionMode::Ask, "write_file", false),
            Policy::Ask
        );
        assert_eq!(
            of(&policies, SessionMode::AcceptEdits, "write_file", false),
            Policy::Allow
        );
        assert_eq!(
            of(&policies, SessionMode::AcceptEdits, "run_command", false),
            Policy::Ask
        );
        assert_eq!(
            of(&policies, SessionMode::FullAccess, "run_command", false),
            Policy::Allow
        );
        policies.0.insert("run_command".into(), Policy::Deny);
        assert_eq!(
            of(&policies, SessionMode::FullAccess, "run_command", false),
            Policy::Deny
        );
        policies.0.insert("write_file".into(), Policy::Allow);
        assert_eq!(
            of(&policies, SessionMode::ReadOnly, "write_file", false),
            Policy::Deny
        );
        // A command allowed outright runs in read-only mode, under the
        // read-only sandbox.
        policies.0.insert("run_command".into(), Policy::Allow);
        assert_eq!(
            of(&policies, SessionMode::ReadOnly, "run_command", false),
            Policy::Allow
        );
    }
}
