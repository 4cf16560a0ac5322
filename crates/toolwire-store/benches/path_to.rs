//! Store benchmarks.
//!
//! * `path_to/sqlite/10000[/tool_loop]/whole`: the path of a 10,000-message
//!   chain (text messages, or a tool loop's calls and results) read whole
//!   from the SQLite file, the store keeping nothing of paths (target:
//!   < 5 ms). `…/whole/after_other_update`: the same through a store that
//!   keeps paths, after another store on the file rewrote a message of the
//!   path, which throws away what it kept.
//! * `path_to/sqlite/10000[/tool_loop]`: the same path read again, through
//!   what the store kept of it; `…/after_other_write`: after another store
//!   wrote something that changes no message (the kept lines stay usable).
//! * `path_to/postgres/10000`: the whole path on PostgreSQL.
//! * `append/{sqlite,postgres}`: storing one message (under the chain's
//!   leaf, which it becomes), one transaction.
//!
//! The `toolwire` binary allocates with jemalloc; to measure as it runs,
//! give this benchmark the same allocator, e.g. Debian's `libjemalloc2`:
//! `LD_PRELOAD=libjemalloc.so.2`.
//!
//! SQLite runs on a file in a temporary directory. PostgreSQL runs only
//! when `TOOLWIRE_TEST_POSTGRES_URL` names a server (as for the tests): a
//! database is created for the run and dropped afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use toolwire_core::{ContentBlock, Message, MessageId, Role, Usage};
use toolwire_store::Store;

const CHAIN: usize = 10_000;

fn message(store_leaf: MessageId, c: toolwire_core::ConversationId, i: usize) -> Message {
    let role = if i % 2 == 1 {
        Role::User
    } else {
        Role::Assistant
    };
    let mut m = Message::new(
        c,
        Some(store_leaf),
        role,
        vec![ContentBlock::Text {
            text: format!("message {i}: a sentence or two of ordinary conversation text."),
        }],
    );
    if role == Role::Assistant {
        m.usage = Some(Usage {
            prompt_tokens: 1000,
            completion_tokens: 100,
            cached_tokens: 500,
            cache_write_tokens: 0,
        });
        m.cost = Some(0.001);
        m.model = Some("bench-model".into());
    }
    m
}

/// A message of a tool loop: an assistant call, its result, a user line.
fn tool_loop_message(parent: MessageId, c: toolwire_core::ConversationId, i: usize) -> Message {
    let call = toolwire_core::ToolCallId(format!("call_{}", i / 3));
    let (role, content) = match i % 3 {
        0 => (
            Role::Assistant,
            vec![
                ContentBlock::Text {
                    text: "Let me look at that file.".into(),
                },
                ContentBlock::ToolUse {
                    id: call,
                    server: None,
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": format!("src/module_{i}.rs"), "limit": 200}),
                },
            ],
        ),
        1 => (
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: call,
                content: format!("fn f{i}() {{}}\n").repeat(4),
                is_error: false,
                images: Vec::new(),
            }],
        ),
        _ => (
            Role::User,
            vec![ContentBlock::Text {
                text: format!("message {i}: and the next one?"),
            }],
        ),
    };
    Message::new(c, Some(parent), role, content)
}

/// A conversation holding a chain of [`CHAIN`] messages; returns its leaf.
async fn chain(store: &Arc<dyn Store>) -> (toolwire_core::ConversationId, MessageId) {
    let c = store
        .create_conversation("You are a benchmark.", None)
        .await
        .unwrap();
    let mut leaf = c.root_id;
    for i in 1..CHAIN {
        let m = message(leaf, c.id, i);
        store.append(&m).await.unwrap();
        leaf = m.id;
    }
    (c.id, leaf)
}

fn bench_append(c: &mut Criterion, rt: &Runtime, name: &str, store: &Arc<dyn Store>) {
    let (conversation, mut leaf) = rt.block_on(chain(store));
    let mut i = CHAIN;
    c.bench_function(&format!("append/{name}"), |b| {
        b.iter(|| {
            let m = message(leaf, conversation, i);
            rt.block_on(store.append(black_box(&m))).unwrap();
            leaf = m.id;
            i += 1;
        })
    });
}

/// A conversation holding a tool loop of [`CHAIN`] messages; returns its
/// leaf.
async fn tool_loop(store: &Arc<dyn Store>) -> (toolwire_core::ConversationId, MessageId) {
    let conv = store.create_conversation("bench", None).await.unwrap();
    let mut leaf = conv.root_id;
    for i in 0..CHAIN - 1 {
        let m = tool_loop_message(leaf, conv.id, i);
        store.append(&m).await.unwrap();
        leaf = m.id;
    }
    (conv.id, leaf)
}

/// Reads the path to `leaf` on `store` after `other` (another store on the
/// file, as another process would) rewrote one of its messages: what
/// `store` kept of the path cannot be trusted, so the read is whole. The
/// time is the read's and the path's drop, not the write's.
fn after_other_update(
    c: &mut Criterion,
    rt: &Runtime,
    name: &str,
    (store, other): (&Arc<dyn Store>, &Arc<dyn Store>),
    leaf: MessageId,
) {
    let mut rewritten = rt.block_on(store.path_to(leaf)).unwrap()[CHAIN / 2].clone();
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            for _ in 0..iters {
                rewritten.duration_ms = Some(rewritten.duration_ms.map_or(0, |d| d + 1));
                rt.block_on(other.update(&rewritten)).unwrap();
                let start = std::time::Instant::now();
                let path = rt.block_on(store.path_to(black_box(leaf))).unwrap();
                assert_eq!(path.len(), CHAIN);
                drop(black_box(path));
                total += start.elapsed();
            }
            total
        })
    });
}

fn bench_sqlite(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = rt.block_on(toolwire_store::open(&url)).unwrap();
    // The same file, read without the kept lines: every read is whole.
    let whole: Arc<dyn Store> = Arc::new(
        rt.block_on(toolwire_store::SqliteStore::open(&url))
            .unwrap()
            .keep_paths(false),
    );
    // Another store on the file, as another process.
    let other = rt.block_on(toolwire_store::open(&url)).unwrap();

    let (text_conversation, text_leaf) = rt.block_on(chain(&store));
    let (loop_conversation, loop_leaf) = rt.block_on(tool_loop(&store));

    // Whole reads: what the 5 ms target is about.
    for (shape, leaf) in [("", text_leaf), ("/tool_loop", loop_leaf)] {
        c.bench_function(&format!("path_to/sqlite/{CHAIN}{shape}/whole"), |b| {
            b.iter(|| rt.block_on(whole.path_to(black_box(leaf))).unwrap())
        });
    }
    for (shape, leaf) in [("", text_leaf), ("/tool_loop", loop_leaf)] {
        after_other_update(
            c,
            &rt,
            &format!("path_to/sqlite/{CHAIN}{shape}/whole/after_other_update"),
            (&store, &other),
            leaf,
        );
    }

    // Reads the kept lines serve: read again, and after another process
    // wrote something that changes no message (the kept lines stay usable,
    // so this is not a whole read).
    for (shape, conversation, leaf) in [
        ("", text_conversation, text_leaf),
        ("/tool_loop", loop_conversation, loop_leaf),
    ] {
        c.bench_function(&format!("path_to/sqlite/{CHAIN}{shape}"), |b| {
            b.iter(|| rt.block_on(store.path_to(black_box(leaf))).unwrap())
        });
        c.bench_function(
            &format!("path_to/sqlite/{CHAIN}{shape}/after_other_write"),
            |b| {
                b.iter_custom(|iters| {
                    let mut total = std::time::Duration::ZERO;
                    for _ in 0..iters {
                        rt.block_on(other.set_active_leaf(conversation, leaf))
                            .unwrap();
                        let start = std::time::Instant::now();
                        let path = rt.block_on(store.path_to(black_box(leaf))).unwrap();
                        assert_eq!(path.len(), CHAIN);
                        drop(black_box(path));
                        total += start.elapsed();
                    }
                    total
                })
            },
        );
    }

    bench_append(c, &rt, "sqlite", &store);
}

fn bench_postgres(c: &mut Criterion) {
    let Ok(admin_url) = std::env::var("TOOLWIRE_TEST_POSTGRES_URL") else {
        eprintln!("note: TOOLWIRE_TEST_POSTGRES_URL is not set; skipping PostgreSQL");
        return;
    };
    let rt = Runtime::new().unwrap();
    let name = format!("tw_bench_{}", uuid::Uuid::now_v7().simple());
    let (admin, connection) = rt
        .block_on(tokio_postgres::connect(&admin_url, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(connection);
    rt.block_on(admin.batch_execute(&format!("CREATE DATABASE {name}")))
        .unwrap();
    let (base, _) = admin_url.rsplit_once('/').unwrap();
    let store = rt
        .block_on(toolwire_store::open(&format!("{base}/{name}")))
        .unwrap();
    let (_, leaf) = rt.block_on(chain(&store));
    c.bench_function(&format!("path_to/postgres/{CHAIN}"), |b| {
        b.iter(|| rt.block_on(store.path_to(black_box(leaf))).unwrap())
    });
    bench_append(c, &rt, "postgres", &store);
    drop(store);
    rt.block_on(admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")))
        .unwrap();
}

criterion_group!(benches, bench_sqlite, bench_postgres);
criterion_main!(benches);
