//! # toolwire-server
//!
//! **Owns** the HTTP front door of `toolwire serve`: the Letta-compatible
//! `/v1` API (tools, agents, messages over JSON and SSE, approvals and
//! client-side tools), the live conversation view's API ([`live`]:
//! conversation trees over REST, each conversation's events and its
//! turn's control over a WebSocket, as `src/live/PROTOCOL.md` says), its
//! stored images by hash (`/v1/blobs/{sha256}`), its OpenAPI document,
//! API keys, browser origin safety ([`origin`]), and the
//! server's life (bind, serve within connection limits, graceful
//! shutdown).
//!
//! Agent and tool records, and the turn options derived from them, are
//! [`agents`], which both doors render from.
//!
//! **Invariants.** Letta's JSON shapes are built here and only here, from
//! core types; the engine never sees them. Handlers read the store and
//! change nothing in it but through the engine. A request that cannot be served
//! gets a JSON error with a status, a code and a message before any byte
//! of a stream; nothing a request does can lose stored data. Without API
//! keys the server refuses to listen beyond loopback. No request reaches a
//! route unless its `Host` names this server, and none changes state or
//! opens a socket from a web page other than the server's own (or a
//! configured one).
//!
//! **Entry points.** [`router`], [`serve`], [`AppState`], [`ServerSettings`].

pub mod agents;
mod auth;
mod blobs;
mod connections;
mod conversations;
mod decisions;
pub mod error;
mod event_index;
mod extract;
mod images;
pub mod letta;
pub mod live;
mod mcp_connections;
mod openapi;
pub mod origin;
mod state;
mod tools_memo;

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::{Request, State};
use axum::routing::get;
use tower::Layer;
use tower_http::normalize_path::NormalizePathLayer;

pub use error::{ApiError, ApiResult};
pub use state::{AppState, ServerSettings};

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0} without API keys: set api_keys in the config \
         (or listen on 127.0.0.1)"
    )]
    Unprotected(SocketAddr),
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Policy(#[from] origin::PolicyError),
}

/// Every route, with API keys checked on `/v1` and JSON errors for
/// unknown routes.
pub fn router(state: AppState) -> Router {
    let v1 = letta::routes()
        .merge(live::routes())
        .merge(conversations::routes())
        .route("/v1/blobs/{sha256}", get(blobs::get))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    Router::new()
        .merge(v1)
        .merge(live::page::routes())
        .route("/openapi.json", get(openapi::document))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(
            state.settings.body_limit,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(state)
}

/// The span of a request: its method and path, never its query (a
/// socket's `?token=` key must not reach the logs).
fn request_span(request: &Request) -> tracing::Span {
    tracing::debug_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        version = ?request.version(),
    )
}

async fn not_found(State(state): State<AppState>, request: Request) -> ApiError {
    let error = ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!("no route for {} {}", request.method(), request.uri().path()),
    );
    extract::drain_body(request, state.settings.body_limit).await;
    error
}

/// Serves `state` on `listener` until `shutdown` resolves, then stops the
/// engine's turns (see [`toolwire_engine::Engine::shutdown`], bounded by
/// `shutdown_grace`) before it stops serving. Without API keys only a
/// loopback address is accepted.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener.local_addr()?;
    let settings = &state.settings;
    let policy = checked(addr, settings)?;
    let limits = connections::Limits {
        max_connections: settings.max_connections,
        header_timeout: settings.header_timeout,
        body_timeout: settings.body_timeout,
        idle_timeout: settings.idle_timeout,
        body_limit: settings.body_limit,
    };
    if let Err(e) = agents::index_owners(&state).await {
        tracing::warn!(error = %e.message, "indexing the agents' conversations");
    }
    if let Err(e) = agents::upgrade_blocks(&state).await {
        tracing::warn!(error = %e.message, "making the agents' memory blocks into records");
    }
    agents::approvals::arm_all(&state).await;
    agents::mcp::reconnect_all(&state).await;
    // When `shutdown` fires the engine takes no new turn (each door answers
    // 503 with Retry-After) and running turns get the grace to reach their
    // next stored step, after which what runs is cut and stored as
    // interrupted; their streams end with that. Only then do the open
    // streams and sockets end and the listener close, so that a client
    // sending meanwhile hears 503, not a refused connection.
    let token = state.shutdown.clone();
    let engine = state.engine.clone();
    let grace = state.settings.shutdown_grace;
    let shutdown = async move {
        shutdown.await;
        let report = engine.shutdown(grace).await;
        tracing::info!(
            running = report.running,
            cut = report.cut,
            left = report.left,
            "turns stopped for shutdown"
        );
        token.cancel();
    };
    // Hosts and origins are checked before anything else, the page and
    // unknown routes included.
    let app = router(state).layer(axum::middleware::from_fn_with_state(
        std::sync::Arc::new(policy),
        origin::guard,
    ));
    // Trailing slashes are trimmed before routing (`/v1/agents/` is
    // `/v1/agents`), as Letta's SDKs send some paths with one.
    let app = NormalizePathLayer::trim_trailing_slash().layer(app);
    connections::serve(listener, app, limits, shutdown).await;
    Ok(())
}

/// Binds `addr`, refusing a non-loopback one when no key protects it (and
/// settings whose allowed hosts or origins are not valid).
pub async fn bind(
    addr: SocketAddr,
    settings: &ServerSettings,
) -> Result<tokio::net::TcpListener, ServeError> {
    checked(addr, settings)?;
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// The browser policy for serving on `addr` with `settings`; refuses a
/// non-loopback address no key protects. `bind` asks first, to fail before
/// binding; `serve` asks again for the address actually bound (port 0).
fn checked(addr: SocketAddr, settings: &ServerSettings) -> Result<origin::Policy, ServeError> {
    if settings.api_keys.is_empty() && !addr.ip().is_loopback() {
        return Err(ServeError::Unprotected(addr));
    }
    Ok(origin::Policy::new(
        addr,
        &settings.allowed_hosts,
        &settings.allowed_origins,
    )?)
}
