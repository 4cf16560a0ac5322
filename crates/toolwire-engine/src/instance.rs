//! Run ownership: which engine runs each turn, and whether it is still
//! there. Several processes may share one database (instances on one
//! PostgreSQL database, or two processes on one SQLite file), so an engine
//! starting up may interrupt only the turns whose owner is gone, never the
//! ones another live process is running.
//!
//! Each engine registers an instance (host, pid) and renews its heartbeat
//! while it lives. An owner is gone when its heartbeat is stale, or, on our
//! own host, when its process has exited (so a crash is noticed at the next
//! start, without waiting for the heartbeat to go stale).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use toolwire_core::{AgentEvent, InstanceId, StopReason};
use toolwire_store::{InstanceRecord, RunRecord, Store, StoreError, UnfinishedRun};

use crate::bus::EventBus;

/// How long an instance may stay silent before its record is deleted (once
/// it owns no unfinished run). Far beyond any stale threshold, so that the
/// record of an instance that was only suspended is still there when it
/// beats again.
const FORGET_AFTER: TimeDelta = TimeDelta::days(1);

/// `tokio::time::interval` panics on a zero period.
const MIN_HEARTBEAT: Duration = Duration::from_millis(1);

/// The instances of this process's live engines. A run whose owner has our
/// pid on our host but is none of them was started by an earlier process
/// that had our pid; only this list tells the two apart.
static LIVE_HERE: Mutex<BTreeSet<InstanceId>> = Mutex::new(BTreeSet::new());

fn live_here() -> std::sync::MutexGuard<'static, BTreeSet<InstanceId>> {
    LIVE_HERE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An engine's instance: its record in the store, kept alive by a heartbeat
/// task until this is dropped (with the engine).
#[derive(Debug)]
pub(crate) struct Registration {
    record: InstanceRecord,
    heartbeat: JoinHandle<()>,
}

impl Registration {
    /// Registers a new instance of this process in `store` and starts its
    /// heartbeat, every `every`.
    pub(crate) async fn register(
        store: &Arc<dyn Store>,
        every: Duration,
    ) -> Result<Registration, StoreError> {
        let record = store
            .register_instance(InstanceId::new(), this_host(), std::process::id())
            .await?;
        live_here().insert(record.id);
        let heartbeat = tokio::spawn(beat(Arc::clone(store), record.clone(), every));
        Ok(Registration { record, heartbeat })
    }

    pub(crate) fn record(&self) -> &InstanceRecord {
        &self.record
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.heartbeat.abort();
        live_here().remove(&self.record.id);
    }
}

/// Renews `me`'s heartbeat every `every`, until aborted.
async fn beat(store: Arc<dyn Store>, me: InstanceRecord, every: Duration) {
    let mut ticks = tokio::time::interval(every.max(MIN_HEARTBEAT));
    // A late beat (a busy runtime, a database locked by a writer) is not
    // made up for with a burst.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is immediate, and registering was the first beat.
    ticks.tick().await;
    loop {
        ticks.tick().await;
        match store.heartbeat_instance(me.id).await {
            Ok(()) => {}
            Err(StoreError::InstanceNotFound(_)) => {
                // Forgotten after a long silence (a suspended machine): the
                // runs this engine starts need a known owner again, or the
                // next instance to start would take them for orphans.
                tracing::warn!(instance = %me.id, "the instance was forgotten while silent; registering it again");
                if let Err(e) = store.register_instance(me.id, &me.host, me.pid).await {
                    tracing::warn!(instance = %me.id, error = %e, "could not register the instance again");
                }
            }
            Err(e) => {
                tracing::warn!(instance = %me.id, error = %e, "could not renew the instance's heartbeat");
            }
        }
    }
}

/// Whether a run's owner is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Alive,
    Gone(Gone),
}

/// Why a run's owner counts as gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// No owner is known: the run was stored before runs had owners, or its
    /// owner's record was forgotten.
    Unknown,
    /// Our own pid on our host, yet no engine of this process: the process
    /// that had this pid before us.
    EarlierProcess,
    /// On our host, and its process has exited.
    Exited,
    /// No heartbeat for longer than the stale threshold.
    Silent,
    /// Its lease on the conversation lapsed (its connection to the shared
    /// database closed: the process died, or lost the database).
    LeaseLapsed,
}

impl Gone {
    /// For the `stopped` event of an interrupted run.
    pub(crate) fn explanation(self) -> &'static str {
        match self {
            Gone::Unknown => "the process running this turn stopped during it",
            Gone::EarlierProcess | Gone::Exited => "the process running this turn exited during it",
            Gone::Silent => "the process running this turn stopped sending heartbeats during it",
            Gone::LeaseLapsed => {
                "the instance running this turn lost its hold on the conversation during it \
                 (it stopped, or lost its database connection)"
            }
        }
    }
}

/// Whether `owner` (`None`: unknown) still runs its runs, as seen by `me`
/// at `now`. `live_here` tells the instances of this process's live
/// engines; `process_alive` whether a pid of our host is alive (`None`:
/// cannot tell). A process on our host is checked directly; anywhere else
/// only the heartbeat tells.
pub(crate) fn judge(
    owner: Option<&InstanceRecord>,
    me: &InstanceRecord,
    now: DateTime<Utc>,
    stale_after: Duration,
    live_here: impl Fn(InstanceId) -> bool,
    process_alive: impl Fn(u32) -> Option<bool>,
) -> Owner {
    let Some(owner) = owner else {
        return Owner::Gone(Gone::Unknown);
    };
    if owner.host == me.host {
        if owner.pid == me.pid {
            // This very process: it knows its live engines exactly, whatever
            // their heartbeats say.
            return if live_here(owner.id) {
                Owner::Alive
            } else {
                Owner::Gone(Gone::EarlierProcess)
            };
        }
        if process_alive(owner.pid) == Some(false) {
            return Owner::Gone(Gone::Exited);
        }
    }
    // A live pid may have been reused by another program, so a stale
    // heartbeat counts on our host too.
    let stale_after = TimeDelta::from_std(stale_after).unwrap_or(TimeDelta::MAX);
    if now.signed_duration_since(owner.heartbeat_at) > stale_after {
        return Owner::Gone(Gone::Silent);
    }
    Owner::Alive
}

/// [`judge`] with this process's live engines and its host's processes.
pub(crate) fn judge_here(
    owner: Option<&InstanceRecord>,
    me: &InstanceRecord,
    now: DateTime<Utc>,
    stale_after: Duration,
) -> Owner {
    let live = |id| live_here().contains(&id);
    judge(owner, me, now, stale_after, live, process_alive)
}

/// The documents of `kind` that instances now gone kept for themselves
/// (each names its instance: `instance_of`), read as `T`, with their ids.
/// An unreadable document is left alone, with a warning.
pub(crate) async fn kept_by_gone<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    kind: &str,
    me: &InstanceRecord,
    stale_after: Duration,
    instance_of: impl Fn(&T) -> InstanceId,
) -> Result<Vec<(String, T)>, StoreError> {
    let now = Utc::now();
    let mut gone = Vec::new();
    // A gone engine may have kept many conversations': judged once.
    let mut judged: HashMap<InstanceId, Owner> = HashMap::new();
    for document in store.documents(kind).await? {
        let kept: T = match serde_json::from_value(document.body) {
            Ok(kept) => kept,
            Err(e) => {
                tracing::warn!(kind, document = %document.id, error = %e, "an unreadable document left alone");
                continue;
            }
        };
        let instance = instance_of(&kept);
        if instance == me.id {
            continue;
        }
        let owner = match judged.get(&instance) {
            Some(owner) => *owner,
            None => {
                let record = store.instance(instance).await?;
                let owner = judge_here(record.as_ref(), me, now, stale_after);
                judged.insert(instance, owner);
                owner
            }
        };
        if owner != Owner::Alive {
            gone.push((document.id, kept));
        }
    }
    Ok(gone)
}

/// Interrupts the unfinished runs whose owner is gone, each with a
/// `stopped` event, and leaves the others to their owners; then forgets
/// instances long silent. Returns the runs it interrupted.
pub(crate) async fn interrupt_orphaned_runs(
    store: &dyn Store,
    bus: &EventBus,
    me: &InstanceRecord,
    stale_after: Duration,
) -> Result<Vec<UnfinishedRun>, StoreError> {
    let now = Utc::now();
    let mut interrupted = Vec::new();
    for unfinished in store.unfinished_runs().await? {
        let UnfinishedRun { run, owner } = &unfinished;
        let why = match judge_here(owner.as_ref(), me, now, stale_after) {
            Owner::Alive => {
                tracing::debug!(run = %run.id, owner = ?run.owner, "an unfinished turn's owner is alive; leaving it");
                continue;
            }
            Owner::Gone(why) => why,
        };
        if interrupt(store, bus, run, why).await? {
            interrupted.push(unfinished);
        }
    }
    if let Err(e) = store.forget_instances(now - FORGET_AFTER).await {
        tracing::warn!(error = %e, "could not forget long-silent instances");
    }
    Ok(interrupted)
}

/// Marks `run`, whose owner is gone (`why`), interrupted: its open calls
/// answered and a `stopped` event stored. `false` when it had ended
/// meanwhile or another instance marked it first: of several instances
/// judging the same run, the one that marks it is the one that reports it.
pub(crate) async fn interrupt(
    store: &dyn Store,
    bus: &EventBus,
    run: &RunRecord,
    why: Gone,
) -> Result<bool, StoreError> {
    if !store.interrupt_run(run.id).await? {
        return Ok(false);
    }
    tracing::warn!(run = %run.id, conversation = %run.conversation_id, owner = ?run.owner, reason = ?why, "a turn whose owner is gone was marked interrupted");
    // Before any model request: a call left without a result would make
    // every later request fail.
    crate::recover::answer_open_calls(store, bus, run).await?;
    bus.emit(
        run.conversation_id,
        AgentEvent::Stopped {
            run_id: run.id,
            reason: StopReason::Interrupted,
            error: Some(why.explanation().into()),
        },
    )
    .await?;
    Ok(true)
}

/// Where our pid names this process: the host name and, inside a PID
/// namespace other than the host's, that namespace (containers that share
/// the host's name, as with host networking, number their processes
/// separately). The same for every engine of the process.
pub(crate) fn this_host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(host_name)
}

fn host_name() -> String {
    let name = nix::unistd::gethostname()
        .ok()
        .and_then(|n| n.into_string().ok())
        .filter(|n| !n.is_empty());
    let Some(name) = name else {
        // A host no other instance shares: pids are then never compared,
        // and only heartbeats tell.
        return format!("unknown-{}", InstanceId::new());
    };
    match pid_namespace() {
        Some(ns) => format!("{name} pidns:{ns}"),
        None => name,
    }
}

/// The PID namespace of this process, unless it is the initial one.
#[cfg(target_os = "linux")]
fn pid_namespace() -> Option<String> {
    /// The initial PID namespace's inode (`PROC_PID_INIT_INO`).
    const INITIAL: &str = "4026531836";
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let inode = link.to_str()?.strip_prefix("pid:[")?.strip_suffix(']')?;
    (inode != INITIAL).then(|| inode.to_owned())
}

#[cfg(not(target_os = "linux"))]
fn pid_namespace() -> Option<String> {
    None
}

/// Whether process `pid` of this host is alive; `None` when that cannot be
/// told here (then only heartbeats tell).
pub(crate) fn process_alive(pid: u32) -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        if let Some(alive) = proc_alive(pid) {
            return Some(alive);
        }
    }
    signal_alive(pid)
}

/// From `/proc`, which also shows an exited process its parent has not
/// reaped yet (a zombie): that one is gone too.
#[cfg(target_os = "linux")]
fn proc_alive(pid: u32) -> Option<bool> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => Some(!matches!(stat_state(&stat), Some('Z' | 'X'))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(false),
        Err(_) => None,
    }
}

/// The state letter of a `/proc/PID/stat` line: after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
#[cfg(any(target_os = "linux", test))]
fn stat_state(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// `kill(pid, 0)`: delivers nothing, only checks that the process exists.
#[cfg(unix)]
fn signal_alive(pid: u32) -> Option<bool> {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    // 0 and negative pids name process groups, not a process.
    let pid = match i32::try_from(pid) {
        Ok(pid) if pid > 0 => pid,
        _ => return Some(false),
    };
    match kill(Pid::from_raw(pid), None) {
        Ok(()) => Some(true),
        // It exists, and belongs to another user.
        Err(Errno::EPERM) => Some(true),
        Err(Errno::ESRCH) => Some(false),
        Err(_) => None,
    }
}

#[cfg(not(unix))]
fn signal_alive(_pid: u32) -> Option<bool> {
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const STALE: Duration = Duration::from_secs(30);

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    fn instance(host: &str, pid: u32, silent_for: i64) -> InstanceRecord {
        InstanceRecord {
            id: InstanceId::new(),
            host: host.into(),
            pid,
            started_at: now() - TimeDelta::hours(1),
            heartbeat_at: now() - TimeDelta::seconds(silent_for),
        }
    }

    /// `owner` as judged by an instance on "here" with pid 100, where
    /// `live` are this process's live engines and `alive` the live pids.
    fn judged(owner: Option<&InstanceRecord>, live: &[InstanceId], alive: &[u32]) -> Owner {
        let me = instance("here", 100, 0);
        judge(
            owner,
            &me,
            now(),
            STALE,
            |id| live.contains(&id),
            |pid| Some(alive.contains(&pid)),
        )
    }

    #[test]
    fn an_unknown_owner_is_gone() {
        assert_eq!(judged(None, &[], &[]), Owner::Gone(Gone::Unknown));
    }

    #[test]
    fn a_live_process_on_this_host_with_a_fresh_heartbeat_is_alive() {
        let owner = instance("here", 200, 5);
        assert_eq!(judged(Some(&owner), &[], &[100, 200]), Owner::Alive);
    }

    #[test]
    fn an_exited_process_on_this_host_is_gone_at_once() {
        let owner = instance("here", 200, 0);
        assert_eq!(judged(Some(&owner), &[], &[100]), Owner::Gone(Gone::Exited));
    }

    #[test]
    fn our_pid_is_alive_only_for_the_engines_of_this_process() {
        let sibling = instance("here", 100, 0);
        assert_eq!(judged(Some(&sibling), &[sibling.id], &[100]), Owner::Alive);
        // Same pid, same host, not ours: the process that had our pid.
        let earlier = instance("here", 100, 0);
        assert_eq!(
            judged(Some(&earlier), &[sibling.id], &[100]),
            Owner::Gone(Gone::EarlierProcess)
        );
        // Our own engines are alive even when their heartbeat is late.
        let late = instance("here", 100, 3600);
        assert_eq!(judged(Some(&late), &[late.id], &[100]), Owner::Alive);
    }

    #[test]
    fn a_stale_heartbeat_is_gone_even_with_a_live_pid() {
        // The pid may have been reused by another program.
        let owner = instance("here", 200, 31);
        assert_eq!(
            judged(Some(&owner), &[], &[100, 200]),
            Owner::Gone(Gone::Silent)
        );
    }

    #[test]
    fn another_host_is_judged_by_its_heartbeat_alone() {
        // Its pids mean nothing here: 200 is not alive on this host, and
        // 100 is ours.
        for pid in [100, 200] {
            let fresh = instance("there", pid, 29);
            assert_eq!(judged(Some(&fresh), &[], &[100]), Owner::Alive);
            let stale = instance("there", pid, 31);
            assert_eq!(judged(Some(&stale), &[], &[100]), Owner::Gone(Gone::Silent));
        }
    }

    #[test]
    fn when_pids_cannot_be_checked_the_heartbeat_decides() {
        let me = instance("here", 100, 0);
        let fresh = instance("here", 200, 1);
        let stale = instance("here", 200, 60);
        let judge_it =
            |owner: &InstanceRecord| judge(Some(owner), &me, now(), STALE, |_| false, |_| None);
        assert_eq!(judge_it(&fresh), Owner::Alive);
        assert_eq!(judge_it(&stale), Owner::Gone(Gone::Silent));
    }

    #[test]
    fn a_heartbeat_from_a_clock_ahead_is_fresh() {
        let ahead = instance("there", 1, -120);
        assert_eq!(judged(Some(&ahead), &[], &[]), Owner::Alive);
    }

    #[test]
    fn this_process_is_alive_and_an_exited_child_is_not() {
        assert_eq!(process_alive(std::process::id()), Some(true));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(process_alive(pid), Some(false));
        assert_eq!(process_alive(0), Some(false));
        assert_eq!(process_alive(u32::MAX), Some(false));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_unreaped_child_counts_as_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Give it time to exit; it stays a zombie until waited for.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process_alive(pid) == Some(true) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(process_alive(pid), Some(false));
        child.wait().unwrap();
    }

    #[test]
    fn the_state_follows_the_last_parenthesis() {
        assert_eq!(stat_state("42 (toolwire) S 1 42"), Some('S'));
        assert_eq!(stat_state("42 (a) b) (c) Z 1 42"), Some('Z'));
        assert_eq!(stat_state("garbage"), None);
    }

    #[test]
    fn the_host_is_named() {
        let host = this_host();
        assert!(!host.is_empty());
        assert_eq!(host, this_host(), "the same for every engine of a process");
    }
}
