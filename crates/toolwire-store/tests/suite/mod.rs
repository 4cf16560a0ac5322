//! The checks every backend must pass. `tests/sqlite.rs` and
//! `tests/postgres.rs` run each of them against a fresh database of their
//! backend through [`store_tests!`].

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use toolwire_core::tree::{edited_sibling, regeneration_parent};
use toolwire_core::{
    AgentEvent, BlobRef, ContentBlock, ConversationId, InstanceId, Message, MessageId,
    MessageStatus, Role, RunId, StopReason, TreeError, Usage,
};
use toolwire_store::{Store, StoreError};

/// A fresh, empty database of one backend, and a store open on it.
pub struct Db {
    pub url: String,
    pub store: Arc<dyn Store>,
}

impl Db {
    pub async fn new(url: String) -> Db {
        let store = toolwire_store::open(&url).await.expect("open the store");
        Db { url, store }
    }

    /// A second store on the same database, as after a restart.
    pub async fn reopen(&self) -> Arc<dyn Store> {
        toolwire_store::open(&self.url)
            .await
            .expect("reopen the store")
    }

    /// Runs raw SQL on the database, behind the store's back.
    pub async fn execute(&self, sql: &'static str) {
        if self.url.starts_with("sqlite:") {
            connect_sqlite(&self.url)
                .execute_batch(sql)
                .expect("execute");
        } else {
            connect_postgres(&self.url)
                .await
                .batch_execute(sql)
                .await
                .expect("execute");
        }
    }
}

/// A connection of its own to the SQLite file at `url`, behind the store's
/// back.
pub fn connect_sqlite(url: &str) -> rusqlite::Connection {
    let files = toolwire_store::local_files(url);
    let file = files.first().expect("a sqlite URL naming a file");
    let conn = rusqlite::Connection::open(file).expect("open the file");
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .expect("set the busy timeout");
    conn
}

/// A connection of its own to the PostgreSQL database at `url`, behind the
/// store's back.
pub async fn connect_postgres(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// Defines one `#[tokio::test]` per check, each calling `$run(check)`.
#[macro_export]
macro_rules! store_tests {
    ($run:path) => {
        $crate::store_tests!(@ $run;
            tree_basics,
            edit_adds_a_sibling,
            regenerate_adds_a_sibling,
            fork_copies_the_path,
            active_leaf_switches_branches,
            bad_parents_are_refused,
            unknown_ids_are_not_found,
            update_keeps_the_tree_place,
            total_cost_and_list,
            runs_and_interrupted_runs,
            a_run_ends_with_its_events_or_not_at_all,
            a_run_ends_with_its_answer_or_not_at_all,
            unfinished_runs_come_with_their_owners,
            a_conversations_unfinished_runs_alone,
            concurrent_interrupts_report_a_run_once,
            instances_register_beat_and_are_forgotten,
            events_are_numbered_and_paged,
            concurrent_events_have_no_gaps,
            path_to_a_long_chain,
            paths_cross_branches,
            concurrent_siblings_keep_their_paths,
            data_survives_reopening,
            corrupt_content_is_reported,
            documents_are_kept_by_kind,
            messages_are_the_whole_tree,
            blobs_are_kept_once_by_hash,
            messages_hold_image_references,
            a_turn_begins_in_one_transaction,
            a_conversation_is_read_with_a_document,
        );
    };
    (@ $run:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $run(suite::$name).await;
            }
        )*
    };
}

/// Now, to the microsecond (what both databases keep).
fn now() -> DateTime<Utc> {
    DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap()
}

fn text(conversation: ConversationId, parent: MessageId, role: Role, text: &str) -> Message {
    Message {
        created_at: now(),
        ..Message::new(
            conversation,
            Some(parent),
            role,
            vec![ContentBlock::Text { text: text.into() }],
        )
    }
}

fn user(c: ConversationId, parent: MessageId, t: &str) -> Message {
    text(c, parent, Role::User, t)
}

fn assistant(c: ConversationId, parent: MessageId, t: &str) -> Message {
    Message {
        usage: Some(Usage {
            prompt_tokens: 100,
            completion_tokens: 20,
            cached_tokens: 50,
            cache_write_tokens: 30,
        }),
        cost: Some(0.25),
        model: Some("test-model".into()),
        duration_ms: Some(1234),
        ..text(c, parent, Role::Assistant, t)
    }
}

fn ids(messages: &[Message]) -> Vec<MessageId> {
    messages.iter().map(|m| m.id).collect()
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages.iter().map(Message::text).collect()
}

fn delta(run_id: RunId, i: usize) -> AgentEvent {
    AgentEvent::TextDelta {
        run_id,
        text: format!("piece {i}"),
    }
}

pub async fn tree_basics(db: Db) {
    let s = &db.store;
    let c = s
        .create_conversation("be brief", Some("greeting"))
        .await
        .unwrap();
    assert_eq!(c.root_id, c.active_leaf);
    assert_eq!(c.title.as_deref(), Some("greeting"));
    assert_eq!(c.forked_from, None);
    assert_eq!(s.conversation(c.id).await.unwrap(), c);

    let root = s.message(c.root_id).await.unwrap();
    assert_eq!(
        (root.role, root.parent_id, root.text()),
        (Role::System, None, "be brief".into())
    );
    let empty = s.create_conversation("", None).await.unwrap();
    assert!(s.message(empty.root_id).await.unwrap().content.is_empty());

    let u1 = user(c.id, c.root_id, "hi");
    s.append(&u1).await.unwrap();
    let a1 = assistant(c.id, u1.id, "hello");
    s.append(&a1).await.unwrap();
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, a1.id);
    assert_eq!(s.message(a1.id).await.unwrap(), a1);
    assert_eq!(s.message(u1.id).await.unwrap(), u1);

    let path = s.path_to(a1.id).await.unwrap();
    assert_eq!(path, vec![root.clone(), u1.clone(), a1.clone()]);
    assert_eq!(s.path_to(c.root_id).await.unwrap(), vec![root.clone()]);

    assert_eq!(s.children(c.root_id).await.unwrap(), vec![u1.clone()]);
    assert_eq!(s.children(a1.id).await.unwrap(), vec![]);
    assert_eq!(s.siblings(u1.id).await.unwrap(), vec![u1.clone()]);
    assert_eq!(s.siblings(c.root_id).await.unwrap(), vec![root]);
    assert_eq!(s.leaves(c.id).await.unwrap(), vec![a1.clone()]);

    // A second answer under u1: two children, two leaves, oldest first.
    let a2 = assistant(c.id, u1.id, "hey");
    s.append(&a2).await.unwrap();
    assert_eq!(ids(&s.children(u1.id).await.unwrap()), [a1.id, a2.id]);
    assert_eq!(ids(&s.siblings(a2.id).await.unwrap()), [a1.id, a2.id]);
    assert_eq!(ids(&s.leaves(c.id).await.unwrap()), [a1.id, a2.id]);
    // The other conversation is untouched.
    assert_eq!(ids(&s.leaves(empty.id).await.unwrap()), [empty.root_id]);
}

pub async fn edit_adds_a_sibling(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let u1 = user(c.id, c.root_id, "hi");
    let a1 = assistant(c.id, u1.id, "hello");
    s.append(&u1).await.unwrap();
    s.append(&a1).await.unwrap();

    let stored = s.message(u1.id).await.unwrap();
    let edit = Message {
        created_at: now(),
        ..edited_sibling(&stored, "hey").unwrap()
    };
    s.append(&edit).await.unwrap();
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, edit.id);
    assert_eq!(ids(&s.siblings(u1.id).await.unwrap()), [u1.id, edit.id]);
    assert_eq!(ids(&s.siblings(edit.id).await.unwrap()), [u1.id, edit.id]);
    // The original branch is kept whole.
    assert_eq!(
        texts(&s.path_to(a1.id).await.unwrap()),
        ["sys", "hi", "hello"]
    );
    assert_eq!(texts(&s.path_to(edit.id).await.unwrap()), ["sys", "hey"]);
    assert_eq!(ids(&s.leaves(c.id).await.unwrap()), [a1.id, edit.id]);
    // Only user messages can be edited.
    let answer = s.message(a1.id).await.unwrap();
    assert!(matches!(
        edited_sibling(&answer, "x"),
        Err(TreeError::NotAUserMessage { .. })
    ));
}

pub async fn regenerate_adds_a_sibling(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let u1 = user(c.id, c.root_id, "hi");
    let a1 = assistant(c.id, u1.id, "hello");
    s.append(&u1).await.unwrap();
    s.append(&a1).await.unwrap();

    let parent = regeneration_parent(&s.message(a1.id).await.unwrap()).unwrap();
    assert_eq!(parent, u1.id);
    let a1b = assistant(c.id, parent, "hello again");
    s.append(&a1b).await.unwrap();
    assert_eq!(ids(&s.siblings(a1.id).await.unwrap()), [a1.id, a1b.id]);
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, a1b.id);
    assert_eq!(
        texts(&s.path_to(a1b.id).await.unwrap()),
        ["sys", "hi", "hello again"]
    );
    assert_eq!(
        texts(&s.path_to(a1.id).await.unwrap()),
        ["sys", "hi", "hello"]
    );
}

pub async fn fork_copies_the_path(db: Db) {
    let s = &db.store;
    let c = s
        .create_conversation("sys", Some("original"))
        .await
        .unwrap();
    let u1 = user(c.id, c.root_id, "hi");
    let a1 = assistant(c.id, u1.id, "hello");
    let u2 = user(c.id, a1.id, "more");
    for m in [&u1, &a1, &u2] {
        s.append(m).await.unwrap();
    }
    let before = s.path_to(u2.id).await.unwrap();

    let f = s.fork(a1.id).await.unwrap();
    assert_ne!(f.id, c.id);
    assert_eq!(f.title.as_deref(), Some("original"));
    let origin = f.forked_from.unwrap();
    assert_eq!((origin.conversation_id, origin.message_id), (c.id, a1.id));
    assert_eq!(s.conversation(f.id).await.unwrap(), f);

    let copy = s.path_to(f.active_leaf).await.unwrap();
    assert_eq!(copy.first().unwrap().id, f.root_id);
    assert_eq!(texts(&copy), ["sys", "hi", "hello"]);
    for (m, original) in copy.iter().zip(&before) {
        assert_eq!(m.conversation_id, f.id);
        assert_ne!(m.id, original.id);
        assert_eq!(
            (m.role, &m.content, m.usage, m.cost),
            (
                original.role,
                &original.content,
                original.usage,
                original.cost
            )
        );
    }
    assert_eq!(copy[1].parent_id, Some(copy[0].id));
    assert_eq!(copy[2].parent_id, Some(copy[1].id));
    assert_eq!(s.leaves(f.id).await.unwrap(), vec![copy[2].clone()]);

    // The original is untouched.
    assert_eq!(s.path_to(u2.id).await.unwrap(), before);
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, u2.id);
    assert_eq!(s.children(a1.id).await.unwrap(), vec![u2.clone()]);

    // The fork grows on its own.
    let u3 = user(f.id, f.active_leaf, "elsewhere");
    s.append(&u3).await.unwrap();
    assert_eq!(s.children(a1.id).await.unwrap(), vec![u2]);
    // Forking the root copies just the root.
    let r = s.fork(c.root_id).await.unwrap();
    assert_eq!(r.root_id, r.active_leaf);
    assert_eq!(texts(&s.path_to(r.active_leaf).await.unwrap()), ["sys"]);
}

pub async fn active_leaf_switches_branches(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let u1 = user(c.id, c.root_id, "left");
    let u2 = user(c.id, c.root_id, "right");
    s.append(&u1).await.unwrap();
    s.append(&u2).await.unwrap();
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, u2.id);

    s.set_active_leaf(c.id, u1.id).await.unwrap();
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, u1.id);
    let leaf = s.conversation(c.id).await.unwrap().active_leaf;
    assert_eq!(texts(&s.path_to(leaf).await.unwrap()), ["sys", "left"]);
    s.set_active_leaf(c.id, c.root_id).await.unwrap();
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, c.root_id);
    s.set_active_leaf(c.id, u2.id).await.unwrap();
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, u2.id);

    // A message of another conversation is refused; nothing changes.
    let other = s.create_conversation("other", None).await.unwrap();
    let err = s.set_active_leaf(c.id, other.root_id).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Tree(TreeError::UnknownMessage(id)) if id == other.root_id),
        "{err:?}"
    );
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, u2.id);
    assert_eq!(
        s.conversation(other.id).await.unwrap().active_leaf,
        other.root_id
    );
}

pub async fn bad_parents_are_refused(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let other = s.create_conversation("other", None).await.unwrap();

    // A parent from another conversation.
    let m = user(c.id, other.root_id, "lost");
    let err = s.append(&m).await.unwrap_err();
    assert!(
        matches!(err, StoreError::BadParent { message, parent, .. } if message == m.id && parent == other.root_id),
        "{err:?}"
    );
    // A parent that does not exist.
    let m = user(c.id, MessageId::new(), "orphan");
    assert!(matches!(
        s.append(&m).await,
        Err(StoreError::BadParent { .. })
    ));
    // No parent: only a root has none, and the store makes roots.
    let mut rootless = user(c.id, c.root_id, "root?");
    rootless.parent_id = None;
    assert!(matches!(
        s.append(&rootless).await,
        Err(StoreError::Tree(TreeError::RootHasNoParent))
    ));
    // The same message twice.
    let m = user(c.id, c.root_id, "once");
    s.append(&m).await.unwrap();
    let err = s.append(&m).await.unwrap_err();
    assert!(
        matches!(err, StoreError::DuplicateMessage(id) if id == m.id),
        "{err:?}"
    );

    // Nothing of that was stored, and the active leaves are as they were.
    assert_eq!(ids(&s.children(c.root_id).await.unwrap()), [m.id]);
    assert_eq!(s.children(other.root_id).await.unwrap(), vec![]);
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, m.id);
    assert_eq!(
        s.conversation(other.id).await.unwrap().active_leaf,
        other.root_id
    );
}

pub async fn unknown_ids_are_not_found(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let (nc, nm, nr) = (ConversationId::new(), MessageId::new(), RunId::new());
    let ni = InstanceId::new();
    let me = s
        .register_instance(InstanceId::new(), "host", 1)
        .await
        .unwrap();
    macro_rules! not_found {
        ($call:expr, $variant:ident, $id:expr) => {
            let err = $call.await.unwrap_err();
            assert!(matches!(err, StoreError::$variant(id) if id == $id), "{}: {err:?}", stringify!($call));
        };
    }
    not_found!(s.conversation(nc), ConversationNotFound, nc);
    not_found!(s.leaves(nc), ConversationNotFound, nc);
    not_found!(s.total_cost(nc), ConversationNotFound, nc);
    not_found!(s.set_active_leaf(nc, c.root_id), ConversationNotFound, nc);
    not_found!(s.start_run(nr, nc, me.id), ConversationNotFound, nc);
    not_found!(s.heartbeat_instance(ni), InstanceNotFound, ni);
    not_found!(s.append_event(nc, &delta(nr, 0)), ConversationNotFound, nc);
    not_found!(s.events_since(nc, 0, 10), ConversationNotFound, nc);
    not_found!(s.message(nm), MessageNotFound, nm);
    not_found!(s.path_to(nm), MessageNotFound, nm);
    not_found!(s.children(nm), MessageNotFound, nm);
    not_found!(s.siblings(nm), MessageNotFound, nm);
    not_found!(s.fork(nm), MessageNotFound, nm);
    not_found!(s.set_active_leaf(c.id, nm), MessageNotFound, nm);
    let ghost = user(c.id, c.root_id, "ghost");
    not_found!(s.update(&ghost), MessageNotFound, ghost.id);
    not_found!(s.run(nr), RunNotFound, nr);
    not_found!(s.finish_run(nr, StopReason::EndTurn, None), RunNotFound, nr);
    not_found!(s.interrupt_run(nr), RunNotFound, nr);
    // A known conversation without events is simply empty.
    assert_eq!(s.events_since(c.id, 0, 10).await.unwrap(), vec![]);
    assert_eq!(s.total_cost(c.id).await.unwrap(), 0.0);
}

pub async fn update_keeps_the_tree_place(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let u1 = user(c.id, c.root_id, "hi");
    let a1 = Message {
        status: MessageStatus::Interrupted,
        usage: None,
        cost: None,
        ..assistant(c.id, u1.id, "hel")
    };
    s.append(&u1).await.unwrap();
    s.append(&a1).await.unwrap();
    s.set_active_leaf(c.id, u1.id).await.unwrap();
    // Inserts and a new active leaf change no stored message.
    assert_eq!(s.conversation(c.id).await.unwrap().revision, 0);

    let done = Message {
        content: vec![
            ContentBlock::Reasoning {
                text: "think".into(),
            },
            ContentBlock::Text {
                text: "hello".into(),
            },
        ],
        usage: Some(Usage {
            prompt_tokens: 7,
            completion_tokens: 3,
            cached_tokens: 0,
            cache_write_tokens: 4,
        }),
        cost: Some(0.5),
        model: Some("other-model".into()),
        duration_ms: Some(99),
        status: MessageStatus::Complete,
        ..a1.clone()
    };
    s.update(&done).await.unwrap();
    assert_eq!(s.message(a1.id).await.unwrap(), done);
    // Each update counts, in the conversation's own read and in the one
    // with a document.
    assert_eq!(s.conversation(c.id).await.unwrap().revision, 1);
    s.update(&done).await.unwrap();
    let (read, _) = s.conversation_and_document(c.id, "k", "d").await.unwrap();
    assert_eq!(read.revision, 2);
    assert_eq!(
        ids(&s.path_to(a1.id).await.unwrap()),
        [c.root_id, u1.id, a1.id]
    );
    assert_eq!(ids(&s.children(u1.id).await.unwrap()), [a1.id]);
    // An update does not touch the active leaf.
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, u1.id);
    assert_eq!(s.total_cost(c.id).await.unwrap(), 0.5);

    // Moving a message, or changing its role, is refused.
    let moved = Message {
        parent_id: Some(c.root_id),
        ..done.clone()
    };
    assert!(matches!(
        s.update(&moved).await,
        Err(StoreError::BadParent { .. })
    ));
    let recast = Message {
        role: Role::User,
        ..done.clone()
    };
    assert!(matches!(
        s.update(&recast).await,
        Err(StoreError::BadParent { .. })
    ));
    assert_eq!(s.message(a1.id).await.unwrap(), done);
}

pub async fn total_cost_and_list(db: Db) {
    let s = &db.store;
    let first = s.create_conversation("one", Some("first")).await.unwrap();
    let second = s.create_conversation("two", Some("second")).await.unwrap();
    let mut parent = second.root_id;
    for (i, cost) in [Some(0.125), None, Some(0.25), Some(1.5)]
        .into_iter()
        .enumerate()
    {
        let m = Message {
            cost,
            ..assistant(second.id, parent, &format!("a{i}"))
        };
        s.append(&m).await.unwrap();
        parent = m.id;
    }
    assert_eq!(s.total_cost(second.id).await.unwrap(), 1.875);
    assert_eq!(s.total_cost(first.id).await.unwrap(), 0.0);

    let list = s.list_conversations().await.unwrap();
    let got: Vec<_> = list
        .iter()
        .map(|l| (l.conversation.id, l.message_count, l.total_cost))
        .collect();
    assert_eq!(got, [(second.id, 5, 1.875), (first.id, 1, 0.0)]);
    assert_eq!(list[0].conversation.active_leaf, parent);
    assert_eq!(list[1].conversation, first);
}

pub async fn runs_and_interrupted_runs(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let owner = s
        .register_instance(InstanceId::new(), "host", 1)
        .await
        .unwrap();
    let (done, failed, hung1, hung2) = (RunId::new(), RunId::new(), RunId::new(), RunId::new());
    for id in [done, failed, hung1, hung2] {
        s.start_run(id, c.id, owner.id).await.unwrap();
    }
    let running = s.run(hung1).await.unwrap();
    assert_eq!((running.id, running.conversation_id), (hung1, c.id));
    assert_eq!((running.stop_reason, running.finished_at), (None, None));
    assert_eq!(running.owner, Some(owner.id));

    s.finish_run(done, StopReason::EndTurn, None).await.unwrap();
    s.finish_run(failed, StopReason::LlmApiError, Some("HTTP 500"))
        .await
        .unwrap();
    let r = s.run(failed).await.unwrap();
    assert_eq!(r.stop_reason, Some(StopReason::LlmApiError));
    assert_eq!(r.error.as_deref(), Some("HTTP 500"));
    assert!(r.finished_at.unwrap() >= r.started_at);

    // A restart: a new store on the same database finds the hung runs.
    let restarted = db.reopen().await;
    let unfinished = restarted.unfinished_runs().await.unwrap();
    assert_eq!(
        unfinished.iter().map(|u| u.run.id).collect::<BTreeSet<_>>(),
        BTreeSet::from([hung1, hung2])
    );
    for u in &unfinished {
        assert!(restarted.interrupt_run(u.run.id).await.unwrap());
        let r = restarted.run(u.run.id).await.unwrap();
        assert_eq!(r.stop_reason, Some(StopReason::Interrupted));
        assert!(r.finished_at.is_some());
        assert_eq!((r.started_at, r.owner), (u.run.started_at, Some(owner.id)));
        // Already interrupted: nothing to do, nothing to report.
        assert!(!restarted.interrupt_run(u.run.id).await.unwrap());
    }
    // A finished run is left as it ended.
    assert!(!restarted.interrupt_run(done).await.unwrap());
    assert_eq!(
        s.run(done).await.unwrap().stop_reason,
        Some(StopReason::EndTurn)
    );
    assert_eq!(
        s.run(failed).await.unwrap().error.as_deref(),
        Some("HTTP 500")
    );
    assert_eq!(restarted.unfinished_runs().await.unwrap(), vec![]);
}

pub async fn a_run_ends_with_its_events_or_not_at_all(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let owner = s
        .register_instance(InstanceId::new(), "host", 1)
        .await
        .unwrap();
    let run = RunId::new();
    s.start_run(run, c.id, owner.id).await.unwrap();
    s.append_event(c.id, &delta(run, 1)).await.unwrap();
    let stopped = AgentEvent::Stopped {
        run_id: run,
        reason: StopReason::LlmApiError,
        error: Some("HTTP 500".into()),
    };
    let seqs = s
        .finish_run_with_events(
            run,
            StopReason::LlmApiError,
            Some("HTTP 500"),
            c.id,
            std::slice::from_ref(&stopped),
        )
        .await
        .unwrap();
    assert_eq!(seqs, [2]);
    let r = db.reopen().await.run(run).await.unwrap();
    assert_eq!(r.stop_reason, Some(StopReason::LlmApiError));
    assert_eq!(r.error.as_deref(), Some("HTTP 500"));
    let log = s.events_since(c.id, 0, 10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!((log[1].seq, &log[1].event), (2, &stopped));

    // An unknown run: refused, and its events are not stored either.
    let unknown = RunId::new();
    let refused = s
        .finish_run_with_events(
            unknown,
            StopReason::EndTurn,
            None,
            c.id,
            &[delta(unknown, 1)],
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::RunNotFound(id)) if id == unknown),
        "{refused:?}"
    );
    assert_eq!(s.events_since(c.id, 0, 10).await.unwrap().len(), 2);
}

/// A turn's final answer, its events and the run's end in one
/// transaction: all stored (the answer the active leaf, the events in
/// order after the log's), or, for an unknown run or a bad parent,
/// nothing.
pub async fn a_run_ends_with_its_answer_or_not_at_all(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let owner = s
        .register_instance(InstanceId::new(), "host", 1)
        .await
        .unwrap();
    let run = RunId::new();
    let question = user(c.id, c.root_id, "hi");
    s.start_run_with_message(run, owner.id, &question, &[delta(run, 0)], &[])
        .await
        .unwrap();
    let answer = assistant(c.id, question.id, "hello");
    let events = [
        AgentEvent::AssistantMessageCreated {
            run_id: run,
            message: answer.clone(),
        },
        AgentEvent::FinalResponse {
            run_id: run,
            message_id: answer.id,
            usage: answer.usage.unwrap(),
            cost: answer.cost,
        },
        AgentEvent::Stopped {
            run_id: run,
            reason: StopReason::EndTurn,
            error: None,
        },
    ];

    // Refused, nothing of it stored: an unknown run, a parent of another
    // conversation.
    let unknown = RunId::new();
    let refused = s
        .finish_run_with_message(unknown, StopReason::EndTurn, None, &answer, &events)
        .await;
    assert!(
        matches!(refused, Err(StoreError::RunNotFound(id)) if id == unknown),
        "{refused:?}"
    );
    let elsewhere = s.create_conversation("sys", None).await.unwrap();
    let astray = assistant(c.id, elsewhere.root_id, "astray");
    assert!(
        s.finish_run_with_message(run, StopReason::EndTurn, None, &astray, &events)
            .await
            .is_err()
    );
    assert_eq!(s.events_since(c.id, 0, 10).await.unwrap().len(), 1);
    assert!(matches!(
        s.message(answer.id).await,
        Err(StoreError::MessageNotFound(_))
    ));
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, question.id);
    assert_eq!(s.run(run).await.unwrap().stop_reason, None);

    let seqs = s
        .finish_run_with_message(run, StopReason::EndTurn, None, &answer, &events)
        .await
        .unwrap();
    assert_eq!(seqs, [2, 3, 4]);
    let reopened = db.reopen().await;
    assert_eq!(reopened.message(answer.id).await.unwrap(), answer);
    assert_eq!(
        reopened.conversation(c.id).await.unwrap().active_leaf,
        answer.id
    );
    let r = reopened.run(run).await.unwrap();
    assert_eq!((r.stop_reason, r.error), (Some(StopReason::EndTurn), None));
    assert!(r.finished_at.is_some());
    let log = reopened.events_since(c.id, 1, 10).await.unwrap();
    assert_eq!(
        log.into_iter()
            .map(|e| (e.seq, e.event))
            .collect::<Vec<_>>(),
        [2, 3, 4].into_iter().zip(events).collect::<Vec<_>>()
    );
    assert!(
        reopened
            .conversation_unfinished_runs(c.id)
            .await
            .unwrap()
            .is_empty()
    );
}

/// One conversation's unfinished runs: oldest first, with their owners,
/// none of another conversation's and none finished.
pub async fn a_conversations_unfinished_runs_alone(db: Db) {
    let s = &db.store;
    let mine = s.create_conversation("sys", None).await.unwrap();
    let other = s.create_conversation("sys", None).await.unwrap();
    let empty = s.create_conversation("sys", None).await.unwrap();
    let owner = s
        .register_instance(InstanceId::new(), "host-a", 7)
        .await
        .unwrap();
    let [first, finished, theirs, second, interrupted] = std::array::from_fn(|_| RunId::new());
    for (run, c) in [
        (first, mine.id),
        (finished, mine.id),
        (theirs, other.id),
        (second, mine.id),
        (interrupted, mine.id),
    ] {
        s.start_run(run, c, owner.id).await.unwrap();
    }
    s.finish_run(finished, StopReason::EndTurn, None)
        .await
        .unwrap();
    assert!(s.interrupt_run(interrupted).await.unwrap());

    let unfinished = s.conversation_unfinished_runs(mine.id).await.unwrap();
    assert_eq!(
        unfinished.iter().map(|u| u.run.id).collect::<Vec<_>>(),
        [first, second],
        "oldest first, finished and other conversations' runs left out"
    );
    assert_eq!(unfinished[0].run, s.run(first).await.unwrap());
    assert_eq!(unfinished[1].owner.as_ref(), Some(&owner));
    // The same runs as the whole list holds for that conversation.
    let everywhere: Vec<_> = s
        .unfinished_runs()
        .await
        .unwrap()
        .into_iter()
        .filter(|u| u.run.conversation_id == mine.id)
        .collect();
    assert_eq!(everywhere, unfinished);
    let theirs_only = s.conversation_unfinished_runs(other.id).await.unwrap();
    assert_eq!(
        theirs_only.iter().map(|u| u.run.id).collect::<Vec<_>>(),
        [theirs]
    );
    assert!(
        s.conversation_unfinished_runs(empty.id)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.conversation_unfinished_runs(ConversationId::new())
            .await
            .unwrap()
            .is_empty(),
        "an unknown conversation has none"
    );
}

pub async fn unfinished_runs_come_with_their_owners(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let a = s
        .register_instance(InstanceId::new(), "host-a", 101)
        .await
        .unwrap();
    let b = s
        .register_instance(InstanceId::new(), "host-b", 4_000_000)
        .await
        .unwrap();
    assert_eq!((a.host.as_str(), a.pid), ("host-a", 101));
    assert_eq!(a.started_at, a.heartbeat_at);
    let legacy_owner = s
        .register_instance(InstanceId::new(), "legacy", 1)
        .await
        .unwrap();
    let lost_owner = s
        .register_instance(InstanceId::new(), "lost", 1)
        .await
        .unwrap();
    let [ra, rb, legacy, lost, done] = std::array::from_fn(|_| RunId::new());
    for (run, owner) in [
        (ra, a.id),
        (rb, b.id),
        (legacy, legacy_owner.id),
        (lost, lost_owner.id),
        (done, b.id),
    ] {
        s.start_run(run, c.id, owner).await.unwrap();
    }
    s.finish_run(done, StopReason::EndTurn, None).await.unwrap();
    // A run stored before runs had owners, and one whose owner's record is
    // gone.
    db.execute(
        "UPDATE runs SET owner = NULL \
         WHERE owner IN (SELECT id FROM instances WHERE host = 'legacy')",
    )
    .await;
    db.execute("DELETE FROM instances WHERE host = 'lost'")
        .await;

    let unfinished = s.unfinished_runs().await.unwrap();
    assert_eq!(
        unfinished.iter().map(|u| u.run.id).collect::<Vec<_>>(),
        [ra, rb, legacy, lost],
        "oldest first, finished runs left out"
    );
    assert_eq!(unfinished[0].owner.as_ref(), Some(&a));
    assert_eq!(unfinished[1].owner.as_ref(), Some(&b));
    assert_eq!(unfinished[0].run, s.run(ra).await.unwrap());
    assert_eq!(
        (unfinished[2].run.owner, &unfinished[2].owner),
        (None, &None)
    );
    assert_eq!(
        (unfinished[3].run.owner, &unfinished[3].owner),
        (Some(lost_owner.id), &None)
    );
}

/// Two instances starting at once both find the same orphaned runs: each
/// run is interrupted (and so reported) by exactly one of them.
pub async fn concurrent_interrupts_report_a_run_once(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let gone = s
        .register_instance(InstanceId::new(), "host", 7)
        .await
        .unwrap();
    let runs: Vec<RunId> = (0..20).map(|_| RunId::new()).collect();
    for &run in &runs {
        s.start_run(run, c.id, gone.id).await.unwrap();
    }
    let stores = [db.reopen().await, db.reopen().await];
    let mut tasks = tokio::task::JoinSet::new();
    for store in stores {
        let runs = runs.clone();
        tasks.spawn(async move {
            let mut mine = Vec::new();
            for run in runs {
                if store.interrupt_run(run).await.unwrap() {
                    mine.push(run);
                }
            }
            mine
        });
    }
    let mut reported = Vec::new();
    while let Some(mine) = tasks.join_next().await {
        reported.extend(mine.unwrap());
    }
    reported.sort();
    assert_eq!(reported, runs);
    assert_eq!(s.unfinished_runs().await.unwrap(), vec![]);
}

pub async fn instances_register_beat_and_are_forgotten(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let (busy, idle, fresh) = (InstanceId::new(), InstanceId::new(), InstanceId::new());
    let first = s.register_instance(busy, "host", 1).await.unwrap();
    s.register_instance(idle, "host", 2).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    s.heartbeat_instance(busy).await.unwrap();
    let run = RunId::new();
    s.start_run(run, c.id, busy).await.unwrap();
    let owner = s.unfinished_runs().await.unwrap()[0].owner.clone().unwrap();
    assert_eq!((owner.started_at, owner.pid), (first.started_at, 1));
    assert!(owner.heartbeat_at > first.heartbeat_at);
    assert_eq!(s.instance(busy).await.unwrap(), Some(owner));
    assert_eq!(s.instance(InstanceId::new()).await.unwrap(), None);

    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let cutoff = now();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    s.register_instance(fresh, "host", 3).await.unwrap();
    // Silent before the cutoff: `idle` goes; `busy` stays while it owns an
    // unfinished run; `fresh` was heard from after it.
    assert_eq!(s.forget_instances(cutoff).await.unwrap(), 1);
    let err = s.heartbeat_instance(idle).await.unwrap_err();
    assert!(
        matches!(err, StoreError::InstanceNotFound(id) if id == idle),
        "{err:?}"
    );
    s.heartbeat_instance(fresh).await.unwrap();
    assert_eq!(s.instance(idle).await.unwrap(), None, "forgotten");

    s.finish_run(run, StopReason::EndTurn, None).await.unwrap();
    assert_eq!(s.forget_instances(cutoff).await.unwrap(), 1);
    assert_eq!(
        s.run(run).await.unwrap().owner,
        Some(busy),
        "the finished run keeps its owner's id"
    );
    assert!(matches!(
        s.heartbeat_instance(busy).await.unwrap_err(),
        StoreError::InstanceNotFound(_)
    ));

    // A forgotten instance that comes back registers under its id again,
    // and a second registration keeps the first start.
    let again = s.register_instance(busy, "host", 1).await.unwrap();
    assert!(again.started_at > first.started_at);
    s.heartbeat_instance(busy).await.unwrap();
    let twice = s.register_instance(busy, "host", 1).await.unwrap();
    assert_eq!(twice.started_at, again.started_at);
    assert!(twice.heartbeat_at >= again.heartbeat_at);
}

pub async fn events_are_numbered_and_paged(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let other = s.create_conversation("other", None).await.unwrap();
    let run = RunId::new();
    let u = user(c.id, c.root_id, "hi");
    let mut sent = vec![AgentEvent::TurnStarted {
        run_id: run,
        conversation_id: c.id,
        message: u,
    }];
    sent.extend((1..25).map(|i| delta(run, i)));
    sent.push(AgentEvent::Stopped {
        run_id: run,
        reason: StopReason::EndTurn,
        error: None,
    });
    for (i, e) in sent.iter().enumerate() {
        assert_eq!(s.append_event(c.id, e).await.unwrap(), i as u64 + 1);
        // Another conversation's log counts on its own.
        assert_eq!(
            s.append_event(other.id, &delta(run, i)).await.unwrap(),
            i as u64 + 1
        );
    }

    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let page = s.events_since(c.id, after, 10).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        after = page.last().unwrap().seq;
        got.extend(page);
    }
    assert_eq!(
        got.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=26).collect::<Vec<_>>()
    );
    assert_eq!(got.into_iter().map(|e| e.event).collect::<Vec<_>>(), sent);
    let tail = s.events_since(c.id, 24, 100).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), [25, 26]);
    assert_eq!(s.events_since(c.id, 26, 100).await.unwrap(), vec![]);
    assert_eq!(s.events_since(c.id, 0, 0).await.unwrap(), vec![]);
}

pub async fn concurrent_events_have_no_gaps(db: Db) {
    const TASKS: usize = 8;
    const EACH: usize = 50;
    let c = db.store.create_conversation("sys", None).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let store = Arc::clone(&db.store);
        tasks.spawn(async move {
            let run = RunId::new();
            let mut seqs = Vec::new();
            for i in 0..EACH {
                seqs.push(
                    store
                        .append_event(c.id, &delta(run, t * 1000 + i))
                        .await
                        .unwrap(),
                );
            }
            seqs
        });
    }
    let mut all = BTreeSet::new();
    while let Some(seqs) = tasks.join_next().await {
        let seqs = seqs.unwrap();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "one task's events in order"
        );
        all.extend(seqs);
    }
    let total = (TASKS * EACH) as u64;
    assert_eq!(all, (1..=total).collect::<BTreeSet<_>>());
    let stored = db.store.events_since(c.id, 0, 10_000).await.unwrap();
    assert_eq!(
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>()
    );
}

pub async fn path_to_a_long_chain(db: Db) {
    const LEN: usize = 10_000;
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let mut expected = vec![c.root_id];
    for i in 1..LEN {
        let parent = *expected.last().unwrap();
        let m = if i % 2 == 1 {
            user(c.id, parent, &format!("u{i}"))
        } else {
            assistant(c.id, parent, &format!("a{i}"))
        };
        s.append(&m).await.unwrap();
        expected.push(m.id);
    }
    let path = s.path_to(*expected.last().unwrap()).await.unwrap();
    assert_eq!(path.len(), LEN);
    assert_eq!(ids(&path), expected);
    assert_eq!(path[LEN - 1].text(), format!("u{}", LEN - 1));
    let middle = s.path_to(expected[LEN / 2]).await.unwrap();
    assert_eq!(ids(&middle), expected[..=LEN / 2]);
}

pub async fn data_survives_reopening(db: Db) {
    let c = db
        .store
        .create_conversation("sys", Some("kept"))
        .await
        .unwrap();
    let u1 = user(c.id, c.root_id, "hi");
    let a1 = assistant(c.id, u1.id, "hello");
    db.store.append(&u1).await.unwrap();
    db.store.append(&a1).await.unwrap();
    let run = RunId::new();
    let me = db
        .store
        .register_instance(InstanceId::new(), "host", 1)
        .await
        .unwrap();
    db.store.start_run(run, c.id, me.id).await.unwrap();
    db.store
        .finish_run(run, StopReason::EndTurn, None)
        .await
        .unwrap();
    db.store.append_event(c.id, &delta(run, 1)).await.unwrap();
    let path = db.store.path_to(a1.id).await.unwrap();
    let record = db.store.run(run).await.unwrap();
    let Db { url, store } = db;
    drop(store);

    let again = Db::new(url).await;
    let s = &again.store;
    let expected = toolwire_core::Conversation {
        active_leaf: a1.id,
        ..c
    };
    assert_eq!(s.conversation(c.id).await.unwrap(), expected);
    assert_eq!(s.path_to(a1.id).await.unwrap(), path);
    assert_eq!(s.run(run).await.unwrap(), record);
    assert_eq!(s.events_since(c.id, 0, 10).await.unwrap().len(), 1);
    assert_eq!(s.append_event(c.id, &delta(run, 2)).await.unwrap(), 2);
}

pub async fn corrupt_content_is_reported(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let u1 = user(c.id, c.root_id, "hi");
    s.append(&u1).await.unwrap();
    // Valid JSON (PostgreSQL checks that much), but not content blocks.
    db.execute(r#"UPDATE messages SET content = '{"not": "blocks"}' WHERE role = 'user'"#)
        .await;
    for err in [
        s.message(u1.id).await.unwrap_err(),
        s.path_to(u1.id).await.unwrap_err(),
        s.children(c.root_id).await.unwrap_err(),
    ] {
        match err {
            StoreError::Corrupt(what) => assert!(what.contains(&u1.id.to_string()), "{what}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    // The rest of the tree still reads.
    assert_eq!(s.message(c.root_id).await.unwrap().text(), "sys");
}

/// The path to `leaf` walked one `message` at a time (the reference).
async fn walked_path(s: &Arc<dyn Store>, leaf: MessageId) -> Vec<Message> {
    let mut path = vec![s.message(leaf).await.unwrap()];
    while let Some(parent) = path.last().unwrap().parent_id {
        path.push(s.message(parent).await.unwrap());
    }
    path.reverse();
    path
}

pub async fn paths_cross_branches(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    // A tree grown in an awkward order: messages go under older ones,
    // under first children and later ones, at several depths.
    let mut all = vec![c.root_id];
    for i in 0..60usize {
        let parent = all[(i * 7 + i / 3) % all.len()];
        let m = user(c.id, parent, &format!("m{i}"));
        s.append(&m).await.unwrap();
        all.push(m.id);
    }
    for &id in &all {
        assert_eq!(s.path_to(id).await.unwrap(), walked_path(s, id).await);
    }
    // A fork of a deep message copies exactly its path.
    let at = *all.last().unwrap();
    let f = s.fork(at).await.unwrap();
    assert_eq!(
        texts(&s.path_to(f.active_leaf).await.unwrap()),
        texts(&walked_path(s, at).await)
    );
}

pub async fn concurrent_siblings_keep_their_paths(db: Db) {
    const TASKS: usize = 8;
    let c = db.store.create_conversation("sys", None).await.unwrap();
    let u = user(c.id, c.root_id, "hi");
    db.store.append(&u).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let store = Arc::clone(&db.store);
        tasks.spawn(async move {
            let mut parent = u.id;
            let mut line = Vec::new();
            for i in 0..5 {
                let m = assistant(c.id, parent, &format!("t{t} m{i}"));
                store.append(&m).await.unwrap();
                parent = m.id;
                line.push(m.id);
            }
            line
        });
    }
    while let Some(line) = tasks.join_next().await {
        let line = line.unwrap();
        let leaf = *line.last().unwrap();
        let path = db.store.path_to(leaf).await.unwrap();
        assert_eq!(path, walked_path(&db.store, leaf).await);
        assert_eq!(ids(&path)[2..], line[..]);
    }
    assert_eq!(db.store.children(u.id).await.unwrap().len(), TASKS);
}

pub async fn documents_are_kept_by_kind(db: Db) {
    let store = &db.store;
    let a = serde_json::json!({"name": "a", "nested": {"list": [1, 2.5, "x"], "none": null}});
    store.put_document("agent", "a1", &a).await.unwrap();
    store
        .put_document("agent", "a2", &serde_json::json!({"name": "b"}))
        .await
        .unwrap();
    store
        .put_document("tool", "a1", &serde_json::json!("same id, other kind"))
        .await
        .unwrap();
    let got = store.document("agent", "a1").await.unwrap().unwrap();
    assert_eq!(got.body, a);
    assert_eq!((got.kind.as_str(), got.id.as_str()), ("agent", "a1"));
    assert_eq!(got.created_at, got.updated_at);
    let listed = store.documents("agent").await.unwrap();
    assert_eq!(
        listed.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
        ["a1", "a2"],
        "oldest first, only this kind"
    );

    // Replacing keeps the creation time.
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let replaced = serde_json::json!({"name": "a, renamed"});
    store.put_document("agent", "a1", &replaced).await.unwrap();
    let got = db
        .reopen()
        .await
        .document("agent", "a1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.body, replaced);
    assert!(got.updated_at > got.created_at);
    assert_eq!(store.documents("agent").await.unwrap().len(), 2);

    assert!(store.delete_document("agent", "a1").await.unwrap());
    assert!(!store.delete_document("agent", "a1").await.unwrap());
    assert_eq!(store.document("agent", "a1").await.unwrap(), None);
    assert_eq!(
        store.document("tool", "a1").await.unwrap().unwrap().body,
        serde_json::json!("same id, other kind")
    );

    // Several at once: stored, replaced and removed in one transaction.
    let body = |n: i32| serde_json::json!({ "n": n });
    store
        .write_documents(
            "agent",
            &[
                ("a2".into(), Some(body(2))),
                ("a3".into(), Some(body(3))),
                ("never-there".into(), None),
            ],
        )
        .await
        .unwrap();
    store
        .write_documents(
            "agent",
            &[("a2".into(), None), ("a3".into(), Some(body(33)))],
        )
        .await
        .unwrap();
    let listed: Vec<(String, serde_json::Value)> = db
        .reopen()
        .await
        .documents("agent")
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id, d.body))
        .collect();
    assert_eq!(listed, [("a3".to_owned(), body(33))]);
    assert_eq!(
        store.documents("tool").await.unwrap().len(),
        1,
        "only its kind"
    );
    store.write_documents("agent", &[]).await.unwrap();

    // Several kinds at once, each replacing what was there.
    let run = serde_json::json!({"run": 1});
    store
        .put_documents(&[
            ("run", "r1", &run),
            ("agent", "a3", &body(333)),
            ("last_run", "a3", &serde_json::json!({"run_id": "r1"})),
        ])
        .await
        .unwrap();
    let reopened = db.reopen().await;
    assert_eq!(
        reopened.document("run", "r1").await.unwrap().unwrap().body,
        run
    );
    assert_eq!(
        reopened
            .document("agent", "a3")
            .await
            .unwrap()
            .unwrap()
            .body,
        body(333)
    );
    assert_eq!(
        reopened
            .document("last_run", "a3")
            .await
            .unwrap()
            .unwrap()
            .body,
        serde_json::json!({"run_id": "r1"})
    );
    store.put_documents(&[]).await.unwrap();
}

pub async fn messages_are_the_whole_tree(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let other = s.create_conversation("other", None).await.unwrap();
    let u1 = user(c.id, c.root_id, "hi");
    let a1 = assistant(c.id, u1.id, "hello");
    s.append(&u1).await.unwrap();
    s.append(&a1).await.unwrap();
    // A second branch, and a message in another conversation.
    let stored = s.message(u1.id).await.unwrap();
    let edit = Message {
        created_at: now(),
        ..edited_sibling(&stored, "hey").unwrap()
    };
    s.append(&edit).await.unwrap();
    s.append(&user(other.id, other.root_id, "elsewhere"))
        .await
        .unwrap();
    let root = s.message(c.root_id).await.unwrap();
    // Every branch, in the order stored, each message whole.
    assert_eq!(
        s.messages(c.id).await.unwrap(),
        vec![root, u1, a1, edit.clone()]
    );
    // A fork holds its copies only.
    let f = s.fork(edit.id).await.unwrap();
    assert_eq!(texts(&s.messages(f.id).await.unwrap()), ["sys", "hey"]);
    let nc = ConversationId::new();
    let err = s.messages(nc).await.unwrap_err();
    assert!(
        matches!(err, StoreError::ConversationNotFound(id) if id == nc),
        "{err:?}"
    );
}

pub async fn blobs_are_kept_once_by_hash(db: Db) {
    let store = &db.store;
    // Every byte value, so neither backend may treat the bytes as text.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let first = store.put_blob("image/png", &bytes).await.unwrap();
    assert_eq!(first, BlobRef::of("image/png", &bytes));
    assert_eq!(first.bytes_len, 70_000);
    // The same bytes again: the same reference, nothing new written.
    let again = store.put_blob("image/png", &bytes).await.unwrap();
    assert_eq!(again, first);
    let got = db
        .reopen()
        .await
        .blob(&first.sha256)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.media_type, "image/png");
    assert_eq!(got.bytes, bytes);

    let other = store.put_blob("image/gif", b"GIF89a").await.unwrap();
    assert_ne!(other.sha256, first.sha256);
    assert_eq!(
        store.blob(&other.sha256).await.unwrap().unwrap().bytes,
        b"GIF89a"
    );
    let empty = store.put_blob("image/png", b"").await.unwrap();
    assert_eq!(store.blob(&empty.sha256).await.unwrap().unwrap().bytes, b"");
    assert_eq!(store.blob(&"0".repeat(64)).await.unwrap(), None);
    assert_eq!(store.blob("not a hash").await.unwrap(), None);
}

pub async fn messages_hold_image_references(db: Db) {
    let store = &db.store;
    let c = store.create_conversation("sys", None).await.unwrap();
    let image = store
        .put_blob("image/png", b"\x89PNG\r\n\x1a\n")
        .await
        .unwrap();
    let mut user = Message::new(
        c.id,
        Some(c.root_id),
        Role::User,
        vec![
            ContentBlock::Text {
                text: "what is this?".into(),
            },
            ContentBlock::Image(image.clone()),
        ],
    );
    user.created_at = now();
    store.append(&user).await.unwrap();
    let mut result = Message::new(
        c.id,
        Some(user.id),
        Role::Tool,
        vec![ContentBlock::ToolResult {
            tool_use_id: toolwire_core::ToolCallId("c1".into()),
            content: "a screenshot".into(),
            is_error: false,
            images: vec![image.clone(), image.clone()],
        }],
    );
    result.created_at = now();
    store.append(&result).await.unwrap();
    let path = db.reopen().await.path_to(result.id).await.unwrap();
    assert_eq!(path[1], user);
    assert_eq!(path[2], result);
    assert_eq!(path[2].images().count(), 2);
    assert_eq!(store.message(user.id).await.unwrap(), user);
}

pub async fn a_turn_begins_in_one_transaction(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let owner = s
        .register_instance(InstanceId::new(), "host", 1)
        .await
        .unwrap();
    let run = RunId::new();
    let first = user(c.id, c.root_id, "hello");
    let record = serde_json::json!({"run": run.to_string()});
    let seqs = s
        .start_run_with_message(
            run,
            owner.id,
            &first,
            &[delta(run, 1), delta(run, 2)],
            &[("front_run", &run.to_string(), &record)],
        )
        .await
        .unwrap();
    assert_eq!(seqs, [1, 2]);
    let reopened = db.reopen().await;
    let r = reopened.run(run).await.unwrap();
    assert_eq!(
        (r.conversation_id, r.owner, r.stop_reason),
        (c.id, Some(owner.id), None)
    );
    assert_eq!(
        reopened.conversation(c.id).await.unwrap().active_leaf,
        first.id
    );
    assert_eq!(
        reopened.path_to(first.id).await.unwrap().last(),
        Some(&first)
    );
    let doc = reopened
        .document("front_run", &run.to_string())
        .await
        .unwrap();
    assert_eq!(doc.map(|d| d.body), Some(record.clone()));
    assert_eq!(reopened.events_since(c.id, 0, 10).await.unwrap().len(), 2);

    // A message that cannot be stored (its parent is another
    // conversation's): nothing of the beginning is, run nor document.
    let other = s.create_conversation("sys", None).await.unwrap();
    let refused_run = RunId::new();
    let stray = user(c.id, other.root_id, "lost");
    let refused = s
        .start_run_with_message(
            refused_run,
            owner.id,
            &stray,
            &[delta(refused_run, 1)],
            &[("front_run", &refused_run.to_string(), &record)],
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(matches!(
        s.run(refused_run).await,
        Err(StoreError::RunNotFound(id)) if id == refused_run
    ));
    assert!(
        s.document("front_run", &refused_run.to_string())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(s.events_since(c.id, 0, 10).await.unwrap().len(), 2);
    assert_eq!(s.conversation(c.id).await.unwrap().active_leaf, first.id);

    // An unknown conversation: refused.
    let nowhere = ConversationId::new();
    let lost = user(nowhere, MessageId::new(), "nowhere");
    assert!(
        s.start_run_with_message(RunId::new(), owner.id, &lost, &[], &[])
            .await
            .is_err()
    );
}

pub async fn a_conversation_is_read_with_a_document(db: Db) {
    let s = &db.store;
    let c = s.create_conversation("sys", None).await.unwrap();
    let (read, doc) = s
        .conversation_and_document(c.id, "paused", &c.id.to_string())
        .await
        .unwrap();
    assert_eq!((read.id, read.active_leaf), (c.id, c.root_id));
    assert!(doc.is_none());
    let body = serde_json::json!({"waiting": ["call-1"]});
    s.put_document("paused", &c.id.to_string(), &body)
        .await
        .unwrap();
    let (_, doc) = s
        .conversation_and_document(c.id, "paused", &c.id.to_string())
        .await
        .unwrap();
    assert_eq!(doc.map(|d| d.body), Some(body));
    let unknown = ConversationId::new();
    assert!(matches!(
        s.conversation_and_document(unknown, "paused", "x").await,
        Err(StoreError::ConversationNotFound(id)) if id == unknown
    ));
}
