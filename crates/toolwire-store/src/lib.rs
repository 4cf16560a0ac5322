//! # toolwire-store
//!
//! **Owns** persistence: conversations and their message trees, runs
//! (turns), the instances that own them, the event log, documents and
//! blobs (images, each kept once under the SHA-256 of its bytes),
//! behind two traits: [`StoreRead`] (every read: what a front door may be
//! handed) and [`Store`] (those and every write). Two backends:
//! SQLite (default, one embedded file in WAL mode, or in memory), on
//! rusqlite alone; and PostgreSQL (for several instances), on
//! tokio-postgres with a deadpool pool. The SQL text is shared where the two
//! dialects agree (`sql.rs`), and so are the rows read (`rows.rs`). Schemas
//! are created and updated by migrations on open (`migrations/sqlite`,
//! `migrations/postgres`), recorded on both in `_sqlx_migrations` as sqlx
//! recorded them when it ran them (`migrate.rs`), so that databases made
//! by older versions open unchanged.
//!
//! **Invariants.** A message is stored only under a parent of the same
//! conversation; stored messages are never deleted, and an update never
//! changes a message's place in the tree. Every method is one transaction:
//! a crash leaves each completed step stored and nothing half-written.
//! Both backends pass the same test suite. No error shows a database
//! URL's password.
//!
//! **Entry points.** [`open`] (by URL: `sqlite://PATH`, `sqlite::memory:`
//! or `postgres://…`), the [`StoreRead`] and [`Store`] traits,
//! [`StoreError`], [`local_files`], [`cluster::Cluster`] (instances on
//! one database: leases, announcements, commands).

pub mod cluster;
mod content;
mod migrate;
mod postgres;
mod rows;
mod sql;
mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;
use toolwire_core::redact::redact_url;
use toolwire_core::{
    AgentEvent, BlobRef, Conversation, ConversationId, InstanceId, Message, MessageId, RunId,
    StopReason, TreeError,
};

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("conversation {0} not found")]
    ConversationNotFound(ConversationId),
    #[error("message {0} not found")]
    MessageNotFound(MessageId),
    #[error("run {0} not found")]
    RunNotFound(RunId),
    #[error("instance {0} not found (never registered, or forgotten)")]
    InstanceNotFound(InstanceId),
    #[error("message {message} cannot go under {parent}: {reason}")]
    BadParent {
        message: MessageId,
        parent: MessageId,
        reason: &'static str,
    },
    #[error("message {0} already exists")]
    DuplicateMessage(MessageId),
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The URL as shown: without its secrets.
    #[error("database URL `{0}` is not supported (use sqlite://PATH or postgres://…)")]
    UnsupportedUrl(String),
    /// `url` as shown: without its secrets.
    #[error("database URL `{url}`: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// From the PostgreSQL backend: the server's message, or what failed
    /// on the way to it.
    #[error("database error: {}", postgres::describe(.0))]
    Postgres(tokio_postgres::Error),
    /// From the SQLite backend.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// No PostgreSQL connection came free in time, or none could be made.
    #[error("database connection: {0}")]
    Connection(String),
    /// The store was closed (an in-memory database is gone then), or its
    /// runtime is shutting down.
    #[error("the store is closed")]
    Closed,
    /// A migration failed, or the database's record of its migrations does
    /// not match this version's.
    #[error("migration {version} ({description}) failed: {reason}")]
    Migration {
        version: i64,
        description: String,
        reason: String,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A conversation with its totals, for lists.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationSummary {
    pub conversation: Conversation,
    pub message_count: u64,
    /// Sum of the cost of every message in the tree, in US dollars.
    pub total_cost: f64,
}

/// How a stored run (turn) stands.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: RunId,
    pub conversation_id: ConversationId,
    /// `None` while the run is going on.
    pub stop_reason: Option<StopReason>,
    pub error: Option<String>,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The instance that runs (or ran) it; `None` for runs stored before
    /// runs had owners.
    pub owner: Option<InstanceId>,
}

/// A process using the store (in toolwire, one engine), as it registered
/// itself ([`Store::register_instance`]). Timestamps are taken from the
/// registering instance's clock, like every other timestamp in the store.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    pub id: InstanceId,
    /// Where `pid` names a process: instances with equal `host`s can look
    /// up each other's processes. The instance chooses it.
    pub host: String,
    pub pid: u32,
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// When the instance last said it was alive.
    pub heartbeat_at: chrono::DateTime<chrono::Utc>,
}

/// A run with no stop reason yet, and what is known of its owner.
#[derive(Debug, Clone, PartialEq)]
pub struct UnfinishedRun {
    pub run: RunRecord,
    /// `None` when the run has no owner (stored before runs had owners) or
    /// its owner's record is gone.
    pub owner: Option<InstanceRecord>,
}

/// An event with its place in the conversation's log.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// 1, 2, 3 … per conversation, without gaps.
    pub seq: u64,
    pub event: AgentEvent,
}

/// Bytes kept once under their SHA-256 (an image a message refers to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// A JSON document kept for a front door or the engine (an agent, a tool,
/// a paused turn), named by its kind and id. The store does not read the
/// body.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub kind: String,
    pub id: String,
    pub body: serde_json::Value,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Reading conversation trees, runs, events and documents: what a front
/// door may do with the store (the engine writes).
#[async_trait]
pub trait StoreRead: Send + Sync + 'static {
    async fn conversation(&self, id: ConversationId) -> Result<Conversation>;

    /// Every conversation, newest first, with totals.
    async fn list_conversations(&self) -> Result<Vec<ConversationSummary>>;

    async fn message(&self, id: MessageId) -> Result<Message>;

    /// Root first, `leaf` last, in one query.
    async fn path_to(&self, leaf: MessageId) -> Result<Vec<Message>>;

    /// Children of `id`, oldest first.
    async fn children(&self, id: MessageId) -> Result<Vec<Message>>;

    /// The children of `id`'s parent, `id` among them, oldest first.
    async fn siblings(&self, id: MessageId) -> Result<Vec<Message>>;

    /// Messages with no children (each branch's last message), oldest first.
    async fn leaves(&self, conversation: ConversationId) -> Result<Vec<Message>>;

    /// Sum of the cost of every message of the conversation.
    async fn total_cost(&self, conversation: ConversationId) -> Result<f64>;

    /// Instance `id` as last heard from; `None` if it never registered or
    /// has been forgotten.
    async fn instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>>;

    async fn run(&self, id: RunId) -> Result<RunRecord>;

    /// Every run with no stop reason yet, oldest first, with its owner's
    /// record: for deciding, at start-up, which of them lost their owner.
    async fn unfinished_runs(&self) -> Result<Vec<UnfinishedRun>>;

    /// [`StoreRead::unfinished_runs`] of one conversation: what a turn's
    /// start looks at, for a cost that does not grow with the other
    /// conversations' runs.
    async fn conversation_unfinished_runs(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<UnfinishedRun>>;

    /// Events with `seq > after`, oldest first, at most `limit`.
    async fn events_since(
        &self,
        conversation: ConversationId,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>>;

    async fn document(&self, kind: &str, id: &str) -> Result<Option<Document>>;

    /// The documents of `kind`, oldest first.
    async fn documents(&self, kind: &str) -> Result<Vec<Document>>;

    /// Every message of the conversation (the whole tree), in the order
    /// they were stored.
    async fn messages(&self, conversation: ConversationId) -> Result<Vec<Message>>;

    /// The blob stored under `sha256` (64 lowercase hex digits), if any.
    async fn blob(&self, sha256: &str) -> Result<Option<Blob>>;

    /// [`StoreRead::conversation`] and [`StoreRead::document`] in one
    /// read: what a turn's start looks at (the active leaf and the
    /// conversation's paused turn) for the cost of one.
    async fn conversation_and_document(
        &self,
        id: ConversationId,
        kind: &str,
        document: &str,
    ) -> Result<(Conversation, Option<Document>)>;
}

/// Persistence of conversation trees, runs and events: [`StoreRead`] and
/// every write. Each write method is one transaction.
#[async_trait]
pub trait Store: StoreRead {
    /// A new conversation whose root is a system message holding
    /// `system_prompt` (empty content when it is empty).
    async fn create_conversation(
        &self,
        system_prompt: &str,
        title: Option<&str>,
    ) -> Result<Conversation>;

    /// Stores a new message under its `parent_id` (which must be a message
    /// of the same conversation) and makes it the active leaf.
    async fn append(&self, message: &Message) -> Result<()> {
        self.append_with_events(message, &[]).await.map(drop)
    }

    /// [`Store::append`], and `events` appended to the conversation's log in
    /// the same transaction (a step and its announcement are stored
    /// together); returns the events' `seq`s.
    async fn append_with_events(
        &self,
        message: &Message,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>>;

    /// Rewrites a stored message's content, usage, cost, model, duration
    /// and status. Its id, conversation, parent and role must not change.
    async fn update(&self, message: &Message) -> Result<()>;

    async fn set_active_leaf(&self, conversation: ConversationId, leaf: MessageId) -> Result<()>;

    /// A new conversation holding a copy of the path to `at`, remembering
    /// where it came from; its active leaf is the copy of `at`.
    async fn fork(&self, at: MessageId) -> Result<Conversation>;

    /// Records instance `id`, on `host` with process `pid`, as alive now.
    /// Registering a known id again (after [`Store::forget_instances`]
    /// forgot it) only renews its heartbeat.
    async fn register_instance(
        &self,
        id: InstanceId,
        host: &str,
        pid: u32,
    ) -> Result<InstanceRecord>;

    /// Records that instance `id` is still alive;
    /// [`StoreError::InstanceNotFound`] once it has been forgotten.
    async fn heartbeat_instance(&self, id: InstanceId) -> Result<()>;

    /// Forgets the instances silent since before `silent_since` that own no
    /// unfinished run (their finished runs keep the owner's id); returns how
    /// many.
    async fn forget_instances(&self, silent_since: chrono::DateTime<chrono::Utc>) -> Result<u64>;

    /// Records that run `id` began in `conversation`, run by instance
    /// `owner` (registered with [`Store::register_instance`]).
    async fn start_run(
        &self,
        id: RunId,
        conversation: ConversationId,
        owner: InstanceId,
    ) -> Result<()>;

    /// Records how run `id` ended.
    async fn finish_run(&self, id: RunId, reason: StopReason, error: Option<&str>) -> Result<()>;

    /// [`Store::finish_run`], and `events` (the run's announcement of its
    /// end) appended to `conversation`'s log in the same transaction;
    /// returns the events' `seq`s. Nothing is stored if either fails.
    async fn finish_run_with_events(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>>;

    /// A turn's end in one transaction: `message` (the run's final
    /// answer) appended with `events` ([`Store::append_with_events`]: its
    /// announcements and, last, the run's end) and run `id` recorded as
    /// ended ([`Store::finish_run`]). Returns the events' `seq`s. Nothing
    /// is stored if any part fails.
    async fn finish_run_with_message(
        &self,
        id: RunId,
        reason: StopReason,
        error: Option<&str>,
        message: &Message,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>>;

    /// A turn's beginning in one transaction: run `id` begins in
    /// `message`'s conversation, run by `owner` ([`Store::start_run`]),
    /// `message` is appended with `events` ([`Store::append_with_events`])
    /// and `documents` are stored ([`Store::put_documents`]). Returns the
    /// events' `seq`s. Nothing is stored if any part fails.
    async fn start_run_with_message(
        &self,
        id: RunId,
        owner: InstanceId,
        message: &Message,
        events: &[AgentEvent],
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> Result<Vec<u64>>;

    /// Marks run `id` interrupted if it is still unfinished, and says
    /// whether it did: `false` when it had ended meanwhile or another
    /// instance interrupted it first, so that only one of several instances
    /// starting at once reports it.
    async fn interrupt_run(&self, id: RunId) -> Result<bool>;

    /// Appends `event` to the conversation's log; returns its `seq`.
    async fn append_event(&self, conversation: ConversationId, event: &AgentEvent) -> Result<u64> {
        let seqs = self
            .append_events(conversation, std::slice::from_ref(event))
            .await?;
        seqs.first()
            .copied()
            .ok_or_else(|| StoreError::Corrupt("an appended event got no sequence number".into()))
    }

    /// Appends `events` in one transaction; returns their `seq`s, in order.
    async fn append_events(
        &self,
        conversation: ConversationId,
        events: &[AgentEvent],
    ) -> Result<Vec<u64>>;

    /// Stores `body` as document `(kind, id)`, replacing one there (which
    /// keeps its `created_at`).
    async fn put_document(&self, kind: &str, id: &str, body: &serde_json::Value) -> Result<()> {
        self.write_documents(kind, &[(id.to_owned(), Some(body.clone()))])
            .await
    }

    /// Removes document `(kind, id)`; says whether it was there.
    async fn delete_document(&self, kind: &str, id: &str) -> Result<bool>;

    /// Stores (`Some` body) or removes (`None`) documents of `kind`, all in
    /// one transaction.
    async fn write_documents(
        &self,
        kind: &str,
        changes: &[(String, Option<serde_json::Value>)],
    ) -> Result<()>;

    /// Stores each `(kind, id, body)`, in place of any document there, all
    /// or none (one transaction).
    async fn put_documents(&self, documents: &[(&str, &str, &serde_json::Value)]) -> Result<()>;

    /// Stores `bytes` once under their SHA-256 and gives the reference a
    /// message holds. Storing the same bytes again writes nothing (the
    /// first media type stays).
    async fn put_blob(&self, media_type: &str, bytes: &[u8]) -> Result<BlobRef>;

    /// How instance `me` coordinates with the other instances on this
    /// database ([`cluster`]): alone unless the backend is shared
    /// (PostgreSQL), where it keeps a connection of its own.
    async fn cluster(&self, me: InstanceId) -> Result<Arc<dyn cluster::Cluster>> {
        let _ = me;
        Ok(Arc::new(cluster::Alone))
    }
}

/// The files the store at `url` keeps on disk: a SQLite database file and
/// its `-wal`, `-shm`, `-journal` and `-leases` siblings (whether they exist yet or
/// not), as named by the URL. None for an in-memory database, PostgreSQL,
/// or a URL that does not parse.
pub fn local_files(url: &str) -> Vec<std::path::PathBuf> {
    let Ok(sqlite::Location::File(file)) = sqlite::Location::parse(url) else {
        return Vec::new();
    };
    let mut files = vec![file.clone()];
    for suffix in ["-wal", "-shm", "-journal", "-leases"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        files.push(name.into());
    }
    files
}

/// Opens (creating if needed, and migrating) the store at `url`.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::open(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(redact_url(url)))
    }
}
