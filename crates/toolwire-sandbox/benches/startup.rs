//! Sandbox start-up cost per command: `sh -c true` started directly and
//! through each helper (`workspace-write`, network off, a protected
//! database inside the workspace so that the carve-out is paid too),
//! alternating, in one run. This binary is its own helper.
//!
//! `cargo bench -p toolwire-sandbox --bench startup [-- ROUNDS]`
//!
//! With `TOOLWIRE_BIN` set to a `toolwire` binary, the helpers measured
//! are toolwire's: its hidden `__sandbox` subcommand (loading all of
//! `toolwire`, twice per command where the helper makes a PID namespace)
//! and, when it sits beside that binary, the small `toolwire-sandbox`
//! executable toolwire prefers.
//!
//! Besides the wall-clock time (which moves with the machine's load: each
//! process start waits for a CPU), it gives the CPU time the command's
//! processes used (user + system, from `RUSAGE_CHILDREN`), which the load
//! moves much less.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use toolwire_sandbox::{Helper, Policy, Sandbox};

const HELPER_ARG: &str = "__helper";

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == HELPER_ARG) {
        toolwire_sandbox::helper::main(args.into_iter().skip(2));
    }
    let rounds: usize = args
        .iter()
        .filter_map(|a| a.to_str()?.parse().ok())
        .next()
        .unwrap_or(300);
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("no current exe");
        return;
    };
    let Ok(workspace) = tempfile::tempdir() else {
        eprintln!("no temp dir");
        return;
    };
    let Ok(root) = workspace.path().canonicalize() else {
        return;
    };
    let db = root.join("toolwire.db");
    for name in ["toolwire.db", "Cargo.toml", "README.md"] {
        let _ = std::fs::write(root.join(name), "x");
    }
    let _ = std::fs::create_dir(root.join("src"));
    let policy = Policy {
        protected: vec![db],
        ..Policy::default()
    };
    let helpers: Vec<(String, Helper)> = match std::env::var_os("TOOLWIRE_BIN") {
        Some(toolwire) => {
            let toolwire = Path::new(&toolwire);
            let mut helpers = vec![(
                "toolwire __sandbox".to_owned(),
                Helper {
                    exe: toolwire.to_path_buf(),
                    args: vec!["__sandbox".into()],
                },
            )];
            let beside = Helper::beside(toolwire);
            if beside.exe.is_file() {
                helpers.push((Helper::EXECUTABLE.to_owned(), beside));
            }
            helpers
        }
        None => vec![(
            "the bench binary".to_owned(),
            Helper {
                exe,
                args: vec![HELPER_ARG.into()],
            },
        )],
    };
    let sandboxes: Vec<(String, Sandbox)> = helpers
        .into_iter()
        .map(|(label, helper)| {
            println!("helper {label}: {}", helper.exe.display());
            (label, Sandbox::new(helper, policy.clone()))
        })
        .collect();
    for (label, sandbox) in &sandboxes {
        println!("kernel ({label}): {}", sandbox.support().describe());
    }
    let argv: Vec<OsString> = ["sh", "-c", "true"].map(OsString::from).to_vec();
    let mut direct = Vec::with_capacity(rounds);
    let mut direct_cpu = Duration::ZERO;
    let mut confined: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); sandboxes.len()];
    let mut confined_cpu = vec![Duration::ZERO; sandboxes.len()];
    for round in 0..rounds + 10 {
        let cpu = children_cpu();
        let started = Instant::now();
        let ok = Command::new("sh")
            .args(["-c", "true"])
            .current_dir(&root)
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let d = started.elapsed();
        if !ok {
            eprintln!("sh -c true failed");
            return;
        }
        // The first rounds warm caches.
        if round >= 10 {
            direct.push(d);
            direct_cpu += children_cpu().saturating_sub(cpu);
        }
        for (((label, sandbox), samples), total_cpu) in
            sandboxes.iter().zip(&mut confined).zip(&mut confined_cpu)
        {
            let cpu = children_cpu();
            let started = Instant::now();
            let ok = match sandbox.prepare(&root, &argv, None) {
                Ok(mut prepared) => prepared
                    .command
                    .current_dir(&root)
                    .stdin(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success()),
                Err(e) => {
                    eprintln!("{label}: {e}");
                    return;
                }
            };
            let c = started.elapsed();
            if !ok {
                eprintln!("sh -c true failed through {label}");
                return;
            }
            if round >= 10 {
                samples.push(c);
                *total_cpu += children_cpu().saturating_sub(cpu);
            }
        }
    }
    let (d_med, d_p90) = stats(&mut direct);
    let per_round = |total: Duration| total / rounds.max(1) as u32;
    let d_cpu = per_round(direct_cpu);
    println!("rounds: {rounds}, alternating");
    println!(
        "sh -c true directly: median {d_med:.2?}, p90 {d_p90:.2?}; CPU {d_cpu:.2?} per command"
    );
    for (((label, _), samples), total_cpu) in sandboxes.iter().zip(&mut confined).zip(confined_cpu)
    {
        let (c_med, c_p90) = stats(samples);
        let c_cpu = per_round(total_cpu);
        println!(
            "sh -c true through {label}: median {c_med:.2?}, p90 {c_p90:.2?}; CPU {c_cpu:.2?} \
             per command\n  start-up cost of the sandbox per command: median {:.2?}, CPU {:.2?}",
            c_med.saturating_sub(d_med),
            c_cpu.saturating_sub(d_cpu)
        );
    }
}

/// User + system CPU time of this process's waited-for children so far.
fn children_cpu() -> Duration {
    let Ok(usage) = getrusage(UsageWho::RUSAGE_CHILDREN) else {
        return Duration::ZERO;
    };
    let time = |t: nix::sys::time::TimeVal| {
        Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000)
    };
    time(usage.user_time()) + time(usage.system_time())
}

fn stats(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.9))
}
