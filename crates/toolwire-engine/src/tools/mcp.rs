//! MCP tools: the tools of Model Context Protocol servers, shown to the
//! model as `{server}__{tool}`. A server is either a child process spoken to
//! over stdio (`command`) or an endpoint spoken to over streamable HTTP
//! (`url`, with optional `headers` such as `Authorization`); both use the
//! `rmcp` client. The deprecated HTTP+SSE transport is not supported.
//!
//! An [`McpServer`] is a [`ToolSource`]: its tool list is read when it
//! connects (again on every restart or reconnection) and whenever the
//! server sends `notifications/tools/list_changed`, and a registry holding
//! the server shows the model the list as it is now.
//!
//! A server that dies or cannot be reached is not fatal: a call that was
//! running when it died fails with an error naming the server (and its URL
//! for HTTP, without credentials or query: see [`redact_url`]), and the next
//! call starts it again (spawn or connect, initialize, list) before running.
//! A stdio server that dies while idle is noticed and restarted by the next
//! call. An HTTP session's event stream that breaks and cannot be resumed
//! counts as a lost connection too, so the next call connects again instead
//! of using a session whose notifications no longer arrive. A server that
//! refuses the session (HTTP 404, or an error saying it does not know the
//! session: it restarted) did not run the request, which then runs once in a
//! new session; any other failure of a `tools/call` is reported, never sent
//! again, as the server may have run it. A call to a server that is gone
//! fails, and the call after it connects again. Failures in a row back off
//! (see [`Backoff`]) so a server that cannot start is not spawned (or
//! dialled) again by every call. Servers that cannot start at all are
//! reported as warnings by [`connect_all`] and the engine runs without their
//! tools.
//!
//! Every call carries a progress token (rmcp puts one in each request's
//! `_meta`); the server's `notifications/progress` for it become the call's
//! progress, as text like `3/5 (60%): message`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientJsonRpcMessage,
    ClientRequest, ContentBlock, ErrorCode, Implementation, JsonRpcMessage,
    ProgressNotificationParam, ProgressToken, RequestId, ResourceContents, ServerResult,
};
use rmcp::service::{
    ClientInitializeError, NotificationContext, PeerRequestOptions, RunningService,
};
use rmcp::transport::common::client_side_sse::SseRetryPolicy;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use rmcp::transport::{DynamicTransportError, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::tools::{
    ProgressHandle, Tool, ToolContext, ToolError, ToolOutput, ToolSource, ToolSpec,
};

/// How long one tool call may run when the config does not say: long enough
/// for real work (builds, searches), short enough that a hung server does not
/// hold a turn forever.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Spawn + `initialize` (+ listing tools). Generous because `npx -y …`
/// downloads the server on first use.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The wait after the first failure that backs off; it doubles with each
/// further failure in a row.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two starts of a failing server: a server fixed
/// while toolwire runs is picked up within a minute.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// OpenAI (and others) accept tool names matching `^[a-zA-Z0-9_-]{1,64}$`.
const MAX_NAME_LEN: usize = 64;
/// Lines of the server's stderr kept to explain why it died.
const STDERR_TAIL_LINES: usize = 10;
/// A kept stderr line is cut here so a chatty server cannot bloat errors.
const STDERR_LINE_MAX: usize = 400;
/// How long an error waits for the rest of a dead server's stderr.
const STDERR_SETTLE: Duration = Duration::from_millis(500);
/// Resumptions of a broken HTTP event stream before it counts as lost: a
/// few, spread over about 2 s, ride out a network hiccup; rmcp's default
/// (forever, doubling without bound) would hold a call to a dead server
/// until its timeout, and every call after it too. rmcp applies the same
/// limit to the session's own event stream (the GET that carries
/// `tools/list_changed` and server requests): one that gives up marks the
/// connection lost (see [`HttpShared`]) so the next use connects again.
const SSE_RETRIES: usize = 3;
const SSE_RETRY_FIRST: Duration = Duration::from_millis(250);
/// Headers rmcp sets itself on every request (and rejects as custom
/// headers, failing each request): refused at validation instead.
const RESERVED_HEADERS: [&str; 3] = ["Accept", "Mcp-Session-Id", "Last-Event-Id"];
/// Progress notifications kept for a token no call has claimed yet.
const EARLY_PROGRESS_KEPT: usize = 16;

/// One MCP server from the config: `[mcp_servers.NAME]` with either
/// `command`, `args` and `env` (added to toolwire's own environment) for a
/// stdio server, or `url` and `headers` for a streamable HTTP server. See
/// [`McpServerConfig::validate`] for what is rejected. `Debug` shows the
/// names of `headers` and `env` but not their values, and the URL without
/// credentials or query (all often secrets).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of the server's tool names; in TOML it is the table's key.
    #[serde(default)]
    pub name: String,
    /// The program of a stdio server.
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The endpoint of a streamable HTTP server (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// Sent with every request to `url`, e.g. `Authorization`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Seconds one tool call may take [default: 120].
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl std::fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &Redacted(&self.env))
            .field("url", &self.url.as_deref().map(redact_url))
            .field("headers", &Redacted(&self.headers))
            .field("timeout_secs", &self.timeout_secs)
            .finish()
    }
}

/// A map shown with its keys only.
struct Redacted<'a>(&'a BTreeMap<String, String>);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|key| (key, "<redacted>")))
            .finish()
    }
}

/// `url` as it may be shown: scheme, host, port and path, without user
/// name, password, query or fragment, which often carry credentials
/// (`?key=…`). Errors and warnings that name an HTTP server end up in
/// logs, tool results (so the model and the database) and editors.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            // Both fail only for URLs that cannot have credentials at all.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.set_query(None);
            parsed.set_fragment(None);
            parsed.to_string()
        }
        Err(_) => "(not a URL)".to_owned(),
    }
}

/// How a configured server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint<'a> {
    Stdio { command: &'a str },
    Http { url: &'a str },
}

impl McpServerConfig {
    /// A stdio server running `command` (no arguments yet).
    pub fn stdio(name: impl Into<String>, command: impl Into<String>) -> Self {
        McpServerConfig {
            name: name.into(),
            command: Some(command.into()),
            ..Default::default()
        }
    }

    /// A streamable HTTP server at `url` (no headers yet).
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        McpServerConfig {
            name: name.into(),
            url: Some(url.into()),
            ..Default::default()
        }
    }

    /// Checks that the config names exactly one way to reach the server
    /// (`command` or `url`), that the fields of the other way are not set
    /// (they would be silently ignored), and that the URL and headers can
    /// be sent. The error names the server.
    pub fn validate(&self) -> Result<(), McpError> {
        self.endpoint().map(|_| ())
    }

    fn endpoint(&self) -> Result<Endpoint<'_>, McpError> {
        let problem = |problem: String| McpError::Config {
            server: self.name.clone(),
            problem,
        };
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => Err(problem(
                "give either `command` (a stdio server) or `url` (a streamable HTTP \
                 server), not both"
                    .into(),
            )),
            (None, None) => Err(problem(
                "give `command` (a stdio server) or `url` (a streamable HTTP server)".into(),
            )),
            (Some(command), None) => {
                if !self.headers.is_empty() {
                    return Err(problem(
                        "`headers` are for `url` servers; a `command` server gets `env`".into(),
                    ));
                }
                Ok(Endpoint::Stdio { command })
            }
            (None, Some(url)) => {
                if !self.args.is_empty() || !self.env.is_empty() {
                    return Err(problem(
                        "`args` and `env` are for `command` servers; a `url` server gets \
                         `headers`"
                            .into(),
                    ));
                }
                // Neither message quotes the URL: it may hold a secret.
                match reqwest::Url::parse(url) {
                    Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                    Ok(parsed) => {
                        return Err(problem(format!(
                            "`url` must be an http:// or https:// URL (its scheme is `{}`)",
                            parsed.scheme()
                        )));
                    }
                    Err(e) => return Err(problem(format!("`url` is not a URL: {e}"))),
                }
                self.header_map().map_err(problem)?;
                Ok(Endpoint::Http { url })
            }
        }
    }

    /// `headers` as HTTP headers. The error names the header but never
    /// shows its value (it is often a secret).
    fn header_map(&self) -> Result<HashMap<HeaderName, HeaderValue>, String> {
        let mut map = HashMap::new();
        for (name, value) in &self.headers {
            if let Some(reserved) = RESERVED_HEADERS
                .iter()
                .find(|reserved| reserved.eq_ignore_ascii_case(name))
            {
                return Err(format!(
                    "header `{name}` cannot be given: the MCP client sets `{reserved}` itself"
                ));
            }
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid HTTP header name"))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| format!("the value of header `{name}` is not a valid header value"))?;
            value.set_sensitive(true);
            // Names differ only in case: two keys would send one header twice.
            if map.insert(header, value).is_some() {
                return Err(format!("header `{name}` is given twice"));
            }
        }
        Ok(map)
    }
}

/// Why an MCP server could not be used. Messages name the server: they end
/// up in logs, startup warnings and tool results.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP server `{server}` could not be started (`{command}`): {source}")]
    Spawn {
        server: String,
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("MCP server `{server}` failed to initialize: {source}{stderr}")]
    Initialize {
        server: String,
        /// Boxed: rmcp's error is large and this path is rare.
        #[source]
        source: Box<ClientInitializeError>,
        stderr: String,
    },
    #[error("MCP server `{server}` did not start within {secs} s{stderr}")]
    StartTimedOut {
        server: String,
        secs: u64,
        stderr: String,
    },
    #[error("MCP server `{server}` failed to list its tools: {source}")]
    ListTools {
        server: String,
        /// Boxed, as for `Initialize`.
        #[source]
        source: Box<ServiceError>,
    },
    #[error("MCP server `{server}` exited: {detail}")]
    Exited { server: String, detail: String },
    #[error("MCP server `{server}` is not configured right: {problem}")]
    Config { server: String, problem: String },
    /// An HTTP server that could not be reached, answered with an HTTP
    /// error, or failed the MCP handshake.
    #[error("MCP server `{server}` at {url} failed to connect: {detail}")]
    Connect {
        server: String,
        /// The server's URL as [`redact_url`] shows it.
        url: String,
        /// The whole chain of causes: the outermost error alone does not
        /// say "connection refused".
        detail: String,
        /// `None` when rmcp reported nothing (no answer in time).
        #[source]
        source: Option<Box<ClientInitializeError>>,
    },
    /// A connected HTTP server that a call could no longer reach.
    #[error("MCP server `{server}` at {url} disconnected: {detail}")]
    Disconnected {
        server: String,
        /// The server's URL as [`redact_url`] shows it.
        url: String,
        detail: String,
    },
    #[error(
        "MCP server `{server}` is not {action} yet: it failed {failures} time{} in a row; \
         it will be {action} by the first use in {} or later (last failure: {last})",
        plural(*.failures),
        seconds(*.retry_in)
    )]
    BackingOff {
        server: String,
        failures: u32,
        retry_in: Duration,
        last: String,
        /// `restarted` (a stdio server) or `reconnected` (an HTTP server).
        action: &'static str,
    },
}

/// What the next use does after a failure: start a new process, or open a
/// new HTTP session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again {
    Restart,
    Reconnect,
}

impl Again {
    fn done(self) -> &'static str {
        match self {
            Again::Restart => "restarted",
            Again::Reconnect => "reconnected",
        }
    }

    fn does(self) -> &'static str {
        match self {
            Again::Restart => "restarts",
            Again::Reconnect => "reconnects",
        }
    }
}

/// Whether `error` says that the HTTP server does not know the session.
fn session_expired(error: &ServiceError) -> bool {
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
struct HttpShared {
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

    fn stream_lost(&self) -> bool {
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
    fn refusal(&self) -> String {
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

/// `error` and its causes, each once: `a: b: c`. Wrappers often repeat
/// their cause's text, which is skipped.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// What went wrong in a transport, without rmcp's wrapper, which names the
/// transport's Rust type (a line of generics) and hides the causes.
fn transport_error(error: &DynamicTransportError) -> String {
    // rmcp does not make reqwest's error the source of its own, so the
    // chain would stop before the cause ("connection refused").
    if let Some(StreamableHttpError::Client(http)) = error
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        return error_chain(http);
    }
    error_chain(&*error.error)
}

/// [`error_chain`], with the transport's own error for a transport failure.
fn initialize_error(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, context } => {
            format!("{context}: {}", transport_error(error))
        }
        other => error_chain(other),
    }
}

/// [`error_chain`], with the transport's own error for a transport failure.
fn service_error(error: &ServiceError) -> String {
    match error {
        ServiceError::TransportSend(error) => transport_error(error),
        other => error_chain(other),
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `1.0 s`, `59.5 s`: precise enough for a person deciding whether to wait.
fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// Starts every server and lists its tools. A server that fails is reported
/// in the second list (one message each) and does not stop the others:
/// a broken MCP server should cost its tools, not the engine. Register the
/// servers with [`ToolRegistry::register_source`](crate::tools::ToolRegistry::register_source)
/// so that changes to their tool lists reach the model.
pub async fn connect_all(
    configs: impl IntoIterator<Item = McpServerConfig>,
) -> (Vec<Arc<McpServer>>, Vec<String>) {
    let started = futures::future::join_all(configs.into_iter().map(|config| async move {
        let server = McpServer::new(config);
        server.tools().await.map(|_| server)
    }))
    .await;
    let mut servers = Vec::new();
    let mut warnings = Vec::new();
    for result in started {
        match result {
            Ok(server) => servers.push(server),
            Err(error) => {
                tracing::warn!("{error}");
                warnings.push(error.to_string());
            }
        }
    }
    (servers, warnings)
}

/// A live connection: the rmcp client (which owns the child process and
/// kills it when dropped, or the worker of the HTTP session) and what we
/// know about the process (nothing, for HTTP) or the HTTP session.
struct Connection {
    client: RunningService<RoleClient, Client>,
    pid: Option<u32>,
    stderr: StderrTail,
    http: Option<Arc<HttpShared>>,
}

impl Connection {
    /// Whether the connection can no longer serve calls, or (HTTP) lost
    /// the event stream that brings the server's notifications.
    fn is_closed(&self) -> bool {
        self.client.is_transport_closed() || self.http.as_ref().is_some_and(|h| h.stream_lost())
    }

    /// What the HTTP server answered when it refused the session.
    fn refusal(&self) -> String {
        self.http
            .as_ref()
            .map_or_else(|| "nothing to say why".to_owned(), |h| h.refusal())
    }
}

/// One tool as the server listed it.
struct Listed {
    /// The name the server knows the tool by.
    tool: String,
    spec: ToolSpec,
}

/// The current tool list and the process that listed it.
#[derive(Default)]
struct Listing {
    epoch: u64,
    tools: Vec<Arc<Listed>>,
}

/// Handle on one MCP server, shared by its tools. Holds at most one running
/// process or HTTP session; (re)starts or (re)connects it on demand.
pub struct McpServer {
    config: McpServerConfig,
    call_timeout: Duration,
    /// For the tools handed out and for each connection's handler, which
    /// must not keep the server (and so its process) alive by itself.
    me: Weak<McpServer>,
    /// A tokio mutex because starting awaits; concurrent calls wait for one
    /// start instead of each spawning a process.
    connection: Mutex<Option<Arc<Connection>>>,
    /// A std mutex: never held across an await, so a call that ends never
    /// waits for a start in progress to record its outcome.
    backoff: StdMutex<Backoff>,
    /// Numbers the processes, so that a list read from an old process
    /// cannot replace one read from a newer process.
    epochs: AtomicU64,
    /// Read synchronously by the registry; holds specs only (tools are made
    /// on demand) so the server is not kept alive by its own list.
    listing: RwLock<Listing>,
    /// One `tools/list` at a time: an answer to an older request cannot
    /// land after the answer to a newer one.
    listing_read: Mutex<()>,
    /// Counts the reads of the tool list, for whoever shows the tools and
    /// wants to know when to look again.
    list_reads: watch::Sender<u64>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.config.name)
            .field("command", &self.config.command)
            .field("url", &self.config.url.as_deref().map(redact_url))
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// A handle; nothing starts until the first use.
    pub fn new(config: McpServerConfig) -> Arc<Self> {
        let call_timeout = config
            .timeout_secs
            .map_or(DEFAULT_CALL_TIMEOUT, Duration::from_secs);
        Arc::new_cyclic(|me| McpServer {
            config,
            call_timeout,
            me: me.clone(),
            connection: Mutex::new(None),
            backoff: StdMutex::new(Backoff::default()),
            epochs: AtomicU64::new(0),
            listing: RwLock::new(Listing::default()),
            listing_read: Mutex::new(()),
            list_reads: watch::Sender::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Starts the server if needed and returns its tools (all pages of
    /// `tools/list`, as last read).
    pub async fn tools(&self) -> Result<Vec<Arc<dyn Tool>>, McpError> {
        self.connection().await?;
        Ok(self.current_tools())
    }

    /// A receiver whose value counts the reads of the tool list (at each
    /// start and on each `notifications/tools/list_changed`): it changes
    /// whenever the tools may have changed, for whoever shows them.
    pub fn watch_tool_list(&self) -> watch::Receiver<u64> {
        self.list_reads.subscribe()
    }

    /// The process id of the running server, if one runs (for diagnostics
    /// and tests); always `None` for an HTTP server.
    pub async fn pid(&self) -> Option<u32> {
        let slot = self.connection.lock().await;
        slot.as_ref().filter(|c| !c.is_closed()).and_then(|c| c.pid)
    }

    /// Whether a server process (or HTTP session) is connected and its
    /// transport still open (for HTTP: its event stream too).
    pub async fn is_running(&self) -> bool {
        let slot = self.connection.lock().await;
        slot.as_ref().is_some_and(|c| !c.is_closed())
    }

    /// Stops the server (it starts again on next use).
    pub async fn shutdown(&self) {
        let taken = self.connection.lock().await.take();
        if let Some(connection) = taken
            && let Ok(mut connection) = Arc::try_unwrap(connection)
        {
            let _ = connection.client.close_with_timeout(STARTUP_TIMEOUT).await;
        }
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live connection, starting (or restarting) the server if it is
    /// not running and its backoff allows.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let server = &self.config.name;
        // A config error is no failure to back off from: trying again
        // cannot fix it, and each use should say what is wrong.
        let endpoint = self.config.endpoint()?;
        let again = self.again();
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            if !connection.is_closed() {
                return Ok(Arc::clone(connection));
            }
            connection.stderr.settle().await;
            let why = match endpoint {
                Endpoint::Stdio { .. } => {
                    format!("exited while idle{}", connection.stderr.describe())
                }
                Endpoint::Http { url } if connection.client.is_transport_closed() => {
                    format!("at {} closed its connection while idle", redact_url(url))
                }
                Endpoint::Http { url } => {
                    format!("at {} lost its session's event stream", redact_url(url))
                }
            };
            let wait = self.backoff().exited(Instant::now(), why.clone());
            tracing::warn!(server = %server, "MCP server `{server}` {why}; {}", restart_note(wait, again));
            *slot = None;
        }
        if let Some(error) = self.backoff().holding_back(Instant::now(), server, again) {
            return Err(error);
        }
        let started = match endpoint {
            Endpoint::Stdio { command } => self.start(command).await,
            Endpoint::Http { url } => self.connect(url).await,
        };
        match started {
            Ok(connection) => {
                let connection = Arc::new(connection);
                tracing::info!(server = %server, pid = ?connection.pid, "MCP server started");
                *slot = Some(Arc::clone(&connection));
                Ok(connection)
            }
            Err(error) => {
                let wait = self.backoff().failed(Instant::now(), error.to_string());
                tracing::warn!(server = %server, "{error}; the first use in {} or later tries again", seconds(wait));
                Err(error)
            }
        }
    }

    /// How the next use gets a server back after a failure.
    fn again(&self) -> Again {
        if self.config.url.is_some() {
            Again::Reconnect
        } else {
            Again::Restart
        }
    }

    /// The rmcp handler of a new connection, and the connection's epoch.
    fn handler(&self) -> (Client, u64) {
        let epoch = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
        let client = Client {
            info: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("toolwire", env!("CARGO_PKG_VERSION")),
            ),
            server: self.me.clone(),
            epoch,
            progress: ProgressRoutes::default(),
        };
        (client, epoch)
    }

    /// Spawns the process `command`, runs the MCP handshake and reads the
    /// tool list (a restarted server may offer other tools than the process
    /// before).
    async fn start(&self, command_name: &str) -> Result<Connection, McpError> {
        let config = &self.config;
        let mut command = tokio::process::Command::new(command_name);
        command.args(&config.args).envs(&config.env);
        let spawn_error = |source| McpError::Spawn {
            server: config.name.clone(),
            command: command_name.to_owned(),
            source,
        };
        // stderr is piped (not inherited) so a server cannot write into a
        // terminal UI, and so its last words can explain a crash.
        let (transport, stderr) = TokioChildProcess::builder(command)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let pid = transport.id();
        let tail = StderrTail::default();
        if let Some(stderr) = stderr {
            tail.follow(config.name.clone(), stderr);
        }
        let (client, epoch) = self.handler();
        // On error or timeout the transport is dropped, which kills the child.
        let client = match tokio::time::timeout(STARTUP_TIMEOUT, client.serve(transport)).await {
            Ok(Ok(client)) => client,
            Ok(Err(source)) => {
                tail.settle().await;
                return Err(McpError::Initialize {
                    server: config.name.clone(),
                    source: Box::new(source),
                    stderr: tail.describe(),
                });
            }
            Err(_) => {
                return Err(McpError::StartTimedOut {
                    server: config.name.clone(),
                    secs: STARTUP_TIMEOUT.as_secs(),
                    stderr: tail.describe(),
                });
            }
        };
        self.read_tool_list(client.peer(), epoch).await?;
        Ok(Connection {
            client,
            pid,
            stderr: tail,
            http: None,
        })
    }

    /// Opens a streamable HTTP session at `url`: the MCP handshake, then
    /// the tool list (a server reconnected to may offer other tools).
    async fn connect(&self, url: &str) -> Result<Connection, McpError> {
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
        })
    }

    /// Reads the tool list of process `epoch` through `peer` and makes it
    /// the current list, unless a newer process has been listed since.
    async fn read_tool_list(&self, peer: &Peer<RoleClient>, epoch: u64) -> Result<(), McpError> {
        let server = &self.config.name;
        let _one_at_a_time = self.listing_read.lock().await;
        let listed = match tokio::time::timeout(STARTUP_TIMEOUT, peer.list_all_tools()).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(source)) => {
                return Err(McpError::ListTools {
                    server: server.clone(),
                    source: Box::new(source),
                });
            }
            Err(_) => {
                return Err(McpError::ListTools {
                    server: server.clone(),
                    source: Box::new(ServiceError::Timeout {
                        timeout: STARTUP_TIMEOUT,
                    }),
                });
            }
        };
        let mut used = HashSet::new();
        let mut tools = Vec::with_capacity(listed.len());
        for tool in listed {
            let mut name = tool_name(server, &tool.name);
            if !used.insert(name.clone()) {
                // Two MCP names sanitized to the same string: the hashed
                // form keeps both, and stays stable across restarts.
                name = hashed_name(&format!("{server}__{}", tool.name));
                used.insert(name.clone());
            }
            let description = tool
                .description
                .as_deref()
                .map(str::to_owned)
                .or(tool.title.clone())
                .unwrap_or_default();
            let read_only = tool
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false);
            tools.push(Arc::new(Listed {
                tool: tool.name.to_string(),
                spec: ToolSpec {
                    name,
                    server: Some(server.clone()),
                    description,
                    parameters: Value::Object((*tool.input_schema).clone()),
                    read_only,
                },
            }));
        }
        {
            let mut listing = self.listing.write().unwrap_or_else(PoisonError::into_inner);
            if listing.epoch > epoch {
                return Ok(());
            }
            *listing = Listing { epoch, tools };
        }
        self.list_reads.send_modify(|reads| *reads += 1);
        tracing::debug!(server = %server, epoch, "MCP tool list read");
        Ok(())
    }

    /// Drops `dead` from the slot if it is still there (so the next call
    /// starts a fresh process; dropping the client kills what is left).
    /// Returns whether it was: only the first to notice a death counts it.
    async fn forget(&self, dead: &Arc<Connection>) -> bool {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
            *slot = None;
            return true;
        }
        false
    }

    async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        progress: &ProgressHandle,
    ) -> CallResult {
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let timed_out = || ToolError::TimedOut(self.call_timeout.as_secs());
        // Set once the first connection is there: starting a server has its
        // own limit, and the call's time is the server's time.
        let mut deadline = None;
        // Why the server refused the session of the first attempt.
        let mut refused: Option<String> = None;
        loop {
            let connection = match deadline {
                None => self.connection().await,
                // The new session of a retry counts against the call.
                Some(deadline) => tokio::time::timeout_at(deadline, self.connection())
                    .await
                    .map_err(|_| timed_out())?,
            }
            .map_err(|e| ToolError::Failed(e.to_string()))?;
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.call_timeout);
            let call = call_tool(&connection, params.clone(), progress);
            match tokio::time::timeout_at(deadline, call).await {
                Err(_) => return Err(timed_out()),
                Ok(Ok(result)) => {
                    self.backoff().succeeded();
                    return Ok(tool_output(result));
                }
                // The server refused the session before running the request
                // (see `refuses_session`): it restarted while idle, which
                // only a request can tell over HTTP. Runs it once in a new
                // session, as a stdio server that died while idle is
                // restarted for the call. Only this answer is retried: after
                // any other the server may have run the call.
                Ok(Err(error)) if refused.is_none() && session_expired(&error) => {
                    let why = connection.refusal();
                    tracing::info!(
                        server = %self.config.name,
                        "MCP server `{}` refused the session (it answered {why}); \
                         running the call in a new session",
                        self.config.name
                    );
                    refused = Some(why);
                    self.forget(&connection).await;
                }
                Ok(Err(error)) => {
                    return Err(self
                        .call_error(&connection, error, refused.as_deref())
                        .await);
                }
            }
        }
    }

    /// The error a failed call ends with. `refused` is why the server
    /// refused the session of a first attempt, when this was the second.
    async fn call_error(
        &self,
        connection: &Arc<Connection>,
        error: ServiceError,
        refused: Option<&str>,
    ) -> ToolError {
        let server = &self.config.name;
        let retried = refused.map_or_else(String::new, |first| {
            format!(" (in a second session: the first was refused: it answered {first})")
        });
        match error {
            ServiceError::McpError(data) if data.code == ErrorCode::INVALID_PARAMS => {
                self.backoff().succeeded();
                ToolError::InvalidArguments(format!(
                    "MCP server `{server}`: {}{retried}",
                    data.message
                ))
            }
            ServiceError::McpError(data) => {
                // The server answered: it works, whatever this call's fate.
                self.backoff().succeeded();
                ToolError::Failed(format!("MCP server `{server}`: {}{retried}", data.message))
            }
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                connection.stderr.settle().await;
                let stderr = connection.stderr.describe();
                let why = if session_expired(&error) {
                    format!(
                        "it does not know the session: it answered {}{retried}",
                        connection.refusal()
                    )
                } else {
                    format!(
                        "connection lost during the call ({}){retried}",
                        service_error(&error)
                    )
                };
                let wait = if self.forget(connection).await {
                    self.backoff()
                        .exited(Instant::now(), format!("{why}{stderr}"))
                } else {
                    self.backoff().waiting(Instant::now()).unwrap_or_default()
                };
                let detail = format!("{why}; {}{stderr}", restart_note(wait, self.again()));
                let error = match &self.config.url {
                    Some(url) => McpError::Disconnected {
                        server: server.clone(),
                        url: redact_url(url),
                        detail,
                    },
                    None => McpError::Exited {
                        server: server.clone(),
                        detail,
                    },
                };
                tracing::warn!(server = %server, "{error}");
                ToolError::Failed(error.to_string())
            }
            other => ToolError::Failed(format!("MCP server `{server}`: {other}{retried}")),
        }
    }
}

impl ToolSource for McpServer {
    fn current_tools(&self) -> Vec<Arc<dyn Tool>> {
        let Some(server) = self.me.upgrade() else {
            return Vec::new();
        };
        let listing = self.listing.read().unwrap_or_else(PoisonError::into_inner);
        listing
            .tools
            .iter()
            .map(|listed| McpTool::shared(&server, listed))
            .collect()
    }

    fn current_tool(&self, name: &str) -> Option<Arc<dyn Tool>> {
        let server = self.me.upgrade()?;
        let listing = self.listing.read().unwrap_or_else(PoisonError::into_inner);
        listing
            .tools
            .iter()
            .find(|listed| listed.spec.name == name)
            .map(|listed| McpTool::shared(&server, listed))
    }
}

type CallResult = Result<ToolOutput, ToolError>;

/// `tools/call` with the request's progress token routed to `progress`.
/// rmcp's `call_tool` would send the same request, but it does not say
/// which progress token it put in the request's `_meta`.
async fn call_tool(
    connection: &Connection,
    params: CallToolRequestParams,
    progress: &ProgressHandle,
) -> Result<CallToolResult, ServiceError> {
    let client = &connection.client;
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
    let handle = client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await?;
    let _route = client
        .service()
        .progress
        .route(handle.progress_token.clone(), progress.clone());
    let mut cancel = CancelOnDrop {
        peer: handle.peer.clone(),
        request: Some(handle.id.clone()),
    };
    let response = handle.await_response().await;
    cancel.request = None;
    match response? {
        ServerResult::CallToolResult(result) => Ok(result),
        // The server wants input first (MRTR): each round is a new
        // `tools/call` by design, so rmcp's driver, which answers the
        // rounds through this client's handler, can start over (without
        // progress for the rounds).
        ServerResult::InputRequiredResult(_) => client.call_tool(params).await,
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// Sends `notifications/cancelled` for a request whose caller stopped
/// waiting (timeout, cancelled turn) so the server can stop working on it,
/// as rmcp's own `call_tool` does.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    request: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        // Sending awaits; a drop cannot, so a task sends it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let params = CancelledNotificationParam::new(
                Some(request),
                Some("the caller stopped waiting".to_owned()),
            );
            let _ = peer
                .send_notification(CancelledNotification::new(params).into())
                .await;
        });
    }
}

/// When a failed server may be started again.
///
/// A server that was working and exits is restarted at once on its next
/// use (one crash says little). Every further failure in a row — a start
/// that fails, or a restarted process that exits before a call succeeds —
/// holds starts back: [`BACKOFF_FIRST`] after the first, doubling up to
/// [`BACKOFF_MAX`]. Without it a server that cannot start would be spawned
/// again by every call the model makes. A call that gets an answer resets
/// it.
#[derive(Debug, Default)]
struct Backoff {
    /// Failures in a row that hold starts back.
    failures: u32,
    /// The immediate restart has been used since the last answered call.
    restarted: bool,
    retry_at: Option<Instant>,
    /// The last failure, for the error shown while starts are held back.
    last: String,
}

impl Backoff {
    /// A process that had started exited. Returns how long until it may be
    /// started again.
    fn exited(&mut self, now: Instant, why: String) -> Duration {
        if self.failures == 0 && !self.restarted {
            self.restarted = true;
            self.last = why;
            return Duration::ZERO;
        }
        self.failed(now, why)
    }

    /// A start failed. Returns how long until the next may be tried.
    fn failed(&mut self, now: Instant, why: String) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = backoff_delay(self.failures);
        self.retry_at = Some(now + wait);
        self.last = why;
        wait
    }

    fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    /// How long starts are still held back, if they are.
    fn waiting(&self, now: Instant) -> Option<Duration> {
        let wait = self.retry_at?.saturating_duration_since(now);
        (!wait.is_zero()).then_some(wait)
    }

    /// The error for a use while starts are held back.
    fn holding_back(&self, now: Instant, server: &str, again: Again) -> Option<McpError> {
        let retry_in = self.waiting(now)?;
        Some(McpError::BackingOff {
            server: server.to_owned(),
            failures: self.failures,
            retry_in,
            last: self.last.clone(),
            action: again.done(),
        })
    }
}

/// The wait after `failures` failures in a row (1 or more).
fn backoff_delay(failures: u32) -> Duration {
    // 2^6 s is past the cap already; the bound keeps the shift in range.
    let doublings = failures.saturating_sub(1).min(6);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
}

fn restart_note(wait: Duration, again: Again) -> String {
    let does = again.does();
    if wait.is_zero() {
        format!("it {does} on next use")
    } else {
        format!("it {does} on the first use in {} or later", seconds(wait))
    }
}

/// The rmcp client handler of one connection: takes the server's
/// notifications.
struct Client {
    info: ClientConfig,
    server: Weak<McpServer>,
    /// The process this connection talks to.
    epoch: u64,
    progress: ProgressRoutes,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.deliver(params);
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let Some(server) = self.server.upgrade() else {
            return;
        };
        tracing::info!(server = %server.name(), "MCP server changed its tools; reading the list again");
        if let Err(error) = server.read_tool_list(&context.peer, self.epoch).await {
            tracing::warn!(server = %server.name(), "{error}; keeping the list read before");
        }
    }
}

/// Where the progress notifications of one connection go: the progress
/// handle of the call whose request carried the token.
#[derive(Default)]
struct ProgressRoutes(StdMutex<Routes>);

#[derive(Default)]
struct Routes {
    calls: HashMap<ProgressToken, Route>,
    /// Notifications for tokens no call has claimed: the server can answer
    /// before the call has registered its token.
    early: VecDeque<ProgressNotificationParam>,
}

struct Route {
    handle: ProgressHandle,
    last: Option<f64>,
}

impl Route {
    /// The text to report, or `None` for a notification that does not
    /// advance: each is handled on its own task so they can arrive out of
    /// order, and progress must increase.
    fn advance(&mut self, params: &ProgressNotificationParam) -> Option<String> {
        if self.last.is_some_and(|last| params.progress <= last) {
            return None;
        }
        self.last = Some(params.progress);
        Some(progress_text(
            params.progress,
            params.total,
            params.message.as_deref(),
        ))
    }
}

impl ProgressRoutes {
    fn lock(&self) -> MutexGuard<'_, Routes> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the progress of the request with `token` to `handle` until the
    /// returned guard is dropped.
    fn route(&self, token: ProgressToken, handle: ProgressHandle) -> RouteGuard<'_> {
        let mut route = Route {
            handle: handle.clone(),
            last: None,
        };
        let mut reports = Vec::new();
        {
            let mut routes = self.lock();
            let early = std::mem::take(&mut routes.early);
            for params in early {
                if params.progress_token == token {
                    reports.extend(route.advance(&params));
                } else {
                    routes.early.push_back(params);
                }
            }
            routes.calls.insert(token.clone(), route);
        }
        for text in reports {
            handle.status(text);
        }
        RouteGuard {
            routes: self,
            token,
        }
    }

    fn deliver(&self, params: ProgressNotificationParam) {
        let mut routes = self.lock();
        let Some(route) = routes.calls.get_mut(&params.progress_token) else {
            if routes.early.len() == EARLY_PROGRESS_KEPT {
                routes.early.pop_front();
            }
            routes.early.push_back(params);
            return;
        };
        if let Some(text) = route.advance(&params) {
            let handle = route.handle.clone();
            drop(routes);
            handle.status(text);
        }
    }
}

struct RouteGuard<'a> {
    routes: &'a ProgressRoutes,
    token: ProgressToken,
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        self.routes.lock().calls.remove(&self.token);
    }
}

/// `3/5 (60%)`, `3/5 (60%): copying`, `progress 3` when the total is
/// unknown. `f64` prints `3`, not `3.0`.
fn progress_text(progress: f64, total: Option<f64>, message: Option<&str>) -> String {
    let mut text = match total {
        Some(total) if total > 0.0 => {
            format!("{progress}/{total} ({:.0}%)", progress / total * 100.0)
        }
        _ => format!("progress {progress}"),
    };
    if let Some(message) = message.map(str::trim).filter(|m| !m.is_empty()) {
        text.push_str(": ");
        text.push_str(message);
    }
    text
}

/// The last lines a server wrote to stderr. Everything it writes also goes
/// to `tracing` at debug level.
#[derive(Clone, Default)]
struct StderrTail {
    lines: Arc<StdMutex<VecDeque<String>>>,
    /// Cancelled when the reader saw the end of stderr.
    done: CancellationToken,
}

impl StderrTail {
    /// The tail of a server without stderr (HTTP): nothing to wait for.
    fn none() -> Self {
        let tail = StderrTail::default();
        tail.done.cancel();
        tail
    }

    fn follow(&self, server: String, stderr: ChildStderr) {
        let lines = Arc::clone(&self.lines);
        let done = self.done.clone();
        tokio::spawn(async move {
            let _done = done.drop_guard();
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                tracing::debug!(server = %server, "MCP server stderr: {line}");
                let line = cut(&line, STDERR_LINE_MAX).to_owned();
                let mut lines = lines.lock().unwrap_or_else(PoisonError::into_inner);
                if lines.len() == STDERR_TAIL_LINES {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
        });
    }

    /// A dead process's last words may still be in the pipe when its death
    /// is noticed: waits (briefly) until the reader has seen the end.
    async fn settle(&self) {
        let _ = tokio::time::timeout(STDERR_SETTLE, self.done.cancelled()).await;
    }

    /// `"; stderr: …"`, or nothing when the server wrote nothing.
    fn describe(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.is_empty() {
            return String::new();
        }
        let joined: Vec<&str> = lines.iter().map(String::as_str).collect();
        format!("; stderr: {}", joined.join(" | "))
    }
}

/// One MCP tool of one server, as last listed.
struct McpTool {
    server: Arc<McpServer>,
    listed: Arc<Listed>,
}

impl McpTool {
    fn shared(server: &Arc<McpServer>, listed: &Arc<Listed>) -> Arc<dyn Tool> {
        Arc::new(McpTool {
            server: Arc::clone(server),
            listed: Arc::clone(listed),
        })
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.listed.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let arguments = match arguments {
            // Models send `null` for "no arguments".
            Value::Null => serde_json::Map::new(),
            Value::Object(map) => map,
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "arguments must be a JSON object, got {other}"
                )));
            }
        };
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
            result = self.server.call(&self.listed.tool, arguments, &ctx.progress) => result,
        }
    }
}

/// What the model sees of a result: text items as they are, other items as
/// a short marker (the model cannot use base64 payloads).
fn tool_output(result: CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = Vec::with_capacity(result.content.len());
    for block in result.content {
        parts.push(match block {
            ContentBlock::Text(text) => text.text,
            ContentBlock::Image(image) => format!("[image: {}]", image.mime_type),
            ContentBlock::Audio(audio) => format!("[audio: {}]", audio.mime_type),
            ContentBlock::Resource(embedded) => match embedded.resource {
                // The text of an embedded text resource is the answer (a file
                // read, say); keep it after its uri.
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource: {uri}]\n{text}")
                }
                ResourceContents::BlobResourceContents { uri, mime_type, .. } => match mime_type {
                    Some(mime) => format!("[resource: {uri} ({mime})]"),
                    None => format!("[resource: {uri}]"),
                },
                _ => "[resource]".to_owned(),
            },
            ContentBlock::ResourceLink(link) => format!("[resource: {}]", link.uri),
            _ => "[unsupported content]".to_owned(),
        });
    }
    if parts.is_empty()
        && let Some(structured) = result.structured_content
    {
        parts.push(structured.to_string());
    }
    ToolOutput {
        content: parts.join("\n"),
        is_error: result.is_error.unwrap_or(false),
    }
}

/// The registry name of `tool` of `server`: `{server}__{tool}` with every
/// character outside `[a-zA-Z0-9_-]` replaced by `_`; names longer than 64
/// are cut and end in a hash of the full name so they stay unique and
/// stable.
pub fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("{server}__{tool}");
    let clean: String = full.chars().map(sanitize).collect();
    if clean.is_empty() || clean.len() > MAX_NAME_LEN {
        return hashed_name(&full);
    }
    clean
}

fn sanitize(c: char) -> char {
    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
        c
    } else {
        '_'
    }
}

/// At most 64 characters: a sanitized prefix, `_`, 8 hex digits of FNV-1a.
fn hashed_name(full: &str) -> String {
    let hash = full.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let prefix: String = full.chars().map(sanitize).take(MAX_NAME_LEN - 9).collect();
    format!("{prefix}_{hash:08x}")
}

/// The longest prefix of `s` of at most `max` bytes ending on a char
/// boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_api_safe() {
        assert_eq!(tool_name("everything", "echo"), "everything__echo");
        assert_eq!(
            tool_name("my server", "get.thing/v2"),
            "my_server__get_thing_v2"
        );
        let long = tool_name("server", &"x".repeat(100));
        assert_eq!(long.len(), MAX_NAME_LEN);
        assert!(
            long.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
        assert_ne!(long, tool_name("server", &"x".repeat(101)));
        assert_eq!(long, tool_name("server", &"x".repeat(100)));
    }

    #[test]
    fn config_from_toml_shape() {
        let config: McpServerConfig = serde_json::from_value(serde_json::json!({
            "command": "node",
            "args": ["server.js"],
            "env": {"A": "1"}
        }))
        .unwrap_or_default();
        assert_eq!(config.command.as_deref(), Some("node"));
        assert_eq!(config.args, ["server.js"]);
        assert_eq!(config.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            config.endpoint().ok(),
            Some(Endpoint::Stdio { command: "node" })
        );

        let config: McpServerConfig = serde_json::from_value(serde_json::json!({
            "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer secret"}
        }))
        .unwrap_or_default();
        assert_eq!(
            config.endpoint().ok(),
            Some(Endpoint::Http {
                url: "https://mcp.example.com/mcp"
            })
        );
        let headers = config.header_map().unwrap_or_default();
        let value = headers
            .get(&HeaderName::from_static("authorization"))
            .map(HeaderValue::as_bytes);
        assert_eq!(value, Some(&b"Bearer secret"[..]));

        let unknown = serde_json::from_value::<McpServerConfig>(serde_json::json!({
            "url": "http://localhost/mcp",
            "transport": "sse"
        }));
        assert!(unknown.is_err(), "unknown fields are still rejected");
    }

    fn config_problem(config: McpServerConfig) -> String {
        match config.validate() {
            Ok(()) => panic!("expected {config:?} to be rejected"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_config_names_exactly_one_way_to_reach_the_server() {
        assert!(McpServerConfig::stdio("s", "node").validate().is_ok());
        assert!(
            McpServerConfig::http("s", "http://127.0.0.1:9/mcp")
                .validate()
                .is_ok()
        );

        let both = McpServerConfig {
            url: Some("http://127.0.0.1:9/mcp".into()),
            ..McpServerConfig::stdio("both", "node")
        };
        assert_eq!(
            config_problem(both),
            "MCP server `both` is not configured right: give either `command` (a stdio \
             server) or `url` (a streamable HTTP server), not both"
        );
        assert_eq!(
            config_problem(McpServerConfig {
                name: "neither".into(),
                ..Default::default()
            }),
            "MCP server `neither` is not configured right: give `command` (a stdio server) \
             or `url` (a streamable HTTP server)"
        );
        let message = config_problem(McpServerConfig {
            args: vec!["x".into()],
            ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
        });
        assert!(
            message.contains("`args` and `env` are for `command` servers"),
            "{message}"
        );
        let message = config_problem(McpServerConfig {
            headers: [("Authorization".into(), "Bearer x".into())].into(),
            ..McpServerConfig::stdio("local", "node")
        });
        assert!(
            message.contains("`headers` are for `url` servers"),
            "{message}"
        );
        let message = config_problem(McpServerConfig::http("web", "ftp://example.com/mcp"));
        assert!(message.contains("http:// or https://"), "{message}");
        let message = config_problem(McpServerConfig::http("web", "not a url"));
        assert!(message.contains("is not a URL"), "{message}");
        let message = config_problem(McpServerConfig {
            headers: [("Authorization".into(), "Bearer \nsecret".into())].into(),
            ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
        });
        assert!(
            message.contains("header `Authorization`") && !message.contains("secret"),
            "{message}"
        );
    }

    #[test]
    fn urls_are_shown_without_credentials_query_or_fragment() {
        assert_eq!(
            redact_url("https://user:pw@mcp.example.com:8443/v1/mcp?key=secret#frag"),
            "https://mcp.example.com:8443/v1/mcp"
        );
        assert_eq!(redact_url("http://[::1]/mcp?token=x"), "http://[::1]/mcp");
        assert_eq!(redact_url("not a url with secret"), "(not a URL)");

        let message = config_problem(McpServerConfig::http(
            "web",
            "ftp://user:secret@example.com/mcp?key=secret",
        ));
        assert!(
            message.contains("http:// or https://") && !message.contains("secret"),
            "{message}"
        );
        let message = config_problem(McpServerConfig::http("web", "http://[secret/mcp"));
        assert!(
            message.contains("is not a URL") && !message.contains("secret"),
            "{message}"
        );
    }

    #[test]
    fn a_config_shows_no_header_or_env_value_when_debugged() {
        let config = McpServerConfig {
            headers: [("Authorization".into(), "Bearer secret".into())].into(),
            ..McpServerConfig::http("web", "https://u:secret@example.com/mcp?key=secret")
        };
        let shown = format!("{config:?} {:?}", McpServer::new(config.clone()));
        assert!(
            shown.contains("Authorization")
                && shown.contains("https://example.com/mcp")
                && !shown.contains("secret"),
            "{shown}"
        );
        let config = McpServerConfig {
            env: [("API_KEY".into(), "secret".into())].into(),
            ..McpServerConfig::stdio("local", "node")
        };
        let shown = format!("{config:?}");
        assert!(
            shown.contains("API_KEY") && !shown.contains("secret"),
            "{shown}"
        );
    }

    #[test]
    fn headers_the_mcp_client_sets_itself_are_refused() {
        for name in ["Accept", "mcp-session-id", "LAST-EVENT-ID"] {
            let message = config_problem(McpServerConfig {
                headers: [(name.to_owned(), "x".to_owned())].into(),
                ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
            });
            assert!(
                message.starts_with("MCP server `web` is not configured right")
                    && message.contains(&format!("header `{name}` cannot be given")),
                "{message}"
            );
        }
        let fine = McpServerConfig {
            headers: [("Mcp-Team".to_owned(), "x".to_owned())].into(),
            ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
        };
        assert!(fine.validate().is_ok());
    }

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

    #[test]
    fn backoff_doubles_from_one_second_up_to_a_minute() {
        let waits: Vec<u64> = (1..=9).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn a_working_server_that_exits_gets_one_immediate_restart_then_waits() {
        let now = Instant::now();
        let mut backoff = Backoff::default();
        assert_eq!(backoff.exited(now, "crashed".into()), Duration::ZERO);
        assert!(backoff.holding_back(now, "s", Again::Restart).is_none());

        assert_eq!(
            backoff.exited(now, "crashed again".into()),
            Duration::from_secs(1)
        );
        let message = backoff
            .holding_back(now + Duration::from_millis(400), "s", Again::Restart)
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            message,
            "MCP server `s` is not restarted yet: it failed 1 time in a row; it will be \
             restarted by the first use in 0.6 s or later (last failure: crashed again)"
        );
        assert!(
            backoff
                .holding_back(now + Duration::from_secs(1), "s", Again::Restart)
                .is_none()
        );
        assert_eq!(
            backoff.failed(now, "no start".into()),
            Duration::from_secs(2)
        );

        // An answered call: the next exit is a first one again.
        backoff.succeeded();
        assert_eq!(backoff.exited(now, "crashed".into()), Duration::ZERO);
    }

    #[test]
    fn a_failed_start_holds_the_next_back_at_once() {
        let now = Instant::now();
        let mut backoff = Backoff::default();
        assert_eq!(backoff.failed(now, "exit 1".into()), Duration::from_secs(1));
        assert!(matches!(
            backoff.holding_back(now, "s", Again::Restart),
            Some(McpError::BackingOff { failures: 1, .. })
        ));
        assert_eq!(
            backoff.exited(now, "exit 1".into()),
            Duration::from_secs(2),
            "no immediate restart for a server that has not worked since"
        );
    }

    #[test]
    fn progress_reads_as_steps_and_percent() {
        assert_eq!(progress_text(3.0, Some(5.0), None), "3/5 (60%)");
        assert_eq!(
            progress_text(1.0, Some(3.0), Some(" copying ")),
            "1/3 (33%): copying"
        );
        assert_eq!(progress_text(2.5, None, Some("")), "progress 2.5");
        assert_eq!(progress_text(1.0, Some(0.0), None), "progress 1");
    }

    fn token(n: i64) -> ProgressToken {
        ProgressToken(rmcp::model::NumberOrString::Number(n))
    }

    fn notification(n: i64, progress: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(token(n), progress).with_total(4.0)
    }

    #[test]
    fn progress_goes_to_the_call_that_owns_the_token_in_order() {
        let routes = ProgressRoutes::default();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let handle = ProgressHandle::new("call-1".into(), tx);

        // The server can report before the call has registered its token.
        routes.deliver(notification(1, 1.0));
        routes.deliver(notification(2, 1.0));
        let route = routes.route(token(1), handle);
        routes.deliver(notification(1, 3.0));
        // Handled out of order: progress must increase, so it is stale.
        routes.deliver(notification(1, 2.0));
        drop(route);
        routes.deliver(notification(1, 4.0));

        let mut texts = Vec::new();
        while let Ok((call_id, progress)) = rx.try_recv() {
            assert_eq!(call_id.0, "call-1");
            match progress {
                toolwire_core::Progress::Status { text } => texts.push(text),
                other => panic!("expected a status, got {other:?}"),
            }
        }
        assert_eq!(texts, ["1/4 (25%)", "3/4 (75%)"]);
        // The other call's early report waits for its call; the late one is
        // kept (bounded) in case a call claims it, and claimed by none.
        assert_eq!(routes.lock().early.len(), 2);
    }

    #[test]
    fn unclaimed_progress_is_bounded() {
        let routes = ProgressRoutes::default();
        for n in 0..100 {
            routes.deliver(notification(n, 1.0));
        }
        assert_eq!(routes.lock().early.len(), EARLY_PROGRESS_KEPT);
    }
}
