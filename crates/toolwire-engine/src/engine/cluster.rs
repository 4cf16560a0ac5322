//! Several engines on one database acting as one: the engine's side of
//! `toolwire_store::cluster`. The store gives each engine a
//! [`Cluster`] (alone on SQLite, shared on PostgreSQL); this module
//!
//! - feeds the conversations followed here with the events other
//!   instances store (an announcement names the conversation and its last
//!   seq; the events themselves are read from the log, in order);
//! - carries out the commands other instances send for the turns this
//!   one runs (cancel, interjections, notifications), one batch at a time
//!   so that their order holds;
//! - sweeps, every heartbeat, for the turns of instances that died: an
//!   unfinished run whose owner is gone (no heartbeat, its process gone,
//!   or its lease on the conversation lapsed) is marked interrupted by
//!   one survivor, which also takes over its pending notifications and
//!   settles the commands that waited for it;
//! - cancels the turns running here when the connection holding their
//!   leases is lost, as another instance may take them over.
//!
//! The engine's hooks: a turn starts only with the conversation's lease
//! (`Engine::start_turn_held`) and gives it back when its entry goes; a
//! publish is announced (`bus.rs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use toolwire_core::{ConversationId, FileChange, Incoming, Priority};
use toolwire_store::cluster::{Cluster, Command, Signal};

use super::{Engine, WeakEngine};
use crate::error::EngineError;
use crate::follow::PAGE;
use crate::instance::{self, Gone, Owner};

/// Announced seqs remembered per conversation (where a newly followed
/// conversation's remote events start), at most this many.
const REMEMBERED_ANNOUNCEMENTS: usize = 100_000;

/// After a failed read of the log for a remote feed.
const FEED_RETRY: Duration = Duration::from_millis(200);

/// The cluster's tasks, stopped with the engine.
#[derive(Debug, Default)]
pub(crate) struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What the tasks share: the remote feeds running and the last seq
/// announced per conversation.
#[derive(Debug, Default)]
pub(crate) struct Feeds {
    /// Conversations whose feed runs, with the seq it is to reach
    /// (`u64::MAX`: whatever the log holds).
    running: Mutex<HashMap<ConversationId, u64>>,
    announced: Mutex<HashMap<ConversationId, u64>>,
    /// One batch of commands at a time.
    commands: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the tasks of a shared cluster (none for an engine alone).
pub(crate) fn start(engine: WeakEngine, cluster: &Arc<dyn Cluster>, every: Duration) -> Tasks {
    if !cluster.shared() {
        return Tasks::default();
    }
    let mut tasks = Vec::new();
    if let Some(signals) = cluster.signals() {
        tasks.push(tokio::spawn(listen(engine.clone(), signals)));
    }
    tasks.push(tokio::spawn(sweep_every(engine, every)));
    Tasks(tasks)
}

async fn listen(engine: WeakEngine, mut signals: mpsc::UnboundedReceiver<Signal>) {
    // Commands sent before the engine listened.
    if let Some(e) = engine.upgrade() {
        tokio::spawn(take_commands(e));
    }
    while let Some(signal) = signals.recv().await {
        let Some(engine) = engine.upgrade() else {
            return;
        };
        match signal {
            Signal::Events { conversation, seq } => on_events(&engine, conversation, seq),
            Signal::Commands => {
                tokio::spawn(take_commands(engine));
            }
            Signal::LinkLost => {
                let cancelled = engine.cancel_all();
                if cancelled > 0 {
                    tracing::warn!(
                        cancelled,
                        "the connection holding this instance's leases was lost: its turns were cancelled, as another instance may take their conversations"
                    );
                }
            }
            Signal::Reconnected => {
                tokio::spawn(take_commands(engine.clone()));
                // Announcements may have been missed: read on.
                for conversation in engine.bus().followed() {
                    feed(&engine, conversation, u64::MAX);
                }
            }
        }
    }
}

/// Another instance stored `conversation`'s events up to `seq`.
fn on_events(engine: &Engine, conversation: ConversationId, seq: u64) {
    engine.bus().remote_seq(conversation, seq);
    let feeds = engine.feeds();
    let previous = {
        let mut announced = lock(&feeds.announced);
        if announced.len() >= REMEMBERED_ANNOUNCEMENTS {
            announced.clear();
        }
        announced.insert(conversation, seq)
    };
    if engine.bus().followed_from(conversation).is_none() {
        return;
    }
    // A channel that never carried an event starts after what was
    // announced before (or just before this seq: a follower that finds
    // a gap reads it from the log).
    let start = previous
        .filter(|p| *p < seq)
        .unwrap_or(seq.saturating_sub(1));
    engine.bus().start_remote_at(conversation, start);
    feed(engine, conversation, seq);
}

/// Makes sure a feed of `conversation` runs until it reached `upto`.
fn feed(engine: &Engine, conversation: ConversationId, upto: u64) {
    {
        let mut running = lock(&engine.feeds().running);
        if let Some(target) = running.get_mut(&conversation) {
            *target = (*target).max(upto);
            return;
        }
        running.insert(conversation, upto);
    }
    tokio::spawn(run_feed(engine.clone(), conversation));
}

async fn run_feed(engine: Engine, conversation: ConversationId) {
    // Ends the feed unless its target moved since `target` was read.
    let done = |target: u64| {
        let mut running = lock(&engine.feeds().running);
        if running.get(&conversation) == Some(&target) {
            running.remove(&conversation);
            true
        } else {
            false
        }
    };
    loop {
        let Some(target) = lock(&engine.feeds().running).get(&conversation).copied() else {
            return;
        };
        let Some(from) = engine.bus().followed_from(conversation) else {
            // Nobody follows it any more.
            lock(&engine.feeds().running).remove(&conversation);
            return;
        };
        if from >= target {
            if done(target) {
                return;
            }
            continue;
        }
        match engine.store().events_since(conversation, from, PAGE).await {
            Ok(events) if events.is_empty() => {
                if done(target) {
                    return;
                }
            }
            Ok(events) => engine.bus().publish_remote(conversation, events),
            Err(e) => {
                tracing::warn!(%conversation, error = %e, "could not read another instance's events");
                tokio::time::sleep(FEED_RETRY).await;
            }
        }
    }
}

/// Takes the commands waiting for this instance and carries them out, in
/// the order they were sent.
async fn take_commands(engine: Engine) {
    let _one_at_a_time = engine.feeds().commands.lock().await;
    let commands = match engine.cluster().take_commands().await {
        Ok(commands) => commands,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the commands sent to this instance");
            return;
        }
    };
    for command in commands {
        carry_out(&engine, command, For::Here).await;
    }
}

/// Whom a command taken from the database was for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum For {
    /// This instance: it runs (or ran) the turn.
    Here,
    /// An instance that is gone, whose turn was interrupted.
    Gone,
}

/// Carries out `command`. One for a gone instance goes where it would
/// have gone had no turn been running: its cancel has nothing left to
/// stop, its words start a turn (or reach the one running now), its
/// notification is routed as a new one.
async fn carry_out(engine: &Engine, command: Command, addressee: For) {
    let conversation = command.conversation();
    let done = match command {
        Command::Cancel { conversation } => {
            if addressee == For::Here {
                engine.cancel(conversation);
            }
            Ok(())
        }
        Command::Interject { text, .. } => engine.interject(conversation, &text).await.map(drop),
        Command::Notify { event, .. } => match serde_json::from_value::<WireIncoming>(event) {
            Ok(event) if addressee == For::Here => engine
                .notify_here(conversation, event.into())
                .await
                .map(drop),
            Ok(event) => engine.notify(conversation, event.into()).await.map(drop),
            Err(e) => {
                tracing::warn!(%conversation, error = %e, "an unreadable notification from another instance was dropped");
                Ok(())
            }
        },
    };
    if let Err(e) = done {
        tracing::warn!(%conversation, error = %e, "a command from another instance failed");
    }
}

/// Every `every`, the sweep for turns whose instance is gone.
async fn sweep_every(engine: WeakEngine, every: Duration) {
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if let Err(e) = sweep(&engine).await {
            tracing::warn!(error = %e, "the sweep for turns of gone instances failed");
        }
    }
}

/// Interrupts the unfinished runs whose owner is gone, settles the
/// commands that waited for gone instances, and takes over their pending
/// notifications. One instance at a time sweeps (the others skip the
/// round), so each is reported once.
pub(crate) async fn sweep(engine: &Engine) -> Result<usize, EngineError> {
    let cluster = engine.cluster();
    let Some(_section) = cluster.exclusively("failover").await? else {
        return Ok(0);
    };
    let me = engine.instance();
    let stale = engine.config().stale_owner_after;
    let now = chrono::Utc::now();
    let mut interrupted = 0;
    // Owners found gone, whose commands are settled below.
    let mut gone = BTreeSet::new();
    for unfinished in engine.store().unfinished_runs().await? {
        let run = &unfinished.run;
        if run.owner == Some(me.id) || engine.is_running(run.conversation_id) {
            continue;
        }
        let why = match instance::judge_here(unfinished.owner.as_ref(), me, now, stale) {
            Owner::Gone(why) => why,
            Owner::Alive if cluster.lease_free(run.conversation_id).await? => Gone::LeaseLapsed,
            Owner::Alive => continue,
        };
        gone.extend(run.owner);
        if instance::interrupt(engine.writer().as_ref(), engine.bus(), run, why).await? {
            interrupted += 1;
        }
    }
    for target in cluster.command_targets().await? {
        let target_gone = gone.contains(&target)
            || matches!(
                instance::judge_here(
                    engine.store().instance(target).await?.as_ref(),
                    me,
                    now,
                    stale
                ),
                Owner::Gone(_)
            );
        if target_gone {
            let commands = cluster.take_commands_of(target).await?;
            settle(engine, target, commands).await;
        }
    }
    engine.take_over_notifications().await?;
    Ok(interrupted)
}

/// Carries out here the commands that waited for `gone`, an instance that
/// will never take them (the turn they were for is interrupted, by this
/// sweep or an earlier one): see [`carry_out`].
async fn settle(engine: &Engine, gone: toolwire_core::InstanceId, commands: Vec<Command>) {
    if commands.is_empty() {
        return;
    }
    tracing::info!(instance = %gone, commands = commands.len(), "settling the commands sent to an instance that is gone");
    for command in commands {
        carry_out(engine, command, For::Gone).await;
    }
}

/// Interrupts the unfinished runs of `conversation` left by a turn that
/// no longer runs: called with the conversation's lease held, so no
/// instance runs a turn there and any such run's owner is gone.
pub(crate) async fn recover_conversation(
    engine: &Engine,
    conversation: ConversationId,
) -> Result<(), EngineError> {
    for unfinished in engine
        .store()
        .conversation_unfinished_runs(conversation)
        .await?
    {
        // What it changes comes after the turn's start read the
        // conversation's revision: no kept path can show it.
        engine.kept_paths().forget(conversation);
        instance::interrupt(
            engine.writer().as_ref(),
            engine.bus(),
            &unfinished.run,
            Gone::LeaseLapsed,
        )
        .await?;
    }
    Ok(())
}

/// A notification as one instance hands it to another.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum WireIncoming {
    Text {
        source: String,
        priority: Priority,
        text: String,
    },
    File {
        source: String,
        priority: Priority,
        path: String,
        change: FileChange,
    },
}

impl From<Incoming> for WireIncoming {
    fn from(event: Incoming) -> Self {
        match event {
            Incoming::Text {
                source,
                priority,
                text,
            } => WireIncoming::Text {
                source,
                priority,
                text,
            },
            Incoming::File {
                source,
                priority,
                path,
                change,
            } => WireIncoming::File {
                source,
                priority,
                path,
                change,
            },
        }
    }
}

impl From<WireIncoming> for Incoming {
    fn from(event: WireIncoming) -> Self {
        match event {
            WireIncoming::Text {
                source,
                priority,
                text,
            } => Incoming::Text {
                source,
                priority,
                text,
            },
            WireIncoming::File {
                source,
                priority,
                path,
                change,
            } => Incoming::File {
                source,
                priority,
                path,
                change,
            },
        }
    }
}

/// The command that hands `event` to another instance.
pub(crate) fn notify_command(conversation: ConversationId, event: Incoming) -> Command {
    let event = serde_json::to_value(WireIncoming::from(event)).unwrap_or_default();
    Command::Notify {
        conversation,
        event,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_crosses_instances_unchanged() {
        let events = [
            Incoming::text("ci", Priority::High, "build failed"),
            Incoming::file("watcher", "src/lib.rs", FileChange::Modified),
        ];
        for event in events {
            let wire = serde_json::to_value(WireIncoming::from(event.clone())).unwrap();
            let back: Incoming = serde_json::from_value::<WireIncoming>(wire).unwrap().into();
            assert_eq!(back, event);
        }
    }
}
