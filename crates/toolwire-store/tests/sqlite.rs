//! The shared suite on SQLite: each test gets its own database file in a
//! temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixtures;
mod suite;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use suite::Db;
use toolwire_core::{ContentBlock, ConversationId, Message, MessageId, MessageStatus, Role};
use toolwire_store::{Store, StoreError};

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
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn in_memory_databases_work() {
    let store = toolwire_store::open("sqlite::memory:").await.unwrap();
    let c = store.create_conversation("sys", None).await.unwrap();
    assert_eq!(store.path_to(c.root_id).await.unwrap().len(), 1);
}

/// An in-memory database is read through its writer's connection rather
/// than the file's readers: run ownership works there too.
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

/// What a front door is handed: the store's read half, upcast from the
/// whole store, reading what the whole one wrote.
#[tokio::test]
async fn the_read_half_reads_what_the_store_wrote() {
    let store = toolwire_store::open("sqlite::memory:").await.unwrap();
    let c = store.create_conversation("sys", Some("t")).await.unwrap();
    let u = said(c.id, c.root_id, "hi");
    store.append(&u).await.unwrap();
    let read: Arc<dyn toolwire_store::StoreRead> = store.clone();
    assert_eq!(read.conversation(c.id).await.unwrap().active_leaf, u.id);
    assert_eq!(read.path_to(u.id).await.unwrap().len(), 2);
}

/// A `sqlite:` URL that does not name a database is refused, naming what
/// is wrong with it.
#[tokio::test]
async fn bad_sqlite_urls_are_refused() {
    for (url, says) in [
        ("sqlite://t.db?mode=ro", "read-only"),
        (
            "sqlite://t.db?journal=wal",
            "unknown parameter `journal=wal`",
        ),
    ] {
        let err = toolwire_store::open(url).await.err().unwrap();
        assert!(matches!(err, StoreError::BadUrl { .. }), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
    }
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

/// A write that finds the file's write lock taken by another process
/// (here a plain connection in `BEGIN IMMEDIATE`) waits for it off the
/// caller's thread: on a one-thread runtime, other tasks go on while it
/// waits, and it is stored once the lock is given back.
#[tokio::test(flavor = "current_thread")]
async fn a_write_waiting_for_another_process_leaves_the_runtime_free() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    let store = toolwire_store::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let writing = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .put_document("note", "a", &serde_json::json!({"n": 1}))
                .await
        }
    });
    // The runtime's one thread keeps running tasks while the write waits.
    let mut ticks = 0;
    while ticks < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        ticks += 1;
    }
    assert!(
        !writing.is_finished(),
        "the write did not wait for the lock"
    );
    other.execute_batch("COMMIT").unwrap();
    writing.await.unwrap().unwrap();
    let stored = store.document("note", "a").await.unwrap().unwrap();
    assert_eq!(stored.body, serde_json::json!({"n": 1}));
}

/// A store on a new file in `dir`, and a second one on the same file (as
/// another process would be).
async fn two_stores(dir: &tempfile::TempDir) -> (String, Arc<dyn Store>, Arc<dyn Store>) {
    let url = format!("sqlite://{}", dir.path().join("kept.db").display());
    let first = toolwire_store::open(&url).await.unwrap();
    let second = toolwire_store::open(&url).await.unwrap();
    (url, first, second)
}

/// A store on the file at `url` that reads every path whole.
async fn whole_reads(url: &str) -> Arc<dyn Store> {
    Arc::new(
        toolwire_store::SqliteStore::open(url)
            .await
            .unwrap()
            .keep_paths(false),
    )
}

/// Long enough for the store to keep what it reads of it.
const LONG: usize = 1_100;

fn said(c: ConversationId, parent: MessageId, text: &str) -> Message {
    Message::new(
        c,
        Some(parent),
        Role::User,
        vec![ContentBlock::Text { text: text.into() }],
    )
}

/// The path to `leaf` read one `message` at a time (the reference).
async fn walked(store: &Arc<dyn Store>, leaf: MessageId) -> Vec<Message> {
    let mut path = vec![store.message(leaf).await.unwrap()];
    while let Some(parent) = path.last().unwrap().parent_id {
        path.push(store.message(parent).await.unwrap());
    }
    path.reverse();
    path
}

/// A path read again reads what changed since: appends (which only add to
/// what was read), branches, and updates made through this store, through
/// another store on the file, and behind both stores' backs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_read_again_see_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let (url, store, other) = two_stores(&dir).await;
    let c = store.create_conversation("sys", None).await.unwrap();
    let mut chain = vec![c.root_id];
    for i in 0..LONG {
        let m = said(c.id, *chain.last().unwrap(), &format!("m{i}"));
        store.append(&m).await.unwrap();
        chain.push(m.id);
    }
    let leaf = |chain: &[MessageId]| *chain.last().unwrap();
    assert_eq!(
        store.path_to(leaf(&chain)).await.unwrap(),
        walked(&store, leaf(&chain)).await
    );
    for i in LONG..LONG + 5 {
        let m = said(c.id, leaf(&chain), &format!("m{i}"));
        store.append(&m).await.unwrap();
        chain.push(m.id);
        assert_eq!(
            store.path_to(m.id).await.unwrap(),
            walked(&store, m.id).await
        );
    }
    for &at in [chain[LONG - 6], chain[6], chain[0], leaf(&chain)].iter() {
        assert_eq!(store.path_to(at).await.unwrap(), walked(&store, at).await);
    }

    // A second child starts a line of its own.
    let branch = said(c.id, chain[LONG - 10], "branch");
    store.append(&branch).await.unwrap();
    let twig = said(c.id, branch.id, "twig");
    store.append(&twig).await.unwrap();
    assert_eq!(
        store.path_to(twig.id).await.unwrap(),
        walked(&store, twig.id).await
    );
    assert_eq!(
        store.path_to(leaf(&chain)).await.unwrap(),
        walked(&store, leaf(&chain)).await
    );

    let mut changed = store.message(chain[3]).await.unwrap();
    changed.content = vec![ContentBlock::Text {
        text: "changed here".into(),
    }];
    store.update(&changed).await.unwrap();
    assert_eq!(store.path_to(twig.id).await.unwrap()[3], changed);

    changed.content = vec![ContentBlock::Text {
        text: "changed there".into(),
    }];
    other.update(&changed).await.unwrap();
    assert_eq!(store.path_to(twig.id).await.unwrap()[3], changed);

    suite::connect_sqlite(&url)
        .execute(
            "UPDATE messages SET status = 'interrupted' WHERE id = ?1",
            [chain[7].0],
        )
        .unwrap();
    let path = store.path_to(leaf(&chain)).await.unwrap();
    assert_eq!(path[7].status, MessageStatus::Interrupted);
    assert_eq!(path, walked(&store, leaf(&chain)).await);

    let more = said(c.id, leaf(&chain), "from the other store");
    other.append(&more).await.unwrap();
    assert_eq!(
        store.path_to(more.id).await.unwrap(),
        walked(&store, more.id).await
    );
}

/// While other tasks read the same paths (and keep what they read), every
/// path read after a write returns is exactly what is stored, whichever of
/// two stores on the file wrote; and no read returns a text a message
/// never had.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paths_stay_exact_under_concurrent_reads_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_url, store, other) = two_stores(&dir).await;
    let c = store.create_conversation("sys", None).await.unwrap();
    let mut path = vec![store.message(c.root_id).await.unwrap()];
    let texts: Arc<Mutex<HashMap<MessageId, Vec<String>>>> = Arc::default();
    texts.lock().unwrap().insert(c.root_id, vec!["sys".into()]);
    for i in 0..LONG {
        let m = said(c.id, path.last().unwrap().id, &format!("m{i}"));
        store.append(&m).await.unwrap();
        texts.lock().unwrap().insert(m.id, vec![m.text()]);
        path.push(store.message(m.id).await.unwrap());
    }
    let expected = Arc::new(Mutex::new(path));
    let done = Arc::new(AtomicBool::new(false));

    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let (store, expected, texts, done) = (
            Arc::clone(&store),
            Arc::clone(&expected),
            Arc::clone(&texts),
            Arc::clone(&done),
        );
        readers.spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let leaf = expected.lock().unwrap().last().unwrap().id;
                for m in store.path_to(leaf).await.unwrap() {
                    let texts = texts.lock().unwrap();
                    assert!(texts[&m.id].contains(&m.text()), "{m:?}");
                }
            }
        });
    }

    for step in 0..150usize {
        let writer = if step % 3 == 0 { &other } else { &store };
        let mut path = expected.lock().unwrap().clone();
        if step % 2 == 0 || path.len() < 3 {
            let m = said(c.id, path.last().unwrap().id, &format!("s{step}"));
            texts.lock().unwrap().insert(m.id, vec![m.text()]);
            writer.append(&m).await.unwrap();
            path.push(store.message(m.id).await.unwrap());
        } else {
            let at = 1 + step * 7 % (path.len() - 1);
            let text = format!("s{step} was {}", path[at].text());
            path[at].content = vec![ContentBlock::Text { text: text.clone() }];
            texts
                .lock()
                .unwrap()
                .get_mut(&path[at].id)
                .unwrap()
                .push(text);
            writer.update(&path[at]).await.unwrap();
        }
        *expected.lock().unwrap() = path.clone();
        assert_eq!(store.path_to(path.last().unwrap().id).await.unwrap(), path);
    }
    done.store(true, Ordering::SeqCst);
    while let Some(read) = readers.join_next().await {
        read.unwrap();
    }
}

/// Paths across several lines (each branch a line of its own) read right
/// whether read whole (a store keeping nothing), read first, or read again
/// after appends to several of their lines; with tool calls and results
/// among the messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_across_lines_read_the_same_kept_or_not() {
    use toolwire_core::ToolCallId;
    let dir = tempfile::tempdir().unwrap();
    let (url, store, _) = two_stores(&dir).await;
    let whole = whole_reads(&url).await;
    let c = store.create_conversation("sys", None).await.unwrap();
    let tool = |parent: MessageId, i: usize| {
        let call = ToolCallId(format!("call_{i}"));
        let mut m = Message::new(
            c.id,
            Some(parent),
            Role::Assistant,
            vec![
                ContentBlock::Text {
                    text: format!("step {i}"),
                },
                ContentBlock::ToolUse {
                    id: call.clone(),
                    server: i.is_multiple_of(2).then(|| "fs".into()),
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": format!("src/{i}.rs"), "limit": i}),
                },
            ],
        );
        m.model = Some("m".into());
        m.duration_ms = Some(i as u64);
        let result = Message::new(
            c.id,
            Some(m.id),
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: call,
                content: format!("line\n\"{i}\"\t\u{e9}"),
                is_error: i.is_multiple_of(3),
                images: Vec::new(),
            }],
        );
        (m, result)
    };
    // A trunk, three branches each forking from the one before, each long
    // enough to be kept.
    let mut leaves = Vec::new();
    let mut fork_at = c.root_id;
    for branch in 0..4 {
        let mut leaf = fork_at;
        for i in 0..LONG / 2 {
            let (call, result) = tool(leaf, branch * LONG + i);
            store.append(&call).await.unwrap();
            store.append(&result).await.unwrap();
            leaf = result.id;
            if i == LONG / 4 {
                fork_at = call.id;
            }
        }
        leaves.push(leaf);
    }
    let check = |leaf: MessageId| {
        let (store, whole) = (Arc::clone(&store), Arc::clone(&whole));
        async move {
            let expected = walked(&store, leaf).await;
            assert_eq!(whole.path_to(leaf).await.unwrap(), expected);
            assert_eq!(store.path_to(leaf).await.unwrap(), expected);
            assert_eq!(store.path_to(leaf).await.unwrap(), expected);
        }
    };
    for &leaf in leaves.iter().rev() {
        check(leaf).await;
    }
    // Appends to two lines of the deepest path, then reads again.
    for leaf in leaves.iter_mut().skip(2) {
        let m = said(c.id, *leaf, "more");
        store.append(&m).await.unwrap();
        *leaf = m.id;
    }
    for &leaf in leaves.iter().rev() {
        check(leaf).await;
    }
}

/// A line is read by seq when it holds most of its seq range (a
/// conversation written alone, or nearly), without checking each row's line
/// when it holds all of it, and through its index when other
/// conversations' messages came in between: every way reads the same path,
/// over more rows than the reader sends the caller at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_read_the_same_written_alone_or_interleaved() {
    const ROWS: usize = 2_500;
    let dir = tempfile::tempdir().unwrap();
    let (url, store, _) = two_stores(&dir).await;
    let whole = whole_reads(&url).await;
    let chain = |c: ConversationId, from: MessageId, i: usize| said(c, from, &format!("{c} {i}"));
    // Two conversations written in turns (each line a third of its seq
    // range), one nearly alone (four fifths), one alone.
    let a = store.create_conversation("a", None).await.unwrap();
    let b = store.create_conversation("b", None).await.unwrap();
    let (mut leaf_a, mut leaf_b) = (a.root_id, b.root_id);
    for i in 0..ROWS {
        let m = chain(a.id, leaf_a, i);
        store.append(&m).await.unwrap();
        leaf_a = m.id;
        let m = chain(b.id, leaf_b, i);
        store.append(&m).await.unwrap();
        leaf_b = m.id;
        if i % 2 == 0 {
            store
                .append(&said(b.id, b.root_id, "elsewhere"))
                .await
                .unwrap();
        }
    }
    let mut leaves = vec![leaf_a, leaf_b];
    for interrupted in [true, false] {
        let c = store.create_conversation("c", None).await.unwrap();
        let mut leaf = c.root_id;
        for i in 0..ROWS {
            let m = chain(c.id, leaf, i);
            store.append(&m).await.unwrap();
            leaf = m.id;
            if interrupted && i % 4 == 0 {
                store
                    .append(&said(a.id, a.root_id, "elsewhere"))
                    .await
                    .unwrap();
            }
        }
        leaves.push(leaf);
    }
    for leaf in leaves {
        let expected = walked(&store, leaf).await;
        assert_eq!(expected.len(), ROWS + 1);
        assert_eq!(whole.path_to(leaf).await.unwrap(), expected);
        assert_eq!(store.path_to(leaf).await.unwrap(), expected);
        assert_eq!(store.path_to(leaf).await.unwrap(), expected);
    }
}

/// Every small field of a message (read on SQLite through the generated
/// column `fields`) reads back as written, whole or kept, appended or
/// updated: usage or none, a model with spaces, an empty model, a
/// duration, another status, times before 1970.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_read_every_field_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let (url, store, other) = two_stores(&dir).await;
    let whole = whole_reads(&url).await;
    let c = store.create_conversation("fields", None).await.unwrap();
    let mut leaf = c.root_id;
    let mut written = Vec::new();
    for i in 0..LONG {
        let mut m = said(c.id, leaf, &format!("message {i}"));
        match i % 5 {
            0 => {
                m.role = Role::Assistant;
                m.usage = Some(toolwire_core::Usage {
                    prompt_tokens: 1_000 + i as u64,
                    completion_tokens: 0,
                    cached_tokens: u64::from(u32::MAX) + 7,
                    cache_write_tokens: 300 + i as u64,
                });
                m.cost = Some(0.1 + 0.2);
                m.model = Some(format!("a model  with spaces {i} ")).filter(|_| i % 2 == 0);
            }
            1 => m.model = Some(String::new()),
            2 => {
                m.duration_ms = Some(i as u64 * 1_000_003);
                m.status = MessageStatus::Interrupted;
            }
            3 => m.created_at = chrono::DateTime::from_timestamp_micros(-(i as i64) * 997).unwrap(),
            _ => {}
        }
        store.append(&m).await.unwrap();
        leaf = m.id;
        // Stored to the microsecond.
        m.created_at = chrono::SubsecRound::trunc_subsecs(m.created_at, 6);
        written.push(m);
    }
    let check = |path: Vec<Message>, expected: &[Message]| {
        assert_eq!(path.len(), expected.len() + 1);
        for (read, written) in path[1..].iter().zip(expected) {
            assert_eq!(read, written);
        }
    };
    check(whole.path_to(leaf).await.unwrap(), &written);
    check(store.path_to(leaf).await.unwrap(), &written);
    // Changed by the other store: usage and model gained, duration lost.
    for i in [3, LONG / 2, LONG - 1] {
        let m = &mut written[i];
        m.usage = Some(toolwire_core::Usage::default());
        m.model = Some("changed".into());
        m.duration_ms = None;
        m.cost = None;
        other.update(m).await.unwrap();
    }
    check(store.path_to(leaf).await.unwrap(), &written);
    check(whole.path_to(leaf).await.unwrap(), &written);
    assert_eq!(
        walked(&store, leaf).await,
        whole.path_to(leaf).await.unwrap()
    );
}

/// A database written before the generated column `fields` existed
/// (migration 4) is rebuilt with it on start: its messages read the same,
/// seqs go on after the highest ever given out, and foreign keys are
/// checked as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_before_fields_is_migrated() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let mut conn = suite::connect_sqlite(&url);
    conn.pragma_update(None, "foreign_keys", true).unwrap();
    // The first three migrations, recorded as sqlx recorded them.
    let before = [
        (
            1,
            "schema",
            include_str!("../migrations/sqlite/0001_schema.sql"),
        ),
        (
            2,
            "run owner",
            include_str!("../migrations/sqlite/0002_run_owner.sql"),
        ),
        (
            3,
            "documents",
            include_str!("../migrations/sqlite/0003_documents.sql"),
        ),
    ];
    conn.execute_batch(
        "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, \
         description TEXT NOT NULL, \
         installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \
         success BOOLEAN NOT NULL, checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .unwrap();
    for (version, description, sql) in before {
        conn.execute_batch(sql).unwrap();
        conn.execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (?1, ?2, TRUE, ?3, 1)",
            (version, description, sha2::Sha384::digest(sql).to_vec()),
        )
        .unwrap();
    }

    // A conversation as toolwire wrote it then: the root, a user message,
    // an assistant answer, and a fourth message deleted since.
    let (conversation, ids) = (uuid::Uuid::now_v7(), [(); 4].map(|_| uuid::Uuid::now_v7()));
    // One transaction: a conversation and its root refer to each other.
    let tx = conn.transaction().unwrap();
    let text = |t: &str| serde_json::to_string(&[ContentBlock::Text { text: t.into() }]).unwrap();
    tx.execute(
        "INSERT INTO conversations (id, title, root_id, active_leaf, created_at) \
         VALUES (?1, 'old', ?2, ?2, 5)",
        (conversation, ids[0]),
    )
    .unwrap();
    /// Tokens (each count), cost and model of an answer.
    type Usage<'a> = Option<(i64, f64, &'a str)>;
    let rows: [(Option<uuid::Uuid>, &str, String, Usage); 4] = [
        (None, "system", text("old system prompt"), None),
        (Some(ids[0]), "user", text("hello"), None),
        (
            Some(ids[1]),
            "assistant",
            text("hi"),
            Some((40, 0.25, "old model")),
        ),
        (Some(ids[2]), "user", text("deleted"), None),
    ];
    for (i, (parent, role, content, usage)) in rows.into_iter().enumerate() {
        tx.execute(
            "INSERT INTO messages (id, conversation_id, parent_id, line, role, content, \
             prompt_tokens, completion_tokens, cached_tokens, cost, model, duration_ms, status, \
             created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?7, ?8, ?9, ?10, 'complete', ?11)",
            rusqlite::params![
                ids[i],
                conversation,
                parent,
                ids[0],
                role,
                content,
                usage.map(|u| u.0),
                usage.map(|u| u.1),
                usage.map(|u| u.2),
                usage.map(|_| 1234_i64),
                1_700_000_000_000_000_i64 + i as i64,
            ],
        )
        .unwrap();
    }
    tx.execute("UPDATE conversations SET active_leaf = ?1", [ids[2]])
        .unwrap();
    tx.execute("DELETE FROM messages WHERE id = ?1", [ids[3]])
        .unwrap();
    tx.commit().unwrap();
    drop(conn);

    let store = toolwire_store::open(&url).await.unwrap();
    let leaf = MessageId(ids[2]);
    let path = store.path_to(leaf).await.unwrap();
    assert_eq!(path.len(), 3);
    assert_eq!(path, walked(&store, leaf).await);
    let answer = &path[2];
    assert_eq!(answer.role, Role::Assistant);
    assert_eq!(answer.model.as_deref(), Some("old model"));
    assert_eq!(answer.cost, Some(0.25));
    assert_eq!(answer.duration_ms, Some(1234));
    assert_eq!(answer.usage.map(|u| u.prompt_tokens), Some(40));
    assert_eq!(
        answer.created_at,
        chrono::DateTime::from_timestamp_micros(1_700_000_000_000_002).unwrap()
    );
    let next = said(ConversationId(conversation), leaf, "after the migration");
    store.append(&next).await.unwrap();
    assert_eq!(
        store.path_to(next.id).await.unwrap()[..3],
        path[..],
        "the old path is the new message's"
    );

    let conn = suite::connect_sqlite(&url);
    let seq: i64 = conn
        .query_row("SELECT seq FROM messages WHERE id = ?1", [next.id.0], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(seq, 5, "the deleted message's seq is not given out again");
    let broken = conn
        .prepare("PRAGMA foreign_key_check")
        .unwrap()
        .query_map([], |_| Ok(()))
        .unwrap()
        .count();
    assert_eq!(broken, 0);
    // Foreign keys are still enforced on the store's connections.
    let orphan = said(
        ConversationId(conversation),
        MessageId(uuid::Uuid::now_v7()),
        "orphan",
    );
    assert!(store.append(&orphan).await.is_err());
}

/// What only another program could store in the small fields (text or a
/// real where toolwire stores integers, a role with a space in it) is an
/// error on a path read, as on any other read, naming the message and what
/// is wrong.
#[tokio::test]
async fn corrupt_fields_are_reported_on_path_reads() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(format!(
        "sqlite://{}",
        dir.path().join("corrupt.db").display()
    ))
    .await;
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let u1 = said(c.id, c.root_id, "hi");
    s.append(&u1).await.unwrap();
    for (sql, says) in [
        (
            "UPDATE messages SET duration_ms = '1 2 3 4' WHERE role = 'user'",
            "duration_ms is text, not an integer",
        ),
        (
            "UPDATE messages SET duration_ms = 2.5 WHERE role = 'user'",
            "duration_ms is real, not an integer",
        ),
        (
            "UPDATE messages SET duration_ms = NULL, prompt_tokens = 1, completion_tokens = 1, \
             cached_tokens = x'00' WHERE role = 'user'",
            "cached_tokens is blob, not an integer",
        ),
        (
            "UPDATE messages SET prompt_tokens = NULL, completion_tokens = NULL, \
             cached_tokens = NULL, created_at = 'today' WHERE role = 'user'",
            "created_at is text, not an integer",
        ),
        (
            "UPDATE messages SET created_at = 5, role = 'user ' WHERE role = 'user'",
            r#"("user  complete 5     ")"#,
        ),
    ] {
        db.execute(sql).await;
        match s.path_to(u1.id).await.unwrap_err() {
            StoreError::Corrupt(what) => {
                assert!(what.contains(&u1.id.to_string()), "{what}");
                assert!(what.contains(says), "{what}");
            }
            other => panic!("{sql}: expected Corrupt, got {other:?}"),
        }
        assert!(s.message(u1.id).await.is_err(), "{sql}");
    }
}

/// A database written by toolwire before SQLite ran on one binding (sqlx
/// created and migrated it, and wrote through it as through the rusqlite
/// writer) opens with no migration run again, reads back exactly what the
/// code of that time read, and takes new writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_before_one_binding_opens() {
    use toolwire_core::{AgentEvent, InstanceId, RunId, StopReason};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("before.db");
    std::fs::copy(fixtures::DB, &file).unwrap();
    let url = format!("sqlite://{}", file.display());
    let recorded = |url: &str| -> Vec<(i64, String, bool, Vec<u8>)> {
        suite::connect_sqlite(url)
            .prepare(
                "SELECT version, description, success, checksum FROM _sqlx_migrations \
                      ORDER BY version",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    let before = recorded(&url);
    assert_eq!(
        before.iter().map(|m| m.0).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "the fixture as sqlx migrated it"
    );

    let store = toolwire_store::open(&url).await.unwrap();
    let after = recorded(&url);
    assert_eq!(after[..4], before, "no migration ran again");
    assert_eq!(
        after[4..].iter().map(|m| m.0).collect::<Vec<_>>(),
        [5, 12, 13, 14],
        "only the migrations newer than the fixture ran"
    );
    let read = fixtures::read_everything(&store).await;
    let expected = std::fs::read_to_string(fixtures::READ).unwrap();
    assert_eq!(
        read, expected,
        "read back as the code that wrote it read it"
    );

    // And it takes new writes: a message with its event in the fork, the
    // open run finished, a new run, a document.
    let conversations = store.list_conversations().await.unwrap();
    let fork = conversations
        .iter()
        .map(|s| &s.conversation)
        .find(|c| c.forked_from.is_some())
        .unwrap();
    let reply = said(fork.id, fork.active_leaf, "after the change of binding");
    let stopped = AgentEvent::Stopped {
        run_id: fixtures::OPEN_RUN,
        reason: StopReason::EndTurn,
        error: None,
    };
    let seqs = store
        .append_with_events(&reply, std::slice::from_ref(&stopped))
        .await
        .unwrap();
    let events_before = store.events_since(fork.id, 0, 1000).await.unwrap().len() as u64;
    assert_eq!(seqs, [events_before]);
    store
        .finish_run(fixtures::OPEN_RUN, StopReason::EndTurn, None)
        .await
        .unwrap();
    assert!(store.unfinished_runs().await.unwrap().is_empty());
    let me = store
        .register_instance(InstanceId::new(), "after", 7)
        .await
        .unwrap();
    let run = RunId::new();
    store.start_run(run, fork.id, me.id).await.unwrap();
    store
        .put_document("agent", "agent-3", &serde_json::json!({"name": "third"}))
        .await
        .unwrap();

    let reopened = toolwire_store::open(&url).await.unwrap();
    let path = reopened.path_to(reply.id).await.unwrap();
    // As stored: to the microsecond.
    assert_eq!(
        path.last().map(|m| (m.id, m.text(), m.parent_id)),
        Some((reply.id, reply.text(), reply.parent_id))
    );
    assert_eq!(path, walked(&reopened, reply.id).await);
    assert_eq!(
        reopened.path_to(fork.active_leaf).await.unwrap(),
        path[..path.len() - 1]
    );
    assert_eq!(reopened.run(run).await.unwrap().owner, Some(me.id));
    assert_eq!(
        reopened
            .events_since(fork.id, events_before - 1, 10)
            .await
            .unwrap()[0]
            .event,
        stopped
    );
    assert_eq!(reopened.documents("agent").await.unwrap().len(), 3);
    assert_eq!(recorded(&url), after, "still no migration ran again");
}

/// Two stores (as two processes would) opening a new file at the same
/// moment both start: each migration is applied in a write transaction
/// that first checks whether the other applied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_migrate_a_new_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..5 {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("{round}.db")).display()
        );
        let (a, b) = tokio::join!(toolwire_store::open(&url), toolwire_store::open(&url));
        let (a, b) = (a.unwrap(), b.unwrap());
        let c = a.create_conversation("sys", None).await.unwrap();
        assert_eq!(b.conversation(c.id).await.unwrap(), c);
        let applied: i64 = suite::connect_sqlite(&url)
            .query_row("SELECT count(*) FROM _sqlx_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(applied, 8);
    }
}
