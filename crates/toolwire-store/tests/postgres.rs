//! The shared suite on PostgreSQL, at the server named by
//! `TOOLWIRE_TEST_POSTGRES_URL` (`scripts/test` starts one). Each test
//! creates its own database and drops it afterwards. Without the variable
//! the tests are skipped with a note, except under CI (`CI` set), where
//! they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;

use std::future::Future;

use suite::{Db, connect_postgres};

const URL_VAR: &str = "TOOLWIRE_TEST_POSTGRES_URL";

/// The server's URL, or `None` (with a note) when the tests cannot run.
fn admin_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => panic!(
            "{URL_VAR} is not set, but CI is: the PostgreSQL tests must run in CI \
             (scripts/test starts a server and sets it)"
        ),
        _ => {
            eprintln!("note: {URL_VAR} is not set; skipping a PostgreSQL test");
            None
        }
    }
}

/// `url` with its database name replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[authority..]
        .find('/')
        .map_or(base.len(), |i| authority + i);
    format!("{}/{database}{query}", &base[..host_end])
}

async fn run<F, Fut>(check: F)
where
    F: FnOnce(Db) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(admin_url) = admin_url() else { return };
    let name = format!("tw_test_{}", uuid::Uuid::now_v7().simple());
    let admin = connect_postgres(&admin_url).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let db = Db::new(with_database(&admin_url, &name)).await;
    // On a task, so that the database is dropped even when the check fails.
    let outcome = tokio::spawn(check(db)).await;
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .unwrap();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

store_tests!(run);

#[test]
fn database_names_are_replaced() {
    assert_eq!(
        with_database("postgres://u:p@h:5432/postgres", "x"),
        "postgres://u:p@h:5432/x"
    );
    assert_eq!(
        with_database("postgres://h/db?sslmode=disable", "x"),
        "postgres://h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
}
