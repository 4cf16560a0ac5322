//! The shared suite on SQLite: each test gets its own database file in a
//! temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;

use std::future::Future;

use suite::Db;
use toolwire_store::StoreError;

async fn run<F, Fut>(check: F)
where
    F: FnOnce(Db) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("toolwire.db").display());
    check(Db::new(url).await).await;
}

store_tests!(run);

#[tokio::test]
async fn a_new_file_is_created_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let store = toolwire_store::SqliteStore::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert!(path.exists());
    store.close().await;
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn in_memory_databases_work() {
    let store = toolwire_store::open("sqlite::memory:").await.unwrap();
    let c = store.create_conversation("sys", None).await.unwrap();
    assert_eq!(store.path_to(c.root_id).await.unwrap().len(), 1);
}

/// An in-memory database is written through sqlx rather than the file's
/// own writer: run ownership works there too.
#[tokio::test]
async fn in_memory_databases_keep_run_owners() {
    use toolwire_core::{InstanceId, RunId};
    let store = toolwire_store::open("sqlite::memory:").await.unwrap();
    let c = store.create_conversation("sys", None).await.unwrap();
    let me = store
        .register_instance(InstanceId::new(), "host", 42)
        .await
        .unwrap();
    store.heartbeat_instance(me.id).await.unwrap();
    let run = RunId::new();
    store.start_run(run, c.id, me.id).await.unwrap();
    let unfinished = store.unfinished_runs().await.unwrap();
    assert_eq!(unfinished.len(), 1);
    assert_eq!(unfinished[0].run.owner, Some(me.id));
    assert_eq!(unfinished[0].owner.as_ref().map(|o| o.pid), Some(42));
    let later = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
    assert_eq!(store.forget_instances(later).await.unwrap(), 0);
    assert!(store.interrupt_run(run).await.unwrap());
    assert!(!store.interrupt_run(run).await.unwrap());
    assert!(matches!(
        store.interrupt_run(RunId::new()).await.unwrap_err(),
        StoreError::RunNotFound(_)
    ));
    assert_eq!(store.forget_instances(later).await.unwrap(), 1);
    assert!(matches!(
        store.heartbeat_instance(me.id).await.unwrap_err(),
        StoreError::InstanceNotFound(_)
    ));
}

#[tokio::test]
async fn unsupported_urls_are_refused() {
    let err = toolwire_store::open("mysql://localhost/x")
        .await
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::UnsupportedUrl(_)), "{err:?}");
}

/// Two stores on one file (as two processes would be) write at once: each
/// has its own writer, and they wait for each other's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_write_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let first = toolwire_store::open(&url).await.unwrap();
    let second = toolwire_store::open(&url).await.unwrap();
    let c = first.create_conversation("sys", None).await.unwrap();
    let run = toolwire_core::RunId::new();
    let me = first
        .register_instance(toolwire_core::InstanceId::new(), "host", 1)
        .await
        .unwrap();
    first.start_run(run, c.id, me.id).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for store in [first.clone(), second.clone()] {
        tasks.spawn(async move {
            for _ in 0..50 {
                store
                    .append_event(
                        c.id,
                        &toolwire_core::AgentEvent::TextDelta {
                            run_id: run,
                            text: "piece".into(),
                        },
                    )
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let events = second.events_since(c.id, 0, 1000).await.unwrap();
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=100).collect::<Vec<_>>()
    );
}
