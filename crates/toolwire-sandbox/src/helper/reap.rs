//! Ending the command's descendants: every process whose parent is the
//! helper (orphans come to it, as it is a child subreaper) is killed and
//! reaped, again and again until none is left.

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// Reaps what has ended; the command's exit code (`128 + n` for signal
/// `n`) once it is among them.
pub(super) fn command_status(command: Pid) -> Option<i32> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => return Some(code),
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => {
                return Some(128 + signal as i32);
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            // An orphan reparented here, reaped.
            Ok(_) => {}
        }
    }
}

/// Kills and reaps every descendant.
pub(super) fn end_all() {
    // A process forking as fast as it can is outrun after a few rounds:
    // each round kills every child there is, and SIGKILL cannot be caught.
    for _ in 0..10_000 {
        let children = children();
        if children.is_empty() {
            return;
        }
        for &pid in &children {
            let _ = kill(pid, Signal::SIGKILL);
        }
        for &pid in &children {
            while let Err(Errno::EINTR) = waitpid(pid, None) {}
        }
    }
}

/// This process's children: `/proc/self/task/TID/children` (one read), or
/// else a scan of every process's parent.
fn children() -> Vec<Pid> {
    let me = std::process::id();
    if let Ok(text) = std::fs::read_to_string(format!("/proc/self/task/{me}/children")) {
        return text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .map(Pid::from_raw)
            .collect();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| parent_of(pid) == Some(me))
        .map(Pid::from_raw)
        .collect()
}

fn parent_of(pid: i32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold spaces: fields start after
    // the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The tasks (threads) running on the machine, from `/proc/loadavg`.
pub(super) fn tasks_on_machine() -> u64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| {
            let field = text.split_whitespace().nth(3)?;
            field.split('/').nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}
