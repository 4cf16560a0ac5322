//! Where a connection's `notifications/progress` go: to the call whose
//! request carried the token ([`ProgressRoutes`]), as text like
//! `3/5 (60%): message`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex as StdMutex, MutexGuard, PoisonError};

use rmcp::model::{ProgressNotificationParam, ProgressToken};

use crate::ProgressHandle;

/// Progress notifications kept for a token no call has claimed yet.
const EARLY_PROGRESS_KEPT: usize = 16;

/// Where the progress notifications of one connection go: the progress
/// handle of the call whose request carried the token.
#[derive(Default)]
pub(super) struct ProgressRoutes(StdMutex<Routes>);

#[derive(Default)]
struct Routes {
    calls: HashMap<ProgressToken, Route>,
    /// Notifications for tokens no call has claimed: the server can answer
    /// before the call has registered its token.
    early: VecDeque<ProgressNotificationParam>,
}

struct Route {
    handle: ProgressHandle,
    last: Option<f64>,
}

impl Route {
    /// The text to report, or `None` for a notification that does not
    /// advance: each is handled on its own task so they can arrive out of
    /// order, and progress must increase.
    fn advance(&mut self, params: &ProgressNotificationParam) -> Option<String> {
        if self.last.is_some_and(|last| params.progress <= last) {
            return None;
        }
        self.last = Some(params.progress);
        Some(progress_text(
            params.progress,
            params.total,
            params.message.as_deref(),
        ))
    }
}

impl ProgressRoutes {
    fn lock(&self) -> MutexGuard<'_, Routes> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the progress of the request with `token` to `handle` until the
    /// returned guard is dropped.
    pub(super) fn route(&self, token: ProgressToken, handle: ProgressHandle) -> RouteGuard<'_> {
        let mut route = Route {
            handle: handle.clone(),
            last: None,
        };
        let mut reports = Vec::new();
        {
            let mut routes = self.lock();
            let early = std::mem::take(&mut routes.early);
            for params in early {
                if params.progress_token == token {
                    reports.extend(route.advance(&params));
                } else {
                    routes.early.push_back(params);
                }
            }
            routes.calls.insert(token.clone(), route);
        }
        for text in reports {
            handle.status(text);
        }
        RouteGuard {
            routes: self,
            token,
        }
    }

    pub(super) fn deliver(&self, params: ProgressNotificationParam) {
        let mut routes = self.lock();
        let Some(route) = routes.calls.get_mut(&params.progress_token) else {
            if routes.early.len() == EARLY_PROGRESS_KEPT {
                routes.early.pop_front();
            }
            routes.early.push_back(params);
            return;
        };
        if let Some(text) = route.advance(&params) {
            let handle = route.handle.clone();
            drop(routes);
            handle.status(text);
        }
    }
}

pub(super) struct RouteGuard<'a> {
    routes: &'a ProgressRoutes,
    token: ProgressToken,
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        self.routes.lock().calls.remove(&self.token);
    }
}

/// `3/5 (60%)`, `3/5 (60%): copying`, `progress 3` when the total is
/// unknown. `f64` prints `3`, not `3.0`.
fn progress_text(progress: f64, total: Option<f64>, message: Option<&str>) -> String {
    let mut text = match total {
        Some(total) if total > 0.0 => {
            format!("{progress}/{total} ({:.0}%)", progress / total * 100.0)
        }
        _ => format!("progress {progress}"),
    };
    if let Some(message) = message.map(str::trim).filter(|m| !m.is_empty()) {
        text.push_str(": ");
        text.push_str(message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_as_steps_and_percent() {
        assert_eq!(progress_text(3.0, Some(5.0), None), "3/5 (60%)");
        assert_eq!(
            progress_text(1.0, Some(3.0), Some(" copying ")),
            "1/3 (33%): copying"
        );
        assert_eq!(progress_text(2.5, None, Some("")), "progress 2.5");
        assert_eq!(progress_text(1.0, Some(0.0), None), "progress 1");
    }

    fn token(n: i64) -> ProgressToken {
        ProgressToken(rmcp::model::NumberOrString::Number(n))
    }

    fn notification(n: i64, progress: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(token(n), progress).with_total(4.0)
    }

    #[test]
    fn progress_goes_to_the_call_that_owns_the_token_in_order() {
        let routes = ProgressRoutes::default();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let handle = ProgressHandle::new("call-1".into(), tx);

        // The server can report before the call has registered its token.
        routes.deliver(notification(1, 1.0));
        routes.deliver(notification(2, 1.0));
        let route = routes.route(token(1), handle);
        routes.deliver(notification(1, 3.0));
        // Handled out of order: progress must increase, so it is stale.
        routes.deliver(notification(1, 2.0));
        drop(route);
        routes.deliver(notification(1, 4.0));

        let mut texts = Vec::new();
        while let Ok((call_id, progress)) = rx.try_recv() {
            assert_eq!(call_id.0, "call-1");
            match progress {
                toolwire_core::Progress::Status { text } => texts.push(text),
                other => panic!("expected a status, got {other:?}"),
            }
        }
        assert_eq!(texts, ["1/4 (25%)", "3/4 (75%)"]);
        // The other call's early report waits for its call; the late one is
        // kept (bounded) in case a call claims it, and claimed by none.
        assert_eq!(routes.lock().early.len(), 2);
    }

    #[test]
    fn unclaimed_progress_is_bounded() {
        let routes = ProgressRoutes::default();
        for n in 0..100 {
            routes.deliver(notification(n, 1.0));
        }
        assert_eq!(routes.lock().early.len(), EARLY_PROGRESS_KEPT);
    }
}
