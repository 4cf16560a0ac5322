//! The shared suite on SQLite: each test gets its own database file in a
//! temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("UPDATE messages SET status = 'interrupted' WHERE id = ?1")
        .bind(chain[7].0)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
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
