//! How much of a tool loop's prompt Anthropic's cache serves: a 20-step
//! turn (19 `read_file` calls on real files, then an answer) against a
//! mock Anthropic server over loopback that keeps Anthropic's prompt cache
//! from each request's own `cache_control` breakpoints (see
//! `toolwire_test_support::anthropic_cache`: prefixes hashed block by
//! block, written at breakpoints of at least 1,024 tokens, read back at a
//! breakpoint or up to 20 blocks before one; tokens estimated as bytes / 4)
//! and reports usage as Anthropic does. The engine is the real one (SQLite
//! file, the built-in tools over a temporary workspace); the figures are
//! what it counted from the reported usage.
//!
//! Prints, with caching on and then off: each step's prompt split into
//! read / written / uncached tokens, the share of prompt tokens read from
//! the cache (target: at least 80 %), and the turn's cost at Claude Sonnet
//! prices ($3 input, $0.30 cache read, $3.75 cache write, $15 output per
//! million tokens). Then the same turn with 10 parallel calls per step:
//! each step adds 21 blocks, more than Anthropic's 20-block lookback, so
//! the prefix is read back only through the breakpoint kept on the
//! previous request's end.
//!
//! Not a timing: the counts are the same in any build profile. Run with
//! `cargo bench -p toolwire-engine --bench prompt_cache`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use toolwire_core::{Price, PriceTable, StopReason};
use toolwire_engine::EngineConfig;
use toolwire_providers::AnthropicProvider;
use toolwire_test_support::anthropic_cache::CacheUsage;
use toolwire_test_support::{
    Call, MockServer, PromptCache, Reply, anthropic_sse_with_usage, engine, http,
};
use toolwire_tools::ToolRegistry;
use toolwire_tools::builtin::{self, Workspace};
use toolwire_tools::confined::Mode;

const STEPS: usize = 20;
/// Anthropic's minimum cacheable prompt for Sonnet and Opus.
const MIN_CACHEABLE_TOKENS: u64 = 1024;
const MODEL: &str = "claude-sonnet-4-5";

/// What one run of the loop reported: `STEPS` model calls, each of the
/// first `STEPS - 1` asking for `parallel` files.
struct Run {
    steps: Vec<CacheUsage>,
    prompt_tokens: u64,
    cached_tokens: u64,
    cache_write_tokens: u64,
    cost: f64,
}

/// A source file of about 3 KB, different for each `n`.
fn source_file(n: usize) -> String {
    let mut s = format!("//! Module {n}: parsing and checking of the settings file.\n\n");
    for f in 0..12 {
        s.push_str(&format!(
            "/// Reads field {f} of section {n}, or its default.\n\
             pub fn field_{n}_{f}(table: &Table) -> Result<u64, Error> {{\n    \
             table.get(\"field_{f}\").map_or(Ok({f}), |v| v.as_u64().ok_or(Error::NotANumber(\"field_{f}\")))\n}}\n\n"
        ));
    }
    s
}

async fn run(caching: bool, parallel: usize) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workspace");
    std::fs::create_dir_all(root.join("src")).unwrap();
    for n in 0..STEPS {
        std::fs::write(root.join(format!("src/module_{n}.rs")), source_file(n)).unwrap();
    }
    let workspace = Arc::new(Workspace::new(&root).unwrap());
    let sandbox = Arc::new(toolwire_test_support::sandbox::protecting(
        env!("CARGO_BIN_EXE_toolwire-engine-sandbox"),
        Mode::WorkspaceWrite,
        false,
        &[],
    ));
    let mut tools = ToolRegistry::new();
    for tool in builtin::all(workspace, sandbox) {
        tools.register(tool);
    }

    let cache = Arc::new(PromptCache::new(MIN_CACHEABLE_TOKENS));
    let reported = Arc::new(Mutex::new(Vec::new()));
    let log = reported.clone();
    let step = AtomicUsize::new(0);
    let server = MockServer::start(vec![Reply::Respond(Arc::new(move |request| {
        let usage = cache.usage(&request.body);
        log.lock().unwrap().push(usage);
        let n = step.fetch_add(1, Ordering::SeqCst);
        let ids: Vec<String> = (0..parallel)
            .map(|k| format!("toolu_{n:02}_{k:02}"))
            .collect();
        let calls: Vec<Call<'_>> = ids
            .iter()
            .enumerate()
            .map(|(k, id)| Call {
                id,
                name: "read_file",
                arguments: json!({"path": format!("src/module_{}.rs", (n * parallel + k) % STEPS)}),
            })
            .collect();
        let body = if n + 1 < STEPS {
            anthropic_sse_with_usage(
                &format!("Reading the next {parallel}."),
                &calls,
                usage.json(),
            )
        } else {
            anthropic_sse_with_usage(
                "Every module reads its fields the same way; none is missing a default.",
                &[],
                usage.json(),
            )
        };
        Reply::sse(body)
    }))])
    .await;

    let provider = Arc::new(
        AnthropicProvider::new(http(&server.url), MODEL, true).with_prompt_caching(caching),
    );
    let mut prices = PriceTable::default();
    prices.0.insert(
        MODEL.into(),
        Price {
            input: 3.0,
            output: 15.0,
            cached_input: Some(0.3),
            cache_write: None,
        },
    );
    let config = EngineConfig {
        prices,
        ..EngineConfig::default()
    };
    let (engine, _db) = engine(provider, tools, config).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine
        .run(
            conv.id,
            "Read every module under src/ one at a time and tell me whether any field lacks a default.",
        )
        .await
        .unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let steps = reported.lock().unwrap().clone();
    assert_eq!(steps.len(), STEPS, "one request per step");
    Run {
        steps,
        prompt_tokens: outcome.usage.prompt_tokens,
        cached_tokens: outcome.usage.cached_tokens,
        cache_write_tokens: outcome.usage.cache_write_tokens,
        cost: outcome.cost.unwrap(),
    }
}

fn report(name: &str, run: &Run) {
    println!("{name}");
    println!("  step   prompt     read  written  uncached");
    for (i, u) in run.steps.iter().enumerate() {
        println!(
            "  {:>4} {:>8} {:>8} {:>8} {:>9}",
            i + 1,
            u.total(),
            u.cache_read_input_tokens,
            u.cache_creation_input_tokens,
            u.input_tokens
        );
    }
    let share = run.cached_tokens as f64 / run.prompt_tokens as f64;
    println!(
        "  total prompt {} tokens: {} read from the cache ({:.1} %), {} written, {} uncached",
        run.prompt_tokens,
        run.cached_tokens,
        share * 100.0,
        run.cache_write_tokens,
        run.prompt_tokens - run.cached_tokens - run.cache_write_tokens,
    );
    println!("  cost at Sonnet prices: ${:.4}", run.cost);
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let on = rt.block_on(run(true, 1));
    let off = rt.block_on(run(false, 1));
    let wide = rt.block_on(run(true, 10));
    report("prompt caching on", &on);
    report("prompt caching off", &off);
    report("prompt caching on, 10 parallel calls per step", &wide);
    // The engine's counts are the mock's reports, summed.
    assert_eq!(
        on.prompt_tokens,
        on.steps.iter().map(CacheUsage::total).sum::<u64>()
    );
    assert_eq!(off.cached_tokens, 0);
    println!(
        "share of prompt tokens read from the cache: {:.1} % (target >= 80 %); cost {:.0} % of uncached",
        on.cached_tokens as f64 / on.prompt_tokens as f64 * 100.0,
        on.cost / off.cost * 100.0
    );
    println!(
        "with 10 parallel calls per step: {:.1} %",
        wide.cached_tokens as f64 / wide.prompt_tokens as f64 * 100.0
    );
}
