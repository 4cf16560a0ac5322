//! HTTP for providers: retries before the first byte, then the body as a
//! stream through a `toolwire-stream` decoder, within bounds a faulty or
//! hostile model server cannot stretch: how long to wait for the first
//! byte and between bytes, how long a `Retry-After` may ask for, how many
//! bytes one response may bring, and what a body must look like to be
//! decoded. URLs in errors and logs are shown redacted.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde::Serialize;
use toolwire_stream::{Decoder, StreamEvent};

use crate::retry_after::{self, RetryAfter};
use crate::{EventStream, ProviderError};
use toolwire_core::redact::{redact_in, redact_url};

/// When and how often to try again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Tries after the first.
    pub max_retries: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured; a server asking for more ends
    /// the step with an error at once rather than holding the turn.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// Exponential backoff with full jitter: a random wait up to
    /// `base × 2^attempt`, capped, so many clients do not retry in step.
    fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(attempt))
            .min(self.max_delay);
        ceiling.mul_f64(jitter())
    }
}

/// A number in [0.5, 1): half fixed, half random.
fn jitter() -> f64 {
    0.5 + fastrand::f64() / 2.0
}

/// How long a model server may keep a step waiting, and how much it may
/// send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamLimits {
    /// From sending the request to the response headers and the first
    /// body byte.
    pub first_byte_timeout: Duration,
    /// Between two reads of the body once it flows.
    pub idle_timeout: Duration,
    /// Bytes of one response body (SSE framing, keep-alive comments and
    /// all): bounds a stream that never ends even when it carries nothing
    /// the step keeps.
    pub max_body_bytes: u64,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            // Headers come in seconds, but a reasoning model behind chat
            // completions may send its first body byte only once it has
            // thought, minutes later: the same bound as silence mid-stream.
            first_byte_timeout: Duration::from_secs(300),
            // codex's stream_idle_timeout_ms default (300 000): reasoning
            // models may think silently for minutes.
            idle_timeout: Duration::from_secs(300),
            max_body_bytes: 256 * 1024 * 1024,
        }
    }
}

/// Where and how a provider talks HTTP. Its `Debug` shows the URL
/// redacted and never the key.
#[derive(Clone)]
pub struct HttpSettings {
    pub base_url: String,
    pub api_key: Option<String>,
    pub retry: RetryPolicy,
    /// Headers besides content type and auth.
    pub headers: Vec<(String, String)>,
    pub limits: StreamLimits,
    /// The output token limit sent with every request (`max_tokens`,
    /// `max_completion_tokens`): a model that does not stop is stopped by
    /// its server.
    pub max_tokens: u32,
}

/// How a provider's API takes its key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyHeader {
    /// `Authorization: Bearer KEY` (OpenAI and the servers that copy it).
    Bearer,
    /// The key as the value of this header (Anthropic's `x-api-key`).
    Named(&'static str),
}

impl HttpSettings {
    /// A POST to `url` carrying the key (as `key` says), the configured
    /// headers and the JSON content type: what every HTTP provider sends.
    pub(crate) fn post(
        &self,
        client: &reqwest::Client,
        url: &str,
        key: KeyHeader,
    ) -> reqwest::RequestBuilder {
        let mut req = client.post(url);
        if let Some(k) = &self.api_key {
            req = match key {
                KeyHeader::Bearer => req.bearer_auth(k),
                KeyHeader::Named(name) => req.header(name, k),
            };
        }
        for (name, value) in &self.headers {
            req = req.header(name, value);
        }
        // What reqwest's `json` did: a configured content type wins.
        if !self
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        {
            req = req.header(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/json"),
            );
        }
        req
    }
}

impl std::fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSettings")
            .field("base_url", &redact_url(&self.base_url))
            .field("api_key", &self.api_key.as_ref().map(|_| "(set)"))
            .field("retry", &self.retry)
            .field(
                "headers",
                &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("limits", &self.limits)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

/// The `max_tokens` sent when none is configured: Anthropic's own
/// examples' value, enough for long code edits, and what a 4k-context
/// local model needs lowered (see docs/configuration.md).
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// `base` with `path` appended to its path, its query kept (a base URL
/// may carry one, as Azure's `?api-version=` does).
pub(crate) fn endpoint(base: &str, path: &str) -> String {
    match reqwest::Url::parse(base) {
        Ok(mut url) => {
            let joined = format!("{}/{}", url.path().trim_end_matches('/'), path);
            url.set_path(&joined);
            url.to_string()
        }
        Err(_) => format!("{}/{path}", base.trim_end_matches('/')),
    }
}

/// `body` as the JSON bytes sent.
pub(crate) fn encode(body: &impl Serialize) -> Result<Vec<u8>, ProviderError> {
    serde_json::to_vec(body).map_err(|e| ProviderError::Encode(e.to_string()))
}

/// Posts `body` (JSON bytes) to `url`, retrying connect errors, 429 (after its
/// Retry-After, if it is within the policy's cap) and 5xx, then streams the
/// response through `decoder`.
pub(crate) async fn post_stream(
    url: &str,
    request: impl Fn() -> reqwest::RequestBuilder,
    body: Vec<u8>,
    retry: RetryPolicy,
    limits: StreamLimits,
    decoder: Box<dyn Decoder + Send>,
) -> Result<EventStream, ProviderError> {
    let shown = redact_url(url);
    // Shared by the attempts without a copy.
    let body = bytes::Bytes::from(body);
    let mut attempt = 0;
    let (response, deadline) = loop {
        let deadline = tokio::time::Instant::now() + limits.first_byte_timeout;
        let outcome =
            match tokio::time::timeout_at(deadline, request().body(body.clone()).send()).await {
                Ok(outcome) => outcome,
                // Not retried: the server is there and may be running (and
                // billing) the request already.
                Err(_) => {
                    return Err(ProviderError::FirstByteTimeout {
                        url: shown,
                        secs: limits.first_byte_timeout.as_secs_f64(),
                    });
                }
            };
        let wait = match outcome {
            Ok(resp) if resp.status().is_success() => break (resp, deadline),
            Ok(resp) => {
                let status = resp.status();
                let asked = retry_after(&resp);
                let text = bounded_text(resp, 64 * 1024).await;
                let error = ProviderError::Http {
                    url: shown.clone(),
                    status: status.as_u16(),
                    body: truncate(&redact_in(&text, url), 500),
                };
                if !(status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error())
                    || attempt >= retry.max_retries
                {
                    return Err(error);
                }
                let wait = match asked {
                    Some(RetryAfter::Wait(wait)) if wait > retry.max_retry_after => {
                        return Err(ProviderError::RetryAfterTooLong {
                            url: shown,
                            status: status.as_u16(),
                            asked: retry_after::describe(wait),
                            limit_secs: retry.max_retry_after.as_secs_f64(),
                        });
                    }
                    Some(RetryAfter::Wait(wait)) => wait,
                    Some(RetryAfter::Unreadable) | None => retry.backoff(attempt),
                };
                tracing::warn!(url = %shown, status = status.as_u16(), attempt, wait_ms = wait.as_millis() as u64, "provider busy; retrying");
                wait
            }
            Err(e) => {
                let connect = e.is_connect();
                let error = ProviderError::Connect {
                    url: shown.clone(),
                    message: redact_in(&error_chain(&e.without_url()), url),
                };
                if attempt >= retry.max_retries || !connect {
                    return Err(error);
                }
                tracing::warn!(url = %shown, attempt, error = %error, "provider unreachable; retrying");
                retry.backoff(attempt)
            }
        };
        tokio::time::sleep(wait).await;
        attempt += 1;
    };
    Ok(decode_body(response, decoder, shown, limits, deadline))
}

/// At most `max` bytes of an error body, as text: an error page that never
/// ends must not hold the step.
async fn bounded_text(resp: reqwest::Response, max: usize) -> String {
    let mut body = resp.bytes_stream();
    let mut out = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = body.next().await {
            let room = max.saturating_sub(out.len());
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if out.len() >= max {
                break;
            }
        }
    };
    // An error body that stalls is cut, not waited for.
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The response body, chunk by chunk, through `decoder`: the first byte by
/// `first_byte_by`, then no pause longer than the idle timeout and no more
/// than the body limit. The first bytes must look like an event stream or
/// a JSON body. A body that breaks, stalls or overflows ends the stream
/// with an error after the events already decoded.
fn decode_body(
    response: reqwest::Response,
    decoder: Box<dyn Decoder + Send>,
    url: String,
    limits: StreamLimits,
    first_byte_by: tokio::time::Instant,
) -> EventStream {
    struct State {
        body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
        decoder: Box<dyn Decoder + Send>,
        content_type: Option<String>,
        url: String,
        limits: StreamLimits,
        first_byte_by: tokio::time::Instant,
        received: u64,
        done: bool,
    }
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let state = State {
        body: response.bytes_stream().boxed(),
        decoder,
        content_type,
        url,
        limits,
        first_byte_by,
        received: 0,
        done: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let next = if s.received == 0 {
            tokio::time::timeout_at(s.first_byte_by, s.body.next()).await
        } else {
            tokio::time::timeout(s.limits.idle_timeout, s.body.next()).await
        };
        let batch: Vec<Result<StreamEvent, ProviderError>> = match next {
            Ok(Some(Ok(bytes))) => {
                let first = s.received == 0;
                s.received += bytes.len() as u64;
                if first && let Err(e) = check_start(s.content_type.as_deref(), &bytes, &s.url) {
                    s.done = true;
                    vec![Err(e)]
                } else if s.received > s.limits.max_body_bytes {
                    s.done = true;
                    vec![Err(ProviderError::TooLarge {
                        limit: s.limits.max_body_bytes,
                    })]
                } else {
                    let events = s.decoder.feed(&bytes).into_iter().map(Ok).collect();
                    if s.decoder.ended() {
                        // Every event is out: the stream ends here, not
                        // when the body does (the turn stores a step's last
                        // events with its message when it sees the end).
                        s.done = true;
                        let left = s.limits.max_body_bytes.saturating_sub(s.received);
                        drain(
                            std::mem::replace(&mut s.body, futures::stream::empty().boxed()),
                            s.limits.idle_timeout,
                            left,
                        );
                    }
                    events
                }
            }
            Ok(Some(Err(e))) => {
                s.done = true;
                vec![Err(ProviderError::Broken {
                    received: s.received,
                    message: error_chain(&e.without_url()),
                })]
            }
            Ok(None) => {
                s.done = true;
                s.decoder.finish().into_iter().map(Ok).collect()
            }
            Err(_) if s.received == 0 => {
                s.done = true;
                vec![Err(ProviderError::FirstByteTimeout {
                    url: s.url.clone(),
                    secs: s.limits.first_byte_timeout.as_secs_f64(),
                })]
            }
            Err(_) => {
                s.done = true;
                vec![Err(ProviderError::Stalled {
                    received: s.received,
                    secs: s.limits.idle_timeout.as_secs_f64(),
                })]
            }
        };
        Some((futures::stream::iter(batch), s))
    })
    .flatten()
    .boxed()
}

/// Reads the rest of a body whose stream said it was over (a chunked
/// body's last chunk, a few bytes), in the background, so that its
/// connection goes back to the pool rather than being closed; gives up
/// after `idle` without a byte or past `max` bytes.
fn drain(
    mut body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    idle: Duration,
    mut max: u64,
) {
    tokio::spawn(async move {
        while let Ok(Some(Ok(bytes))) = tokio::time::timeout(idle, body.next()).await {
            max = max.saturating_sub(bytes.len() as u64);
            if max == 0 {
                break;
            }
        }
    });
}

/// Whether a 200's body can be what was asked for: an event stream, or
/// the plain JSON body some servers send instead. Decided by the content
/// type when it says so, else by the first bytes: an HTML error page from
/// a proxy or a captive portal must be an error, not an empty answer.
fn check_start(content_type: Option<&str>, first: &[u8], url: &str) -> Result<(), ProviderError> {
    let ct = content_type.unwrap_or("").to_ascii_lowercase();
    let media = ct.split(';').next().unwrap_or("").trim();
    let declared_ok = media == "text/event-stream"
        || media == "application/json"
        || media.ends_with("+json")
        || media == "application/x-ndjson";
    let declared_bad = media.contains("html") || media.contains("xml");
    let start = first.trim_ascii_start();
    let looks_ok = start.is_empty()
        || start.starts_with(b"{")
        || [&b"data:"[..], b"event:", b"id:", b"retry:", b":"]
            .iter()
            .any(|field| start.starts_with(field));
    if declared_ok || (!declared_bad && looks_ok) {
        return Ok(());
    }
    Err(ProviderError::NotAStream {
        url: url.to_owned(),
        content_type: content_type.unwrap_or("none").to_owned(),
        start: sanitized_start(first, 200),
    })
}

/// The first `max` characters of `bytes` as one line of printable text.
fn sanitized_start(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(max * 4)]);
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate(line.trim(), max)
}

/// Retry-After, if the response has one.
fn retry_after(resp: &reqwest::Response) -> Option<RetryAfter> {
    let value = resp.headers().get(reqwest::header::RETRY_AFTER)?;
    Some(match value.to_str() {
        Ok(v) => retry_after::parse(v, chrono::Utc::now()),
        Err(_) => RetryAfter::Unreadable,
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        for attempt in 0..10 {
            let d = p.backoff(attempt);
            let ceiling = (p.base_delay * 2u32.pow(attempt.min(16))).min(p.max_delay);
            assert!(d >= ceiling / 2 && d <= ceiling, "{attempt}: {d:?}");
        }
    }

    #[test]
    fn event_streams_and_json_bodies_pass_html_does_not() {
        let url = "http://127.0.0.1:1/v1";
        assert!(check_start(Some("text/event-stream"), b"data: {}", url).is_ok());
        assert!(check_start(Some("application/json"), b"{\"id\":1}", url).is_ok());
        // No content type, or a wrong one: the first bytes decide.
        assert!(check_start(None, b"\n\ndata: {}", url).is_ok());
        assert!(check_start(Some("text/plain"), b": keep-alive\n", url).is_ok());
        let html = b"<!DOCTYPE html>\n<html><body>Bad gateway</body></html>";
        let err = check_start(Some("text/html; charset=utf-8"), html, url).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("text/html") && text.contains("<!DOCTYPE html> <html>"),
            "{text}"
        );
        assert!(check_start(None, html, url).is_err());
    }

    #[test]
    fn endpoints_keep_the_base_query() {
        assert_eq!(
            endpoint("https://h.example/v1/", "chat/completions"),
            "https://h.example/v1/chat/completions"
        );
        assert_eq!(
            endpoint("https://h.example/openai?api-version=1", "chat/completions"),
            "https://h.example/openai/chat/completions?api-version=1"
        );
        assert_eq!(
            endpoint("https://api.anthropic.com", "v1/messages"),
            "https://api.anthropic.com/v1/messages"
        );
    }

    #[test]
    fn settings_debug_shows_no_credentials() {
        let settings = HttpSettings {
            base_url: "https://me:pw@llm.example/v1?key=k3y".into(),
            api_key: Some("sk-secret".into()),
            retry: RetryPolicy::default(),
            headers: vec![("x-api-key".into(), "hdr-secret".into())],
            limits: StreamLimits::default(),
            max_tokens: DEFAULT_MAX_TOKENS,
        };
        let shown = format!("{settings:?}");
        for secret in ["pw", "k3y", "sk-secret", "hdr-secret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }

    #[test]
    fn the_start_shown_is_bounded_and_printable() {
        let shown = sanitized_start(&[b'a'; 10_000], 200);
        assert_eq!(shown.chars().count(), 201); // 200 and the ellipsis
        assert_eq!(sanitized_start(b"a\x1b[31mb\r\nc", 200), "a [31mb  c");
    }
}
