//! Sandbox start-up cost per command: `sh -c true` started directly and
//! through the helper (`workspace-write`, network off, a protected
//! database inside the workspace so that the carve-out is paid too),
//! alternating, in one run. This binary is its own helper.
//!
//! `cargo bench -p toolwire-sandbox --bench startup [-- ROUNDS]`
//!
//! With `TOOLWIRE_BIN` set to a `toolwire` binary, that binary's hidden
//! `__sandbox` subcommand is the helper instead: the cost as toolwire
//! pays it, loading its own (larger) executable twice per command.

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let helper = match std::env::var_os("TOOLWIRE_BIN") {
        Some(toolwire) => Helper {
            exe: toolwire.into(),
            args: vec!["__sandbox".into()],
        },
        None => Helper {
            exe,
            args: vec![HELPER_ARG.into()],
        },
    };
    println!("helper: {}", helper.exe.display());
    let sandbox = Sandbox::new(
        helper,
        Policy {
            protected: vec![db],
            ..Policy::default()
        },
    );
    println!("kernel: {}", sandbox.support().describe());
    let argv: Vec<OsString> = ["sh", "-c", "true"].map(OsString::from).to_vec();
    let mut direct = Vec::with_capacity(rounds);
    let mut confined = Vec::with_capacity(rounds);
    for round in 0..rounds + 10 {
        let started = Instant::now();
        let ok = Command::new("sh")
            .args(["-c", "true"])
            .current_dir(&root)
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let d = started.elapsed();
        let started = Instant::now();
        let ok2 = match sandbox.prepare(&root, &argv, None) {
            Ok(mut prepared) => prepared
                .command
                .current_dir(&root)
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            Err(e) => {
                eprintln!("{e}");
                return;
            }
        };
        let c = started.elapsed();
        if !(ok && ok2) {
            eprintln!("a command failed");
            return;
        }
        // The first rounds warm caches.
        if round >= 10 {
            direct.push(d);
            confined.push(c);
        }
    }
    let (d_med, d_p90) = stats(&mut direct);
    let (c_med, c_p90) = stats(&mut confined);
    println!("rounds: {rounds}, alternating");
    println!("sh -c true directly:      median {d_med:>8.2?}, p90 {d_p90:>8.2?}");
    println!("sh -c true in the sandbox: median {c_med:>8.2?}, p90 {c_p90:>8.2?}");
    println!(
        "start-up cost of the sandbox per command: median {:.2?}",
        c_med.saturating_sub(d_med)
    );
}

fn stats(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.9))
}
