//! The Letta-compatible API: tools, agents and their messages, models.

pub mod agents;
pub(crate) mod api_doc;
pub mod block_view;
pub mod blocks;
pub mod context;
pub mod conversations;
pub mod mcp_servers;
pub mod messages;
pub mod models;
pub mod notifications;
pub mod page;
pub mod render;
pub mod runs;
pub mod summarize;
pub mod tools;

use axum::Router;
use axum::routing::{get, patch, post};

use crate::state::AppState;

/// The `/v1` routes Letta's SDKs call.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/tools",
            get(tools::list).post(tools::create).put(tools::upsert),
        )
        .route(
            "/v1/tools/{id}",
            get(tools::retrieve)
                .patch(tools::update)
                .delete(tools::delete),
        )
        .route("/v1/agents", get(agents::list).post(agents::create))
        .route(
            "/v1/agents/{id}",
            get(agents::retrieve)
                .patch(agents::update)
                .delete(agents::delete),
        )
        .route(
            "/v1/agents/{id}/tools/approval/{tool_name}",
            patch(agents::set_approval),
        )
        .route(
            "/v1/agents/{id}/messages",
            get(messages::list).post(messages::create),
        )
        .route("/v1/agents/{id}/messages/stream", post(messages::stream))
        .route(
            "/v1/agents/{id}/messages/async",
            post(messages::create_async),
        )
        .route("/v1/agents/{id}/messages/cancel", post(messages::cancel))
        .route("/v1/agents/{id}/notifications", post(notifications::create))
        .route("/v1/agents/{id}/summarize", post(summarize::summarize))
        .route("/v1/models", get(models::list))
        .merge(runs::routes())
        .merge(blocks::routes())
        .merge(mcp_servers::routes())
}
