//! [`McpError`], and the text of rmcp's and reqwest's errors (their whole
//! chain of causes) for messages.

use std::time::Duration;

use rmcp::ServiceError;
use rmcp::service::ClientInitializeError;
use rmcp::transport::DynamicTransportError;
use rmcp::transport::streamable_http_client::StreamableHttpError;

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
    #[error("MCP server `{server}` could not be sandboxed: {source}")]
    Sandbox {
        server: String,
        #[source]
        source: toolwire_sandbox::SandboxError,
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
    #[error("MCP server `{server}` failed {request}: {detail}")]
    Prompt {
        server: String,
        request: String,
        detail: String,
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
        /// The server's URL as [`redact_url`](super::redact_url) shows it.
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
        /// The server's URL as [`redact_url`](super::redact_url) shows it.
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

/// `error` and its causes, each once: `a: b: c`. Wrappers often repeat
/// their cause's text, which is skipped.
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
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
pub(super) fn initialize_error(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, context } => {
            format!("{context}: {}", transport_error(error))
        }
        other => error_chain(other),
    }
}

/// [`error_chain`], with the transport's own error for a transport failure.
pub(super) fn service_error(error: &ServiceError) -> String {
    match error {
        ServiceError::TransportSend(error) => transport_error(error),
        other => error_chain(other),
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `1.0 s`, `59.5 s`: precise enough for a person deciding whether to wait.
pub(super) fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}
