//! Request bodies and queries whose rejections are API errors (JSON with
//! a code and a message naming what was wrong), not axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body. An empty body reads as `{}` (Letta's SDKs send none on
/// some PATCH and POST calls).
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(status, "BODY_TOO_LARGE", "the request body is too large")
            } else {
                ApiError::new(status, "INVALID_BODY", e.body_text())
            }
        })?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(text).map(Body).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_BODY",
                format!("the request body is not valid: {e}"),
            )
        })
    }
}

/// A query string.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(query).map(Query).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_QUERY",
                format!("the query string is not valid: {e}"),
            )
        })
    }
}
