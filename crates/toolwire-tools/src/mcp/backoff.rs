//! When a failed server may be started (or connected to) again: see
//! [`Backoff`].

use std::time::Duration;

use tokio::time::Instant;

use super::McpError;
use super::error::seconds;

/// The wait after the first failure that backs off; it doubles with each
/// further failure in a row.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two starts of a failing server: a server fixed
/// while toolwire runs is picked up within a minute.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// What the next use does after a failure: start a new process, or open a
/// new HTTP session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Again {
    Restart,
    Reconnect,
}

impl Again {
    fn done(self) -> &'static str {
        match self {
            Again::Restart => "restarted",
            Again::Reconnect => "reconnected",
        }
    }

    fn does(self) -> &'static str {
        match self {
            Again::Restart => "restarts",
            Again::Reconnect => "reconnects",
        }
    }
}

/// When a failed server may be started again.
///
/// A server that was working and exits is restarted at once on its next
/// use (one crash says little). Every further failure in a row — a start
/// that fails, or a restarted process that exits before a call succeeds —
/// holds starts back: [`BACKOFF_FIRST`] after the first, doubling up to
/// [`BACKOFF_MAX`]. Without it a server that cannot start would be spawned
/// again by every call the model makes. A call that gets an answer resets
/// it.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    /// Failures in a row that hold starts back.
    failures: u32,
    /// The immediate restart has been used since the last answered call.
    restarted: bool,
    retry_at: Option<Instant>,
    /// The last failure, for the error shown while starts are held back.
    last: String,
}

impl Backoff {
    /// A process that had started exited. Returns how long until it may be
    /// started again.
    pub(super) fn exited(&mut self, now: Instant, why: String) -> Duration {
        if self.failures == 0 && !self.restarted {
            self.restarted = true;
            self.last = why;
            return Duration::ZERO;
        }
        self.failed(now, why)
    }

    /// A start failed. Returns how long until the next may be tried.
    pub(super) fn failed(&mut self, now: Instant, why: String) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = backoff_delay(self.failures);
        self.retry_at = Some(now + wait);
        self.last = why;
        wait
    }

    pub(super) fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    /// How long starts are still held back, if they are.
    pub(super) fn waiting(&self, now: Instant) -> Option<Duration> {
        let wait = self.retry_at?.saturating_duration_since(now);
        (!wait.is_zero()).then_some(wait)
    }

    /// The error for a use while starts are held back.
    pub(super) fn holding_back(
        &self,
        now: Instant,
        server: &str,
        again: Again,
    ) -> Option<McpError> {
        let retry_in = self.waiting(now)?;
        Some(McpError::BackingOff {
            server: server.to_owned(),
            failures: self.failures,
            retry_in,
            last: self.last.clone(),
            action: again.done(),
        })
    }
}

/// The wait after `failures` failures in a row (1 or more).
fn backoff_delay(failures: u32) -> Duration {
    // 2^6 s is past the cap already; the bound keeps the shift in range.
    let doublings = failures.saturating_sub(1).min(6);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
}

pub(super) fn restart_note(wait: Duration, again: Again) -> String {
    let does = again.does();
    if wait.is_zero() {
        format!("it {does} on next use")
    } else {
        format!("it {does} on the first use in {} or later", seconds(wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_one_second_up_to_a_minute() {
        let waits: Vec<u64> = (1..=9).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn a_working_server_that_exits_gets_one_immediate_restart_then_waits() {
        let now = Instant::now();
        let mut backoff = Backoff::default();
        assert_eq!(backoff.exited(now, "crashed".into()), Duration::ZERO);
        assert!(backoff.holding_back(now, "s", Again::Restart).is_none());

        assert_eq!(
            backoff.exited(now, "crashed again".into()),
            Duration::from_secs(1)
        );
        let message = backoff
            .holding_back(now + Duration::from_millis(400), "s", Again::Restart)
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            message,
            "MCP server `s` is not restarted yet: it failed 1 time in a row; it will be \
             restarted by the first use in 0.6 s or later (last failure: crashed again)"
        );
        assert!(
            backoff
                .holding_back(now + Duration::from_secs(1), "s", Again::Restart)
                .is_none()
        );
        assert_eq!(
            backoff.failed(now, "no start".into()),
            Duration::from_secs(2)
        );

        // An answered call: the next exit is a first one again.
        backoff.succeeded();
        assert_eq!(backoff.exited(now, "crashed".into()), Duration::ZERO);
    }

    #[test]
    fn a_failed_start_holds_the_next_back_at_once() {
        let now = Instant::now();
        let mut backoff = Backoff::default();
        assert_eq!(backoff.failed(now, "exit 1".into()), Duration::from_secs(1));
        assert!(matches!(
            backoff.holding_back(now, "s", Again::Restart),
            Some(McpError::BackingOff { failures: 1, .. })
        ));
        assert_eq!(
            backoff.exited(now, "exit 1".into()),
            Duration::from_secs(2),
            "no immediate restart for a server that has not worked since"
        );
    }
}
