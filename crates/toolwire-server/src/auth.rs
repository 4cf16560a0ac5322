//! Bearer API keys. With keys configured every `/v1` request must carry
//! one (`Authorization: Bearer KEY`, or `?token=KEY` on the upgrade of a
//! conversation's socket, `/v1/conversations/{id}/ws`); without, the server only listens on loopback, so nothing off
//! the machine reaches it unchecked.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

use crate::error::ApiError;
use crate::state::AppState;

pub async fn require_key(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let keys = &state.settings.api_keys;
    if keys.is_empty() {
        return Ok(next.run(request).await);
    }
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|v| v.trim().to_owned())
        .or_else(|| websocket_token(&request));
    let refusal = match given.as_deref() {
        Some(key)
            if keys
                .iter()
                .any(|k| constant_time_eq(k.as_bytes(), key.as_bytes())) =>
        {
            return Ok(next.run(request).await);
        }
        Some(_) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "the API key is not valid",
        ),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "an API key is required: send `Authorization: Bearer KEY`",
        ),
    };
    crate::extract::drain_body(request, state.settings.body_limit).await;
    Err(refusal)
}

/// The key of a WebSocket upgrade, from its `token` query parameter: a
/// browser's WebSocket cannot send an `Authorization` header. Only an
/// upgrade of a conversation's socket (`/v1/conversations/{id}/ws`) may
/// carry it, so that keys stay out of ordinary URLs.
fn websocket_token(request: &Request) -> Option<String> {
    if !is_conversation_socket(request.uri().path()) {
        return None;
    }
    let upgrade = request
        .headers()
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    let query = request.uri().query()?;
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .ok()?
        .into_iter()
        .find_map(|(k, v)| (k == "token").then_some(v))
}

/// Whether `path` is a conversation's socket: `/v1/conversations/{id}/ws`.
fn is_conversation_socket(path: &str) -> bool {
    let path = path.strip_suffix('/').unwrap_or(path);
    matches!(
        path.split('/').collect::<Vec<_>>().as_slice(),
        ["", "v1", "conversations", id, "ws"] if !id.is_empty()
    )
}

/// Compares without leaking, through timing, how much of a key matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::{constant_time_eq, is_conversation_socket};

    #[test]
    fn only_a_conversation_socket_takes_a_query_key() {
        assert!(is_conversation_socket("/v1/conversations/abc/ws"));
        assert!(is_conversation_socket("/v1/conversations/abc/ws/"));
        assert!(!is_conversation_socket("/v1/conversations//ws"));
        assert!(!is_conversation_socket("/v1/conversations/abc/tree"));
        assert!(!is_conversation_socket("/v1/agents/abc/ws"));
        assert!(!is_conversation_socket("/v1/conversations/abc/ws/x"));
        assert!(!is_conversation_socket("/v1/conversations"));
    }

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
