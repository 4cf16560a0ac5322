//! What the model can call. A [`Tool`] has a [`ToolSpec`] (shown to the
//! model) and runs with a [`ToolContext`] (who called, cancellation,
//! progress, notifications for later). Tool failures are results the model
//! sees, not engine errors.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolwire_core::{ConversationId, Incoming, Message, Progress, RunId, ToolCallId, ToolSpec};

/// A tool's answer, shown to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub content: String,
    /// The tool ran but reports a failure (the model should see it as one).
    pub is_error: bool,
    /// Images it returned, shown to the model after the text (the engine
    /// stores each once and keeps a reference in the result).
    pub images: Vec<ToolImage>,
}

/// An image a tool returned: checked to be a PNG, JPEG, GIF or WebP
/// within [`toolwire_core::MAX_IMAGE_BYTES`] (see [`ToolImage::new`]).
#[derive(Clone, PartialEq)]
pub struct ToolImage {
    media_type: &'static str,
    bytes: Vec<u8>,
}

impl ToolImage {
    /// `bytes` as an image, if they are one within the limit; `declared`
    /// (the type a server named) only words the error.
    pub fn new(bytes: Vec<u8>, declared: Option<&str>) -> Result<Self, toolwire_core::ImageError> {
        let media_type = toolwire_core::image::check_image(&bytes, declared)?;
        Ok(ToolImage { media_type, bytes })
    }

    /// What the bytes are (`image/png`, …), by their first bytes.
    pub fn media_type(&self) -> &'static str {
        self.media_type
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::fmt::Debug for ToolImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolImage")
            .field("media_type", &self.media_type)
            .field("bytes_len", &self.bytes.len())
            .finish()
    }
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: false,
            images: Vec::new(),
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: true,
            images: Vec::new(),
        }
    }

    /// With `images` after the text.
    pub fn with_images(mut self, images: Vec<ToolImage>) -> Self {
        self.images = images;
        self
    }
}

/// Why a tool could not run. Shown to the model as an error result.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("{0}")]
    Refused(String),
    #[error("cancelled")]
    Cancelled,
    #[error("timed out after {0} s")]
    TimedOut(u64),
    #[error("{0}")]
    Failed(String),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Sends a running tool's progress to the engine. Cheap to clone. Reports
/// never block the tool: if the engine is far behind, statuses are
/// dropped and output waits (joined into one piece, up to
/// [`MAX_HELD_OUTPUT`] bytes, past which its oldest part is dropped) for
/// the next report or [`flush`](Self::flush), so that clients showing
/// appended output get every byte of a fast command. The final result
/// always arrives.
#[derive(Debug, Clone)]
pub struct ProgressHandle {
    call_id: ToolCallId,
    tx: Option<mpsc::Sender<(ToolCallId, Progress)>>,
    held: Arc<std::sync::Mutex<String>>,
}

/// Output a [`ProgressHandle`] keeps while the engine is behind.
pub const MAX_HELD_OUTPUT: usize = 8 * 1024 * 1024;

impl ProgressHandle {
    pub fn new(call_id: ToolCallId, tx: mpsc::Sender<(ToolCallId, Progress)>) -> Self {
        ProgressHandle {
            call_id,
            tx: Some(tx),
            held: Arc::default(),
        }
    }

    /// A handle that discards everything (for tests and one-off calls).
    pub fn discard(call_id: ToolCallId) -> Self {
        ProgressHandle {
            call_id,
            tx: None,
            held: Arc::default(),
        }
    }

    pub fn report(&self, progress: Progress) {
        if let Progress::Output { text } = progress {
            self.output(text);
        } else if let Some(tx) = &self.tx {
            let _ = tx.try_send((self.call_id.clone(), progress));
        }
    }

    pub fn status(&self, text: impl Into<String>) {
        self.report(Progress::Status { text: text.into() });
    }

    pub fn output(&self, text: impl Into<String>) {
        let Some(tx) = &self.tx else { return };
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        held.push_str(&text.into());
        let text = std::mem::take(&mut *held);
        if let Err(mpsc::error::TrySendError::Full((_, Progress::Output { text }))) =
            tx.try_send((self.call_id.clone(), Progress::Output { text }))
        {
            *held = text;
            if held.len() > MAX_HELD_OUTPUT {
                let cut = held.ceil_char_boundary(held.len() - MAX_HELD_OUTPUT);
                held.drain(..cut);
            }
        }
    }

    /// Sends the output still held, waiting for room: call it before the
    /// tool returns, so the output is complete before the result.
    pub async fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        let text = match self.held.lock() {
            Ok(mut held) => std::mem::take(&mut *held),
            Err(_) => return,
        };
        if !text.is_empty() {
            let _ = tx
                .send((self.call_id.clone(), Progress::Output { text }))
                .await;
        }
    }
}

/// Where a tool sends notifications that outlive its call (a background
/// task's completion). The engine provides one to every call; it does not
/// keep the engine alive.
#[async_trait]
pub trait NotificationSink: Send + Sync {
    /// Tells the agent of `conversation` about `event` (queued for its next
    /// tool result or turn; a source set to wake the agent may start a
    /// turn). Failures are the sink's to log.
    async fn notify(&self, conversation: ConversationId, event: Incoming);
}

/// A tool's handle on a [`NotificationSink`]: cheap to clone, and a no-op
/// when the call has no engine behind it ([`ToolContext::detached`]).
#[derive(Clone, Default)]
pub struct Notifier(Option<Arc<dyn NotificationSink>>);

impl Notifier {
    pub fn new(sink: Arc<dyn NotificationSink>) -> Self {
        Notifier(Some(sink))
    }

    /// A notifier that discards everything.
    pub fn none() -> Self {
        Notifier(None)
    }

    /// Whether notifications reach anyone.
    pub fn is_connected(&self) -> bool {
        self.0.is_some()
    }

    pub async fn notify(&self, conversation: ConversationId, event: Incoming) {
        if let Some(sink) = &self.0 {
            sink.notify(conversation, event).await;
        }
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_connected() {
            "Notifier(connected)"
        } else {
            "Notifier(none)"
        })
    }
}

/// What a tool knows about its call.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub conversation_id: ConversationId,
    pub run_id: RunId,
    pub call_id: ToolCallId,
    /// The conversation path the model saw (read-only).
    pub path: Arc<[Message]>,
    /// The step of the turn (1 for the first model call).
    pub iteration: u32,
    pub cancel: CancellationToken,
    pub progress: ProgressHandle,
    /// The front-door client that started the turn, if known.
    pub client_id: Option<String>,
    /// Notifications to send later (after the call has returned).
    pub notifier: Notifier,
}

impl ToolContext {
    /// A context for calling a tool outside a turn (tests, one-off calls).
    pub fn detached(call_id: impl Into<ToolCallId>) -> Self {
        let call_id = call_id.into();
        ToolContext {
            conversation_id: ConversationId::new(),
            run_id: RunId::new(),
            progress: ProgressHandle::discard(call_id.clone()),
            call_id,
            path: Arc::from(Vec::new()),
            iteration: 1,
            cancel: CancellationToken::new(),
            client_id: None,
            notifier: Notifier::none(),
        }
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The tool's spec, shared: every model request lists the tools'
    /// specs, and an `Arc` lets each list them without copying a schema.
    fn spec(&self) -> &Arc<ToolSpec>;
    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_waits_when_the_engine_is_behind_and_none_is_lost() {
        let (tx, mut rx) = mpsc::channel(1);
        let progress = ProgressHandle::new(ToolCallId("c".into()), tx);
        progress.output("a");
        progress.output("b");
        progress.status("dropped: statuses do not wait");
        progress.output("c");
        let first = rx.recv().await.map(|(_, p)| p);
        assert_eq!(first, Some(Progress::Output { text: "a".into() }));
        progress.flush().await;
        let rest = rx.recv().await.map(|(_, p)| p);
        assert_eq!(rest, Some(Progress::Output { text: "bc".into() }));
    }
}
