//! Where a step's store time goes: the cost of one event write, one
//! statement, and of writing a step's events in one transaction.
//!
//! A tool step of the engine stores 7 events (text_delta,
//! tool_call_started, arguments_delta, argument_field,
//! assistant_message_created, tool_calls_generated, tool_execution_started
//! … see the breakdown printed by the `step` bench), each with
//! `Store::append_event`: one `BEGIN IMMEDIATE` transaction of an UPDATE
//! (the event counter) and an INSERT. These benches replay that SQL with
//! sqlx on a store file made by `toolwire_store::open` (same schema, WAL,
//! `synchronous = NORMAL`):
//!
//! * `store_tx/select_1`: one statement round trip through sqlx.
//! * `store_tx/events_7_in_7_tx`: 7 events, one transaction each (today).
//! * `store_tx/events_7_in_1_tx`: 7 events in one transaction.
//! * `store_tx/events_7_in_1_statement`: 7 events as one multi-row INSERT
//!   after the counter's UPDATE, in one transaction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::str::FromStr;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::runtime::Runtime;
use uuid::Uuid;

const EVENTS: i64 = 7;
const PAYLOAD: &str =
    r#"{"type":"text_delta","run_id":"0195f3a4-7b1c-7d2e-9a3b-4c5d6e7f8091","text":"Checking."}"#;

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

async fn one_per_tx(pool: &SqlitePool, conversation: Uuid) {
    for _ in 0..EVENTS {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let seq: i64 = sqlx::query_scalar(
            "UPDATE conversations SET last_event_seq = last_event_seq + 1 \
             WHERE id = $1 RETURNING last_event_seq",
        )
        .bind(conversation)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO events (conversation_id, seq, type, payload, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(conversation)
        .bind(seq)
        .bind("text_delta")
        .bind(PAYLOAD)
        .bind(now_micros())
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
}

async fn all_in_one_tx(pool: &SqlitePool, conversation: Uuid) {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let last: i64 = sqlx::query_scalar(
        "UPDATE conversations SET last_event_seq = last_event_seq + $2 \
         WHERE id = $1 RETURNING last_event_seq",
    )
    .bind(conversation)
    .bind(EVENTS)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    for seq in last - EVENTS + 1..=last {
        sqlx::query(
            "INSERT INTO events (conversation_id, seq, type, payload, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(conversation)
        .bind(seq)
        .bind("text_delta")
        .bind(PAYLOAD)
        .bind(now_micros())
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

async fn all_in_one_statement(pool: &SqlitePool, conversation: Uuid) {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let last: i64 = sqlx::query_scalar(
        "UPDATE conversations SET last_event_seq = last_event_seq + $2 \
         WHERE id = $1 RETURNING last_event_seq",
    )
    .bind(conversation)
    .bind(EVENTS)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let mut insert = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
        "INSERT INTO events (conversation_id, seq, type, payload, created_at) ",
    );
    insert.push_values(last - EVENTS + 1..=last, |mut row, seq| {
        row.push_bind(conversation)
            .push_bind(seq)
            .push_bind("text_delta")
            .push_bind(PAYLOAD)
            .push_bind(now_micros());
    });
    insert.build().execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
}

fn bench_store_tx(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let url = format!("sqlite://{}", path.display());
    let store = rt.block_on(toolwire_store::open(&url)).unwrap();
    let conversation = rt
        .block_on(store.create_conversation("bench", None))
        .unwrap()
        .id
        .0;
    let options = SqliteConnectOptions::from_str(&url)
        .unwrap()
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(30));
    let pool = rt
        .block_on(
            SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options),
        )
        .unwrap();

    let mut group = c.benchmark_group("store_tx");
    group.bench_function("select_1", |b| {
        b.iter(|| {
            rt.block_on(sqlx::query_scalar::<_, i64>("SELECT 1").fetch_one(&pool))
                .unwrap()
        })
    });
    group.bench_function("events_7_in_7_tx", |b| {
        b.iter(|| rt.block_on(one_per_tx(&pool, conversation)))
    });
    group.bench_function("events_7_in_1_tx", |b| {
        b.iter(|| rt.block_on(all_in_one_tx(&pool, conversation)))
    });
    group.bench_function("events_7_in_1_statement", |b| {
        b.iter(|| rt.block_on(all_in_one_statement(&pool, conversation)))
    });
    group.finish();
}

criterion_group!(benches, bench_store_tx);
criterion_main!(benches);
