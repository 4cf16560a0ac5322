//! Images a client sends in a user message, for both doors: base64
//! decoded (a text far over the size limit refused before it is decoded)
//! and stored once, by hash, through the engine. Every error names where
//! in the request the image was.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use toolwire_core::{ContentBlock, ImageError, MAX_IMAGE_BYTES};
use toolwire_engine::EngineError;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The bytes of base64 `data`, the image at `at` in the request.
pub fn decode(data: &str, at: &str) -> ApiResult<Vec<u8>> {
    // Decoded, a base64 text is three quarters of its length.
    if data.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        let e = ImageError::TooLarge {
            bytes: data.len() / 4 * 3,
            limit: MAX_IMAGE_BYTES,
        };
        return Err(ApiError::bad_request(format!("{at}: {e}")));
    }
    STANDARD
        .decode(data.trim())
        .map_err(|e| ApiError::bad_request(format!("{at}: the image's data is not base64: {e}")))
}

/// `bytes` checked (a known image type, within the size limit, matching
/// the `declared` type if any) and stored: the block a message refers to
/// it by.
pub async fn store(
    state: &AppState,
    bytes: &[u8],
    declared: Option<&str>,
    at: &str,
) -> ApiResult<ContentBlock> {
    let image = state
        .engine
        .put_image(bytes, declared)
        .await
        .map_err(|e| match e {
            EngineError::Image(e) => ApiError::bad_request(format!("{at}: {e}")),
            other => other.into(),
        })?;
    Ok(ContentBlock::Image(image))
}
