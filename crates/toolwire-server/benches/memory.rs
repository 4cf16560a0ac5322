//! What compiling an agent's memory blocks into its prompt costs, per
//! model step: 1,000 prompts rendered by `AgentMemory` (the turn's
//! `SystemPrompt`), each reading the agent and its four blocks from a
//! SQLite file through the engine's store and compiling them as Letta
//! does; and the compilation alone (`memory::compile` + `place`) of the
//! same blocks, without the reads. The blocks hold what a working agent's
//! do: a persona and a human of ~1 KB, a 2 KB notes block and a 4 KB
//! project block, about 8 KB of memory in all.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use chrono::Utc;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use toolwire_engine::{EngineConfig, SystemPrompt};
use toolwire_server::agents::blocks::{self, BlockCreate, BlockRecord};
use toolwire_server::agents::memory::{self, AgentMemory};
use toolwire_server::agents::{self, AgentRecord};
use toolwire_tools::ToolRegistry;

const PROMPTS: u32 = 1_000;
const STORED: &str = "You are a helpful assistant with a memory.";

fn block(label: &str, bytes: usize) -> BlockRecord {
    let line = "The user prefers short answers and works on a Rust agent runtime.\n";
    BlockRecord::create(BlockCreate {
        label: Some(label.into()),
        value: Some(line.repeat(bytes / line.len() + 1)),
        limit: Some(20_000),
        ..BlockCreate::default()
    })
    .unwrap()
}

fn memory_bench(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = rt.block_on(toolwire_test_support::engine_at(
        &dir.path().join("memory.db"),
        toolwire_test_support::script("steps:\n  - text: \"ok\"\n"),
        ToolRegistry::new(),
        EngineConfig::default(),
    ));
    let made = vec![
        block("persona", 1_000),
        block("human", 1_000),
        block("notes", 2_000),
        block("project", 4_000),
    ];
    let agent = rt.block_on(async {
        blocks::save_all(&engine, &made).await.unwrap();
        let conversation = engine.create_conversation_with(STORED, None).await.unwrap();
        let now = Utc::now();
        let agent = AgentRecord {
            id: format!("agent-{}", uuid::Uuid::now_v7()),
            name: "bench".into(),
            description: None,
            model: None,
            model_settings: None,
            tool_ids: Vec::new(),
            tool_rules: Vec::new(),
            tags: Vec::new(),
            metadata: None,
            block_ids: made.iter().map(|b| b.id.clone()).collect(),
            memory_blocks: Vec::new(),
            embedding: None,
            conversation_id: conversation.id,
            approvals: Default::default(),
            approval_timeout_seconds: None,
            created_at: now,
            updated_at: now,
        };
        agents::save_to(&engine, &agent).await.unwrap();
        agent
    });
    let hook = AgentMemory::new(&engine, &agent.id);
    let size = rt.block_on(hook.render(STORED)).unwrap().len();

    // The figure the docs quote: 1,000 prompts in a row, as 1,000 model
    // steps would ask for them.
    let start = Instant::now();
    for _ in 0..PROMPTS {
        let prompt = rt.block_on(hook.render(STORED)).unwrap();
        assert_eq!(prompt.len(), size);
    }
    let per = start.elapsed() / PROMPTS;
    eprintln!("{PROMPTS} prompts of {size} bytes rendered from the store: {per:?} per prompt");
    let start = Instant::now();
    for _ in 0..PROMPTS {
        let prompt = memory::place(STORED, &memory::compile(&engine, &agent, &made));
        assert_eq!(prompt.len(), size);
    }
    let per = start.elapsed() / PROMPTS;
    eprintln!("{PROMPTS} prompts compiled from blocks in memory: {per:?} per prompt");

    let mut group = c.benchmark_group("memory");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("render_from_store", |b| {
        b.iter(|| rt.block_on(hook.render(STORED)).unwrap())
    });
    group.bench_function("compile_only", |b| {
        b.iter(|| memory::place(STORED, &memory::compile(&engine, &agent, &made)))
    });
    group.finish();
}

criterion_group!(benches, memory_bench);
criterion_main!(benches);
