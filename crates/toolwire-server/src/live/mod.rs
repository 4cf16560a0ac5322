//! The live conversation view's API (the wire is `PROTOCOL.md`, beside
//! this file): conversations as trees over REST, and each conversation's
//! events, as they are stored, over a WebSocket.

pub mod compact;
pub mod conversations;
pub mod frames;
/// The web page, served at `/` without a key (its API calls carry one).
pub mod page;
pub mod socket;
pub mod tree;

use axum::Router;
use axum::routing::{get, post, put};

use crate::state::AppState;

/// The `/v1/conversations` routes.
pub fn routes() -> Router<AppState> {
    // `/v1/conversations` and `…/{id}/messages` are shared with Letta's
    // conversations API: `crate::conversations` routes them here by shape.
    Router::new()
        .route("/v1/conversations/{id}/tree", get(conversations::tree))
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
        .route(
            "/v1/conversations/{id}/model",
            get(conversations::model).put(conversations::set_model),
        )
        .route("/v1/conversations/{id}/fork", post(conversations::fork))
        .route("/v1/conversations/{id}/compact", post(compact::compact))
        .route(
            "/v1/conversations/{id}/active_leaf",
            put(conversations::set_active_leaf),
        )
        .route("/v1/conversations/{id}/ws", get(socket::upgrade))
}
