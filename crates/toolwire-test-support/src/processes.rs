//! What a test asks of the processes a tool started: whether one has gone,
//! and which still run, found by a marker number on their command line.

use std::time::Duration;

/// Whether process `pid` has exited, or lingers as a zombie waiting to be
/// reaped (gone for our purposes); waits up to 5 s.
pub async fn gone(pid: u32) -> bool {
    for _ in 0..50 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    false
}

/// A number no other test uses: `sleep MARKER` is then a process only
/// this test started (pids inside a command's PID namespace mean nothing
/// outside it, so tests find their processes by this instead).
pub fn marker() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    900_000_000 + u64::from(std::process::id()) * 1000 + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The processes whose command line holds `marker` as a word (zombies
/// left out: they are gone for our purposes).
pub fn running_with(marker: u64) -> Vec<u32> {
    let marker = marker.to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'))
            });
            !zombie
                && cmdline
                    .split(|b| *b == 0)
                    .any(|word| word == marker.as_bytes())
        })
        .collect()
}

/// Whether no process holds `marker` (see [`running_with`]); waits up to
/// 5 s.
pub async fn none_with(marker: u64) -> bool {
    for _ in 0..50 {
        if running_with(marker).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Whether a process holds `marker`; waits up to 5 s, as a shell may
/// report a background job (`$!`, an echo after `&`) before the job has
/// exec'd the command that carries the marker.
pub async fn some_with(marker: u64) -> bool {
    for _ in 0..50 {
        if !running_with(marker).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
