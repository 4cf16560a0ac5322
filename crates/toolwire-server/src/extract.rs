//! Request bodies and queries whose rejections are API errors (JSON with
//! a code and a message naming what was wrong), not axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body. An empty body reads as `{}` (Letta's SDKs send none on
/// some PATCH and POST calls). Any other body must come as JSON
/// (`application/json`, or `application/*+json`): a web page may send
/// `text/plain` (or a form) anywhere without asking, so JSON under such a
/// type is refused (415). Text with a NUL character (U+0000) is refused:
/// PostgreSQL cannot store it, and stored text must not depend on the
/// backend.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = req.headers().get(CONTENT_TYPE).cloned();
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
            check_json_type(content_type.as_ref())?;
            &bytes
        };
        if has_nul(text) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_BODY",
                "the request body is not valid: text may not contain the NUL character (\\u0000)",
            ));
        }
        // The path names the field that was wrong (`model_settings: …`).
        let mut json = serde_json::Deserializer::from_slice(text);
        serde_path_to_error::deserialize(&mut json)
            .map(Body)
            .map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                let message = if path == "." {
                    format!("the request body is not valid: {inner}")
                } else {
                    format!("the request body is not valid: {path}: {inner}")
                };
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "INVALID_BODY", message)
            })
    }
}

/// Refuses a body whose `Content-Type` is not JSON's.
fn check_json_type(content_type: Option<&HeaderValue>) -> Result<(), ApiError> {
    let given = content_type.map(|v| v.to_str().unwrap_or("(not ASCII)"));
    let essence = given
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let json = essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json") && !sub.contains('/'));
    if json {
        return Ok(());
    }
    let got = match given {
        Some(v) => format!("`{}`", v.chars().take(100).collect::<String>()),
        None => "no Content-Type".to_owned(),
    };
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UNSUPPORTED_MEDIA_TYPE",
        format!(
            "the request body must be sent as `Content-Type: application/json` (got {got}): \
             JSON under another type is refused, as a web page can send that to any server \
             without asking"
        ),
    ))
}

/// Whether the JSON `text` has a string (or key) with U+0000 in it. JSON
/// can only write it as the escape `\u0000`, so only a body with that
/// escape is parsed to look closer (`\\u0000` is a backslash and "u0000").
fn has_nul(text: &[u8]) -> bool {
    fn walk(value: &serde_json::Value) -> bool {
        use serde_json::Value;
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(walk),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || walk(v)),
            _ => false,
        }
    }
    text.windows(6).any(|w| w == b"\\u0000")
        && serde_json::from_slice::<serde_json::Value>(text).is_ok_and(|v| walk(&v))
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

/// Reads and drops a refused request's body: an unread body left on the
/// connection makes hyper close it, and a client that reuses it (Letta's
/// SDKs do) then fails its next request.
pub(crate) async fn drain_body(request: axum::extract::Request, limit: usize) {
    let _ = axum::body::to_bytes(request.into_body(), limit).await;
}
