//! Serving connections within limits: a cap on open connections, a
//! deadline for a request's head, one for its body and one for a
//! kept-alive connection with nothing to do.
//!
//! Each connection is in one of three phases, told by its reads and by its
//! requests (`Activity`): waiting for a request's head (from the accept,
//! or from the first byte after an idle spell: `header_timeout`, however
//! slowly the bytes trickle in), idle between requests (`idle_timeout`,
//! no byte of a new request yet), or busy (a request is being answered:
//! no deadline, as a stream or a turn may take long). An upgraded
//! connection (the WebSocket) has no deadline either. A deadline that
//! passes fails the connection's next read, and hyper closes it.
//!
//! A request's body has a deadline of its own (`body_timeout`, counted
//! from the head's arrival, however slowly the bytes trickle in): past it,
//! reading the body fails, the request is answered 408 with a JSON error
//! and the connection closed. It sits on the body, not the socket, so
//! that the answer can say what happened.
//!
//! hyper's own `header_read_timeout` is not used: it starts again as soon
//! as a kept-alive connection goes idle, so it cannot be a separate idle
//! timeout; and hyper-util's HTTP/1-or-2 builder (what `axum::serve` uses)
//! first reads the bytes that tell the version with no deadline at all, so
//! a connection that sends nothing was held forever. Connections are
//! HTTP/1.1 (what browsers and the SDKs speak to a server without TLS).
//!
//! At the cap, the server stops accepting: new connections wait in the
//! kernel's accept queue, which costs this process no file descriptor,
//! and are taken as open ones close (the deadlines see to it that idle
//! and stalled ones do). Accepting and closing them instead would turn a
//! burst of honest clients into errors.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use futures::task::AtomicWaker;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// The limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once (WebSockets included).
    pub max_connections: usize,
    /// How long a request's head may take to arrive.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive, from its head.
    pub body_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves,
/// then stops accepting, lets each connection finish the request it is
/// answering (a kept-alive one closes once it has), and returns when all
/// have closed. An upgraded connection is the upgrade's to end.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) where
    S: tower::Service<Request, Response = Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Dropping the receiver tells every connection (`closed()`).
    let (signal_tx, signal_rx) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        drop(signal_rx);
    });
    // Each connection holds a receiver; all dropped: all closed.
    let (close_tx, close_rx) = watch::channel(());
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = signal_tx.closed() => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = signal_tx.closed() => break,
        };
        // TCP_NODELAY: a stream's events are small writes, and with
        // Nagle's algorithm each one after the first waited for the
        // client's ACK, which a client delays by up to 40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let app = app.clone();
        let signal = signal_tx.clone();
        let close = close_rx.clone();
        tokio::spawn(async move {
            let activity = Arc::new(Activity::default());
            let io = TokioIo::new(Timed::new(tcp, permit, activity.clone(), limits));
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let app = app.clone();
                let busy = Busy::begin(activity.clone());
                let timed_out = Arc::new(AtomicBool::new(false));
                let request = request.map(|body| {
                    Body::new(Deadlined::new(body, limits.body_timeout, timed_out.clone()))
                });
                async move {
                    let Ok(mut response) = app.oneshot(request).await;
                    // The handler failed reading the body (in its own
                    // words): the answer says why.
                    if timed_out.load(Ordering::Acquire) {
                        response = body_timed_out(limits.body_timeout);
                    }
                    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                        busy.activity.upgraded.store(true, Ordering::Release);
                    }
                    Ok::<_, Infallible>(response.map(|body| Tracked { body, _busy: busy }))
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .with_upgrades();
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => finished(result),
                () = signal.closed() => {
                    connection.as_mut().graceful_shutdown();
                    finished(connection.await);
                }
            }
            drop(close);
        });
    }
    drop(close_rx);
    drop(listener);
    close_tx.closed().await;
}

fn finished(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended");
    }
}

/// An error of `accept`: one connection's (it is gone: go on) or the
/// process's (out of file descriptors: wait a moment, as retrying at once
/// would spin).
async fn accept_failed(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// 408 with a JSON error; the rest of the body is not waited for.
fn body_timed_out(limit: Duration) -> Response {
    use axum::response::IntoResponse;
    let mut response = crate::ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "BODY_TIMEOUT",
        format!(
            "the request body did not arrive within {} s (body_timeout_secs)",
            limit.as_secs_f64()
        ),
    )
    .into_response();
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// Reading a request's body failed: `body_timeout_secs` passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s (body_timeout_secs)", .0.as_secs_f64())]
struct BodyTimedOut(Duration);

/// A request's body with its deadline, counted from when the head arrived;
/// its timer is made only if the body has to be waited for.
struct Deadlined {
    body: Incoming,
    limit: Duration,
    due: Instant,
    timer: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl Deadlined {
    fn new(body: Incoming, limit: Duration, timed_out: Arc<AtomicBool>) -> Deadlined {
        Deadlined {
            body,
            limit,
            due: Instant::now() + limit,
            timer: None,
            timed_out,
        }
    }
}

impl http_body::Body for Deadlined {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|result| result.map_err(Into::into)));
        }
        let due = this.due;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        tracing::debug!(limit = ?this.limit, "a request body passed body_timeout_secs");
        this.timed_out.store(true, Ordering::Release);
        Poll::Ready(Some(Err(BodyTimedOut(this.limit).into())))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What the requests of one connection tell its I/O.
#[derive(Debug, Default)]
struct Activity {
    /// Requests being answered (their responses not yet written whole).
    in_flight: AtomicUsize,
    /// Requests answered so far.
    answered: AtomicU64,
    /// Switched to another protocol: no deadlines from here on.
    upgraded: AtomicBool,
    /// The read that was pending while a request was answered: woken when
    /// the answer is done, for the idle deadline to start.
    reader: AtomicWaker,
}

/// A request being answered, until its response body is written (or
/// dropped).
struct Busy {
    activity: Arc<Activity>,
}

impl Busy {
    fn begin(activity: Arc<Activity>) -> Busy {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy { activity }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.activity.answered.fetch_add(1, Ordering::AcqRel);
        self.activity.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.activity.reader.wake();
    }
}

/// A response body that marks its request answered once hyper is done
/// with it.
pub struct Tracked {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request's head to arrive whole.
    Head,
    /// Kept alive, waiting for the next request's first byte.
    Idle,
    /// Answering a request.
    Busy,
}

/// A connection's socket with its deadlines; holds the connection's place
/// under the cap for as long as the socket is open (through an upgrade).
pub struct Timed {
    tcp: TcpStream,
    activity: Arc<Activity>,
    limits: Limits,
    phase: Phase,
    /// `activity.answered` when the phase was last decided.
    answered: u64,
    deadline: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl Timed {
    fn new(
        tcp: TcpStream,
        permit: OwnedSemaphorePermit,
        activity: Arc<Activity>,
        limits: Limits,
    ) -> Timed {
        Timed {
            tcp,
            activity,
            limits,
            phase: Phase::Head,
            answered: 0,
            deadline: Box::pin(tokio::time::sleep(limits.header_timeout)),
            _permit: permit,
        }
    }

    /// The phase the requests say the connection is in.
    fn update_phase(&mut self) {
        if self.activity.in_flight.load(Ordering::Acquire) > 0 {
            self.phase = Phase::Busy;
            return;
        }
        let answered = self.activity.answered.load(Ordering::Acquire);
        if self.phase == Phase::Busy || answered != self.answered {
            self.answered = answered;
            self.phase = Phase::Idle;
            self.deadline
                .as_mut()
                .reset(Instant::now() + self.limits.idle_timeout);
        }
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if this.activity.upgraded.load(Ordering::Acquire) {
            return read;
        }
        this.update_phase();
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before && this.phase == Phase::Idle => {
                this.phase = Phase::Head;
                this.deadline
                    .as_mut()
                    .reset(Instant::now() + this.limits.header_timeout);
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.phase == Phase::Busy => {
                this.activity.reader.register(cx.waker());
                // Answered since the check: decide again, deadline included.
                if this.activity.in_flight.load(Ordering::Acquire) == 0 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let (what, limit) = match this.phase {
                    Phase::Idle => ("idle_timeout_secs", this.limits.idle_timeout),
                    _ => ("header_timeout_secs", this.limits.header_timeout),
                };
                tracing::debug!(
                    limit = ?limit,
                    "closing a connection: {what} passed"
                );
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what} ({} s) passed", limit.as_secs_f64()),
                )))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}
