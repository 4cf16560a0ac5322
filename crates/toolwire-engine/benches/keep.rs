//! What keeping pending notifications in the store costs: a file change
//! told to the 1,000 conversations the engine has run a turn in
//! (`Engine::notify_attached`, as the file watcher does), with and without
//! waiting until every conversation's pending notifications are written
//! (`Engine::keep_notifications`). The engine's own keeper writes
//! alongside, as in a running server. Each conversation has three lines
//! pending, and the change joins one of them (a coalescing window of an
//! hour, no rate limit), so every round writes the same.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use toolwire_core::{FileChange, Incoming, NotifyConfig, Priority};
use toolwire_engine::notify::NotificationSettings;
use toolwire_engine::{Engine, EngineConfig};
use toolwire_providers::{Script, ScriptedProvider};
use toolwire_tools::ToolRegistry;

const CONVERSATIONS: usize = 1_000;

fn keep(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("keep.db").display());
    let engine = rt.block_on(async {
        let store = toolwire_store::open(&url).await.unwrap();
        let script = Script::parse("steps:\n  - text: \"Noted.\"\n").unwrap();
        let provider = Arc::new(ScriptedProvider::new(script, false));
        let config = EngineConfig {
            notifications: NotificationSettings {
                queue: NotifyConfig {
                    coalesce_window: Duration::from_secs(3600),
                    burst: u32::MAX,
                    ..NotifyConfig::default()
                },
                ..NotificationSettings::default()
            },
            ..EngineConfig::default()
        };
        let engine = Engine::start(store, provider, ToolRegistry::new(), config)
            .await
            .unwrap();
        for _ in 0..CONVERSATIONS {
            let conversation = engine.create_conversation(None).await.unwrap().id;
            engine.run(conversation, "hi").await.unwrap();
            for (source, text) in [
                (
                    "background_task",
                    "`cargo test` finished (exit 0) after 41.2 s",
                ),
                ("ci", "deploy of 4f2a91c finished"),
            ] {
                let event = Incoming::text(source, Priority::Normal, text);
                engine.notify(conversation, event).await.unwrap();
            }
        }
        engine
    });
    // One file, changed again and again: it joins the same line.
    let notify_all = || {
        engine.notify_attached(Incoming::file(
            "file_watcher",
            "src/lib.rs",
            FileChange::Modified,
        ))
    };
    let mut group = c.benchmark_group("keep");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("notify_1000", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    notify_all();
                    total += t.elapsed();
                    // Not timed: what is kept starts each round the same.
                    engine.keep_notifications().await.unwrap();
                }
                total
            })
        })
    });
    group.bench_function("notify_1000_and_keep", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    notify_all();
                    engine.keep_notifications().await.unwrap();
                }
                t.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, keep);
criterion_main!(benches);
