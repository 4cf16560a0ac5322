#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The file tools against an attacker who changes the workspace while
//! they run, and against files that are not files: FIFOs, devices,
//! sockets. Real directories, a real thread swapping them, real tools.

use std::os::unix::fs::symlink;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rustix::fs::{CWD, FileType, Mode, RenameFlags};
use serde_json::{Value, json};
use toolwire_tools::builtin::{self, Workspace};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput};

mod support;

/// Long enough for a loaded CI machine, short enough that a tool that
/// blocks fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(20);

const SECRET: &str = "OUTSIDE-SECRET-7f3a";
const MARKER: &str = "WRITTEN-BY-TOOL-91c2";

/// Runs a test on its own runtime and leaves it without waiting for its
/// blocking threads: a tool stuck in a read (the bug these tests guard
/// against) fails the test instead of keeping it from ever ending.
fn run(test: impl Future<Output = ()> + Send + 'static) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let outcome =
        runtime.block_on(async { tokio::time::timeout(2 * PATIENCE, tokio::spawn(test)).await });
    runtime.shutdown_background();
    match outcome {
        Err(_) => panic!("the test did not finish within {:?}", 2 * PATIENCE),
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(result) => result.unwrap(),
    }
}

struct Tools {
    tools: Vec<Arc<dyn Tool>>,
}

impl Tools {
    fn new(root: &Path) -> Tools {
        let workspace = Arc::new(Workspace::new(root).unwrap());
        Tools {
            tools: builtin::all(workspace, support::sandbox()),
        }
    }

    async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, ToolError> {
        let tool = self.tools.iter().find(|t| t.spec().name == name).unwrap();
        tokio::time::timeout(PATIENCE, tool.call(args, ToolContext::detached("call")))
            .await
            .unwrap_or_else(|_| panic!("{name} did not answer within {PATIENCE:?}"))
    }

    async fn refusal(&self, name: &str, args: Value) -> String {
        match self.call(name, args.clone()).await {
            Err(ToolError::Refused(message)) => message,
            other => panic!("{name} {args}: expected a refusal, got {other:?}"),
        }
    }
}

/// Every file under `dir` with its content (symlinks not followed).
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            out.extend(contents(&entry.path()));
        } else if kind.is_file() {
            out.push((entry.path(), std::fs::read(entry.path()).unwrap()));
        }
    }
    out.sort();
    out
}

/// The swap from issue 17: `d` is a real directory of the workspace one
/// moment and a symlink to a directory outside it the next
/// (`renameat2(RENAME_EXCHANGE)`, atomic), while read_file, write_file,
/// list_dir, apply_diff and search run thousands of times. Not one byte
/// may come from outside or land there.
#[test]
fn swapping_a_directory_for_an_outside_symlink_never_leaks() {
    run(swap_race());
}

async fn swap_race() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let lure = outside.path().join("lure");
    std::fs::create_dir(&lure).unwrap();
    // The outside directory looks like the inside one, file for file.
    std::fs::write(lure.join("f.txt"), format!("{SECRET}\n")).unwrap();
    std::fs::write(lure.join("g.txt"), "line\n").unwrap();
    std::fs::write(lure.join(format!("only-outside-{SECRET}")), "x").unwrap();
    let d = root.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("f.txt"), "inside\n").unwrap();
    std::fs::write(d.join("g.txt"), "line\n").unwrap();
    let swap = root.path().join("swap");
    symlink(&lure, &swap).unwrap();
    let outside_before = contents(outside.path());

    let tools = Arc::new(Tools::new(root.path()));
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps, d, swap) = (stop.clone(), swaps.clone(), d.clone(), swap.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(CWD, &d, CWD, &swap, RenameFlags::EXCHANGE).unwrap();
                // A pause after each swap back lets calls also meet a
                // quiet `d`, so not every call is refused.
                if swaps.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
                    std::thread::sleep(Duration::from_micros(30));
                }
            }
            // Leave `d` the real directory.
            if swaps.load(Ordering::Relaxed) % 2 == 1 {
                rustix::fs::renameat_with(CWD, &d, CWD, &swap, RenameFlags::EXCHANGE).unwrap();
            }
        })
    };

    const ROUNDS: usize = 250;
    let read_ok = Arc::new(AtomicUsize::new(0));
    let write_ok = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (tools, read_ok, write_ok) = (tools.clone(), read_ok.clone(), write_ok.clone());
        workers.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let out = tools.call("read_file", json!({"path": "d/f.txt"})).await;
                let text = format!("{out:?}");
                assert!(!text.contains(SECRET), "read_file read outside: {text}");
                if out.is_ok_and(|o| o.content.contains("inside")) {
                    read_ok.fetch_add(1, Ordering::Relaxed);
                }

                let path = format!("d/w-{worker}-{round}.txt");
                let out = tools
                    .call("write_file", json!({"path": path, "content": MARKER}))
                    .await;
                if out.is_ok() {
                    write_ok.fetch_add(1, Ordering::Relaxed);
                }

                let out = tools.call("list_dir", json!({"path": "d"})).await;
                let text = format!("{out:?}");
                assert!(!text.contains(SECRET), "list_dir listed outside: {text}");

                let diff = "@@ -1 +1 @@\n-line\n+line\n";
                let out = tools
                    .call("apply_diff", json!({"path": "d/g.txt", "diff": diff}))
                    .await;
                let text = format!("{out:?}");
                assert!(!text.contains(SECRET), "apply_diff: {text}");
                let created = format!("--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+{MARKER}\n");
                let path = format!("d/c-{worker}-{round}.txt");
                let _ = tools
                    .call("apply_diff", json!({"path": path, "diff": created}))
                    .await;

                if round % 10 == 0 {
                    let out = tools
                        .call("search", json!({"pattern": SECRET, "path": "d"}))
                        .await;
                    let text = format!("{out:?}");
                    assert!(
                        text.contains("no matches") || out.is_err(),
                        "search: {text}"
                    );
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();

    let calls = 4 * ROUNDS * 5 + 4 * ROUNDS / 10;
    let (reads, writes) = (
        read_ok.load(Ordering::Relaxed),
        write_ok.load(Ordering::Relaxed),
    );
    eprintln!(
        "{calls} calls, {} swaps; {reads} reads and {writes} writes succeeded inside",
        swaps.load(Ordering::Relaxed)
    );
    assert!(
        swaps.load(Ordering::Relaxed) > 100,
        "the swapper barely ran"
    );
    // The swap did not simply make every call fail.
    assert!(reads > 0 && writes > 0, "{reads} reads, {writes} writes");
    assert_eq!(
        contents(outside.path()),
        outside_before,
        "something was written outside the workspace"
    );
    for (path, bytes) in contents(root.path()) {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(SECRET),
            "{} holds the secret",
            path.display()
        );
    }
}

/// A FIFO, a device and a socket in the workspace: every tool refuses them
/// at once, naming what they are, and never waits on them.
#[test]
fn fifos_devices_and_sockets_are_refused_at_once() {
    run(special_files());
}

async fn special_files() {
    let root = tempfile::tempdir().unwrap();
    let at = |name: &str| root.path().join(name);
    rustix::fs::mknodat(
        CWD,
        at("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _socket = UnixListener::bind(at("socket")).unwrap();
    // A device node needs root (CAP_MKNOD); without it, a symlink to
    // /dev/zero is refused anyway, as leaving the workspace.
    let device = rustix::fs::mknodat(
        CWD,
        at("zero"),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 5),
    )
    .is_ok();
    if !device {
        symlink("/dev/zero", at("zero")).unwrap();
    }
    let tools = Tools::new(root.path());

    for (name, kind) in [
        ("fifo", "a FIFO (named pipe)"),
        ("socket", "a socket"),
        ("zero", "a character device"),
    ] {
        let want = |message: &str| {
            if name == "zero" && !device {
                assert!(message.contains("outside the workspace root"), "{message}");
            } else {
                assert!(
                    message.contains(&format!("`{name}` is {kind}")),
                    "{message}"
                );
            }
        };
        want(&tools.refusal("read_file", json!({"path": name})).await);
        want(
            &tools
                .refusal("write_file", json!({"path": name, "content": "x"}))
                .await,
        );
        let diff = "@@ -1 +1 @@\n-a\n+b\n";
        want(
            &tools
                .refusal("apply_diff", json!({"path": name, "diff": diff}))
                .await,
        );
        want(&tools.refusal("list_dir", json!({"path": name})).await);
        want(
            &tools
                .refusal("search", json!({"pattern": "x", "path": name}))
                .await,
        );
        want(
            &tools
                .refusal("run_command", json!({"command": "true", "cwd": name}))
                .await,
        );
    }
    // Nothing was replaced: the FIFO is still a FIFO.
    let meta = std::fs::symlink_metadata(at("fifo")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()));

    // A search over the whole workspace passes them by.
    std::fs::write(at("plain.txt"), "needle\n").unwrap();
    let out = tools
        .call("search", json!({"pattern": "needle"}))
        .await
        .unwrap();
    assert_eq!(out.content, "plain.txt:1: needle");
    // A directory whose .gitignore is a FIFO is skipped, not read.
    std::fs::create_dir(at("sub")).unwrap();
    std::fs::write(at("sub/hidden.txt"), "needle\n").unwrap();
    rustix::fs::mknodat(
        CWD,
        at("sub/.gitignore"),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let out = tools
        .call("search", json!({"pattern": "needle"}))
        .await
        .unwrap();
    assert_eq!(out.content, "plain.txt:1: needle");
    let message = tools
        .refusal("search", json!({"pattern": "needle", "path": "sub"}))
        .await;
    assert!(message.contains("ignore file that is a FIFO"), "{message}");
    // list_dir names them without opening them.
    let out = tools.call("list_dir", json!({})).await.unwrap();
    assert!(out.content.contains("fifo\n"), "{}", out.content);
}

/// Issue 17: 528 reads of a FIFO froze the server. Now 600 at once are all
/// refused, and an ordinary read still answers afterwards.
#[test]
fn many_fifo_reads_do_not_starve_other_calls() {
    run(many_fifo_reads());
}

async fn many_fifo_reads() {
    let root = tempfile::tempdir().unwrap();
    for n in 0..10 {
        let fifo = root.path().join(format!("fifo{n}"));
        rustix::fs::mknodat(CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o644), 0).unwrap();
    }
    std::fs::write(root.path().join("a.txt"), "hello\n").unwrap();
    let tools = Arc::new(Tools::new(root.path()));
    let calls: Vec<_> = (0..600)
        .map(|n| {
            let tools = tools.clone();
            tokio::spawn(async move {
                tools
                    .refusal("read_file", json!({"path": format!("fifo{}", n % 10)}))
                    .await
            })
        })
        .collect();
    // A read asked for while those are in flight answers too.
    let out = tools
        .call("read_file", json!({"path": "a.txt"}))
        .await
        .unwrap();
    assert_eq!(out.content, "hello\n");
    for call in calls {
        assert!(call.await.unwrap().contains("a FIFO"));
    }
    let out = tools
        .call("read_file", json!({"path": "a.txt"}))
        .await
        .unwrap();
    assert_eq!(out.content, "hello\n");
}
