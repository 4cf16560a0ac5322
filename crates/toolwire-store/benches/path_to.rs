//! Store benchmarks.
//!
//! * `path_to/{sqlite,postgres}/10000`: the whole path of a 10,000-message
//!   chain, read in one query (target on the SQLite file: < 5 ms).
//! * `append/{sqlite,postgres}`: storing one message (under the chain's
//!   leaf, which it becomes), one transaction.
//!
//! SQLite runs on a file in a temporary directory. PostgreSQL runs only
//! when `TOOLWIRE_TEST_POSTGRES_URL` names a server (as for the tests): a
//! database is created for the run and dropped afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use sqlx::{Connection, PgConnection};
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

fn bench_backend(c: &mut Criterion, rt: &Runtime, name: &str, store: &Arc<dyn Store>) {
    let (conversation, leaf) = rt.block_on(chain(store));
    assert_eq!(rt.block_on(store.path_to(leaf)).unwrap().len(), CHAIN);

    c.bench_function(&format!("path_to/{name}/{CHAIN}"), |b| {
        b.iter(|| rt.block_on(store.path_to(black_box(leaf))).unwrap())
    });

    let mut leaf = leaf;
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

fn bench_sqlite(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = rt.block_on(toolwire_store::open(&url)).unwrap();
    bench_backend(c, &rt, "sqlite", &store);

    // The same, on a tool loop's messages (calls and results, not only
    // text).
    let (conversation_mixed, leaf_mixed) = rt.block_on(async {
        let conv = store.create_conversation("bench", None).await.unwrap();
        let mut leaf = conv.root_id;
        for i in 0..CHAIN - 1 {
            let m = tool_loop_message(leaf, conv.id, i);
            store.append(&m).await.unwrap();
            leaf = m.id;
        }
        (conv.id, leaf)
    });
    let other_mixed = rt.block_on(toolwire_store::open(&url)).unwrap();
    c.bench_function(&format!("path_to/sqlite/{CHAIN}/tool_loop"), |b| {
        b.iter(|| rt.block_on(store.path_to(black_box(leaf_mixed))).unwrap())
    });
    c.bench_function(
        &format!("path_to/sqlite/{CHAIN}/tool_loop/after_other_write"),
        |b| {
            b.iter_batched(
                || {
                    rt.block_on(other_mixed.set_active_leaf(conversation_mixed, leaf_mixed))
                        .unwrap()
                },
                |()| {
                    let path = rt.block_on(store.path_to(black_box(leaf_mixed))).unwrap();
                    assert_eq!(path.len(), CHAIN);
                    path
                },
                criterion::BatchSize::PerIteration,
            )
        },
    );

    // Another store on the file (as another process) writes before each
    // read. The write changes no message, so what the reader keeps of the
    // path stays usable: this is not a whole read (a whole read of this
    // path measured 5.6 ms, of the tool loop 12.4 ms).
    let other = rt.block_on(toolwire_store::open(&url)).unwrap();
    let (conversation, leaf) = rt.block_on(chain(&store));
    c.bench_function(&format!("path_to/sqlite/{CHAIN}/after_other_write"), |b| {
        b.iter_batched(
            || {
                rt.block_on(other.set_active_leaf(conversation, leaf))
                    .unwrap()
            },
            |()| {
                let path = rt.block_on(store.path_to(black_box(leaf))).unwrap();
                assert_eq!(path.len(), CHAIN);
                path
            },
            criterion::BatchSize::PerIteration,
        )
    });
}

fn bench_postgres(c: &mut Criterion) {
    let Ok(admin_url) = std::env::var("TOOLWIRE_TEST_POSTGRES_URL") else {
        eprintln!("note: TOOLWIRE_TEST_POSTGRES_URL is not set; skipping PostgreSQL");
        return;
    };
    let rt = Runtime::new().unwrap();
    let name = format!("tw_bench_{}", uuid::Uuid::now_v7().simple());
    let mut admin = rt.block_on(PgConnection::connect(&admin_url)).unwrap();
    let sql = |s: String| sqlx::raw_sql(sqlx::AssertSqlSafe(s));
    rt.block_on(sql(format!("CREATE DATABASE {name}")).execute(&mut admin))
        .unwrap();
    let (base, _) = admin_url.rsplit_once('/').unwrap();
    let store = rt
        .block_on(toolwire_store::open(&format!("{base}/{name}")))
        .unwrap();
    bench_backend(c, &rt, "postgres", &store);
    drop(store);
    rt.block_on(sql(format!("DROP DATABASE {name} WITH (FORCE)")).execute(&mut admin))
        .unwrap();
}

criterion_group!(benches, bench_sqlite, bench_postgres);
criterion_main!(benches);
