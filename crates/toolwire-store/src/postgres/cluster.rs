//! [`Cluster`] on PostgreSQL. Each instance keeps one connection of its
//! own (outside the pool), the *link*, which
//!
//! - holds the leases: a session advisory lock per conversation whose
//!   turn the instance runs, so that when the instance dies its
//!   connection closes and the server lets go of every lease at once;
//! - `LISTEN`s on two channels of the database: `toolwire_events`
//!   (payload `CONVERSATION:SEQ`, sent after the commit, coalesced per
//!   conversation) and `toolwire_commands` (payload: the instance a
//!   command waits for in `cluster_commands`).
//!
//! A lost link is made again (with backoff); the leases the instance held
//! are taken again and the engine is told ([`Signal::Reconnected`]) that
//! it may have missed signals.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use futures::StreamExt;
use tokio::sync::{Notify, mpsc};
use tokio_postgres::{AsyncMessage, Client, NoTls};
use toolwire_core::{ConversationId, InstanceId};

use crate::cluster::{Cluster, Command, ExclusiveGuard, Signal};
use crate::{Result, StoreError};

/// Where committed events are announced.
pub(crate) const EVENTS_CHANNEL: &str = "toolwire_events";
/// Where an instance is told that commands wait for it.
pub(crate) const COMMANDS_CHANNEL: &str = "toolwire_commands";

/// The first of the two advisory lock keys of a conversation's lease; the
/// second is folded from its id. (sqlx's migration lock uses the one-key
/// form, a separate key space.)
const LEASE_SPACE: i32 = 0x7477_6c65; // "twle"
/// The key space of [`Cluster::exclusively`]'s sections.
const SECTION_SPACE: i32 = 0x7477_7365; // "twse"

const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1, $2)";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1, $2)";
const ANNOUNCE: &str = "SELECT pg_notify('toolwire_events', x) FROM unnest($1::text[]) AS x";
const SEND_COMMAND: &str = "WITH c AS (INSERT INTO cluster_commands (target, body) \
    VALUES ($1, $2) RETURNING target) \
    SELECT pg_notify('toolwire_commands', target::text) FROM c";
const TAKE_COMMANDS: &str = "DELETE FROM cluster_commands WHERE target = $1 RETURNING id, body";
const COMMAND_TARGETS: &str = "SELECT DISTINCT target FROM cluster_commands WHERE target <> $1";
const TURN_OWNER: &str = "SELECT owner FROM runs WHERE conversation_id = $1 \
    AND stop_reason IS NULL ORDER BY started_at DESC LIMIT 1";

/// The conversation's second lease key: its id folded to 32 bits. Two
/// conversations that share one only wait for each other.
fn lease_key(conversation: ConversationId) -> i32 {
    let (hi, lo) = conversation.0.as_u64_pair();
    let folded = hi ^ lo;
    // Truncation intended: the key is a hash.
    #[allow(clippy::cast_possible_truncation)]
    let key = ((folded >> 32) ^ folded) as u32;
    i32::from_ne_bytes(key.to_ne_bytes())
}

fn section_key(name: &str) -> i32 {
    let hash = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    i32::from_ne_bytes(hash.to_ne_bytes())
}

struct Shared {
    me: InstanceId,
    pool: Pool,
    /// The link's client while it is up.
    link: Mutex<Option<Arc<Client>>>,
    /// The link's server process, whose own notifications are skipped.
    backend_pid: Mutex<Option<i32>>,
    /// Leases held, with how many holds each.
    held: Mutex<HashMap<ConversationId, u32>>,
    /// Announcements not sent yet: each conversation's last seq.
    pending: Mutex<HashMap<ConversationId, u64>>,
    wake_announcer: Notify,
    link_up: Notify,
    signals: Mutex<Option<mpsc::UnboundedReceiver<Signal>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// See the module documentation.
pub(crate) struct PgCluster {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCluster")
            .field("instance", &self.shared.me)
            .finish_non_exhaustive()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl PgCluster {
    /// Makes the link (and fails if it cannot be made now), then keeps it.
    pub(crate) async fn start(
        config: tokio_postgres::Config,
        pool: Pool,
        me: InstanceId,
    ) -> Result<PgCluster> {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            me,
            pool,
            link: Mutex::new(None),
            backend_pid: Mutex::new(None),
            held: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            wake_announcer: Notify::new(),
            link_up: Notify::new(),
            signals: Mutex::new(Some(rx)),
        });
        let first = connect(&config, &shared, &tx).await?;
        let keeper = tokio::spawn(keep_link(config, Arc::clone(&shared), tx, first));
        let announcer = tokio::spawn(announce_loop(Arc::clone(&shared)));
        Ok(PgCluster {
            shared,
            tasks: vec![keeper, announcer],
        })
    }

    fn client(&self) -> Result<Arc<Client>> {
        lock(&self.shared.link)
            .clone()
            .ok_or_else(|| StoreError::Connection("the cluster link is down; retrying".into()))
    }
}

/// A connection's message pump: notifications become signals.
type Pump = tokio::task::JoinHandle<()>;

/// Connects the link, listens, takes the held leases again; returns the
/// task that pumps its messages (it ends when the connection does).
async fn connect(
    config: &tokio_postgres::Config,
    shared: &Arc<Shared>,
    tx: &mpsc::UnboundedSender<Signal>,
) -> Result<Pump> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let me = shared.me;
    let own_pid = Arc::new(Mutex::new(None::<i32>));
    let pump_pid = Arc::clone(&own_pid);
    let pump_tx = tx.clone();
    let pump = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if Some(n.process_id()) == *lock(&pump_pid) {
                        continue;
                    }
                    if let Some(signal) = parse(n.channel(), n.payload(), me) {
                        let _ = pump_tx.send(signal);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %super::describe(&e), "the cluster link failed");
                    break;
                }
            }
        }
    });
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    *lock(&own_pid) = Some(pid);
    *lock(&shared.backend_pid) = Some(pid);
    client
        .batch_execute(&format!(
            "LISTEN {EVENTS_CHANNEL}; LISTEN {COMMANDS_CHANNEL}"
        ))
        .await?;
    let held: Vec<ConversationId> = lock(&shared.held).keys().copied().collect();
    for conversation in held {
        let row = client
            .query_one(TRY_LOCK, &[&LEASE_SPACE, &lease_key(conversation)])
            .await?;
        if !row.get::<_, bool>(0) {
            tracing::error!(%conversation, "a lease was lost with the cluster link and another instance took it");
        }
    }
    *lock(&shared.link) = Some(Arc::new(client));
    shared.link_up.notify_waiters();
    Ok(pump)
}

/// What a notification says to instance `me`.
fn parse(channel: &str, payload: &str, me: InstanceId) -> Option<Signal> {
    match channel {
        EVENTS_CHANNEL => {
            let (conversation, seq) = payload.split_once(':')?;
            Some(Signal::Events {
                conversation: ConversationId(conversation.parse().ok()?),
                seq: seq.parse().ok()?,
            })
        }
        COMMANDS_CHANNEL => {
            let target: uuid::Uuid = payload.parse().ok()?;
            (target == me.0).then_some(Signal::Commands)
        }
        _ => None,
    }
}

/// Keeps the link up: when its connection ends, connects again (with
/// backoff) and says so.
async fn keep_link(
    config: tokio_postgres::Config,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Signal>,
    mut pump: Pump,
) {
    loop {
        let _ = (&mut pump).await;
        *lock(&shared.link) = None;
        let _ = tx.send(Signal::LinkLost);
        let mut wait = RECONNECT_FIRST;
        loop {
            tokio::time::sleep(wait).await;
            match connect(&config, &shared, &tx).await {
                Ok(next) => {
                    pump = next;
                    tracing::info!("the cluster link is up again");
                    let _ = tx.send(Signal::Reconnected);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not make the cluster link again");
                    wait = (wait * 2).min(RECONNECT_MAX);
                }
            }
        }
    }
}

/// Sends what waits in `pending`, one statement per round: a burst of
/// events is one notification per conversation.
async fn announce_loop(shared: Arc<Shared>) {
    loop {
        shared.wake_announcer.notified().await;
        let batch: Vec<String> = {
            let mut pending = lock(&shared.pending);
            pending
                .drain()
                .map(|(conversation, seq)| format!("{}:{seq}", conversation.0))
                .collect()
        };
        if batch.is_empty() {
            continue;
        }
        let client = lock(&shared.link).clone();
        let sent = match client {
            Some(client) => client.execute(ANNOUNCE, &[&batch]).await.map(drop),
            None => {
                // Followers elsewhere read the log on `Reconnected`.
                tracing::debug!("the cluster link is down: an announcement was not sent");
                Ok(())
            }
        };
        if let Err(e) = sent {
            tracing::warn!(error = %super::describe(&e), "could not announce events");
        }
    }
}

#[async_trait]
impl Cluster for PgCluster {
    fn shared(&self) -> bool {
        true
    }

    async fn try_lease(&self, conversation: ConversationId) -> Result<bool> {
        {
            let mut held = lock(&self.shared.held);
            if let Some(count) = held.get_mut(&conversation) {
                *count += 1;
                return Ok(true);
            }
        }
        let client = self.client()?;
        let row = client
            .query_one(TRY_LOCK, &[&LEASE_SPACE, &lease_key(conversation)])
            .await?;
        let taken: bool = row.get(0);
        if taken {
            let mut held = lock(&self.shared.held);
            *held.entry(conversation).or_insert(0) += 1;
        }
        Ok(taken)
    }

    fn release(&self, conversation: ConversationId) {
        {
            let mut held = lock(&self.shared.held);
            match held.get_mut(&conversation) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    return;
                }
                Some(_) => {
                    held.remove(&conversation);
                }
                None => return,
            }
        }
        let Ok(client) = self.client() else {
            // The link is down: its session, and the lock, are gone.
            return;
        };
        tokio::spawn(async move {
            if let Err(e) = client
                .query_one(UNLOCK, &[&LEASE_SPACE, &lease_key(conversation)])
                .await
            {
                tracing::warn!(%conversation, error = %super::describe(&e), "could not give back a lease");
            }
        });
    }

    fn announce(&self, conversation: ConversationId, seq: u64) {
        {
            let mut pending = lock(&self.shared.pending);
            let last = pending.entry(conversation).or_insert(seq);
            *last = (*last).max(seq);
        }
        self.shared.wake_announcer.notify_one();
    }

    fn signals(&self) -> Option<mpsc::UnboundedReceiver<Signal>> {
        lock(&self.shared.signals).take()
    }

    async fn send(&self, to: InstanceId, command: &Command) -> Result<()> {
        let body = serde_json::to_value(command)
            .map_err(|e| StoreError::Corrupt(format!("a command: {e}")))?;
        let client = self.shared.pool.get().await?;
        let statement = client.prepare_cached(SEND_COMMAND).await?;
        client
            .execute(&statement, &[&to.0, &tokio_postgres::types::Json(&body)])
            .await?;
        Ok(())
    }

    async fn take_commands(&self) -> Result<Vec<Command>> {
        self.take_commands_of(self.shared.me).await
    }

    async fn command_targets(&self) -> Result<Vec<InstanceId>> {
        let client = self.shared.pool.get().await?;
        let statement = client.prepare_cached(COMMAND_TARGETS).await?;
        let rows = client.query(&statement, &[&self.shared.me.0]).await?;
        rows.iter()
            .map(|row| Ok(InstanceId(row.try_get(0)?)))
            .collect()
    }

    async fn take_commands_of(&self, other: InstanceId) -> Result<Vec<Command>> {
        let client = self.shared.pool.get().await?;
        let statement = client.prepare_cached(TAKE_COMMANDS).await?;
        let rows = client.query(&statement, &[&other.0]).await?;
        let mut commands = Vec::with_capacity(rows.len());
        for row in rows {
            let id: i64 = row.try_get(0)?;
            let tokio_postgres::types::Json(body): tokio_postgres::types::Json<serde_json::Value> =
                row.try_get(1)?;
            match serde_json::from_value::<Command>(body) {
                Ok(command) => commands.push((id, command)),
                Err(e) => {
                    tracing::warn!(id, error = %e, "a stored command could not be read; dropped")
                }
            }
        }
        commands.sort_by_key(|(id, _)| *id);
        Ok(commands.into_iter().map(|(_, c)| c).collect())
    }

    async fn lease_free(&self, conversation: ConversationId) -> Result<bool> {
        let client = self.client()?;
        let key = lease_key(conversation);
        let taken: bool = client
            .query_one(TRY_LOCK, &[&LEASE_SPACE, &key])
            .await?
            .get(0);
        if taken {
            client.query_one(UNLOCK, &[&LEASE_SPACE, &key]).await?;
        }
        Ok(taken)
    }

    async fn turn_owner(&self, conversation: ConversationId) -> Result<Option<InstanceId>> {
        let client = self.shared.pool.get().await?;
        let statement = client.prepare_cached(TURN_OWNER).await?;
        let row = client.query_opt(&statement, &[&conversation.0]).await?;
        Ok(row
            .map(|r| r.try_get::<_, Option<uuid::Uuid>>(0))
            .transpose()?
            .flatten()
            .map(InstanceId))
    }

    async fn exclusively(&self, name: &str) -> Result<Option<ExclusiveGuard>> {
        let client = self.client()?;
        let key = section_key(name);
        let taken: bool = client
            .query_one(TRY_LOCK, &[&SECTION_SPACE, &key])
            .await?
            .get(0);
        if !taken {
            return Ok(None);
        }
        Ok(Some(ExclusiveGuard::new(move || {
            tokio::spawn(async move {
                let _ = client.query_one(UNLOCK, &[&SECTION_SPACE, &key]).await;
            });
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_are_read_and_others_commands_ignored() {
        let me = InstanceId::new();
        let conversation = ConversationId::new();
        assert_eq!(
            parse(EVENTS_CHANNEL, &format!("{}:42", conversation.0), me),
            Some(Signal::Events {
                conversation,
                seq: 42
            })
        );
        assert_eq!(parse(EVENTS_CHANNEL, "garbage", me), None);
        assert_eq!(
            parse(COMMANDS_CHANNEL, &me.0.to_string(), me),
            Some(Signal::Commands)
        );
        assert_eq!(
            parse(COMMANDS_CHANNEL, &InstanceId::new().0.to_string(), me),
            None
        );
    }
}
