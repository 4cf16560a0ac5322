//! Turns the engine starts itself in an open session (a waking
//! notification: a `_toolwire/notify` from a source in
//! `notifications.wake`, a background command's end) are shown to the
//! editor as they run, and their permission requests asked, as a prompt's
//! turn is: the editor is not left with a thread that changed unseen, nor
//! with calls that wait for an answer nobody is asked for.
//!
//! Each open session has one task following its conversation. A turn is
//! its to show when this engine started it itself and, once the prompts
//! that hold or wait for the session's turn are done, none of them went
//! past its start: every turn a prompt starts or follows (its own, a
//! permission answer's, an interjection's, a compaction's, a woken turn
//! it found running) is then the prompt's. While a woken turn is shown it
//! holds the session's turn, so a prompt that comes meanwhile waits for it
//! (or joins it, with `acp.prompt_while_running = "interject"`), never
//! refused. A prompt that took the turn first and finds the engine's turn
//! running shows it itself before its own (`session::run_prompt`).

use std::sync::atomic::Ordering;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::SessionId;
use toolwire_core::AgentEvent;
use toolwire_engine::Engine;

use crate::session::{self, Start};
use crate::sessions;
use crate::state::{AbortOnDrop, Session};

/// Follows `session_id`'s conversation and shows each turn the engine
/// starts itself there; `open` gives the session while it is open. Stops
/// when the returned guard is dropped (with the session).
pub(crate) fn follow(
    engine: Engine,
    session_id: SessionId,
    cx: ConnectionTo<Client>,
    open: impl Fn() -> Option<Session> + Send + 'static,
) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let Ok(conversation) = session_id.0.parse() else {
            return;
        };
        let mut follower = engine.follow(conversation);
        loop {
            let batch = match follower.next().await {
                Ok(Some(batch)) => batch,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(session = %session_id.0, error = %e, "following the session for turns the engine starts");
                    return;
                }
            };
            for stored in batch {
                let AgentEvent::TurnStarted { run_id, .. } = &stored.event else {
                    continue;
                };
                let run_id = *run_id;
                // A front door's turn (here or on another instance) is
                // that front door's.
                if !engine.started_itself(run_id) {
                    continue;
                }
                // Not open yet (the follower starts first), or closed: the
                // task ends with the session's last clone.
                let Some(session) = open() else {
                    continue;
                };
                // Behind the prompts that hold or wait for the session's
                // turn: one that sends finds this turn running and shows
                // it; one that does not (a slash command answered at once,
                // a prompt refused) leaves it to be shown here after it.
                let _turn = session.turns.clone().lock_owned().await;
                let unshown = stored.seq > session.shown_through.load(Ordering::SeqCst);
                // Closed meanwhile: nothing to show it in.
                if let Some(_running) = open()
                    .filter(|_| unshown)
                    .and_then(|_| session.start_prompt())
                {
                    session.cancelled.store(false, Ordering::SeqCst);
                    tracing::info!(session = %session_id.0, run = %run_id, "ACP: showing a turn the engine started itself");
                    let start = Start::Woken {
                        run: run_id,
                        after: stored.seq,
                    };
                    if let Err(e) =
                        session::run_prompt(&engine, &session, session_id.clone(), start, "", &cx)
                            .await
                    {
                        tracing::warn!(session = %session_id.0, error = %e, "showing a turn the engine started itself");
                    }
                    sessions::touch(&engine, conversation, &session.cwd, session.mode(), "").await;
                }
                // Followed again from where the prompts and the show left
                // off (never before this turn's start): what they went past
                // is not read back from the store (this follower fell
                // behind while it waited), and what they did not is read
                // again.
                let shown = session.shown_through.load(Ordering::SeqCst);
                follower = engine.follow_after(conversation, shown.max(stored.seq));
                break;
            }
        }
    }))
}
