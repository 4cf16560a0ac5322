//! Which tool calls run without asking, and asking the editor about the
//! others with `session/request_permission`.
//!
//! A call runs at once when its tool's policy is `allow` (by default the
//! read-only tools: read_file, list_dir, search, update_plan and MCP tools
//! annotated `readOnlyHint`) or the user answered "always allow" for the
//! tool in this session; it is rejected without asking when the policy is
//! `deny` or the user answered "always reject"; otherwise the editor is
//! asked. "Always" answers are stored, so a loaded session keeps them.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    self as acp, PermissionOption, PermissionOptionKind, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId,
};
use serde::Deserialize;
use toolwire_core::{ConversationId, Decision, GatedCall, ToolCallId};
use toolwire_engine::Engine;

use crate::Session;

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

    async fn save(&self, engine: &Engine, conversation: ConversationId) {
        let body = serde_json::json!({"allow": self.allow, "reject": self.reject});
        if let Err(e) = engine
            .store()
            .put_document(PERMISSIONS_KIND, &conversation.to_string(), &body)
            .await
        {
            tracing::warn!(error = %e, "storing ACP permissions");
        }
    }
}

const ALLOW_ONCE: &str = "allow_once";
const ALLOW_ALWAYS: &str = "allow_always";
const REJECT_ONCE: &str = "reject_once";
const REJECT_ALWAYS: &str = "reject_always";

/// The options of every permission request.
fn permission_options() -> Vec<PermissionOption> {
    vec![
        PermissionOption::new(ALLOW_ONCE, "Allow once", PermissionOptionKind::AllowOnce),
        PermissionOption::new(
            ALLOW_ALWAYS,
            "Always allow",
            PermissionOptionKind::AllowAlways,
        ),
        PermissionOption::new(REJECT_ONCE, "Reject", PermissionOptionKind::RejectOnce),
        PermissionOption::new(
            REJECT_ALWAYS,
            "Always reject",
            PermissionOptionKind::RejectAlways,
        ),
    ]
}

/// The tools of `session` whose calls wait (to be asked about, or to be
/// rejected without asking): all but those that may run at once.
pub(crate) fn require_approval(session: &Session) -> HashSet<String> {
    let allowed = session
        .permissions
        .lock()
        .map(|p| p.allow.clone())
        .unwrap_or_default();
    session
        .tools
        .specs()
        .into_iter()
        .filter(|spec| {
            let policy = session.policies.of(&spec.name, spec.read_only);
            policy == Policy::Deny || (policy == Policy::Ask && !allowed.contains(&spec.name))
        })
        .map(|spec| spec.name)
        .collect()
}

/// The answers to the waiting calls among `calls`, in order: a tool denied
/// by configuration or always rejected in the session is rejected at once,
/// the others are asked about. "Always" answers are remembered and stored.
pub(crate) async fn ask(
    engine: &Engine,
    session: &Session,
    session_id: &SessionId,
    cx: &ConnectionTo<Client>,
    calls: &[GatedCall],
) -> Result<Vec<(ToolCallId, Decision)>, agent_client_protocol::Error> {
    let mut decisions = Vec::new();
    for gated in calls.iter().filter(|c| c.gate.is_some()) {
        let call = &gated.call;
        if session.policies.0.get(&call.name) == Some(&Policy::Deny) {
            decisions.push((
                call.id.clone(),
                Decision::Deny {
                    reason: Some("the configuration denies this tool".into()),
                },
            ));
            continue;
        }
        // An "always" answer given earlier, this batch included.
        let always = session
            .permissions
            .lock()
            .map(|p| (p.allow.contains(&call.name), p.reject.contains(&call.name)))
            .unwrap_or_default();
        match always {
            (_, true) => {
                decisions.push((call.id.clone(), rejected()));
                continue;
            }
            (true, _) => {
                decisions.push((call.id.clone(), Decision::Approve));
                continue;
            }
            _ => {}
        }
        if session.cancelled.load(Ordering::SeqCst) {
            decisions.push((call.id.clone(), cancelled_decision()));
            continue;
        }
        let request = RequestPermissionRequest::new(
            session_id.clone(),
            crate::session::permission_tool_call(session, call).await,
            permission_options(),
        );
        let response = cx.send_request(request).block_task().await?;
        let decision = match response.outcome {
            // A cancel that came while the editor was asking wins over the
            // answer: the user wants the turn stopped.
            _ if session.cancelled.load(Ordering::SeqCst) => cancelled_decision(),
            RequestPermissionOutcome::Selected(selected) => {
                remember(engine, session, &call.name, &selected).await
            }
            _ => cancelled_decision(),
        };
        tracing::info!(
            session = %session_id.0,
            call = %call.id.0,
            tool = %call.name,
            approved = matches!(decision, Decision::Approve),
            "the editor answered a permission request"
        );
        decisions.push((call.id.clone(), decision));
    }
    Ok(decisions)
}

/// The decision an option stands for; an "always" option is remembered.
async fn remember(
    engine: &Engine,
    session: &Session,
    tool: &str,
    selected: &acp::SelectedPermissionOutcome,
) -> Decision {
    let update = |f: &dyn Fn(&mut Permissions)| {
        let mut changed = None;
        if let Ok(mut p) = session.permissions.lock() {
            f(&mut p);
            changed = Some(p.clone());
        }
        changed
    };
    let (decision, changed) = match selected.option_id.0.as_ref() {
        ALLOW_ONCE => (Decision::Approve, None),
        ALLOW_ALWAYS => (
            Decision::Approve,
            update(&|p| {
                p.reject.remove(tool);
                p.allow.insert(tool.to_owned());
            }),
        ),
        REJECT_ALWAYS => (
            rejected(),
            update(&|p| {
                p.allow.remove(tool);
                p.reject.insert(tool.to_owned());
            }),
        ),
        // reject_once, and options we never offered.
        _ => (rejected(), None),
    };
    if let Some(permissions) = changed {
        tracing::info!(tool, answer = %selected.option_id.0, "remembered for the session");
        permissions.save(engine, session.conversation).await;
        // The turns the engine starts itself follow it too.
        engine.set_conversation_options(session.conversation, session.turn_options());
    }
    decision
}

fn rejected() -> Decision {
    Decision::Deny {
        reason: Some("the user rejected it".into()),
    }
}

pub(crate) fn cancelled_decision() -> Decision {
    Decision::Deny {
        reason: Some("cancelled".into()),
    }
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
}
