//! What instances sharing one database tell each other, behind
//! [`Cluster`]: who runs a turn in a conversation (a lease), that a
//! conversation's event log grew, and commands for the instance running a
//! turn (cancel, interjections, notifications). The database is the only
//! channel: no other service.
//!
//! Two implementations: [`Alone`] for a database one process uses (SQLite,
//! or tests): every lease is granted, nothing is announced, no command
//! goes anywhere; and PostgreSQL's (`postgres/cluster.rs`): session
//! advisory locks on a connection held by the instance, `LISTEN`/`NOTIFY`,
//! and a table of commands.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use toolwire_core::{ConversationId, InstanceId};

use crate::Result;

/// What another instance said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// `conversation`'s log holds events up to `seq` (stored and
    /// committed by another instance).
    Events {
        conversation: ConversationId,
        seq: u64,
    },
    /// Commands wait for this instance ([`Cluster::take_commands`]).
    Commands,
    /// The connection that holds this instance's leases was lost: they
    /// are gone, and another instance may start a turn in conversations
    /// whose turns run here.
    LinkLost,
    /// That connection was made again: signals may have been missed
    /// meanwhile.
    Reconnected,
}

/// What the instance running a conversation's turn is asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Command {
    /// Cancel the running turn.
    Cancel { conversation: ConversationId },
    /// Words for the running turn (or, once it ended, the next one).
    Interject {
        conversation: ConversationId,
        text: String,
    },
    /// A notification for the running turn's next tool result: the
    /// engine's own serialised form (the store does not read it).
    Notify {
        conversation: ConversationId,
        event: serde_json::Value,
    },
}

impl Command {
    pub fn conversation(&self) -> ConversationId {
        match self {
            Command::Cancel { conversation }
            | Command::Interject { conversation, .. }
            | Command::Notify { conversation, .. } => *conversation,
        }
    }
}

/// How the instances sharing a database coordinate. One per engine
/// (instance); cheap calls, none of which waits for another instance.
#[async_trait]
pub trait Cluster: Send + Sync + std::fmt::Debug {
    /// Whether other instances may share the database (`false`: this one
    /// is alone, and nothing needs telling).
    fn shared(&self) -> bool;

    /// Takes `conversation`'s lease for this instance: `false` when another
    /// instance holds it (runs a turn there). Taking a lease this instance
    /// holds succeeds again; each success is matched by one
    /// [`Cluster::release`].
    async fn try_lease(&self, conversation: ConversationId) -> Result<bool>;

    /// Gives back one hold of `conversation`'s lease (in the background).
    fn release(&self, conversation: ConversationId);

    /// Tells the other instances that `conversation`'s log holds events up
    /// to `seq` (after they are committed). Announcements may be
    /// coalesced: only the last seq of a conversation counts.
    fn announce(&self, conversation: ConversationId, seq: u64);

    /// What other instances say; `None` after the first call (one reader),
    /// and always for an instance alone.
    fn signals(&self) -> Option<mpsc::UnboundedReceiver<Signal>>;

    /// Stores `command` for instance `to` and wakes it.
    async fn send(&self, to: InstanceId, command: &Command) -> Result<()>;

    /// The commands stored for this instance, oldest first, each taken
    /// once (removed as it is read).
    async fn take_commands(&self) -> Result<Vec<Command>>;

    /// The other instances that commands wait for (any, gone or not).
    /// None where commands do not travel (no shared database).
    async fn command_targets(&self) -> Result<Vec<InstanceId>> {
        Ok(Vec::new())
    }

    /// The commands stored for instance `other`, oldest first, each taken
    /// once: for the survivor that settles what waited for an instance
    /// that is gone (it would never take them).
    async fn take_commands_of(&self, other: InstanceId) -> Result<Vec<Command>> {
        let _ = other;
        Ok(Vec::new())
    }

    /// Whether no instance holds `conversation`'s lease (this one's own
    /// holds aside: ask only about conversations it does not run).
    async fn lease_free(&self, conversation: ConversationId) -> Result<bool>;

    /// The instance that runs `conversation`'s current turn, as its
    /// unfinished run names it; `None` when no turn runs there.
    async fn turn_owner(&self, conversation: ConversationId) -> Result<Option<InstanceId>>;

    /// A section that one instance at a time runs (the sweep after an
    /// instance died: once, by one survivor), held until the guard drops;
    /// `None` when another instance holds it now.
    async fn exclusively(&self, name: &str) -> Result<Option<ExclusiveGuard>>;
}

/// Held while a [`Cluster::exclusively`] section runs; let go on drop.
pub struct ExclusiveGuard {
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl ExclusiveGuard {
    pub fn new(release: impl FnOnce() + Send + 'static) -> Self {
        ExclusiveGuard {
            release: Some(Box::new(release)),
        }
    }
}

impl std::fmt::Debug for ExclusiveGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExclusiveGuard").finish_non_exhaustive()
    }
}

impl Drop for ExclusiveGuard {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// The cluster of one instance: the engine's own bookkeeping (one turn per
/// conversation, in memory) is all there is.
#[derive(Debug, Default)]
pub struct Alone;

#[async_trait]
impl Cluster for Alone {
    fn shared(&self) -> bool {
        false
    }

    async fn try_lease(&self, _conversation: ConversationId) -> Result<bool> {
        Ok(true)
    }

    fn release(&self, _conversation: ConversationId) {}

    fn announce(&self, _conversation: ConversationId, _seq: u64) {}

    fn signals(&self) -> Option<mpsc::UnboundedReceiver<Signal>> {
        None
    }

    async fn send(&self, to: InstanceId, _command: &Command) -> Result<()> {
        Err(crate::StoreError::InstanceNotFound(to))
    }

    async fn take_commands(&self) -> Result<Vec<Command>> {
        Ok(Vec::new())
    }

    async fn lease_free(&self, _conversation: ConversationId) -> Result<bool> {
        Ok(true)
    }

    async fn turn_owner(&self, _conversation: ConversationId) -> Result<Option<InstanceId>> {
        Ok(None)
    }

    async fn exclusively(&self, _name: &str) -> Result<Option<ExclusiveGuard>> {
        Ok(Some(ExclusiveGuard::new(|| {})))
    }
}
