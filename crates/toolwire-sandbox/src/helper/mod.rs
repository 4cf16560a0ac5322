//! The helper: confines ITSELF (rlimits, `no_new_privs`, Landlock,
//! seccomp, a PID namespace), then starts the command as its child and
//! ends every descendant with it. Runs as a process of its own
//! (`toolwire`'s hidden subcommand, or a test binary) and stays
//! single-threaded: Landlock and seccomp apply to the calling thread, and
//! the command must inherit both.
//!
//! Where new PID and mount namespaces are permitted, it runs in two
//! stages: the first makes them and starts itself again (`--pid1`) as PID
//! 1 of the new namespace, which mounts a `/proc` of that namespace before
//! confining itself. Without it a command could read `/proc/PID/environ`
//! of any process of the same user — toolwire's, or the shell that
//! started it, with the provider keys — since Landlock's ptrace scoping
//! does not cover that read. Ending the first stage's child (SIGKILL to
//! PID 1) ends everything in the namespace.
//!
//! Command line: `[--pid1] --policy JSON -- PROGRAM ARGS…`, or `--probe`.

mod files;
mod reap;
mod syscalls;

use std::ffi::OsString;
use std::process::Command;

use nix::sys::prctl;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::Signal;
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::policy::{Invocation, Limits};
use crate::support::Support;

/// The helper's own failure (not the command's): as `env` and `timeout` do.
const SETUP_FAILED: i32 = 125;
const NOT_EXECUTABLE: i32 = 126;
const NOT_FOUND: i32 = 127;

/// Runs the helper on `args` (without the program name and any prefix)
/// and exits with the command's status (a signal `n` as `128 + n`).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ! {
    let code = match run(args.into_iter().collect()) {
        Ok(code) => code,
        Err((code, message)) => {
            eprintln!("toolwire sandbox: {message}");
            code
        }
    };
    std::process::exit(code)
}

fn run(args: Vec<OsString>) -> Result<i32, (i32, String)> {
    let setup = |message: String| (SETUP_FAILED, message);
    if args.first().is_some_and(|a| a == "--probe") {
        let support = probe();
        let json = serde_json::to_string(&support).map_err(|e| setup(e.to_string()))?;
        println!("{json}");
        return Ok(0);
    }
    let pid1 = args.first().is_some_and(|a| a == PID1);
    let args = if pid1 { args[1..].to_vec() } else { args };

    // Die with toolwire (or with the first stage): SIGTERM, so that the
    // descendants are ended first.
    prctl::set_pdeathsig(Signal::SIGTERM).map_err(|e| setup(format!("PR_SET_PDEATHSIG: {e}")))?;
    let (invocation, argv) = parse(args.clone()).map_err(setup)?;
    if pid1 {
        private_proc().map_err(setup)?;
    } else if invocation.policy.mode.confines() && namespaces() {
        return first_stage(&args);
    }
    // Orphans of the command come to this process, so none escapes the
    // reaper (a `setsid` child included).
    prctl::set_child_subreaper(true).map_err(|e| setup(format!("PR_SET_CHILD_SUBREAPER: {e}")))?;
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP, SIGCHLD])
        .map_err(|e| setup(format!("installing signal handlers: {e}")))?;

    limits(&invocation.policy.limits).map_err(setup)?;
    // Run as root, the command would keep CAP_SYS_PTRACE through exec:
    // other processes' memory. Not permitted (nor needed) unprivileged.
    let _ = rustix::thread::remove_capability_from_bounding_set(
        rustix::thread::CapabilitySet::SYS_PTRACE,
    );
    prctl::set_no_new_privs().map_err(|e| setup(format!("PR_SET_NO_NEW_PRIVS: {e}")))?;
    let policy = &invocation.policy;
    if policy.mode.confines() {
        let enforced = files::restrict(&invocation).map_err(setup)?;
        if !enforced && !policy.accept_weaker {
            return Err(setup(format!(
                "the kernel cannot confine the file system (no Landlock); refusing to run in \
                 `{}` mode (set `accept_weaker = true` in [sandbox] to run anyway)",
                policy.mode
            )));
        }
        if !policy.network {
            syscalls::deny_sockets().or_else(|e| {
                if policy.accept_weaker {
                    Ok(())
                } else {
                    Err(setup(format!("seccomp: {e}")))
                }
            })?;
        }
    }
    if !pid1 {
        // `full` mode, or unprivileged: the command becomes PID 1 of a
        // namespace of its own where permitted (the kernel ends the rest
        // with it), with the machine's `/proc`; else the reaper below
        // ends the descendants.
        let _ = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID);
    }

    let Some((program, rest)) = argv.split_first() else {
        return Err(setup("no command given after `--`".into()));
    };
    let child = Command::new(program).args(rest).spawn().map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => NOT_FOUND,
            _ => NOT_EXECUTABLE,
        };
        (
            code,
            format!("could not start {}: {e}", program.to_string_lossy()),
        )
    })?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    // Waited for through waitpid below; std's handle is not needed.
    drop(child);

    let code = loop {
        if let Some(code) = reap::command_status(pid) {
            break code;
        }
        let mut stop = None;
        for signal in signals.wait() {
            if signal != SIGCHLD {
                stop = Some(signal);
            }
        }
        if let Some(signal) = stop {
            reap::end_all();
            return Ok(128 + signal);
        }
    };
    reap::end_all();
    Ok(code)
}

/// The flag of the second stage, PID 1 of the new namespaces.
const PID1: &str = "--pid1";

/// Makes the new PID and mount namespaces for the second stage (false
/// where not permitted: unprivileged). Mounts made in the new mount
/// namespace stay there.
fn namespaces() -> bool {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};
    if unshare(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS).is_err() {
        return false;
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .is_ok()
}

/// Second stage: a `/proc` that shows only this namespace's processes,
/// mounted before Landlock (which forbids mounting, and whose rule for
/// `/proc` must name this mount).
fn private_proc() -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| format!("mounting a private /proc: {e}"))
}

/// First stage: starts this helper again as PID 1 of the new namespaces
/// and passes on its status; a stop signal ends that PID 1, and with it
/// the kernel ends every process of the namespace.
fn first_stage(args: &[OsString]) -> Result<i32, (i32, String)> {
    let setup = |message: String| (SETUP_FAILED, message);
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP, SIGCHLD])
        .map_err(|e| setup(format!("installing signal handlers: {e}")))?;
    let exe = std::env::current_exe().map_err(|e| setup(format!("finding the helper: {e}")))?;
    // The prefix that reached this helper (`__sandbox` for toolwire).
    let all: Vec<OsString> = std::env::args_os().collect();
    let prefix = all
        .get(1..all.len().saturating_sub(args.len()))
        .unwrap_or_default();
    let child = Command::new(exe)
        .args(prefix)
        .arg(PID1)
        .args(args)
        .spawn()
        .map_err(|e| setup(format!("starting the sandbox's second stage: {e}")))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    drop(child);
    loop {
        if let Some(code) = reap::command_status(pid) {
            return Ok(code);
        }
        for signal in signals.wait() {
            if signal != SIGCHLD {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
                return Ok(128 + signal);
            }
        }
    }
}

fn parse(args: Vec<OsString>) -> Result<(Invocation, Vec<OsString>), String> {
    let mut args = args.into_iter();
    match args.next() {
        Some(flag) if flag == "--policy" => {}
        other => return Err(format!("expected --policy, got {other:?}")),
    }
    let json = args
        .next()
        .ok_or("--policy needs a value")?
        .into_string()
        .map_err(|_| "the policy is not UTF-8".to_owned())?;
    let invocation: Invocation =
        serde_json::from_str(&json).map_err(|e| format!("the policy is not valid: {e}"))?;
    match args.next() {
        Some(sep) if sep == "--" => {}
        other => return Err(format!("expected -- before the command, got {other:?}")),
    }
    Ok((invocation, args.collect()))
}

fn limits(limits: &Limits) -> Result<(), String> {
    let set = |resource: Resource, name: &str, value: u64| {
        setrlimit(resource, value, value).map_err(|e| format!("{name} = {value}: {e}"))
    };
    if let Some(processes) = limits.processes {
        // The kernel counts every task of the user, toolwire's and the
        // desktop's included; the command gets `processes` more than run
        // on the whole machine now.
        set(
            Resource::RLIMIT_NPROC,
            "RLIMIT_NPROC",
            processes.saturating_add(reap::tasks_on_machine()),
        )?;
    }
    if let Some(bytes) = limits.file_size {
        set(Resource::RLIMIT_FSIZE, "RLIMIT_FSIZE", bytes)?;
    }
    if let Some(seconds) = limits.cpu_seconds {
        set(Resource::RLIMIT_CPU, "RLIMIT_CPU", seconds)?;
    }
    if let Some(bytes) = limits.memory {
        set(Resource::RLIMIT_AS, "RLIMIT_AS", bytes)?;
    }
    Ok(())
}

/// What this process can do (and, having done it, exits).
fn probe() -> Support {
    // First: the seccomp probe's filter or Landlock's could refuse it.
    let pid_namespace = namespaces();
    let seccomp = syscalls::probe().is_ok();
    let landlock_abi = files::probe();
    Support {
        landlock_abi,
        seccomp,
        pid_namespace,
        error: None,
        version: crate::VERSION.to_owned(),
    }
}
