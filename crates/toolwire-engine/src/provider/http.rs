//! HTTP for providers: retries before the first byte, then the body as a
//! stream through a `toolwire-stream` decoder.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;
use toolwire_stream::{Decoder, StreamEvent};

use super::{EventStream, ProviderError};

/// When and how often to try again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Tries after the first.
    pub max_retries: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
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

/// Where and how a provider talks HTTP.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub base_url: String,
    pub api_key: Option<String>,
    pub retry: RetryPolicy,
    /// Headers besides content type and auth.
    pub headers: Vec<(String, String)>,
}

/// Posts `body` to `url`, retrying connect errors, 429 (after its
/// Retry-After) and 5xx, then streams the response through `decoder`.
pub(crate) async fn post_stream(
    url: &str,
    request: impl Fn() -> reqwest::RequestBuilder,
    body: &Value,
    retry: RetryPolicy,
    decoder: Box<dyn Decoder + Send>,
) -> Result<EventStream, ProviderError> {
    let mut attempt = 0;
    let response = loop {
        let outcome = request().json(body).send().await;
        let wait = match outcome {
            Ok(resp) if resp.status().is_success() => break resp,
            Ok(resp) => {
                let status = resp.status();
                let retry_after = retry_after(&resp);
                let text = resp.text().await.unwrap_or_default();
                let error = ProviderError::Http {
                    url: url.to_owned(),
                    status: status.as_u16(),
                    body: truncate(&text, 500),
                };
                if !(status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error())
                    || attempt >= retry.max_retries
                {
                    return Err(error);
                }
                tracing::warn!(%url, status = status.as_u16(), attempt, "provider busy; retrying");
                retry_after.unwrap_or_else(|| retry.backoff(attempt))
            }
            Err(e) => {
                let error = ProviderError::Connect {
                    url: url.to_owned(),
                    message: error_chain(&e),
                };
                if attempt >= retry.max_retries || !(e.is_connect() || e.is_timeout()) {
                    return Err(error);
                }
                tracing::warn!(%url, attempt, error = %error, "provider unreachable; retrying");
                retry.backoff(attempt)
            }
        };
        tokio::time::sleep(wait.min(retry.max_delay)).await;
        attempt += 1;
    };
    Ok(decode_body(response, decoder))
}

/// The response body, chunk by chunk, through `decoder`. A body that
/// breaks ends the stream with [`ProviderError::Broken`] after the events
/// already decoded.
fn decode_body(response: reqwest::Response, decoder: Box<dyn Decoder + Send>) -> EventStream {
    struct State {
        body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
        decoder: Box<dyn Decoder + Send>,
        received: u64,
        done: bool,
    }
    let state = State {
        body: response.bytes_stream().boxed(),
        decoder,
        received: 0,
        done: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let batch: Vec<Result<StreamEvent, ProviderError>> = match s.body.next().await {
            Some(Ok(bytes)) => {
                s.received += bytes.len() as u64;
                s.decoder.feed(&bytes).into_iter().map(Ok).collect()
            }
            Some(Err(e)) => {
                s.done = true;
                vec![Err(ProviderError::Broken {
                    received: s.received,
                    message: error_chain(&e),
                })]
            }
            None => {
                s.done = true;
                s.decoder.finish().into_iter().map(Ok).collect()
            }
        };
        Some((futures::stream::iter(batch), s))
    })
    .flatten()
    .boxed()
}

/// Retry-After in seconds (the HTTP-date form is rare from APIs).
fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let value = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0)
        .map(Duration::from_secs_f64)
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
}
