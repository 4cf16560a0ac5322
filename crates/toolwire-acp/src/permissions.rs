//! Asking the editor about the calls that wait (`policy.rs` says which)
//! with `session/request_permission`, and remembering its "always"
//! answers.

use std::sync::atomic::Ordering;
use std::time::Instant;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    self as acp, PermissionOption, PermissionOptionKind, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId,
};
use toolwire_core::{Decision, GatedCall, ToolCall, ToolCallContent, ToolCallId};
use toolwire_engine::Engine;

use crate::policy::{self, Permissions, Policy};
use crate::state::Session;
use crate::updates::Updates;
use crate::{convert, titles};

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

/// The answers to the waiting calls among `calls`, in order: a tool denied
/// by configuration or always rejected in the session is rejected at once,
/// the others are asked about. "Always" answers are remembered and stored.
/// The diffs the requests showed go to `shown`: the editor has them, and
/// the calls' later updates need not send them again.
pub(crate) async fn ask(
    engine: &Engine,
    session: &Session,
    session_id: &SessionId,
    cx: &ConnectionTo<Client>,
    calls: &[GatedCall],
    updates: &mut Updates<'_>,
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
        let mode = session.mode();
        let read_only = session
            .tools
            .get(&call.name)
            .is_some_and(|t| t.spec().read_only);
        match policy::effective(&session.policies, mode, &call.name, read_only) {
            Policy::Deny => {
                decisions.push((
                    call.id.clone(),
                    Decision::Deny {
                        reason: Some(format!(
                            "the session is in {} mode: tools that change files or run \
                             commands are refused",
                            mode.id()
                        )),
                    },
                ));
                continue;
            }
            // The mode changed since the turn began: it runs unasked now.
            Policy::Allow if mode.runs_unasked(&call.name) => {
                decisions.push((call.id.clone(), Decision::Approve));
                continue;
            }
            _ => {}
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
        let preview = session.edits.preview(&call.name, &call.arguments).await;
        let tool_call = match updates.asked_about(call, preview.clone(), Instant::now()) {
            Some(unsent) => unsent,
            None => permission_tool_call(session, call, preview),
        };
        let request =
            RequestPermissionRequest::new(session_id.clone(), tool_call, permission_options());
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

/// The whole tool call a permission request is about, for a call the
/// editor was not shown yet: title, kind, locations, raw input and, for
/// `write_file` and `apply_diff`, the diff it would make.
fn permission_tool_call(
    session: &Session,
    call: &ToolCall,
    preview: Option<ToolCallContent>,
) -> acp::ToolCallUpdate {
    let mut state = titles::described_state(&call.id, &call.name, &call.arguments, &session.cwd);
    state.raw_input = Some(call.arguments.clone());
    state.content = preview.into_iter().collect();
    acp::ToolCallUpdate::from(convert::tool_call(&state))
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
