//! Streamable HTTP servers: opening a session ([`McpServer::connect`]), the
//! HTTP client rmcp uses ([`HttpClient`]: session-expiry classification,
//! errors without their URL, same-origin redirects) and how a broken event
//! stream is resumed ([`SseRetry`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ErrorCode, JsonRpcMessage, RequestId};
use rmcp::service::ClientInitializeError;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::SseRetryPolicy;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use rmcp::{ServiceError, ServiceExt};

use super::error::{error_chain, initialize_error};
use super::stdio::{STDERR_LINE_MAX, StderrTail};
use super::{Connection, McpError, McpServer, STARTUP_TIMEOUT, cut, redact_url};

/// Resumptions of a broken HTTP event stream before it counts as lost: a
/// few, spread over about 2 s, ride out a network hiccup; rmcp's default
/// (forever, doubling without bound) would hold a call to a dead server
/// until its timeout, and every call after it too. rmcp applies the same
/// limit to the session's own event stream (the GET that carries
/// `tools/list_changed` and server requests): one that gives up marks the
/// connection lost (see [`HttpShared`]) so the next use connects again.
const SSE_RETRIES: usize = 3;
const SSE_RETRY_FIRST: Duration = Duration::from_millis(250);

impl McpServer {
    /// Opens a streamable HTTP session at `url`: the MCP handshake, then
    /// the tool list (a server reconnected to may offer other tools).
    pub(super) async fn connect(&self, url: &str) -> Result<Connection, McpError> {
        let config = &self.config;
        let shown = redact_url(url);
        let connect_error =
            |detail: String, source: Option<Box<ClientInitializeError>>| McpError::Connect {
                server: config.name.clone(),
                url: shown.clone(),
                detail,
                source,
            };
        let headers = config.header_map().map_err(|problem| McpError::Config {
            server: config.name.clone(),
            problem,
        })?;
        let shared = Arc::new(HttpShared {
            server: config.name.clone(),
            url: shown.clone(),
            stream_lost: AtomicBool::new(false),
            stream_opened: AtomicBool::new(false),
            refusal: StdMutex::new(None),
        });
        let http = HttpClient::new(Arc::clone(&shared))
            .map_err(|e| connect_error(error_chain(&e.without_url()), None))?;
        let mut transport =
            StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        transport.retry_config = Arc::new(SseRetry(Arc::clone(&shared)));
        // A lost session is a new connection here (see `call`), which reads
        // the tool list again, not a new session under the old list.
        transport.reinit_on_expired_session = false;
        let transport = StreamableHttpClientTransport::with_client(http, transport);
        let (client, epoch) = self.handler();
        // On error or timeout the transport is dropped, which ends its
        // worker (and so the HTTP session).
        let client = match tokio::time::timeout(STARTUP_TIMEOUT, client.serve(transport)).await {
            Ok(Ok(client)) => client,
            Ok(Err(source)) => {
                return Err(connect_error(
                    initialize_error(&source),
                    Some(Box::new(source)),
                ));
            }
            Err(_) => {
                return Err(connect_error(
                    format!(
                        "no answer to `initialize` within {} s",
                        STARTUP_TIMEOUT.as_secs()
                    ),
                    None,
                ));
            }
        };
        self.read_tool_list(client.peer(), epoch).await?;
        Ok(Connection {
            client,
            pid: None,
            stderr: StderrTail::none(),
            http: Some(shared),
            _temp_dir: None,
        })
    }
}

/// Whether `error` says that the HTTP server does not know the session.
pub(super) fn session_expired(error: &ServiceError) -> bool {
    let ServiceError::TransportSend(error) = error else {
        return false;
    };
    matches!(
        error
            .error
            .downcast_ref::<StreamableHttpError<reqwest::Error>>(),
        Some(StreamableHttpError::SessionExpired)
    )
}

/// The HTTP client of streamable HTTP servers: rmcp's reqwest client, set
/// up as rmcp sets up its own, with these repairs:
///
/// - A server that lost a session (it restarted) should answer 404, which
///   rmcp reports as an expired session. Servers built on the TypeScript
///   SDK's examples (server-everything among them) answer 400 with a
///   JSON-RPC error, with or without the request's `id`, which rmcp hands on
///   as an answer: an error from a server that works (the session would be
///   kept, and every later call would fail the same way), or, without an
///   `id`, a message no request claims (the call would wait for its
///   timeout). An error that says so in its code and message is taken as
///   an expired session: see [`refuses_session`].
/// - Any other JSON-RPC error answering a POSTed request answers that
///   request whatever its `id` says, so that the caller gets it at once
///   (a 500 `Internal server error` with `"id": null`, say). It is not an
///   expired session: the server may have run the request.
/// - reqwest's errors lose their URL, which may hold credentials.
/// - A session event stream that rmcp gives up on marks the connection
///   lost ([`HttpShared`]).
#[derive(Clone)]
struct HttpClient {
    http: reqwest::Client,
    shared: Arc<HttpShared>,
}

/// What one HTTP connection's client tells the connection.
#[derive(Debug)]
pub(super) struct HttpShared {
    /// For logs: the server's name and redacted URL.
    server: String,
    url: String,
    /// An event stream broke and could not be resumed: the session no
    /// longer delivers notifications (or no longer exists).
    stream_lost: AtomicBool,
    /// Whether the session's first GET (its own event stream) was sent.
    stream_opened: AtomicBool,
    /// Why the server last refused the session: its own words, for the
    /// error a call ends with.
    refusal: StdMutex<Option<String>>,
}

impl HttpShared {
    fn lose_stream(&self, why: &str) {
        if !self.stream_lost.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                server = %self.server,
                "MCP server `{}` at {}: the session's event stream is lost ({why}); \
                 the next use reconnects",
                self.server,
                self.url
            );
        }
    }

    pub(super) fn stream_lost(&self) -> bool {
        self.stream_lost.load(Ordering::Relaxed)
    }

    /// `answer` is what the server answered, as `…` after "it answered".
    fn refused(&self, answer: String) {
        tracing::info!(
            server = %self.server,
            "MCP server `{}` at {} does not know the session: it answered {answer}",
            self.server,
            self.url
        );
        *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
    }

    /// What the server answered when it last refused the session.
    pub(super) fn refusal(&self) -> String {
        self.refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "nothing to say why".to_owned())
    }
}

/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 10;

impl HttpClient {
    fn new(shared: Arc<HttpShared>) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            // As rmcp's own client: a reused connection whose last response
            // was not read to the end stalls on delayed ACKs.
            .pool_max_idle_per_host(0)
            .redirect(same_origin_redirects())
            .build()?;
        Ok(HttpClient { http, shared })
    }

    /// See [`HttpClient`]. `request` is the id of the request posted (none
    /// for a notification or a response), `in_session` whether it carried
    /// a session id.
    fn answer(
        &self,
        request: Option<RequestId>,
        in_session: bool,
        response: HttpResult<StreamableHttpPostResponse>,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let Some(request) = request else {
            return response.map_err(without_url);
        };
        match response.map_err(without_url) {
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(mut error), session)) => {
                if in_session && refuses_session(error.error.code, &error.error.message) {
                    self.shared.refused(format!(
                        "`{}` (JSON-RPC error {})",
                        cut(&error.error.message, STDERR_LINE_MAX),
                        error.error.code.0
                    ));
                    return Err(StreamableHttpError::SessionExpired);
                }
                // The body of the answer to a POSTed request answers that
                // request, whatever its `id` says.
                error.id = Some(request);
                Ok(StreamableHttpPostResponse::Json(
                    JsonRpcMessage::Error(error),
                    session,
                ))
            }
            // rmcp's verdict on a 404 to a request in a session: the MCP
            // spec's answer for a session the server does not know.
            Err(StreamableHttpError::SessionExpired) => {
                self.shared.refused("HTTP 404 Not Found".to_owned());
                Err(StreamableHttpError::SessionExpired)
            }
            // A body that is not JSON-RPC: rmcp passes its text on.
            Err(StreamableHttpError::UnexpectedServerResponse(text))
                if in_session
                    && text.starts_with("HTTP 4")
                    && refuses_session(ErrorCode(-32000), &text) =>
            {
                self.shared
                    .refused(format!("`{}`", cut(&text, STDERR_LINE_MAX)));
                Err(StreamableHttpError::SessionExpired)
            }
            other => other,
        }
    }

    /// Notes what the failure of a GET means for the session's event
    /// stream (see [`HttpShared`]).
    fn got_stream(&self, first: bool, result: HttpResult<EventStream>) -> HttpResult<EventStream> {
        let result = result.map_err(without_url);
        if let Err(error) = &result {
            match error {
                // Rejected credentials: no resumption can succeed, and rmcp
                // stops the stream without asking the retry policy.
                StreamableHttpError::AuthRequired(_)
                | StreamableHttpError::InsufficientScope(_) => {
                    self.shared.lose_stream(&error.to_string());
                }
                // A server without an event stream: nothing to lose.
                StreamableHttpError::ServerDoesNotSupportSse => {}
                // The first GET comes right after a handshake that worked;
                // a server that answers it with an error (not 405) may not
                // offer a stream at all, and reconnecting for it would make
                // each use open a session.
                _ if first => tracing::warn!(
                    server = %self.shared.server,
                    "MCP server `{}` at {} refused the session's event stream ({}); \
                     changes to its tools will not be noticed",
                    self.shared.server,
                    self.shared.url,
                    error_chain(error)
                ),
                _ => tracing::debug!(
                    server = %self.shared.server,
                    "resuming the event stream failed: {}",
                    error_chain(error)
                ),
            }
        }
        result
    }

    /// Whether this GET (without a `Last-Event-Id`: the session's own
    /// stream) is the session's first.
    fn first_get(&self, last_event_id: Option<&String>) -> bool {
        last_event_id.is_none() && !self.shared.stream_opened.swap(true, Ordering::Relaxed)
    }
}

/// Whether a JSON-RPC error with `code` and `message` says that the server
/// does not know the session (and so did not run the request): the
/// TypeScript SDK's `Session not found` (-32001) and `Server not
/// initialized` (-32000, a restarted single-session server), its examples'
/// `No valid session ID provided` (-32000), the Python SDK's `Session not
/// found` (-32600). Both must say so: a server's own failure (`-32603
/// Internal server error`) may come after it ran the request, and the
/// request must not run twice.
fn refuses_session(code: ErrorCode, message: &str) -> bool {
    const CODES: [i32; 3] = [-32000, -32001, -32600];
    const SESSION_IS: [&str; 8] = [
        "not found",
        "no valid",
        "invalid",
        "unknown",
        "expired",
        "terminated",
        "required",
        "missing",
    ];
    if !CODES.contains(&code.0) {
        return false;
    }
    let message = message.to_ascii_lowercase();
    message.contains("not initialized")
        || (message.contains("session") && SESSION_IS.iter().any(|is| message.contains(is)))
}

fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

/// reqwest's error without its URL (see [`redact_url`]).
fn without_url(error: StreamableHttpError<reqwest::Error>) -> StreamableHttpError<reqwest::Error> {
    match error {
        StreamableHttpError::Client(error) => StreamableHttpError::Client(error.without_url()),
        other => other,
    }
}

/// As rmcp's own client: only 307 and 308 keep a POST's body, and another
/// origin must not get the session id and the configured headers.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

type HttpResult<T> = Result<T, StreamableHttpError<reqwest::Error>>;
type EventStream = BoxStream<'static, Result<sse_stream::Sse, SseError>>;

impl StreamableHttpClient for HttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let request = request_id(&message);
        let in_session = session_id.is_some();
        let response = self
            .http
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        self.answer(request, in_session, response)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let request = request_id(&message);
        let in_session = session_id.is_some();
        let response = self
            .http
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.answer(request, in_session, response)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<()> {
        self.http
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
            .map_err(without_url)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<EventStream> {
        let first = self.first_get(last_event_id.as_ref());
        let stream = self
            .http
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await;
        self.got_stream(first, stream)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> HttpResult<EventStream> {
        let first = self.first_get(last_event_id.as_ref());
        let stream = self
            .http
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.got_stream(first, stream)
    }
}

/// How a broken event stream of an HTTP server is resumed: see
/// [`SSE_RETRIES`]. rmcp asks it after each failed attempt (and, with 0,
/// after a stream the server closed); `None` ends the stream for good.
#[derive(Debug)]
struct SseRetry(Arc<HttpShared>);

impl SseRetryPolicy for SseRetry {
    fn retry(&self, failures: usize) -> Option<Duration> {
        if failures >= SSE_RETRIES {
            // A request's own stream or the session's: either way the
            // server is gone or has lost the session, whose notifications
            // would then be lost without a word.
            self.0
                .lose_stream(&format!("{SSE_RETRIES} attempts to resume it failed"));
            return None;
        }
        let doublings = u32::try_from(failures).unwrap_or(u32::MAX).min(8);
        Some(SSE_RETRY_FIRST.saturating_mul(1 << doublings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_error_that_says_so_means_the_session_is_unknown() {
        for (code, message) in [
            (-32000, "Bad Request: No valid session ID provided"),
            (-32001, "Session not found"),
            (-32000, "Bad Request: Server not initialized"),
            (-32600, "Session not found"),
            (-32000, "Invalid or expired session"),
        ] {
            assert!(
                refuses_session(ErrorCode(code), message),
                "{code} {message}"
            );
        }
        for (code, message) in [
            // A failure of the server's own: it may have run the request.
            (-32603, "Internal server error"),
            (-32603, "Session not found"),
            (-32000, "Bad Request: Unsupported protocol version"),
            (-32001, "Request timed out"),
            (-32602, "Invalid session name argument"),
        ] {
            assert!(
                !refuses_session(ErrorCode(code), message),
                "{code} {message}"
            );
        }
    }

    fn http_client() -> HttpClient {
        let shared = Arc::new(HttpShared {
            server: "s".into(),
            url: "http://127.0.0.1:9/mcp".into(),
            stream_lost: AtomicBool::new(false),
            stream_opened: AtomicBool::new(false),
            refusal: StdMutex::new(None),
        });
        HttpClient::new(shared).unwrap_or_else(|e| panic!("{e}"))
    }

    fn json_error(
        id: Option<i64>,
        code: i32,
        message: &str,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let error = rmcp::model::JsonRpcError {
            jsonrpc: Default::default(),
            id: id.map(rmcp::model::NumberOrString::Number),
            error: rmcp::model::ErrorData::new(ErrorCode(code), message.to_owned(), None),
        };
        Ok(StreamableHttpPostResponse::Json(
            JsonRpcMessage::Error(error),
            None,
        ))
    }

    /// What the client makes of an answer to request 7: the id the error
    /// goes to, or `None` for an expired session.
    fn answered(
        in_session: bool,
        response: HttpResult<StreamableHttpPostResponse>,
    ) -> Option<Option<i64>> {
        match http_client().answer(
            Some(rmcp::model::NumberOrString::Number(7)),
            in_session,
            response,
        ) {
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), _)) => {
                Some(error.id.map(|id| match id {
                    rmcp::model::NumberOrString::Number(n) => n,
                    rmcp::model::NumberOrString::String(_) => -1,
                }))
            }
            Err(StreamableHttpError::SessionExpired) => None,
            Ok(_) => panic!("expected an error answer"),
            Err(error) => panic!("unexpected {error}"),
        }
    }

    #[test]
    fn an_answer_refusing_the_session_is_an_expired_session_with_or_without_an_id() {
        let no_session = "Bad Request: No valid session ID provided";
        assert_eq!(answered(true, json_error(None, -32000, no_session)), None);
        assert_eq!(
            answered(true, json_error(Some(7), -32000, no_session)),
            None
        );
        // Without a session the server cannot have lost one.
        assert_eq!(
            answered(false, json_error(None, -32000, no_session)),
            Some(Some(7))
        );
        // Any other error answers the request it was posted with, at once.
        assert_eq!(
            answered(true, json_error(None, -32603, "Internal server error")),
            Some(Some(7))
        );
        assert_eq!(
            answered(true, json_error(Some(99), -32603, "boom")),
            Some(Some(7))
        );
        // A plain-text 400 about the session, as rmcp passes it on.
        let text = |text: &str| {
            Err(StreamableHttpError::UnexpectedServerResponse(
                std::borrow::Cow::Owned(text.to_owned()),
            ))
        };
        assert_eq!(
            answered(
                true,
                text("HTTP 400 Bad Request: Bad Request: No valid session ID provided")
            ),
            None
        );
        assert!(matches!(
            http_client().answer(
                Some(rmcp::model::NumberOrString::Number(7)),
                true,
                text("HTTP 500 Internal Server Error: session not found"),
            ),
            Err(StreamableHttpError::UnexpectedServerResponse(_))
        ));
    }

    #[test]
    fn a_stream_that_cannot_be_resumed_loses_the_connection() {
        let client = http_client();
        let retry = SseRetry(Arc::clone(&client.shared));
        let waits: Vec<_> = (0..SSE_RETRIES).map(|n| retry.retry(n)).collect();
        assert_eq!(
            waits,
            [250, 500, 1000].map(|ms| Some(Duration::from_millis(ms)))
        );
        assert!(!client.shared.stream_lost());
        assert_eq!(retry.retry(SSE_RETRIES), None);
        assert!(client.shared.stream_lost());
    }
}
