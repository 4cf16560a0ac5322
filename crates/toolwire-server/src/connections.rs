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
//!
//! Stopping (once `shutdown` resolves) drains rather than drops: every
//! request whose head arrives from then on is answered 503 with
//! `Retry-After` and `Connection: close` (its body read first, so that
//! closing does not reset the connection under the answer); a request
//! being answered finishes; a kept-alive connection waiting for its next
//! request (or a new one that has sent nothing yet) gets [`DRAIN_IDLE`]
//! for one already on its way, then closes; a connection with part of a
//! request's head read keeps its head deadline.
//! Connections the kernel has accepted but this process has not yet taken
//! (at the cap, or arriving as the loop stops) are taken before the
//! listener closes and answered the same way: closing a listener resets
//! every connection left in its queue, which a client sees as a request
//! broken mid-way rather than as a refusal it can act on.

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
    /// The most of a request's body read before it is refused while
    /// stopping.
    pub body_limit: usize,
}

/// While stopping, how long a kept-alive connection with no request
/// under way, or a new one with no byte sent, is kept open for a request
/// already sent (it is answered 503); a
/// request on its way when the server stopped arrives within this on any
/// network a server is stopped on, and a client starting one later sees
/// the connection closed before it wrote, which HTTP clients retry.
pub const DRAIN_IDLE: Duration = Duration::from_millis(500);

/// Serves `app` on `listener` within `limits` until `shutdown` resolves,
/// then stops accepting and drains (see the module's words): each
/// request that arrives from then on is refused with 503, those being
/// answered finish, and it returns when every connection has closed. An
/// upgraded connection is the upgrade's to end.
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
    let draining = Arc::new(AtomicBool::new(false));
    // Dropping the receiver tells every connection (`closed()`), after
    // `draining` is set: a connection woken by it sees the flag.
    let (signal_tx, signal_rx) = watch::channel(());
    {
        let draining = draining.clone();
        tokio::spawn(async move {
            shutdown.await;
            draining.store(true, Ordering::Release);
            drop(signal_rx);
        });
    }
    // Each connection holds a receiver; all dropped: all closed.
    let (close_tx, close_rx) = watch::channel(());
    let spawn = |tcp: TcpStream, permit: Option<OwnedSemaphorePermit>| {
        tokio::spawn(connection(
            tcp,
            permit,
            app.clone(),
            limits,
            draining.clone(),
            signal_tx.clone(),
            close_rx.clone(),
        ));
    };
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
        spawn(tcp, Some(permit));
    }
    // What the kernel accepted and the loop did not take, taken now (over
    // the cap: each is answered 503 and closed at once); the listener
    // closes right after, so what connects later is refused at connect.
    for tcp in take_queued(listener) {
        spawn(tcp, None);
    }
    drop(close_rx);
    close_tx.closed().await;
}

/// The connections waiting in `listener`'s accept queue, taken without
/// waiting; then the listener is closed.
fn take_queued(listener: TcpListener) -> Vec<TcpStream> {
    let mut taken = Vec::new();
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "could not take the queued connections before closing");
            return taken;
        }
    };
    loop {
        match listener.accept() {
            Ok((tcp, _)) => {
                match tcp
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(tcp))
                {
                    Ok(tcp) => taken.push(tcp),
                    Err(e) => tracing::debug!(error = %e, "a queued connection was lost"),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) => {}
            Err(e) => {
                tracing::warn!(error = %e, "taking the queued connections before closing");
                break;
            }
        }
    }
    if !taken.is_empty() {
        tracing::debug!(
            connections = taken.len(),
            "queued connections taken to be refused"
        );
    }
    taken
}

/// One connection, served until it closes; while stopping, its requests
/// are refused (see the module's words).
async fn connection<S>(
    tcp: TcpStream,
    permit: Option<OwnedSemaphorePermit>,
    app: S,
    limits: Limits,
    draining: Arc<AtomicBool>,
    signal: watch::Sender<()>,
    close: watch::Receiver<()>,
) where
    S: tower::Service<Request, Response = Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    // TCP_NODELAY: a stream's events are small writes, and with Nagle's
    // algorithm each one after the first waited for the client's ACK,
    // which a client delays by up to 40 ms.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Timed::new(
        tcp,
        permit,
        activity.clone(),
        limits,
        draining.clone(),
    ));
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let app = app.clone();
        let busy = Busy::begin(activity.clone());
        let timed_out = Arc::new(AtomicBool::new(false));
        let request = request
            .map(|body| Body::new(Deadlined::new(body, limits.body_timeout, timed_out.clone())));
        let stopping = draining.load(Ordering::Acquire);
        async move {
            let mut response = if stopping {
                refuse_stopping(request, limits.body_limit).await
            } else {
                let Ok(response) = app.oneshot(request).await;
                response
            };
            // The handler failed reading the body (in its own words): the
            // answer says why.
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
        // Not hyper's `graceful_shutdown`: it closes a kept-alive
        // connection at once, even one with part of a request read. Polled
        // again, the connection's reads see `draining` (a kept-alive one
        // gets `DRAIN_IDLE`), and each answer from here on closes it.
        () = signal.closed() => finished(connection.await),
    }
    drop(close);
}

/// A request that arrived while stopping: 503, nothing of it kept. The
/// body is read first (up to `limit`): closing a socket with unread bytes
/// sends a reset, which can reach the client before the answer does.
async fn refuse_stopping(request: Request, limit: usize) -> Response {
    use axum::response::IntoResponse;
    let _ = axum::body::to_bytes(request.into_body(), limit).await;
    let mut response = crate::ApiError::shutting_down(
        "the server is stopping; nothing of this request was kept: send it again once it is back",
    )
    .into_response();
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
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
    /// Set once the server is stopping (shared by all connections).
    draining: Arc<AtomicBool>,
    /// This connection has seen `draining` (its idle deadline shortened).
    drained: bool,
    /// A byte has been read on this connection.
    heard: bool,
    /// `None` for a connection taken from the queue while stopping.
    _permit: Option<OwnedSemaphorePermit>,
}

impl Timed {
    fn new(
        tcp: TcpStream,
        permit: Option<OwnedSemaphorePermit>,
        activity: Arc<Activity>,
        limits: Limits,
        draining: Arc<AtomicBool>,
    ) -> Timed {
        Timed {
            tcp,
            activity,
            limits,
            phase: Phase::Head,
            answered: 0,
            deadline: Box::pin(tokio::time::sleep(limits.header_timeout)),
            draining,
            drained: false,
            heard: false,
            _permit: permit,
        }
    }

    /// How long a kept-alive connection may wait for its next request now.
    fn idle_limit(&self) -> Duration {
        if self.drained {
            self.limits.idle_timeout.min(DRAIN_IDLE)
        } else {
            self.limits.idle_timeout
        }
    }

    /// No request under way and no byte of one read.
    fn waiting_for_nothing(&self) -> bool {
        self.phase == Phase::Idle || (self.phase == Phase::Head && !self.heard)
    }

    /// The phase the requests say the connection is in.
    fn update_phase(&mut self) {
        if !self.drained && self.draining.load(Ordering::Acquire) {
            self.drained = true;
            // Idle now, or never sent a byte: what remains of its spell, at
            // most the drain's (a request on its way arrives within it; a
            // connection opened ahead of need, as browsers do, must not hold
            // the shutdown for `header_timeout`).
            if self.waiting_for_nothing() {
                let due = self.deadline.deadline().min(Instant::now() + DRAIN_IDLE);
                self.deadline.as_mut().reset(due);
            }
        }
        if self.activity.in_flight.load(Ordering::Acquire) > 0 {
            self.phase = Phase::Busy;
            return;
        }
        let answered = self.activity.answered.load(Ordering::Acquire);
        if self.phase == Phase::Busy || answered != self.answered {
            self.answered = answered;
            self.phase = Phase::Idle;
            let limit = self.idle_limit();
            self.deadline.as_mut().reset(Instant::now() + limit);
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
        this.heard |= buf.filled().len() > before;
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
                    _ if this.drained && this.waiting_for_nothing() => {
                        ("the drain", this.idle_limit())
                    }
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
