//! Engines as tests build them: a real SQLite file in a temporary
//! directory, any provider (the scripted one for a turn that needs no
//! HTTP, an HTTP provider pointed at the mock model server), and reading
//! back what the engine stored.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toolwire_core::{AgentEvent, ConversationId};
use toolwire_engine::{Engine, EngineConfig};
use toolwire_providers::{
    HttpSettings, ModelEntry, ModelInfo, Models, Provider, RetryPolicy, Script, ScriptedProvider,
    StreamLimits,
};
use toolwire_store::Store;
use toolwire_tools::ToolRegistry;

/// The scripted provider playing `yaml` (see `Script::parse`).
pub fn script(yaml: &str) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new(Script::parse(yaml).unwrap(), false))
}

/// A registry entry: `provider` named `name`, of provider kind `kind`
/// (`openai`, `anthropic`, `scripted`), answering for `fallback` in order
/// when it cannot.
pub fn model_entry(
    name: &str,
    kind: &str,
    provider: Arc<dyn Provider>,
    fallback: &[&str],
) -> ModelEntry {
    ModelEntry {
        info: ModelInfo {
            name: name.to_owned(),
            provider: kind.to_owned(),
            model: provider.model().to_owned(),
            fallback: fallback.iter().map(|f| (*f).to_owned()).collect(),
            ..ModelInfo::default()
        },
        provider,
    }
}

/// A SQLite store in a temporary directory (kept alive by the returned
/// guard).
pub async fn sqlite_store() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("test.db").display());
    (toolwire_store::open(&url).await.unwrap(), dir)
}

/// The HTTP settings of a provider at `url` (the mock model server): a
/// test key, quick retries (10 ms base) so that fault tests stay fast.
pub fn http(url: &str) -> HttpSettings {
    HttpSettings {
        base_url: url.to_owned(),
        api_key: Some("test-key".into()),
        retry: RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(2),
            max_retry_after: Duration::from_secs(2),
        },
        headers: Vec::new(),
        limits: StreamLimits::default(),
        max_tokens: 1024,
    }
}

/// An engine over a new SQLite file in a temporary directory (kept alive
/// by the returned guard).
pub async fn engine(
    provider: impl Into<Models>,
    tools: ToolRegistry,
    config: EngineConfig,
) -> (Engine, tempfile::TempDir) {
    let (store, dir) = sqlite_store().await;
    (
        Engine::start(store, provider, tools, config).await.unwrap(),
        dir,
    )
}

/// The scripted engine: [`engine`] with the scripted provider playing
/// `yaml`.
pub async fn scripted_engine(
    yaml: &str,
    tools: ToolRegistry,
    config: EngineConfig,
) -> (Engine, tempfile::TempDir) {
    engine(script(yaml), tools, config).await
}

/// An engine over the SQLite database at `db` (created if missing), as a
/// server or a second engine of the same file opens it.
pub async fn engine_at(
    db: &Path,
    provider: impl Into<Models>,
    tools: ToolRegistry,
    config: EngineConfig,
) -> Engine {
    let store = toolwire_store::open(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    Engine::start(store, provider, tools, config).await.unwrap()
}

/// Every stored event of a conversation, by type name.
pub async fn event_types(engine: &Engine, conversation: ConversationId) -> Vec<String> {
    engine
        .events_since(conversation, 0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| type_of(&e.event))
        .collect()
}

/// The `type` an event is stored under (`text_delta`, `tool_call_started` …).
pub fn type_of(event: &AgentEvent) -> String {
    serde_json::to_value(event).unwrap()["type"]
        .as_str()
        .unwrap()
        .to_owned()
}
