//! Errors as the API reports them: a status, a stable code and a message
//! (also under `detail`, where Letta's own server puts it).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use toolwire_engine::EngineError;
use toolwire_store::StoreError;

/// What a request refused during shutdown is told to wait before sending
/// again: about what a restart takes.
pub const SHUTDOWN_RETRY_AFTER_SECS: u16 = 5;

/// The code of a refusal while the server stops.
const SHUTTING_DOWN: &str = "SHUTTING_DOWN";

/// An API error.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// More fields for the body (e.g. `pending_request_id`).
    pub extra: Map<String, Value>,
    /// Seconds after which the same request may succeed (`Retry-After`);
    /// set only where nothing of the request was stored.
    pub retry_after: Option<u16>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: Map::new(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }

    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("{what} {id} not found"),
        )
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", message)
    }

    /// 503: the server is stopping; nothing of the request was stored, so
    /// sending it again (to the restarted server) is safe.
    pub fn shutting_down(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: Some(SHUTDOWN_RETRY_AFTER_SECS),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, SHUTTING_DOWN, message)
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A refusal while stopping is the shutdown working, not a failure.
        if self.status.is_server_error() && self.code != SHUTTING_DOWN {
            tracing::error!(code = self.code, message = %self.message, "request failed");
        } else {
            tracing::debug!(status = self.status.as_u16(), code = self.code, message = %self.message, "request refused");
        }
        let mut body = json!({
            "code": self.code,
            "message": self.message,
            "detail": self.message,
        });
        if let Value::Object(map) = &mut body {
            map.extend(self.extra);
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            // Nothing was stored: the same request is safe to send again.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
            response.headers_mut().insert(
                "x-should-retry",
                axum::http::HeaderValue::from_static("true"),
            );
        } else if self.status == StatusCode::CONFLICT || self.status.is_server_error() {
            // Letta's SDKs retry 409 and 5xx with the same body; a retried
            // message would run a turn twice.
            response.headers_mut().insert(
                "x-should-retry",
                axum::http::HeaderValue::from_static("false"),
            );
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::ConversationNotFound(id) => {
                Self::not_found("conversation", &id.to_string())
            }
            StoreError::MessageNotFound(id) => Self::not_found("message", &id.to_string()),
            StoreError::RunNotFound(id) => Self::not_found("run", &id.to_string()),
            StoreError::BadParent { .. } | StoreError::Tree(_) => Self::bad_request(e.to_string()),
            other => Self::internal(other.to_string()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Store(s) => s.into(),
            EngineError::Tree(t) => Self::bad_request(t.to_string()),
            // Letta's wording, which clients such as letta-code look for.
            EngineError::TurnInProgress(_) => Self::conflict(
                "CONVERSATION_BUSY",
                "Cannot send a new message: Another request is currently being processed \
                 for this conversation. Wait for it to finish, or cancel it.",
            ),
            EngineError::ShuttingDown => Self::shutting_down(e.to_string()),
            EngineError::NotStarted(_) => Self::internal(e.to_string()),
            EngineError::ApprovalPending { message_id, .. } => Self::conflict(
                "PENDING_APPROVAL",
                "Cannot send a new message: The agent is waiting for approval on a tool call. \
                 Please approve or deny the pending request before continuing.",
            )
            .with("pending_request_id", format!("message-{}", message_id.0)),
            EngineError::NothingPending(_) => Self::bad_request(
                "Cannot process approval response: No tool call is currently awaiting approval. \
                 Please send a regular message to interact with the agent.",
            ),
            EngineError::ClientToolApproved(_)
            | EngineError::UnknownModel(_)
            | EngineError::Image(_) => Self::bad_request(e.to_string()),
            EngineError::ApprovalMismatch {
                ref expected,
                ref received,
            } => {
                let ids = |v: &[toolwire_core::ToolCallId]| {
                    v.iter().map(|i| i.0.clone()).collect::<Vec<_>>()
                };
                Self::bad_request(format!(
                    "Invalid tool call IDs. Expected '{:?}', but received '{:?}'. {e}",
                    ids(expected),
                    ids(received),
                ))
            }
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
