//! Approvals from the live view come one call at a time (a person clicks
//! approve or deny on each card), while the engine takes the answers to a
//! paused turn all at once: they are gathered here, per pause, until every
//! waiting call has one.

use std::collections::HashMap;
use std::sync::Mutex;

use toolwire_core::{ConversationId, Decision, Gate, MessageId, PendingApproval, ToolCallId};

/// The answers given for the pause on one message.
type Given = (MessageId, HashMap<ToolCallId, Decision>);

/// Answers given so far, per conversation.
#[derive(Debug, Default)]
pub struct Decisions {
    given: Mutex<HashMap<ConversationId, Given>>,
}

/// Why an answer was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    #[error("tool call `{0}` does not wait for an answer")]
    NotWaiting(ToolCallId),
    #[error(
        "tool call `{0}` is a client tool: its result must come from the client, \
         so it cannot be approved to run on the server (deny it, or answer it from the client)"
    )]
    ClientTool(ToolCallId),
    #[error("the approvals could not be recorded")]
    Poisoned,
}

impl Decisions {
    /// Records `decision` for call `id` of `pending` (a later answer for
    /// the same call replaces the earlier one: a person may change their
    /// mind until the last call is answered). Returns every answer, in the
    /// order of the waiting calls, once each has one.
    pub fn record(
        &self,
        pending: &PendingApproval,
        id: ToolCallId,
        decision: Decision,
    ) -> Result<Option<Vec<(ToolCallId, Decision)>>, DecisionError> {
        let Some(call) = pending.waiting().find(|c| c.call.id == id) else {
            return Err(DecisionError::NotWaiting(id));
        };
        // A client tool is never run on the server: it may only be denied.
        if call.gate == Some(Gate::Client) && decision == Decision::Approve {
            return Err(DecisionError::ClientTool(id));
        }
        let waiting = pending.waiting_ids();
        let mut given = self.given.lock().map_err(|_| DecisionError::Poisoned)?;
        let entry = given
            .entry(pending.conversation_id)
            .or_insert_with(|| (pending.message_id, HashMap::new()));
        // Answers for an earlier pause are stale.
        if entry.0 != pending.message_id {
            *entry = (pending.message_id, HashMap::new());
        }
        entry.1.insert(id, decision);
        if !waiting.iter().all(|w| entry.1.contains_key(w)) {
            return Ok(None);
        }
        let mut answers = std::mem::take(&mut entry.1);
        given.remove(&pending.conversation_id);
        Ok(Some(
            waiting
                .into_iter()
                .filter_map(|w| answers.remove(&w).map(|d| (w, d)))
                .collect(),
        ))
    }

    /// Forgets the answers gathered for `conversation` (after a cancel).
    pub fn clear(&self, conversation: ConversationId) {
        if let Ok(mut given) = self.given.lock() {
            given.remove(&conversation);
        }
    }

    /// Puts answers back after the engine refused them, so that a retry
    /// need not give them all again.
    pub fn restore(&self, pending: &PendingApproval, answers: Vec<(ToolCallId, Decision)>) {
        if let Ok(mut given) = self.given.lock() {
            given.insert(
                pending.conversation_id,
                (pending.message_id, answers.into_iter().collect()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwire_core::{GatedCall, RunId, ToolCall};

    fn pause(conversation: ConversationId, ids: &[&str]) -> PendingApproval {
        PendingApproval {
            conversation_id: conversation,
            run_id: RunId::new(),
            message_id: MessageId::new(),
            iteration: 1,
            calls: ids
                .iter()
                .map(|id| GatedCall {
                    call: ToolCall {
                        id: ToolCallId((*id).into()),
                        server: None,
                        name: "t".into(),
                        arguments: serde_json::json!({}),
                    },
                    gate: Some(Gate::Approval),
                    invalid: None,
                })
                .collect(),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn answers_are_given_back_once_every_call_has_one() {
        let decisions = Decisions::default();
        let c = ConversationId::new();
        let p = pause(c, &["a", "b"]);
        let id = |s: &str| ToolCallId(s.into());
        assert!(decisions.record(&p, id("x"), Decision::Approve).is_err());
        assert_eq!(
            decisions.record(&p, id("b"), Decision::Approve).unwrap(),
            None
        );
        // A second answer replaces the first.
        let deny = Decision::Deny { reason: None };
        assert_eq!(decisions.record(&p, id("b"), deny.clone()).unwrap(), None);
        let all = decisions.record(&p, id("a"), Decision::Approve).unwrap();
        assert_eq!(
            all,
            Some(vec![(id("a"), Decision::Approve), (id("b"), deny)])
        );
        // Answers for an earlier pause do not count for the next one.
        decisions.record(&p, id("a"), Decision::Approve).unwrap();
        let next = pause(c, &["a", "b"]);
        assert_eq!(
            decisions.record(&next, id("b"), Decision::Approve).unwrap(),
            None
        );
    }

    #[test]
    fn a_client_tool_can_be_denied_but_not_approved() {
        let decisions = Decisions::default();
        let c = ConversationId::new();
        let mut p = pause(c, &["a", "client"]);
        p.calls[1].gate = Some(Gate::Client);
        let id = |s: &str| ToolCallId(s.into());
        assert!(matches!(
            decisions.record(&p, id("client"), Decision::Approve),
            Err(DecisionError::ClientTool(_))
        ));
        // Refused, it is not counted: the approval of `a` does not finish.
        assert_eq!(
            decisions.record(&p, id("a"), Decision::Approve).unwrap(),
            None
        );
        let deny = Decision::Deny { reason: None };
        assert_eq!(
            decisions.record(&p, id("client"), deny.clone()).unwrap(),
            Some(vec![(id("a"), Decision::Approve), (id("client"), deny)])
        );
    }
}
