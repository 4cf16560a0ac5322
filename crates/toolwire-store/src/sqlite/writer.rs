//! The writer: each write method is one transaction on the store's one
//! writing connection, run whole in one place (not one hop per
//! statement). Writers of this process wait for the connection as tasks,
//! in turn (an async lock: no thread is held while they wait), and each
//! runs its transaction on its own thread once it has the connection.
//! The SQL is [`crate::sql`]'s, shared with PostgreSQL.
//!
//! A write run on the caller's thread never waits for SQLite: not for
//! another process's writer (it fails at once with `SQLITE_BUSY` instead
//! and is run again on a blocking thread, still holding the connection,
//! where it waits as long as the busy timeout), nor for a checkpoint's
//! `fsync` (the connection checkpoints nothing itself: once enough was
//! written, a blocking thread checkpoints the WAL on a connection of its
//! own, see [`checkpoint`]). Writes that may take long (a fork, a large
//! blob) and the migrations run on a blocking thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rusqlite::hooks::Action;
use rusqlite::types::ToSql;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use toolwire_core::{
    AgentEvent, BlobRef, Conversation, ConversationId, InstanceId, Message, MessageId, RunId,
    StopReason, TreeError,
};
use uuid::Uuid;

mod batch;
mod begin;
mod checkpoint;

use super::transaction::{Begin, configure, is_busy, transaction, without_waiting};
use super::{BUSY_TIMEOUT, Inline, Location, blocking};
use crate::rows::{self, InstanceRow, MessageValues, Ts};
use crate::sql;
use crate::{InstanceRecord, Result, StoreError};

/// Blobs larger than this are written on a blocking thread, never on the
/// caller's (copying them into the page cache takes a while).
const INLINE_BLOB_BYTES: usize = 64 << 10;

/// The one connection our writes go through: writers of this process
/// queue on its lock rather than on SQLite's (other processes' writers
/// still wait for each other through the busy timeout).
#[derive(Debug)]
pub(in crate::sqlite) struct Writer {
    location: Location,
    /// Opened by [`Writer::migrate`]; a file's is opened again after a
    /// failure that left it in a transaction it could not roll back, or
    /// after [`Writer::close`]. An in-memory database's is the database.
    conn: Arc<tokio::sync::Mutex<Option<Connection>>>,
    /// Whether the connection was ever opened (an in-memory database
    /// cannot be opened again).
    opened: AtomicBool,
    /// Counts the connections opened and the changes made through them
    /// to stored messages other than inserts: see [`Stamp`].
    generation: Arc<AtomicU64>,
    /// The file's WAL checkpoints, told of every commit.
    checkpoints: Arc<checkpoint::Checkpoints>,
    /// Writes waiting for the connection, to be run in one batch (see
    /// [`batch`]).
    queue: batch::Queue,
}

/// The state of the file as the writer sees it while it holds still
/// (see [`Writer::quiet`]). Two snapshots taken under one stamp differ
/// at most by messages this store inserted: `data_version` (of the
/// writer's connection) changes with every commit of any other
/// connection, `generation` with this store's own updates (and
/// deletions) of messages, and with each new writer connection, whose
/// `data_version` counts afresh. Both only grow, so stamps are ordered
/// as they were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::sqlite) struct Stamp {
    generation: u64,
    data_version: i64,
}

/// Puts the file in WAL mode and says the mode it is in. The change
/// takes the file's exclusive lock, and SQLite answers busy at once,
/// without waiting through the busy timeout, while another process opens
/// the same new file: it is tried again until the timeout has passed.
fn wal_mode(conn: &Connection) -> Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        let mode = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(StoreError::from);
        match mode {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            mode => return mode,
        }
    }
}

impl Writer {
    pub(in crate::sqlite) fn new(location: Location) -> Writer {
        Writer {
            location,
            conn: Arc::new(tokio::sync::Mutex::new(None)),
            opened: AtomicBool::new(false),
            generation: Arc::new(AtomicU64::new(0)),
            checkpoints: Arc::default(),
            queue: batch::Queue::default(),
        }
    }

    /// Runs `f`, a read that takes its snapshot on another connection,
    /// while none of this store's writes can commit, and stamps it:
    /// `None` when the writer is busy (it may be waiting for another
    /// process's writer, for as long as the busy timeout), or when
    /// another connection committed while `f` ran (the snapshot may or
    /// may not hold that commit).
    pub(in crate::sqlite) fn quiet<T>(
        &self,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<(T, Option<Stamp>)> {
        let Ok(mut conn) = self.conn.try_lock() else {
            return Ok((f()?, None));
        };
        if conn.as_ref().is_some_and(|c| !c.is_autocommit()) {
            // Left in a transaction by a failure, for the next write
            // to deal with.
            return Ok((f()?, None));
        }
        let conn = self.ready(&mut conn)?;
        let before = self.stamp(conn)?;
        let value = f()?;
        let after = self.stamp(conn)?;
        Ok((value, (before == after).then_some(before)))
    }

    fn stamp(&self, conn: &Connection) -> Result<Stamp> {
        let data_version = conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?;
        Ok(Stamp {
            generation: self.generation.load(Ordering::SeqCst),
            data_version,
        })
    }

    pub(in crate::sqlite) async fn close(&self) {
        *self.conn.lock().await = None;
        self.checkpoints.close();
    }

    fn open(&self) -> Result<Connection> {
        let reopened = self.opened.swap(true, Ordering::SeqCst);
        let mut conn = match &self.location {
            Location::File(path) => {
                let mut conn = Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE
                        | OpenFlags::SQLITE_OPEN_CREATE
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                conn.busy_timeout(BUSY_TIMEOUT)?;
                // The file's own from then on; said again on every
                // open, which costs nothing once it is.
                let mode = wal_mode(&conn)?;
                if !mode.eq_ignore_ascii_case("wal") {
                    tracing::warn!(mode, "the database file could not be put in WAL mode");
                }
                // In place of SQLite's automatic checkpoints: see
                // [`checkpoint`].
                let checkpoints = Arc::clone(&self.checkpoints);
                conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames| {
                    checkpoints.committed(frames);
                    Ok(())
                }))?;
                conn
            }
            Location::Memory if reopened => return Err(StoreError::Closed),
            Location::Memory => Connection::open_in_memory()?,
        };
        configure(&conn)?;
        conn.pragma_update(None, "foreign_keys", true)?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Readers keep the messages they read while the stamp holds:
        // any write that changes or removes one (however it comes about,
        // committed or not) must change it.
        self.generation.fetch_add(1, Ordering::SeqCst);
        let generation = Arc::clone(&self.generation);
        conn.update_hook(Some(move |action, _: &str, table: &str, _| {
            if table == "messages" && action != Action::SQLITE_INSERT {
                generation.fetch_add(1, Ordering::SeqCst);
            }
        }))?;
        Ok(conn)
    }

    /// The connection in `slot`, out of any transaction a failure left
    /// it in, opened if needed.
    fn ready<'c>(&self, slot: &'c mut Option<Connection>) -> Result<&'c mut Connection> {
        let stuck = slot.as_ref().is_some_and(|c| !c.is_autocommit());
        if stuck {
            let rolled_back = slot
                .as_ref()
                .is_some_and(|c| c.execute("ROLLBACK", []).is_ok());
            // A file's connection can be opened afresh; an in-memory
            // database's is the database, and its next transaction
            // fails instead.
            if !rolled_back && matches!(self.location, Location::File(_)) {
                *slot = None;
            }
        }
        match slot {
            Some(conn) => Ok(conn),
            none => Ok(none.insert(self.open()?)),
        }
    }

    /// Opens the database (creating a missing file) and brings its
    /// schema up to date.
    pub(in crate::sqlite) async fn migrate(self: &Arc<Self>) -> Result<()> {
        let this = Arc::clone(self);
        blocking(move || {
            let mut slot = this.conn.blocking_lock();
            let conn = this.ready(&mut slot)?;
            let migrated = super::migrate::run(conn);
            // A migration that failed half-way may have left them off.
            conn.pragma_update(None, "foreign_keys", true)?;
            migrated
        })
        .await
    }

    /// Runs `f` in one transaction on the connection (an error rolls it
    /// back), once the connection is this call's: on the caller's thread
    /// when `inline` allows it and SQLite need not wait (see
    /// [`Writer::now`]), else on a blocking thread.
    async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        begin: Begin,
        inline: Inline,
        f: impl FnMut(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let slot = Arc::clone(&self.conn).lock_owned().await;
        self.run_locked(slot, begin, inline, f).await
    }

    /// [`Writer::run`] once the connection in `slot` is this call's.
    async fn run_locked<T: Send + 'static>(
        self: &Arc<Self>,
        mut slot: tokio::sync::OwnedMutexGuard<Option<Connection>>,
        begin: Begin,
        inline: Inline,
        mut f: impl FnMut(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if inline == Inline::Try
            && let Some(done) = Self::now(&mut slot, begin, &mut f)
        {
            drop(slot);
            self.checkpoint_if_due();
            return done;
        }
        let this = Arc::clone(self);
        let done = blocking(move || {
            let conn = this.ready(&mut slot)?;
            transaction(conn, begin, f)
        })
        .await;
        self.checkpoint_if_due();
        done
    }

    /// Runs `f` in one transaction on the connection in `slot` here and
    /// now, if that can be done without waiting: `None` when the
    /// connection is not open and ready (a failure left it in a
    /// transaction), or when SQLite would have waited for another
    /// process's lock (nothing is written then: the transaction rolled
    /// back, and `f` is to be run again where it may wait).
    fn now<T>(
        slot: &mut Option<Connection>,
        begin: Begin,
        f: &mut impl FnMut(&Connection) -> Result<T>,
    ) -> Option<Result<T>> {
        let conn = slot.as_mut().filter(|c| c.is_autocommit())?;
        match without_waiting(conn, |conn| transaction(conn, begin, &mut *f)) {
            Err(e) if is_busy(&e) => None,
            done => Some(done),
        }
    }

    /// Has the WAL checkpointed if enough was written since the last
    /// checkpoint (see [`checkpoint`]).
    fn checkpoint_if_due(&self) {
        self.checkpoints.run_if_due(&self.location);
    }

    /// Runs `f` as one write: in a transaction of its own (`BEGIN
    /// IMMEDIATE` … `COMMIT`) on the caller's thread if the connection is
    /// free at once, else in one batch with the writes queued with it
    /// (see [`batch`]). Either way its caller hears of it after the
    /// commit.
    async fn write<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnMut(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.write_batched(f).await
    }

    /// Runs `f` in one read transaction on the writer's connection (an
    /// in-memory database has no other); on the caller's thread if
    /// `inline` allows it and it can be run there at once.
    pub(in crate::sqlite) async fn read<T: Send + 'static>(
        self: &Arc<Self>,
        inline: Inline,
        f: impl FnMut(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.run(Begin::Deferred, inline, f).await
    }

    pub(in crate::sqlite) async fn delete_document(
        self: &Arc<Self>,
        kind: &str,
        id: &str,
    ) -> Result<bool> {
        let (kind, id) = (kind.to_owned(), id.to_owned());
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached(sql::DELETE_DOCUMENT)?
                .execute(numbered(&[&kind, &id]).as_slice())?;
            Ok(deleted > 0)
        })
        .await
    }

    pub(in crate::sqlite) async fn put_blob(
        self: &Arc<Self>,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<BlobRef> {
        let reference = BlobRef::of(media_type, bytes);
        let (hash, media_type, bytes) = (
            reference.sha256.clone(),
            media_type.to_owned(),
            bytes.to_vec(),
        );
        let now = Ts::now();
        let inline = if bytes.len() <= INLINE_BLOB_BYTES {
            Inline::Try
        } else {
            Inline::Never
        };
        self.run(Begin::Immediate, inline, move |tx| {
            tx.prepare_cached(sql::PUT_BLOB)?
                .execute(numbered(&[&hash, &media_type, &bytes, &now]).as_slice())?;
            Ok(())
        })
        .await?;
        Ok(reference)
    }

    pub(in crate::sqlite) async fn write_documents(
        self: &Arc<Self>,
        kind: &str,
        changes: &[(String, Option<serde_json::Value>)],
    ) -> Result<()> {
        let kind = kind.to_owned();
        let changes: Vec<(String, Option<String>)> = changes
            .iter()
            .map(|(id, body)| (id.clone(), body.as_ref().map(|b| b.to_string())))
            .collect();
        let now = Ts::now();
        self.write(move |tx| {
            for (id, body) in &changes {
                match body {
                    Some(body) => tx
                        .prepare_cached(sql::PUT_DOCUMENT)?
                        .execute(numbered(&[&kind, id, body, &now]).as_slice())?,
                    None => tx
                        .prepare_cached(sql::DELETE_DOCUMENT)?
                        .execute(numbered(&[&kind, id]).as_slice())?,
                };
            }
            Ok(())
        })
        .await
    }

    pub(in crate::sqlite) async fn put_documents(
        self: &Arc<Self>,
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> Result<()> {
        let documents = owned_documents(documents);
        let now = Ts::now();
        self.write(move |tx| put_documents(tx, &documents, &now))
            .await
    }

    pub(in crate::sqlite) async fn create_conversation(
        self: &Arc<Self>,
        system_prompt: &str,
        title: Option<&str>,
    ) -> Result<Conversation> {
        let (conversation, root) = sql::new_conversation(system_prompt, title);
        self.write(move |tx| {
            insert_conversation(tx, &conversation)?;
            insert_message(tx, &root)?;
            Ok(conversation.clone())
        })
        .await
    }

    pub(in crate::sqlite) async fn append_with_events(
        self: &Arc<Self>,
        message: &Message,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
        let message = message.clone();
        let events = event_rows(events)?;
        self.write(move |tx| append_on_path(tx, &message, parent, &events))
            .await
    }

    pub(in crate::sqlite) async fn update(self: &Arc<Self>, message: &Message) -> Result<()> {
        let message = message.clone();
        self.write(move |tx| {
            let (conversation, parent, role): (Uuid, Option<Uuid>, String) = tx
                .prepare_cached(sql::MESSAGE_PLACE)?
                .query_row(numbered(&[&message.id.0]).as_slice(), |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()?
                .ok_or(StoreError::MessageNotFound(message.id))?;
            sql::check_update(&message, conversation, parent, &role)?;
            let v = MessageValues::from(&message);
            let content = content_json(&message)?;
            tx.prepare_cached(sql::UPDATE_MESSAGE)?.execute(
                numbered(&[
                    &v.id,
                    &content,
                    &v.prompt_tokens,
                    &v.completion_tokens,
                    &v.cached_tokens,
                    &v.cache_write_tokens,
                    &v.cost,
                    &v.model,
                    &v.duration_ms,
                    &v.status,
                ])
                .as_slice(),
            )?;
            Ok(())
        })
        .await
    }

    pub(in crate::sqlite) async fn set_active_leaf(
        self: &Arc<Self>,
        conversation: ConversationId,
        leaf: MessageId,
    ) -> Result<()> {
        self.write(move |tx| {
            let owner: Option<Uuid> = tx
                .prepare_cached(sql::MESSAGE_CONVERSATION)?
                .query_row(numbered(&[&leaf.0]).as_slice(), |r| r.get(0))
                .optional()?;
            match owner {
                None => Err(StoreError::MessageNotFound(leaf)),
                Some(c) if c == conversation.0 => {
                    tx.prepare_cached(sql::SET_ACTIVE_LEAF)?
                        .execute(numbered(&[&conversation.0, &leaf.0]).as_slice())?;
                    Ok(())
                }
                Some(_) => {
                    super::get_conversation(tx, conversation)?;
                    Err(TreeError::UnknownMessage(leaf).into())
                }
            }
        })
        .await
    }

    pub(in crate::sqlite) async fn fork(self: &Arc<Self>, at: MessageId) -> Result<Conversation> {
        // A whole path copied: not on the caller's thread.
        self.run(Begin::Immediate, Inline::Never, move |tx| {
            let path = super::lines::read_path(tx, at)?;
            let source = path
                .first()
                .map(|root| root.conversation_id)
                .ok_or(StoreError::MessageNotFound(at))?;
            let source = super::get_conversation(tx, source)?;
            let (conversation, copies) = sql::forked(source, at, &path)?;
            insert_conversation(tx, &conversation)?;
            for copy in &copies {
                insert_message(tx, copy)?;
            }
            Ok(conversation)
        })
        .await
    }

    pub(in crate::sqlite) async fn register_instance(
        self: &Arc<Self>,
        id: InstanceId,
        host: &str,
        pid: u32,
    ) -> Result<InstanceRecord> {
        let host = host.to_owned();
        let now = Ts::now();
        self.write(move |tx| {
            let values = numbered(&[&id.0, &host, &pid, &now]);
            tx.prepare_cached(sql::REGISTER_INSTANCE)?
                .query_row(values.as_slice(), InstanceRow::from_sqlite)?
                .try_into()
        })
        .await
    }

    pub(in crate::sqlite) async fn heartbeat_instance(
        self: &Arc<Self>,
        id: InstanceId,
    ) -> Result<()> {
        let now = Ts::now();
        self.write(move |tx| {
            let updated = tx
                .prepare_cached(sql::HEARTBEAT_INSTANCE)?
                .execute(numbered(&[&id.0, &now]).as_slice())?;
            if updated == 0 {
                return Err(StoreError::InstanceNotFound(id));
            }
            Ok(())
        })
        .await
    }

    pub(in crate::sqlite) async fn forget_instances(
        self: &Arc<Self>,
        silent_since: chrono::DateTime<chrono::Utc>,
    ) -> Result<u64> {
        let before = Ts::from(silent_since);
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached(sql::FORGET_INSTANCES)?
                .execute(numbered(&[&before]).as_slice())?;
            // A count of rows always fits.
            Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
        })
        .await
    }

    pub(in crate::sqlite) async fn start_run(
        self: &Arc<Self>,
        id: RunId,
        conversation: ConversationId,
        owner: InstanceId,
    ) -> Result<()> {
        let now = Ts::now();
        self.write(move |tx| insert_run(tx, id, conversation, owner, &now))
            .await
    }

    pub(in crate::sqlite) async fn finish_run(
        self: &Arc<Self>,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
    ) -> Result<()> {
        let error = error.map(str::to_owned);
        let now = Ts::now();
        self.write(move |tx| finish_run(tx, id, reason, error.as_deref(), &now))
            .await
    }

    pub(in crate::sqlite) async fn finish_run_with_events(
        self: &Arc<Self>,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let error = error.map(str::to_owned);
        let events = event_rows(events)?;
        let now = Ts::now();
        self.write(move |tx| {
            finish_run(tx, id, reason, error.as_deref(), &now)?;
            insert_events(tx, conversation, &events)
        })
        .await
    }

    /// [`crate::Store::finish_run_with_message`].
    pub(in crate::sqlite) async fn finish_run_with_message(
        self: &Arc<Self>,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        message: &Message,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
        let message = message.clone();
        let error = error.map(str::to_owned);
        let events = event_rows(events)?;
        let now = Ts::now();
        self.write(move |tx| {
            let seqs = append_on_path(tx, &message, parent, &events)?;
            finish_run(tx, id, reason, error.as_deref(), &now)?;
            Ok(seqs)
        })
        .await
    }

    pub(in crate::sqlite) async fn interrupt_run(self: &Arc<Self>, id: RunId) -> Result<bool> {
        let now = Ts::now();
        self.write(move |tx| {
            let updated = tx
                .prepare_cached(sql::INTERRUPT_RUN)?
                .execute(numbered(&[&id.0, &StopReason::Interrupted.as_str(), &now]).as_slice())?;
            if updated > 0 {
                return Ok(true);
            }
            tx.prepare_cached(sql::RUN_EXISTS)?
                .query_row(numbered(&[&id.0]).as_slice(), |_| Ok(()))
                .optional()?
                .map(|()| false)
                .ok_or(StoreError::RunNotFound(id))
        })
        .await
    }

    pub(in crate::sqlite) async fn append_events(
        self: &Arc<Self>,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>> {
        let events = event_rows(events)?;
        self.write(move |tx| insert_events(tx, conversation, &events))
            .await
    }
}

/// Documents as a write takes them along: (kind, id, body as text).
type OwnedDocuments = Vec<(String, String, String)>;

fn owned_documents(documents: &[(&str, &str, &serde_json::Value)]) -> OwnedDocuments {
    documents
        .iter()
        .map(|(kind, id, body)| ((*kind).to_owned(), (*id).to_owned(), body.to_string()))
        .collect()
}

/// Each of `documents` stored, replacing one of its kind and id.
fn put_documents(tx: &Connection, documents: &OwnedDocuments, now: &Ts) -> Result<()> {
    for (kind, id, body) in documents {
        tx.prepare_cached(sql::PUT_DOCUMENT)?
            .execute(numbered(&[kind, id, body, now]).as_slice())?;
    }
    Ok(())
}

/// A new run of `conversation`, owned by `owner`.
fn insert_run(
    tx: &Connection,
    id: RunId,
    conversation: ConversationId,
    owner: InstanceId,
    now: &Ts,
) -> Result<()> {
    let inserted = tx
        .prepare_cached(sql::START_RUN)?
        .execute(numbered(&[&id.0, &conversation.0, now, &owner.0]).as_slice())?;
    if inserted == 0 {
        return Err(StoreError::ConversationNotFound(conversation));
    }
    Ok(())
}

/// `message` (whose parent is `parent`) stored as its conversation's new
/// active leaf, with `events` after it; their sequence numbers.
fn append_on_path(
    tx: &Connection,
    message: &Message,
    parent: MessageId,
    events: &[(String, String)],
) -> Result<Vec<u64>> {
    let parent_conversation: Option<Uuid> = tx
        .prepare_cached(sql::MESSAGE_CONVERSATION)?
        .query_row(numbered(&[&parent.0]).as_slice(), |r| r.get(0))
        .optional()?;
    sql::check_parent(message, parent, parent_conversation)?;
    tx.prepare_cached(sql::SET_ACTIVE_LEAF)?
        .execute(numbered(&[&message.conversation_id.0, &message.id.0]).as_slice())?;
    insert_message(tx, message)?;
    insert_events(tx, message.conversation_id, events)
}

fn finish_run(
    tx: &Connection,
    id: RunId,
    reason: StopReason,
    error: Option<&str>,
    now: &Ts,
) -> Result<()> {
    let updated = tx
        .prepare_cached(sql::FINISH_RUN)?
        .execute(numbered(&[&id.0, &reason.as_str(), &error, now]).as_slice())?;
    if updated == 0 {
        return Err(StoreError::RunNotFound(id));
    }
    Ok(())
}

/// `values` bound to `$1`, `$2` … by name: SQLite numbers the shared
/// statements' `$N` in the order they first appear, not by `N`.
fn numbered<'a>(values: &[&'a dyn ToSql]) -> Vec<(&'static str, &'a dyn ToSql)> {
    const NAMES: [&str; 16] = [
        "$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10", "$11", "$12", "$13", "$14",
        "$15", "$16",
    ];
    debug_assert!(values.len() <= NAMES.len());
    NAMES.iter().copied().zip(values.iter().copied()).collect()
}

/// A message's content as it is stored: serde_json's text, as the
/// PostgreSQL backend's JSON binding writes it too.
fn content_json(m: &Message) -> Result<String> {
    serde_json::to_string(&m.content).map_err(|e| {
        StoreError::Corrupt(format!(
            "message {}: content cannot be serialised: {e}",
            m.id
        ))
    })
}

/// Each event's type and JSON, as they are stored.
fn event_rows(events: &[AgentEvent]) -> Result<Vec<(String, String)>> {
    events.iter().map(rows::event_text).collect()
}

fn insert_conversation(tx: &Connection, c: &Conversation) -> Result<()> {
    tx.prepare_cached(sql::INSERT_CONVERSATION)?.execute(
        numbered(&[
            &c.id.0,
            &c.title,
            &c.root_id.0,
            &c.active_leaf.0,
            &c.forked_from.map(|f| f.conversation_id.0),
            &c.forked_from.map(|f| f.message_id.0),
            &Ts::from(c.created_at),
        ])
        .as_slice(),
    )?;
    Ok(())
}

fn insert_message(tx: &Connection, m: &Message) -> Result<()> {
    let v = MessageValues::from(m);
    let content = content_json(m)?;
    let inserted = tx.prepare_cached(sql::INSERT_MESSAGE)?.execute(
        numbered(&[
            &v.id,
            &v.conversation_id,
            &v.parent_id,
            &v.role,
            &content,
            &v.prompt_tokens,
            &v.completion_tokens,
            &v.cached_tokens,
            &v.cache_write_tokens,
            &v.cost,
            &v.model,
            &v.duration_ms,
            &v.status,
            &v.created_at,
        ])
        .as_slice(),
    );
    match inserted {
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
        {
            Err(StoreError::DuplicateMessage(m.id))
        }
        other => other.map(drop).map_err(Into::into),
    }
}

/// Appends `events` (type and JSON) to the conversation's log, numbered
/// on from its counter.
fn insert_events(
    tx: &Connection,
    conversation: ConversationId,
    events: &[(String, String)],
) -> Result<Vec<u64>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let corrupt =
        |seq: i64| StoreError::Corrupt(format!("conversation {conversation}: event seq {seq}"));
    let count = i64::try_from(events.len()).map_err(|_| corrupt(-1))?;
    let bumped = tx
        .prepare_cached(sql::BUMP_EVENT_SEQS)?
        .execute(numbered(&[&conversation.0, &count]).as_slice())?;
    if bumped == 0 {
        return Err(StoreError::ConversationNotFound(conversation));
    }
    let last: i64 = tx
        .prepare_cached(sql::LAST_EVENT_SEQ)?
        .query_row(numbered(&[&conversation.0]).as_slice(), |r| r.get(0))?;
    let now = Ts::now();
    let mut insert = tx.prepare_cached(sql::INSERT_EVENT)?;
    let mut seqs = Vec::with_capacity(events.len());
    for (seq, (kind, payload)) in (last - count + 1..).zip(events) {
        insert.execute(numbered(&[&conversation.0, &seq, kind, payload, &now]).as_slice())?;
        seqs.push(u64::try_from(seq).map_err(|_| corrupt(seq))?);
    }
    Ok(seqs)
}
