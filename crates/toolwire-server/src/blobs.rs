//! `GET /v1/blobs/{sha256}`: the bytes of a stored image, by the SHA-256
//! its messages name (content blocks of type `image`, a tool result's
//! `images`). Both doors' messages refer to it; the page shows it.
//!
//! The bytes never change under their hash, so they are cached for good
//! (privately: the route wants the API key as every `/v1` route does);
//! the type is the one the bytes showed when stored, never guessed again
//! by a browser (`nosniff`), and a stored blob is no document a browser
//! would run anything from (its own CSP: `sandbox`).

use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use toolwire_core::image::{is_sha256_hex, sniff};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// A year, what `immutable` caches are given.
const CACHE: &str = "private, max-age=31536000, immutable";

pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    if !is_sha256_hex(&id) {
        let shown: String = id.chars().take(80).collect();
        return Err(ApiError::bad_request(format!(
            "`{shown}` is not a blob id: a blob is named by the SHA-256 of its bytes, \
             64 lowercase hex digits"
        )));
    }
    let blob = state
        .store()
        .blob(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("blob", &id))?;
    // Only what the bytes are: a type stored some other way is served as
    // bytes, never as something a browser would render.
    let media_type = sniff(&blob.bytes)
        .filter(|t| *t == blob.media_type)
        .unwrap_or("application/octet-stream");
    let etag = format!("\"{id}\"");
    let mut response = blob.bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(CACHE));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    if let Ok(etag) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, etag);
    }
    Ok(response)
}
