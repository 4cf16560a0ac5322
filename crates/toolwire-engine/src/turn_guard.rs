//! A panic inside a turn (a bug in toolwire, a provider or a tool adapter)
//! must not leave its conversation busy nor its run unfinished: the turn
//! ends with an error, stored as such, and the conversation is released.
//! The panic's text goes to the server log only; clients get a generic
//! message, since it may quote anything the turn held.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use toolwire_core::{AgentEvent, ConversationId, RunId, StopReason, Usage};

use crate::engine::{Inner, TurnOutcome};

/// What a client is told about a turn that panicked.
pub(crate) const PANICKED: &str = "internal error in the turn: see the server log";

/// Runs `turn`; should it panic, records the run as failed, publishes its
/// end and returns that outcome instead.
pub(crate) async fn caught(
    inner: &Inner,
    conversation: ConversationId,
    run_id: RunId,
    turn: impl Future<Output = TurnOutcome>,
) -> TurnOutcome {
    // The turn's state is dropped with it; only the store is read after.
    let payload = match AssertUnwindSafe(turn).catch_unwind().await {
        Ok(outcome) => return outcome,
        Err(payload) => payload,
    };
    tracing::error!(%conversation, run = %run_id, panic = %panic_text(payload.as_ref()), "a turn panicked; it ends with an error");
    if let Err(e) = inner
        .store
        .finish_run(run_id, StopReason::Error, Some(PANICKED))
        .await
    {
        tracing::error!(run = %run_id, error = %e, "could not record the end of a turn that panicked");
    }
    let stopped = AgentEvent::Stopped {
        run_id,
        reason: StopReason::Error,
        error: Some(PANICKED.into()),
    };
    if let Err(e) = inner.bus.emit(conversation, stopped).await {
        tracing::error!(run = %run_id, error = %e, "could not publish the end of a turn that panicked");
    }
    TurnOutcome {
        run_id,
        conversation_id: conversation,
        reason: StopReason::Error,
        error: Some(PANICKED.into()),
        final_message: None,
        usage: Usage::default(),
        cost: None,
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
