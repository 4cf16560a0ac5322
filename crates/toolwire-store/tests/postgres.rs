//! The shared suite on PostgreSQL, at the server named by
//! `TOOLWIRE_TEST_POSTGRES_URL` (`scripts/test` starts one). Each test
//! creates its own database and drops it afterwards. Without the variable
//! the tests are skipped with a note, except under CI (`CI` set), where
//! they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;

use std::future::Future;

use std::sync::Arc;

use sha2::Digest as _;
use suite::{Db, connect_postgres};
use toolwire_core::{
    AgentEvent, ContentBlock, InstanceId, Message, MessageId, Role, RunId, StopReason,
};
use toolwire_store::{Store, StoreError};

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

/// Runs `check` on the URL of a new, empty database of the server, and
/// drops the database afterwards.
async fn in_new_database<F, Fut>(check: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(admin_url) = admin_url() else { return };
    let name = format!("tw_test_{}", uuid::Uuid::now_v7().simple());
    let admin = connect_postgres(&admin_url).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    // On a task, so that the database is dropped even when the check fails.
    let outcome = tokio::spawn(check(with_database(&admin_url, &name))).await;
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .unwrap();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn run<F, Fut>(check: F)
where
    F: FnOnce(Db) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    in_new_database(|url| async move { check(Db::new(url).await).await }).await
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

/// The migrations sqlx applied (toolwire before tokio-postgres), as sqlx
/// named them; later ones are toolwire's own (`migration_files`).
const MIGRATIONS: [(i64, &str, &str); 3] = [
    (
        1,
        "schema",
        include_str!("../migrations/postgres/0001_schema.sql"),
    ),
    (
        2,
        "run owner",
        include_str!("../migrations/postgres/0002_run_owner.sql"),
    ),
    (
        3,
        "documents",
        include_str!("../migrations/postgres/0003_documents.sql"),
    ),
];

/// Migrates the database on `db` as sqlx 0.9's migrator did (toolwire
/// before tokio-postgres): its table, then each migration and its row in
/// one transaction, its execution time written afterwards.
async fn migrate_as_sqlx_did(db: &tokio_postgres::Client, migrations: &[(i64, &str, &str)]) {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
);",
    )
    .await
    .unwrap();
    for &(version, description, sql) in migrations {
        db.batch_execute("BEGIN").await.unwrap();
        db.batch_execute(sql).await.unwrap();
        db.execute(
            "INSERT INTO _sqlx_migrations ( version, description, success, checksum, \
             execution_time ) VALUES ( $1, $2, TRUE, $3, -1 )",
            &[&version, &description, &sha2::Sha384::digest(sql).to_vec()],
        )
        .await
        .unwrap();
        db.batch_execute("COMMIT").await.unwrap();
        db.execute(
            "UPDATE _sqlx_migrations SET execution_time = $1 WHERE version = $2",
            &[&1_234_567_i64, &version],
        )
        .await
        .unwrap();
    }
}

/// `_sqlx_migrations`, every column, as text.
async fn recorded(db: &tokio_postgres::Client) -> Vec<String> {
    db.query(
        "SELECT concat_ws(' ', version, description, installed_on, success, \
         encode(checksum, 'hex'), execution_time) FROM _sqlx_migrations ORDER BY version",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn said(c: toolwire_core::ConversationId, parent: MessageId, text: &str) -> Message {
    Message::new(
        c,
        Some(parent),
        Role::User,
        vec![ContentBlock::Text { text: text.into() }],
    )
}

/// A database that toolwire on sqlx migrated and wrote (its tables,
/// `_sqlx_migrations` as sqlx keeps it, rows as that code stored them)
/// opens with no migration run again, reads back what was written, and
/// takes new writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_by_sqlx_opens() {
    in_new_database(|url| async move {
        let db = connect_postgres(&url).await;
        migrate_as_sqlx_did(&db, &MIGRATIONS).await;
        let before = recorded(&db).await;
        assert_eq!(before.len(), 3);

        // A conversation as the sqlx code stored it: root, question and an
        // answer with usage (JSON content as serde_json wrote it), an event
        // of a run still going on, its owner, and a document.
        let c = uuid::Uuid::now_v7();
        let ids = [(); 3].map(|_| uuid::Uuid::now_v7());
        let (instance, run) = (InstanceId::new(), RunId::new());
        let stopped = AgentEvent::Stopped {
            run_id: run,
            reason: StopReason::EndTurn,
            error: None,
        };
        let text =
            |t: &str| tokio_postgres::types::Json(vec![ContentBlock::Text { text: t.into() }]);
        db.batch_execute("BEGIN").await.unwrap();
        db.execute(
            "INSERT INTO conversations (id, title, root_id, active_leaf, created_at, \
             last_event_seq) VALUES ($1, 'old', $2, $3, '2026-01-02 03:04:05.123456+00', 1)",
            &[&c, &ids[0], &ids[2]],
        )
        .await
        .unwrap();
        let rows = [
            (None, "system", text("old system prompt"), None),
            (Some(ids[0]), "user", text("hello"), None),
            (Some(ids[1]), "assistant", text("hi"), Some(40_i64)),
        ];
        for (i, (parent, role, content, tokens)) in rows.iter().enumerate() {
            db.execute(
                "INSERT INTO messages (id, conversation_id, parent_id, line, role, content, \
                 prompt_tokens, completion_tokens, cached_tokens, cost, model, duration_ms, \
                 status, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $7, $8, $9, $10, \
                 'complete', '2026-01-02 03:04:05.123456+00')",
                &[
                    &ids[i],
                    &c,
                    parent,
                    &ids[0],
                    role,
                    content,
                    tokens,
                    &tokens.map(|_| 0.25_f64),
                    &tokens.map(|_| "old model"),
                    &tokens.map(|_| 12_i64),
                ],
            )
            .await
            .unwrap();
        }
        db.execute(
            "INSERT INTO events (conversation_id, seq, type, payload, created_at) \
             VALUES ($1, 1, 'stopped', $2, now())",
            &[&c, &tokio_postgres::types::Json(&stopped)],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO instances (id, host, pid, started_at, heartbeat_at) \
             VALUES ($1, 'old host', 7, now(), now())",
            &[&instance.0],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO runs (id, conversation_id, started_at, owner) VALUES ($1, $2, now(), $3)",
            &[&run.0, &c, &instance.0],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO documents (kind, id, body, created_at, updated_at) \
             VALUES ('agent', 'a1', $1, now(), now())",
            &[&serde_json::json!({"name": "old agent"})],
        )
        .await
        .unwrap();
        db.batch_execute("COMMIT").await.unwrap();

        let store = toolwire_store::open(&url).await.unwrap();
        // What sqlx applied stays as it was; only the migrations made
        // since are added.
        let migrated = recorded(&db).await;
        assert_eq!(
            migrated[..before.len()],
            before[..],
            "no migration ran again"
        );
        assert_eq!(migrated.len(), migration_files());
        assert!(migrated[3].starts_with("5 blobs "), "{migrated:?}");
        let conversation = store
            .conversation(toolwire_core::ConversationId(c))
            .await
            .unwrap();
        assert_eq!(conversation.title.as_deref(), Some("old"));
        assert_eq!(
            conversation.created_at.to_rfc3339(),
            "2026-01-02T03:04:05.123456+00:00"
        );
        let path = store.path_to(MessageId(ids[2])).await.unwrap();
        assert_eq!(
            path.iter().map(Message::text).collect::<Vec<_>>(),
            ["old system prompt", "hello", "hi"]
        );
        let answer = &path[2];
        assert_eq!(
            (
                answer.usage.map(|u| u.prompt_tokens),
                answer.cost,
                answer.model.as_deref(),
                answer.duration_ms
            ),
            (Some(40), Some(0.25), Some("old model"), Some(12))
        );
        let events = store.events_since(conversation.id, 0, 10).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].seq, &events[0].event), (1, &stopped));
        let unfinished = store.unfinished_runs().await.unwrap();
        assert_eq!(unfinished.len(), 1);
        assert_eq!(unfinished[0].run.id, run);
        assert_eq!(
            unfinished[0].owner.as_ref().map(|o| (o.id, o.pid)),
            Some((instance, 7))
        );
        assert_eq!(
            store.document("agent", "a1").await.unwrap().unwrap().body,
            serde_json::json!({"name": "old agent"})
        );

        // And it takes new writes.
        let reply = said(conversation.id, MessageId(ids[2]), "after the change");
        assert_eq!(
            store
                .append_with_events(&reply, std::slice::from_ref(&stopped))
                .await
                .unwrap(),
            [2]
        );
        let fork = store.fork(MessageId(ids[1])).await.unwrap();
        store
            .finish_run(run, StopReason::EndTurn, None)
            .await
            .unwrap();
        let reopened: Arc<dyn Store> = toolwire_store::open(&url).await.unwrap();
        assert_eq!(reopened.path_to(reply.id).await.unwrap().len(), 4);
        assert_eq!(reopened.path_to(fork.active_leaf).await.unwrap().len(), 2);
        assert!(reopened.unfinished_runs().await.unwrap().is_empty());
        assert_eq!(
            recorded(&db).await,
            migrated,
            "still no migration ran again"
        );
    })
    .await;
}

/// A database sqlx migrated by an older toolwire (before documents) gets
/// the migration it lacks, recorded as sqlx records it; the older rows
/// stay as they were.
#[tokio::test]
async fn an_older_database_gets_the_migrations_it_lacks() {
    in_new_database(|url| async move {
        let db = connect_postgres(&url).await;
        migrate_as_sqlx_did(&db, &MIGRATIONS[..2]).await;
        let before = recorded(&db).await;
        let store = toolwire_store::open(&url).await.unwrap();
        let after = recorded(&db).await;
        assert_eq!(after[..2], before[..]);
        let (version, description, sql) = MIGRATIONS[2];
        let row = db
            .query_one(
                "SELECT version, description, success, checksum, execution_time \
                 FROM _sqlx_migrations WHERE version = 3",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), version);
        assert_eq!(row.get::<_, &str>(1), description);
        assert!(row.get::<_, bool>(2));
        assert_eq!(row.get::<_, Vec<u8>>(3), sha2::Sha384::digest(sql).to_vec());
        assert!(row.get::<_, i64>(4) >= 0);
        store
            .put_document("agent", "a", &serde_json::json!({}))
            .await
            .unwrap();
        // The new row is as sqlx would check it: a second open runs nothing.
        drop(toolwire_store::open(&url).await.unwrap());
        assert_eq!(recorded(&db).await, after);
    })
    .await;
}

/// A database with a migration this version does not know (a newer
/// toolwire's), or one that differs from this version's, is refused with
/// an error naming it.
#[tokio::test]
async fn unknown_or_changed_migrations_are_refused() {
    in_new_database(|url| async move {
        let db = connect_postgres(&url).await;
        migrate_as_sqlx_did(&db, &MIGRATIONS).await;
        db.batch_execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (99, 'from the future', TRUE, '\\x00', 1)",
        )
        .await
        .unwrap();
        let err = toolwire_store::open(&url).await.err().unwrap();
        assert!(
            matches!(err, StoreError::Migration { version: 99, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("newer"), "{err}");

        db.batch_execute(
            "DELETE FROM _sqlx_migrations WHERE version = 99; \
             UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 2",
        )
        .await
        .unwrap();
        let err = toolwire_store::open(&url).await.err().unwrap();
        assert!(
            err.to_string()
                .starts_with("migration 2 (run owner) failed: the applied migration differs"),
            "{err}"
        );
    })
    .await;
}

/// Several stores (as several instances would) opening a new database at
/// once all start, and each migration is applied once: they take turns
/// under an advisory lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_migrate_a_new_database_at_once() {
    in_new_database(|url| async move {
        let (a, b, c) = tokio::join!(
            toolwire_store::open(&url),
            toolwire_store::open(&url),
            toolwire_store::open(&url)
        );
        let (a, b, _c) = (a.unwrap(), b.unwrap(), c.unwrap());
        let conversation = a.create_conversation("sys", None).await.unwrap();
        assert_eq!(b.conversation(conversation.id).await.unwrap(), conversation);
        let db = connect_postgres(&url).await;
        assert_eq!(recorded(&db).await.len(), migration_files());
    })
    .await;
}

/// How many migrations `migrations/postgres` holds.
fn migration_files() -> usize {
    std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .unwrap()
        .count()
}

/// Errors name the database they could not reach without its password;
/// a URL that does not parse, or names no supported backend, is shown
/// without its secrets too.
#[tokio::test]
async fn errors_show_no_password() {
    let secret = "s3cret-Pa55";
    for (url, says) in [
        (
            format!("postgres://someone:{secret}@127.0.0.1:notaport/db"),
            "invalid value for option `port`",
        ),
        (
            format!("mysql://someone:{secret}@127.0.0.1/db"),
            "mysql://REDACTED@127.0.0.1/db",
        ),
    ] {
        let err = toolwire_store::open(&url).await.err().unwrap();
        let shown = err.to_string();
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains(says), "{shown}");
    }

    let Some(admin_url) = admin_url() else { return };
    let config: tokio_postgres::Config = admin_url.parse().unwrap();
    let password = String::from_utf8(config.get_password().unwrap_or_default().to_vec()).unwrap();
    let missing = with_database(&admin_url, "tw_no_such_database");
    let err = toolwire_store::open(&missing).await.err().unwrap();
    let shown = err.to_string();
    assert!(matches!(err, StoreError::Connection(_)), "{err:?}");
    assert!(
        shown.contains("tw_no_such_database") && shown.contains("cannot connect to"),
        "{shown}"
    );
    if password.len() >= 3 {
        assert!(!shown.contains(&password), "{shown}");
    }
}
