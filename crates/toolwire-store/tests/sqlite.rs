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

#[tokio::test]
async fn unsupported_urls_are_refused() {
    let err = toolwire_store::open("mysql://localhost/x")
        .await
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::UnsupportedUrl(_)), "{err:?}");
}
