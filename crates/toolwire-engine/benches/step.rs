//! Engine overhead per step.
//!
//! The scripted provider plays steps with no delay and one chunk per model
//! call (`chunk_size: 65536`), so a step costs what the engine itself
//! costs: building the request (the conversation path), decoding, storing
//! and publishing every event, storing the messages, running one no-op
//! tool. The store is an SQLite *file* in a temporary directory. Every
//! measured turn runs in a fresh conversation (created outside the timing).
//!
//! * `engine_step/per_step/tool_turn_sqlite_file`: a turn of 6 model calls
//!   (5 that call the no-op tool, then a final answer); the time reported
//!   is the turn's time divided by 6, i.e. per step (target < 1 ms).
//! * `engine_step/per_step/tool_turn_sqlite_memory`: the same on
//!   `sqlite::memory:`, to separate file I/O from the rest.
//! * `engine_step/text_only_turn/sqlite_file`: a turn of one model call
//!   that only answers text.
//! * `store/append_event/sqlite_file`: one event appended (one
//!   transaction), the unit most of a step is made of.
//!
//! Before the timed runs, a breakdown is printed: the store calls a turn
//! makes and the time they take, measured through a counting `Store`
//! wrapper.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use tokio::runtime::Runtime;
use toolwire_core::{
    AgentEvent, Conversation, ConversationId, InstanceId, Message, MessageId, RunId, StopReason,
};
use toolwire_engine::{Engine, EngineConfig};
use toolwire_providers::{Script, ScriptedProvider};
use toolwire_store::{
    ConversationSummary, InstanceRecord, RunRecord, Store, StoreRead, StoredEvent, UnfinishedRun,
};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

/// Tool-calling steps per measured turn (plus one final answer).
const TOOL_STEPS: usize = 5;
const STEPS_PER_TURN: u32 = TOOL_STEPS as u32 + 1;

/// A tool that does nothing.
struct Noop {
    spec: Arc<ToolSpec>,
}

#[async_trait]
impl Tool for Noop {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, _arguments: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::ok("ok"))
    }
}

fn noop_tools() -> ToolRegistry {
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Noop {
        spec: Arc::new(ToolSpec {
            name: "noop".into(),
            server: None,
            description: "Does nothing.".into(),
            parameters: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            read_only: true,
        }),
    }));
    tools
}

/// `tool_steps` steps calling `noop`, then a final answer; no delay, one
/// chunk per model call.
fn script(tool_steps: usize) -> Script {
    let mut steps: Vec<Value> = (0..tool_steps)
        .map(|i| {
            json!({
                "text": "Checking.",
                "tool_calls": [{"name": "noop", "arguments": {"n": i}}],
                "chunk_size": 65536,
                "delay_ms": 0,
            })
        })
        .collect();
    steps.push(json!({"text": "All done.", "chunk_size": 65536, "delay_ms": 0}));
    Script::parse(&json!({ "steps": steps }).to_string()).unwrap()
}

async fn engine(store: Arc<dyn Store>, tool_steps: usize) -> Engine {
    let provider = Arc::new(ScriptedProvider::new(script(tool_steps), false));
    Engine::start(store, provider, noop_tools(), EngineConfig::default())
        .await
        .unwrap()
}

async fn one_turn(engine: &Engine, conversation: ConversationId) {
    let outcome = engine.run(conversation, "go").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
}

/// Runs `iters` turns, each in a conversation made beforehand; returns the
/// time of the turns alone, divided by `divide`.
fn timed_turns(rt: &Runtime, engine: &Engine, iters: u64, divide: u32) -> Duration {
    rt.block_on(async {
        let mut conversations = Vec::with_capacity(iters as usize);
        for _ in 0..iters {
            conversations.push(engine.create_conversation(None).await.unwrap().id);
        }
        let start = Instant::now();
        for c in conversations {
            one_turn(engine, black_box(c)).await;
        }
        start.elapsed() / divide
    })
}

fn sqlite_file(rt: &Runtime) -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    (rt.block_on(toolwire_store::open(&url)).unwrap(), dir)
}

fn bench_steps(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();

    let (file_store, _dir) = sqlite_file(&rt);
    breakdown(&rt, file_store.clone());

    let memory_store = rt
        .block_on(toolwire_store::open("sqlite::memory:"))
        .unwrap();
    let mut group = c.benchmark_group("engine_step/per_step");
    for (name, store) in [
        ("tool_turn_sqlite_file", file_store.clone()),
        ("tool_turn_sqlite_memory", memory_store),
    ] {
        let engine = rt.block_on(engine(store, TOOL_STEPS));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| timed_turns(&rt, &engine, iters, STEPS_PER_TURN))
        });
    }
    group.finish();

    let engine = rt.block_on(engine(file_store.clone(), 0));
    c.bench_function("engine_step/text_only_turn/sqlite_file", |b| {
        b.iter_custom(|iters| timed_turns(&rt, &engine, iters, 1))
    });

    let conversation = rt
        .block_on(file_store.create_conversation("bench", None))
        .unwrap();
    let event = AgentEvent::TextDelta {
        run_id: RunId::new(),
        text: "Checking.".into(),
    };
    c.bench_function("store/append_event/sqlite_file", |b| {
        b.iter(|| {
            rt.block_on(file_store.append_event(conversation.id, black_box(&event)))
                .unwrap()
        })
    });
}

/// Prints the store calls of one tool turn and their share of its time.
fn breakdown(rt: &Runtime, store: Arc<dyn Store>) {
    const TURNS: u32 = 200;
    let counting = Arc::new(Counting {
        inner: store,
        calls: Mutex::new(BTreeMap::new()),
    });
    let engine = rt.block_on(engine(counting.clone(), TOOL_STEPS));
    // Warm up, then count.
    timed_turns(rt, &engine, 20, 1);
    counting.calls.lock().unwrap().clear();
    let conversations: Vec<ConversationId> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..TURNS {
            v.push(engine.create_conversation(None).await.unwrap().id);
        }
        v
    });
    counting.calls.lock().unwrap().clear();
    let start = Instant::now();
    rt.block_on(async {
        for c in &conversations {
            one_turn(&engine, *c).await;
        }
    });
    let total = start.elapsed();
    let last = *conversations.last().unwrap();
    let calls = counting.calls.lock().unwrap().clone();
    let store_time: Duration = calls.values().map(|(_, t)| *t).sum();
    let store_calls: u64 = calls.values().map(|(n, _)| *n).sum();
    eprintln!(
        "\nbreakdown of a turn of {STEPS_PER_TURN} model calls ({TOOL_STEPS} with one no-op tool call), \
         mean over {TURNS} turns, SQLite file:"
    );
    eprintln!(
        "  turn {:>8.1} µs = {:.1} µs per step; store calls {:.1} per turn ({:.1} per step), \
         {:.1} µs per turn in the store ({:.0}%)",
        micros(total) / f64::from(TURNS),
        micros(total) / f64::from(TURNS * STEPS_PER_TURN),
        store_calls as f64 / f64::from(TURNS),
        store_calls as f64 / f64::from(TURNS * STEPS_PER_TURN),
        micros(store_time) / f64::from(TURNS),
        100.0 * store_time.as_secs_f64() / total.as_secs_f64(),
    );
    for (name, (n, t)) in calls.iter() {
        eprintln!(
            "  {name:<22} {:>5.1} calls/turn  {:>7.1} µs/call  {:>8.1} µs/turn",
            *n as f64 / f64::from(TURNS),
            micros(*t) / *n as f64,
            micros(*t) / f64::from(TURNS),
        );
    }
    let mut types: BTreeMap<String, usize> = BTreeMap::new();
    for e in rt.block_on(engine.events_since(last, 0, 10_000)).unwrap() {
        let kind = serde_json::to_value(&e.event).unwrap()["type"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        *types.entry(kind).or_default() += 1;
    }
    eprintln!("  events of one turn (one append_event transaction each):");
    for (kind, n) in &types {
        eprintln!("    {kind:<26} {n}");
    }
    eprintln!();
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A store that counts and times the calls it passes on.
struct Counting {
    inner: Arc<dyn Store>,
    calls: Mutex<BTreeMap<&'static str, (u64, Duration)>>,
}

impl Counting {
    async fn time<T>(&self, name: &'static str, f: impl Future<Output = T>) -> T {
        let start = Instant::now();
        let out = f.await;
        let took = start.elapsed();
        let mut calls = self.calls.lock().unwrap();
        let entry = calls.entry(name).or_default();
        entry.0 += 1;
        entry.1 += took;
        out
    }
}

type R<T> = toolwire_store::Result<T>;

#[async_trait]
impl StoreRead for Counting {
    async fn conversation(&self, id: ConversationId) -> R<Conversation> {
        self.time("conversation", self.inner.conversation(id)).await
    }
    async fn list_conversations(&self) -> R<Vec<ConversationSummary>> {
        self.time("list_conversations", self.inner.list_conversations())
            .await
    }
    async fn message(&self, id: MessageId) -> R<Message> {
        self.time("message", self.inner.message(id)).await
    }
    async fn path_to(&self, leaf: MessageId) -> R<Vec<Message>> {
        self.time("path_to", self.inner.path_to(leaf)).await
    }
    async fn children(&self, id: MessageId) -> R<Vec<Message>> {
        self.time("children", self.inner.children(id)).await
    }
    async fn siblings(&self, id: MessageId) -> R<Vec<Message>> {
        self.time("siblings", self.inner.siblings(id)).await
    }
    async fn leaves(&self, c: ConversationId) -> R<Vec<Message>> {
        self.time("leaves", self.inner.leaves(c)).await
    }
    async fn total_cost(&self, c: ConversationId) -> R<f64> {
        self.time("total_cost", self.inner.total_cost(c)).await
    }
    async fn instance(&self, id: InstanceId) -> R<Option<InstanceRecord>> {
        self.time("instance", self.inner.instance(id)).await
    }
    async fn run(&self, id: RunId) -> R<RunRecord> {
        self.time("run", self.inner.run(id)).await
    }
    async fn unfinished_runs(&self) -> R<Vec<UnfinishedRun>> {
        self.time("unfinished_runs", self.inner.unfinished_runs())
            .await
    }
    async fn conversation_unfinished_runs(&self, c: ConversationId) -> R<Vec<UnfinishedRun>> {
        self.time(
            "conversation_unfinished_runs",
            self.inner.conversation_unfinished_runs(c),
        )
        .await
    }
    async fn events_since(&self, c: ConversationId, after: u64, limit: u32) -> R<Vec<StoredEvent>> {
        self.time("events_since", self.inner.events_since(c, after, limit))
            .await
    }
    async fn document(&self, kind: &str, id: &str) -> R<Option<toolwire_store::Document>> {
        self.time("document", self.inner.document(kind, id)).await
    }
    async fn documents(&self, kind: &str) -> R<Vec<toolwire_store::Document>> {
        self.time("documents", self.inner.documents(kind)).await
    }
    async fn messages(&self, c: ConversationId) -> R<Vec<Message>> {
        self.time("messages", self.inner.messages(c)).await
    }
    async fn blob(&self, sha256: &str) -> R<Option<toolwire_store::Blob>> {
        self.time("blob", self.inner.blob(sha256)).await
    }
    async fn conversation_and_document(
        &self,
        c: ConversationId,
        kind: &str,
        id: &str,
    ) -> R<(Conversation, Option<toolwire_store::Document>)> {
        self.time(
            "conversation_and_document",
            self.inner.conversation_and_document(c, kind, id),
        )
        .await
    }
}

#[async_trait]
impl Store for Counting {
    async fn put_blob(&self, media_type: &str, bytes: &[u8]) -> R<toolwire_core::BlobRef> {
        self.time("put_blob", self.inner.put_blob(media_type, bytes))
            .await
    }
    async fn create_conversation(&self, p: &str, t: Option<&str>) -> R<Conversation> {
        self.time("create_conversation", self.inner.create_conversation(p, t))
            .await
    }
    async fn append_with_events(&self, m: &Message, events: &[AgentEvent]) -> R<Vec<u64>> {
        self.time(
            "append_with_events",
            self.inner.append_with_events(m, events),
        )
        .await
    }
    async fn update(&self, m: &Message) -> R<()> {
        self.time("update", self.inner.update(m)).await
    }
    async fn set_active_leaf(&self, c: ConversationId, leaf: MessageId) -> R<()> {
        self.time("set_active_leaf", self.inner.set_active_leaf(c, leaf))
            .await
    }
    async fn fork(&self, at: MessageId) -> R<Conversation> {
        self.time("fork", self.inner.fork(at)).await
    }
    async fn register_instance(&self, id: InstanceId, host: &str, pid: u32) -> R<InstanceRecord> {
        self.time(
            "register_instance",
            self.inner.register_instance(id, host, pid),
        )
        .await
    }
    async fn heartbeat_instance(&self, id: InstanceId) -> R<()> {
        self.time("heartbeat_instance", self.inner.heartbeat_instance(id))
            .await
    }
    async fn forget_instances(&self, silent_since: chrono::DateTime<chrono::Utc>) -> R<u64> {
        self.time(
            "forget_instances",
            self.inner.forget_instances(silent_since),
        )
        .await
    }
    async fn start_run(&self, id: RunId, c: ConversationId, owner: InstanceId) -> R<()> {
        self.time("start_run", self.inner.start_run(id, c, owner))
            .await
    }
    async fn finish_run(&self, id: RunId, reason: StopReason, error: Option<&str>) -> R<()> {
        self.time("finish_run", self.inner.finish_run(id, reason, error))
            .await
    }
    async fn start_run_with_message(
        &self,
        id: RunId,
        owner: InstanceId,
        m: &Message,
        events: &[AgentEvent],
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> R<Vec<u64>> {
        self.time(
            "start_run_with_message",
            self.inner
                .start_run_with_message(id, owner, m, events, documents),
        )
        .await
    }
    async fn interrupt_run(&self, id: RunId) -> R<bool> {
        self.time("interrupt_run", self.inner.interrupt_run(id))
            .await
    }
    async fn finish_run_with_events(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        c: ConversationId,
        events: &[AgentEvent],
    ) -> R<Vec<u64>> {
        self.time(
            "finish_run_with_events",
            self.inner
                .finish_run_with_events(id, reason, error, c, events),
        )
        .await
    }
    async fn finish_run_with_message(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        message: &Message,
        events: &[AgentEvent],
    ) -> R<Vec<u64>> {
        self.time(
            "finish_run_with_message",
            self.inner
                .finish_run_with_message(id, reason, error, message, events),
        )
        .await
    }
    async fn put_documents(&self, documents: &[(&str, &str, &serde_json::Value)]) -> R<()> {
        self.time("put_documents", self.inner.put_documents(documents))
            .await
    }
    async fn append_events(&self, c: ConversationId, events: &[AgentEvent]) -> R<Vec<u64>> {
        self.time("append_events", self.inner.append_events(c, events))
            .await
    }
    async fn put_document(&self, kind: &str, id: &str, body: &serde_json::Value) -> R<()> {
        self.time("put_document", self.inner.put_document(kind, id, body))
            .await
    }
    async fn delete_document(&self, kind: &str, id: &str) -> R<bool> {
        self.time("delete_document", self.inner.delete_document(kind, id))
            .await
    }
    async fn write_documents(
        &self,
        kind: &str,
        changes: &[(String, Option<serde_json::Value>)],
    ) -> R<()> {
        self.time("write_documents", self.inner.write_documents(kind, changes))
            .await
    }
}

criterion_group!(benches, bench_steps);
criterion_main!(benches);
