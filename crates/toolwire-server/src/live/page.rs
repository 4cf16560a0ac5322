//! The live view's web page: plain HTML, JS and CSS (no build step),
//! built into the binary and served at `/` without an API key. The page
//! itself asks for a key (kept in the browser's localStorage) when the
//! `/v1` API wants one. It speaks only PROTOCOL.md's REST and WebSocket.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::state::AppState;

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");

/// Everything from this server only: no inline script or style, no
/// framing, no form posts elsewhere. `connect-src 'self'` covers the
/// same-origin WebSocket; `img-src blob:` the stored images, fetched with
/// the API key and shown from object URLs.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// `/` (the page) and `/assets/*` (its script and style sheet).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/assets/style.css",
            get(|| async { asset(STYLE_CSS, "text/css; charset=utf-8") }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Built into the binary: a new binary may serve a new page.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::{APP_JS, INDEX_HTML, STYLE_CSS};

    /// The policy allows no inline code and nothing from elsewhere.
    #[test]
    fn the_page_keeps_to_its_content_security_policy() {
        assert!(!INDEX_HTML.contains("<script>") && !INDEX_HTML.contains("<style"));
        assert!(!INDEX_HTML.contains(" style="));
        // No inline handler (` onclick=`, …).
        let handler = INDEX_HTML.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!handler, "index.html has an inline event handler");
        for text in [INDEX_HTML, APP_JS, STYLE_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
    }

    /// Data reaches the page as text only.
    #[test]
    fn the_script_never_writes_html() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!APP_JS.contains(sink), "app.js uses {sink}");
        }
    }
}
