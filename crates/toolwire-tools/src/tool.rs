//! Tools: what the model can call. A [`Tool`] has a [`ToolSpec`] (shown to
//! the model) and runs with a [`ToolContext`] (who called, cancellation,
//! progress). Tool failures are results the model sees, not engine errors.

use std::collections::BTreeMap;
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
    fn spec(&self) -> &ToolSpec;
    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

/// Tools whose list can change while the engine runs: an MCP server's
/// tools change when it says so (`notifications/tools/list_changed`) or when
/// it is restarted. A [`ToolRegistry`] asks a source for its tools each time
/// it is read, so the model is shown what can be called now rather than what
/// could be called at start-up.
pub trait ToolSource: Send + Sync {
    /// The tools now. Called for every model request: keep it cheap.
    fn current_tools(&self) -> Vec<Arc<dyn Tool>>;

    /// The tool named `name` now, if there is one.
    fn current_tool(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.current_tools()
            .into_iter()
            .find(|tool| tool.spec().name == name)
    }
}

/// The tools of an engine, by name: tools registered one by one, and the
/// tools that [`ToolSource`]s have at the moment they are asked. A name
/// registered as a tool wins over a source's tool of the same name, and an
/// earlier source wins over a later one.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    sources: Vec<Arc<dyn ToolSource>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.specs().into_iter().map(|spec| spec.name))
            .finish()
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

    /// Adds a source whose tools are looked up each time the registry is read.
    pub fn register_source(&mut self, source: Arc<dyn ToolSource>) {
        self.sources.push(source);
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        if let Some(tool) = self.tools.get(name) {
            return Some(Arc::clone(tool));
        }
        self.sources
            .iter()
            .find_map(|source| source.current_tool(name))
    }

    /// One spec per name, sorted by name (a stable prompt from one request
    /// to the next), with the precedence of [`get`](Self::get).
    pub fn specs(&self) -> Vec<ToolSpec> {
        if self.sources.is_empty() {
            return self.tools.values().map(|t| t.spec().clone()).collect();
        }
        let current: Vec<Vec<Arc<dyn Tool>>> =
            self.sources.iter().map(|s| s.current_tools()).collect();
        let mut by_name: BTreeMap<&str, &ToolSpec> = self
            .tools
            .iter()
            .map(|(name, tool)| (name.as_str(), tool.spec()))
            .collect();
        for tool in current.iter().flatten() {
            let spec = tool.spec();
            by_name.entry(spec.name.as_str()).or_insert(spec);
        }
        by_name.into_values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    struct Named(ToolSpec);

    #[async_trait]
    impl Tool for Named {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        async fn call(&self, _: Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::ok(self.0.description.clone()))
        }
    }

    fn tool(name: &str, from: &str) -> Arc<dyn Tool> {
        Arc::new(Named(ToolSpec {
            name: name.to_owned(),
            server: None,
            description: from.to_owned(),
            parameters: serde_json::json!({"type": "object"}),
            read_only: true,
        }))
    }

    /// A source whose list the test changes, as a server's list changes.
    #[derive(Default)]
    struct Changing(Mutex<Vec<Arc<dyn Tool>>>);

    impl ToolSource for Changing {
        fn current_tools(&self) -> Vec<Arc<dyn Tool>> {
            self.0.lock().map(|tools| tools.clone()).unwrap_or_default()
        }
    }

    fn from(registry: &ToolRegistry, name: &str) -> Option<String> {
        registry.get(name).map(|t| t.spec().description.clone())
    }

    #[test]
    fn sources_are_read_each_time_and_registered_tools_win() {
        let source = Arc::new(Changing::default());
        let other = Arc::new(Changing::default());
        let mut registry = ToolRegistry::new();
        registry.register(tool("b", "registered"));
        registry.register_source(source.clone());
        registry.register_source(other.clone());
        *other.0.lock().unwrap() = vec![tool("c", "other")];
        assert_eq!(names(&registry), ["b", "c"]);

        *source.0.lock().unwrap() = vec![
            tool("a", "source"),
            tool("b", "source"),
            tool("c", "source"),
        ];
        assert_eq!(names(&registry), ["a", "b", "c"]);
        assert_eq!(from(&registry, "a").as_deref(), Some("source"));
        assert_eq!(from(&registry, "b").as_deref(), Some("registered"));
        assert_eq!(from(&registry, "c").as_deref(), Some("source"));
        let specs = registry.specs();
        assert_eq!(specs[1].description, "registered");
        assert_eq!(specs[2].description, "source");

        source.0.lock().unwrap().clear();
        assert_eq!(names(&registry), ["b", "c"]);
        assert!(registry.get("a").is_none());
        assert_eq!(from(&registry, "c").as_deref(), Some("other"));
    }

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

    fn names(registry: &ToolRegistry) -> Vec<String> {
        registry.specs().into_iter().map(|s| s.name).collect()
    }
}
