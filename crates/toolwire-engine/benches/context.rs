//! The context window: what compaction saves, and what size accounting
//! costs.
//!
//! Printed before the timed runs:
//!
//! * **Tokens sent per step** over the 200-step tool loop of
//!   `tests/context_window.rs` (each result about 400 tokens, ten times
//!   an 8,000-token window in all), against the mock model on loopback
//!   (its own token counts): with compaction (the engine knows the
//!   window), and without (the engine does not know it) until the mock
//!   refuses a request over its window.
//! * **The estimate's accuracy**: the engine's count of each request
//!   (its estimator over the path, as `fit` counts a path no provider
//!   has counted) against the mock's count of the same request.
//! * **Accounting overhead per step**: the scripted engine of
//!   `benches/step.rs` (5 no-op tool steps and an answer per turn, SQLite
//!   file) with the model's window unknown (no accounting: today's step)
//!   and known (every step measured before it is sent), alternating
//!   rounds in one run; medians per step.
//!
//! Then criterion: `context/per_step/{window_unknown,window_known}`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use tokio::runtime::Runtime;
use toolwire_core::{ConversationId, Message, StopReason};
use toolwire_engine::context::Family;
use toolwire_engine::{Engine, EngineConfig};
use toolwire_providers::{ModelEntry, Models, OpenAiProvider, Script, ScriptedProvider};
use toolwire_test_support::{Answer, MockServer, Windowed, Wire, http, is_summary_request};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

const WINDOW: u64 = 8_000;
const LOOP_STEPS: u64 = 200;

struct Chunks {
    spec: Arc<ToolSpec>,
}

fn chunk(n: u64) -> String {
    (0..20)
        .map(|j| {
            format!(
                "chunk {n} line {j}: the quick brown fox jumps over the lazy dog {}\n",
                n * 1000 + j
            )
        })
        .collect()
}

#[async_trait]
impl Tool for Chunks {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let n = arguments["n"].as_u64().unwrap_or(0);
        Ok(ToolOutput::ok(chunk(n)))
    }
}

fn tool(name: &str) -> Arc<ToolSpec> {
    Arc::new(ToolSpec {
        name: name.into(),
        server: None,
        description: "Reads chunk n.".into(),
        parameters: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        read_only: true,
    })
}

fn chunk_tools() -> ToolRegistry {
    let mut r = ToolRegistry::new();
    r.register(Arc::new(Chunks {
        spec: tool("read_chunk"),
    }));
    r
}

/// One 200-step loop against the mock: the mock's count of every
/// non-summary request, the number of summaries, how the turn ended, and
/// the stored path.
async fn long_loop(window_known: bool) -> (Vec<u64>, usize, StopReason, Vec<Message>) {
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let step = Arc::new(AtomicUsize::new(0));
    let summaries = Arc::new(AtomicUsize::new(0));
    let (s, m) = (step.clone(), summaries.clone());
    let server = MockServer::start(vec![window.reply(move |r| {
        if is_summary_request(r) {
            let k = m.fetch_add(1, Ordering::SeqCst);
            return Answer::Text(format!(
                "Summary {k}: the user asked to read every chunk; those read so far hold \
                 numbered lines about a fox and a dog. Go on with the next chunk."
            ));
        }
        let n = s.fetch_add(1, Ordering::SeqCst) as u64;
        if n < LOOP_STEPS {
            Answer::Calls(vec![(
                format!("call_{n}"),
                "read_chunk".into(),
                json!({"n": n}),
            )])
        } else {
            Answer::Text("done".into())
        }
    })])
    .await;
    // "gpt-test" has no known window: the engine measures nothing.
    let id = if window_known { "gpt-4o" } else { "gpt-test" };
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), id, true));
    let mut entry = toolwire_test_support::model_entry("gpt", "openai", provider, &[]);
    entry.info.context_window = window_known.then_some(WINDOW);
    let models = Models::new(vec![entry], None).unwrap();
    let config = EngineConfig {
        max_steps: 400,
        ..EngineConfig::default()
    };
    let (engine, _dir) = toolwire_test_support::engine(models, chunk_tools(), config).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "Read every chunk.").await.unwrap();
    let sizes: Vec<u64> = server
        .received()
        .iter()
        .zip(window.sizes())
        .filter(|(r, _)| !is_summary_request(r))
        .map(|(_, s)| s)
        .collect();
    let leaf = engine
        .store()
        .conversation(conv.id)
        .await
        .unwrap()
        .active_leaf;
    let path = engine.store().path_to(leaf).await.unwrap();
    (
        sizes,
        summaries.load(Ordering::SeqCst),
        outcome.reason,
        path,
    )
}

fn stats(v: &[u64]) -> (f64, u64, u64) {
    let mut s = v.to_vec();
    s.sort_unstable();
    let mean = s.iter().sum::<u64>() as f64 / s.len().max(1) as f64;
    (mean, s[s.len() / 2], *s.last().unwrap_or(&0))
}

fn tokens_per_step(rt: &Runtime) {
    let (with, summaries, reason, _) = rt.block_on(long_loop(true));
    let (without, _, reason_without, path) = rt.block_on(long_loop(false));
    let (mean, median, max) = stats(&with);
    println!("tokens sent per step, 200-step loop, 8,000-token window (the mock's counts):");
    println!(
        "  with compaction:    {} requests, ended {}, {summaries} compactions, mean {mean:.0}, median {median}, max {max}, total {}",
        with.len(),
        reason.as_str(),
        with.iter().sum::<u64>()
    );
    let fit: Vec<u64> = without.iter().copied().filter(|s| *s <= WINDOW).collect();
    let (mean, median, max) = stats(&fit);
    println!(
        "  without compaction: {} requests sent, ended {} at step {} (its request {} tokens), before it mean {mean:.0}, median {median}, max {max}, total {}",
        without.len(),
        reason_without.as_str(),
        without.len(),
        without.last().unwrap_or(&0),
        fit.iter().sum::<u64>()
    );
    // The with-compaction figures over the same steps, for a like-for-like
    // comparison.
    let same = &with[..fit.len().min(with.len())];
    let (mean, median, max) = stats(same);
    println!(
        "  with compaction, the same first {} steps: mean {mean:.0}, median {median}, max {max}, total {}",
        same.len(),
        same.iter().sum::<u64>()
    );

    // The estimator against the mock: request k (no compaction) sends the
    // root's prompt, the tools and the path's first k messages after the
    // root (the user message, then call/result pairs).
    // The engine sends the notifications' addition after the prompt.
    let system = format!(
        "{}\n\n{}",
        path[0].text(),
        toolwire_core::notification::SYSTEM_PROMPT_ADDITION
    );
    let fixed = 4 + Family::O200k.count(&system) + Family::O200k.tools(&[tool("read_chunk")]);
    let mut errors = Vec::new();
    for (k, mock) in without.iter().enumerate() {
        let upto = 1 + 1 + 2 * k;
        if upto > path.len() {
            break;
        }
        let estimate: u64 = fixed
            + path[1..upto]
                .iter()
                .map(|m| Family::O200k.message(m))
                .sum::<u64>();
        errors.push((estimate as f64 - *mock as f64) / *mock as f64);
    }
    let n = errors.len().max(1) as f64;
    let mean = errors.iter().sum::<f64>() / n;
    let worst = errors.iter().fold(0.0f64, |a, e| a.max(e.abs()));
    println!(
        "estimate against the mock's count over {} requests: mean {:+.1}%, worst {:.1}%",
        errors.len(),
        mean * 100.0,
        worst * 100.0
    );
}

// -- accounting overhead --------------------------------------------------

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

const TOOL_STEPS: usize = 5;
const STEPS_PER_TURN: u32 = TOOL_STEPS as u32 + 1;

fn script() -> Script {
    let mut steps: Vec<Value> = (0..TOOL_STEPS)
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

async fn scripted_engine(window: Option<u64>, dir: &std::path::Path) -> Engine {
    let provider = Arc::new(ScriptedProvider::new(script(), false));
    let mut entry = ModelEntry {
        info: toolwire_providers::ModelInfo {
            name: "scripted".into(),
            provider: "scripted".into(),
            model: "scripted".into(),
            ..Default::default()
        },
        provider,
    };
    entry.info.context_window = window;
    let models = Models::new(vec![entry], None).unwrap();
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Noop { spec: tool("noop") }));
    let url = format!("sqlite://{}", dir.join("bench.db").display());
    let store = toolwire_store::open(&url).await.unwrap();
    Engine::start(store, models, tools, EngineConfig::default())
        .await
        .unwrap()
}

fn timed_turns(rt: &Runtime, engine: &Engine, iters: u64) -> Duration {
    rt.block_on(async {
        let mut conversations: Vec<ConversationId> = Vec::with_capacity(iters as usize);
        for _ in 0..iters {
            conversations.push(engine.create_conversation(None).await.unwrap().id);
        }
        let start = Instant::now();
        for c in conversations {
            let outcome = engine.run(c, "go").await.unwrap();
            assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
        }
        start.elapsed() / STEPS_PER_TURN
    })
}

fn bench(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    tokens_per_step(&rt);

    let dir = tempfile::tempdir().unwrap();
    let unknown = rt.block_on(scripted_engine(None, dir.path()));
    let known = rt.block_on(scripted_engine(Some(1_000_000), dir.path()));
    // Alternating rounds, so that the machine's load falls on both alike.
    const ROUNDS: usize = 15;
    const TURNS: u64 = 40;
    timed_turns(&rt, &unknown, 10);
    timed_turns(&rt, &known, 10);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        a.push(timed_turns(&rt, &unknown, TURNS) / TURNS as u32);
        b.push(timed_turns(&rt, &known, TURNS) / TURNS as u32);
    }
    a.sort();
    b.sort();
    let (ma, mb) = (a[ROUNDS / 2], b[ROUNDS / 2]);
    println!(
        "per step, alternating {ROUNDS} rounds of {TURNS} turns: window unknown (no accounting) {ma:?}, window known (accounting) {mb:?}: {:+.1}%",
        (mb.as_secs_f64() / ma.as_secs_f64() - 1.0) * 100.0
    );

    let mut group = c.benchmark_group("context/per_step");
    group.bench_function("window_unknown", |bch| {
        bch.iter_custom(|iters| timed_turns(&rt, &unknown, iters))
    });
    group.bench_function("window_known", |bch| {
        bch.iter_custom(|iters| timed_turns(&rt, &known, iters))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
