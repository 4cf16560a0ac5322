//! Stopping the engine: from the moment it stops no turn starts; running
//! turns are let reach their next stored step within a grace period, and
//! what still runs then is cancelled, so that each cut turn's messages are
//! stored (what the model sent so far, marked interrupted) and its run
//! ends as `interrupted` rather than vanishing with the process.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What became of the turns running when the engine stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Turns running when the engine stopped taking new ones.
    pub running: usize,
    /// Of them, those that still ran when the grace period ended and were
    /// cancelled.
    pub cut: usize,
    /// Turns still not ended after the cut and its own bound (a store
    /// that does not answer): the process exits without them.
    pub left: usize,
}

/// The engine's stop flag and its count of turns (each turn's task, up to
/// the end of its bookkeeping, so that words queued for it are stored
/// before the count reaches zero).
pub(crate) struct Stopping {
    token: CancellationToken,
    running: watch::Sender<usize>,
}

impl Default for Stopping {
    fn default() -> Self {
        Stopping {
            token: CancellationToken::new(),
            running: watch::Sender::new(0),
        }
    }
}

/// Held by a turn's task while it runs.
pub(crate) struct TurnGuard(watch::Sender<usize>);

impl Drop for TurnGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Stopping {
    pub(crate) fn is_stopping(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Stops new turns from starting.
    pub(crate) fn stop(&self) {
        self.token.cancel();
    }

    /// Counts a turn until the guard drops.
    pub(crate) fn enter(&self) -> TurnGuard {
        self.running.send_modify(|n| *n += 1);
        TurnGuard(self.running.clone())
    }

    pub(crate) fn running(&self) -> usize {
        *self.running.borrow()
    }

    /// Waits up to `bound` for every turn to end; says whether they did.
    pub(crate) async fn settled(&self, bound: Duration) -> bool {
        let mut rx = self.running.subscribe();
        matches!(
            tokio::time::timeout(bound, rx.wait_for(|n| *n == 0)).await,
            Ok(Ok(_))
        )
    }
}
