//! The live conversation view's API (the wire is `PROTOCOL.md`, beside
//! this file): conversations as trees over REST, and each conversation's
//! events, as they are stored, over a WebSocket.

pub mod approvals;
pub mod conversations;
pub mod frames;
pub mod index;
pub mod owner;
/// The web page, served at `/` without a key (its API calls carry one).
pub mod page;
pub mod socket;
pub mod tree;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post, put};

use crate::state::AppState;

/// What the live view keeps across requests and sockets.
#[derive(Default)]
pub struct Shared {
    /// Where each conversation's log and running turn stand.
    pub(crate) index: Arc<index::EventIndex>,
    /// Approvals given one call at a time, until every waiting call has one.
    pub(crate) decisions: approvals::Decisions,
}

/// The `/v1/conversations` routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/conversations",
            get(conversations::list).post(conversations::create),
        )
        .route("/v1/conversations/{id}/tree", get(conversations::tree))
        .route(
            "/v1/conversations/{id}/messages",
            get(conversations::messages).post(conversations::send),
        )
        .route(
            "/v1/conversations/{id}/messages/{mid}",
            get(conversations::message),
        )
        .route(
            "/v1/conversations/{id}/messages/{mid}/edit",
            post(conversations::edit),
        )
        .route(
            "/v1/conversations/{id}/messages/{mid}/regenerate",
            post(conversations::regenerate),
        )
        .route("/v1/conversations/{id}/fork", post(conversations::fork))
        .route(
            "/v1/conversations/{id}/active_leaf",
            put(conversations::set_active_leaf),
        )
        .route("/v1/conversations/{id}/ws", get(socket::upgrade))
}
