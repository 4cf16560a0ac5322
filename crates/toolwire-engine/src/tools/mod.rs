//! Tools: what the model can call. A [`Tool`] has a [`ToolSpec`] (shown to
//! the model) and runs with a [`ToolContext`] (who called, cancellation,
//! progress). Tool failures are results the model sees, not engine errors.

pub mod builtin;
pub mod mcp;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolwire_core::{ConversationId, Message, Progress, RunId, ToolCallId};

/// What the model is told about a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The MCP server (or other namespace) the tool belongs to.
    pub server: Option<String>,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
    /// The tool only reads (no side effects): safe to run without asking.
    pub read_only: bool,
}

/// A tool's answer, shown to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub content: String,
    /// The tool ran but reports a failure (the model should see it as one).
    pub is_error: bool,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: false,
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: true,
        }
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
/// never block the tool: if the engine is far behind they are dropped
/// (the final result always arrives).
#[derive(Debug, Clone)]
pub struct ProgressHandle {
    call_id: ToolCallId,
    tx: Option<mpsc::Sender<(ToolCallId, Progress)>>,
}

impl ProgressHandle {
    pub fn new(call_id: ToolCallId, tx: mpsc::Sender<(ToolCallId, Progress)>) -> Self {
        ProgressHandle {
            call_id,
            tx: Some(tx),
        }
    }

    /// A handle that discards everything (for tests and one-off calls).
    pub fn discard(call_id: ToolCallId) -> Self {
        ProgressHandle { call_id, tx: None }
    }

    pub fn report(&self, progress: Progress) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send((self.call_id.clone(), progress));
        }
    }

    pub fn status(&self, text: impl Into<String>) {
        self.report(Progress::Status { text: text.into() });
    }

    pub fn output(&self, text: impl Into<String>) {
        self.report(Progress::Output { text: text.into() });
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
        }
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;
    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

/// The tools of an engine, by name.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tool`, replacing one of the same name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name.clone(), tool);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec().clone()).collect()
    }
}
