#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sandbox, through the real tools and the real helper: what a
//! command and a Python tool can reach under `workspace-write` (the
//! default) and `read-only`, and the same commands under `full`, so that
//! the policy is seen to decide.

mod support;

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tempfile::TempDir;
use toolwire_tools::builtin::{self, Workspace};
use toolwire_tools::confined::{Mode, Sandbox};
use toolwire_tools::python::{PythonLimits, PythonSandbox, PythonTool, PythonToolDef};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput};

const SECRET: &str = "s3cret-do-not-read";

/// A workspace holding toolwire's database (as `sqlite://toolwire.db` in
/// the working directory would), a directory outside it and one in the
/// home directory, each with a secret file; a loopback TCP server.
struct World {
    workspace: TempDir,
    outside: TempDir,
    home: TempDir,
    db: PathBuf,
    listener: TcpListener,
    accepted: Arc<AtomicUsize>,
}

impl World {
    fn new() -> World {
        let workspace = tempfile::tempdir().unwrap();
        let root = workspace.path().canonicalize().unwrap();
        std::fs::write(root.join("notes.txt"), "notes\n").unwrap();
        std::fs::create_dir(root.join("src")).unwrap();
        let db = root.join("toolwire.db");
        for suffix in ["", "-wal", "-shm"] {
            std::fs::write(format!("{}{suffix}", db.display()), SECRET).unwrap();
        }
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), SECRET).unwrap();
        let home = tempfile::tempdir_in(std::env::var("HOME").unwrap()).unwrap();
        std::fs::write(home.path().join("secret.txt"), SECRET).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let server = listener.try_clone().unwrap();
        std::thread::spawn(move || {
            for stream in server.incoming() {
                if stream.is_ok() {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        World {
            workspace,
            outside,
            home,
            db,
            listener,
            accepted,
        }
    }

    fn root(&self) -> PathBuf {
        self.workspace.path().canonicalize().unwrap()
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }

    fn protected(&self) -> Vec<PathBuf> {
        ["", "-wal", "-shm", "-journal"]
            .iter()
            .map(|s| PathBuf::from(format!("{}{s}", self.db.display())))
            .collect()
    }

    /// A sandbox in `mode` whose parent environment holds the keys a
    /// command must never see.
    fn sandbox(&self, mode: Mode) -> Arc<Sandbox> {
        let keys = [
            ("OPENAI_API_KEY", "sk-openai-secret"),
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
            ("TOOLWIRE_API_KEYS", "tw-secret"),
            ("PROBE_PASSED", "configured"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        Arc::new(
            support::sandbox_protecting(mode, false, &self.protected())
                .with_parent_env(std::env::vars_os().chain(keys)),
        )
    }

    async fn run(&self, mode: Mode, command: &str) -> ToolOutput {
        let tools = builtin::all(
            Arc::new(Workspace::new(self.root()).unwrap()),
            self.sandbox(mode),
        );
        let tool = tools
            .into_iter()
            .find(|t| t.spec().name == "run_command")
            .unwrap();
        tool.call(json!({"command": command}), ToolContext::detached("call"))
            .await
            .unwrap()
    }
}

/// `cat`s each path, one line per path: its content or `DENIED`.
fn reads(paths: &[&Path]) -> String {
    paths
        .iter()
        .map(|p| format!("cat '{}' 2>/dev/null || echo DENIED; echo", p.display()))
        .collect::<Vec<_>>()
        .join("; ")
}

#[tokio::test]
async fn a_command_reads_only_what_the_policy_allows() {
    let w = World::new();
    let secrets = [
        w.db.clone(),
        PathBuf::from(format!("{}-wal", w.db.display())),
        w.outside.path().join("secret.txt"),
        w.home.path().join("secret.txt"),
    ];
    let paths: Vec<&Path> = secrets.iter().map(PathBuf::as_path).collect();
    let command = format!("cat notes.txt; {}", reads(&paths));

    for mode in [Mode::WorkspaceWrite, Mode::ReadOnly] {
        let out = w.run(mode, &command).await;
        assert!(
            out.content.starts_with("notes\n"),
            "{mode}: {}",
            out.content
        );
        assert!(!out.content.contains(SECRET), "{mode}: {}", out.content);
        assert_eq!(out.content.matches("DENIED").count(), 4, "{}", out.content);
        // System files a command needs stay readable; the system's own
        // secrets do not.
        let out = w
            .run(
                mode,
                "head -c 5 /etc/passwd; echo; cat /etc/shadow || echo SHADOW-DENIED",
            )
            .await;
        assert!(out.content.starts_with("root:"), "{}", out.content);
        assert!(out.content.contains("SHADOW-DENIED"), "{}", out.content);
    }

    // toolwire's open files (the database among them) are out of reach
    // through /proc too.
    let out = w
        .run(
            Mode::WorkspaceWrite,
            &format!(
                "cat /proc/{}/fd/* >/dev/null 2>&1 && echo FD-READ || echo FD-DENIED",
                std::process::id()
            ),
        )
        .await;
    assert!(out.content.contains("FD-DENIED"), "{}", out.content);

    let out = w.run(Mode::Full, &command).await;
    assert_eq!(out.content.matches(SECRET).count(), 4, "{}", out.content);
}

#[tokio::test]
async fn a_command_writes_only_the_workspace_and_its_temp_dir() {
    let w = World::new();
    let outside = w.outside.path().join("written.txt");
    let command = format!(
        "echo a > src/new.txt && echo WS-OK; echo b > \"$TMPDIR/t\" && echo TMP-OK; \
         echo c > '{}' && echo OUT-OK; echo d > \"$HOME/toolwire-sandbox-probe\" && echo HOME-OK; \
         echo e >> toolwire.db && echo DB-OK; ls; true",
        outside.display()
    );
    let out = w.run(Mode::WorkspaceWrite, &command).await;
    let text = &out.content;
    assert!(text.contains("WS-OK") && text.contains("TMP-OK"), "{text}");
    assert!(
        !text.contains("OUT-OK") && !text.contains("HOME-OK"),
        "{text}"
    );
    assert!(!text.contains("DB-OK"), "{text}");
    // The carve-out around the database still lists the workspace root.
    assert!(text.contains("notes.txt") && text.contains("src"), "{text}");
    assert!(!outside.exists());
    assert_eq!(std::fs::read_to_string(&w.db).unwrap(), SECRET);

    let out = w.run(Mode::ReadOnly, &command).await;
    assert!(!out.content.contains("-OK"), "{}", out.content);

    let out = w.run(Mode::Full, &command).await;
    assert!(out.content.contains("OUT-OK"), "{}", out.content);
    assert!(outside.exists());
    let _ = std::fs::remove_file(
        PathBuf::from(std::env::var("HOME").unwrap()).join("toolwire-sandbox-probe"),
    );
}

/// A workspace's additional root is granted as its root is: written in
/// `workspace-write`, only read in `read-only`; a third directory stays
/// out of reach.
#[tokio::test]
async fn a_command_writes_an_additional_root_as_the_workspace() {
    let w = World::new();
    let other = tempfile::tempdir().unwrap();
    let other_root = other.path().canonicalize().unwrap();
    std::fs::write(other_root.join("seen.txt"), "SEEN\n").unwrap();
    let outside = w.outside.path().join("written.txt");
    let command = format!(
        "cat '{o}/seen.txt'; echo a > '{o}/made.txt' && echo OTHER-OK; \
         echo c > '{}' && echo OUT-OK; true",
        outside.display(),
        o = other_root.display()
    );
    let run = |mode| {
        let workspace = Workspace::new(w.root())
            .unwrap()
            .with_additional_roots(std::slice::from_ref(&other_root))
            .unwrap();
        let tool = builtin::all(Arc::new(workspace), w.sandbox(mode))
            .into_iter()
            .find(|t| t.spec().name == "run_command")
            .unwrap();
        let command = command.clone();
        async move {
            tool.call(json!({"command": command}), ToolContext::detached("call"))
                .await
                .unwrap()
                .content
        }
    };
    let text = run(Mode::WorkspaceWrite).await;
    assert!(text.contains("SEEN") && text.contains("OTHER-OK"), "{text}");
    assert!(!text.contains("OUT-OK"), "{text}");
    assert!(!outside.exists());
    std::fs::remove_file(other_root.join("made.txt")).unwrap();
    let text = run(Mode::ReadOnly).await;
    assert!(
        text.contains("SEEN") && !text.contains("OTHER-OK"),
        "{text}"
    );
    assert!(!other_root.join("made.txt").exists());
}

#[tokio::test]
async fn a_command_cannot_reach_a_loopback_server_with_the_network_off() {
    let w = World::new();
    let connect = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {}), timeout=5); \
         print('CONNECTED')\" 2>&1 | tail -1; \
         python3 -c \"import socket; socket.socket(socket.AF_UNIX)\" 2>&1 | tail -1; \
         python3 -c \"import socket; socket.socketpair(); print('PAIR-OK')\"",
        w.port()
    );
    let out = w.run(Mode::WorkspaceWrite, &connect).await;
    assert!(!out.content.contains("CONNECTED"), "{}", out.content);
    assert!(
        out.content.matches("PermissionError").count() == 2,
        "{}",
        out.content
    );
    assert!(out.content.contains("PAIR-OK"), "{}", out.content);
    assert_eq!(w.accepted.load(Ordering::SeqCst), 0);

    let out = w.run(Mode::Full, &connect).await;
    assert!(out.content.contains("CONNECTED"), "{}", out.content);
    assert_eq!(w.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_command_sees_no_key_in_its_environment() {
    let w = World::new();
    for mode in [Mode::WorkspaceWrite, Mode::Full] {
        let out = w.run(mode, "env").await;
        for name in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TOOLWIRE_"] {
            assert!(!out.content.contains(name), "{mode}: {}", out.content);
        }
        assert!(out.content.contains("PATH="), "{}", out.content);
        assert!(out.content.contains("TMPDIR=/"), "{}", out.content);
    }
}

#[tokio::test]
async fn a_command_cannot_read_another_process_environment() {
    let w = World::new();
    // A process of the same user holding a key, as toolwire or the shell
    // that started it would: its /proc/PID/environ is readable to the user.
    let mut holder = std::process::Command::new("sleep")
        .arg("300")
        .env("TOOLWIRE_TEST_HELD_KEY", "sk-held-by-another-process")
        .spawn()
        .unwrap();
    let command = format!(
        "cat /proc/{}/environ | tr '\\0' '\\n' | grep HELD || echo NOT-READ; \
         echo visible=$(ls /proc | grep -c '^[0-9]')",
        holder.id()
    );
    let confined = w.run(Mode::WorkspaceWrite, &command).await;
    let full = w.run(Mode::Full, &command).await;
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        !confined.content.contains("sk-held-by-another-process"),
        "{}",
        confined.content
    );
    assert!(
        confined.content.contains("NOT-READ"),
        "{}",
        confined.content
    );
    // Its own namespace's /proc: the shell and what it runs, not the machine.
    let visible: usize = confined
        .content
        .split("visible=")
        .nth(1)
        .and_then(|rest| rest.lines().next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count in {}", confined.content));
    assert!(visible < 10, "{}", confined.content);
    // The policy decides: unconfined, the same read succeeds.
    assert!(
        full.content.contains("sk-held-by-another-process"),
        "{}",
        full.content
    );
}

#[tokio::test]
async fn no_process_outlives_the_command() {
    let w = World::new();
    let marker = support::marker();
    // A setsid child, a double fork, a plain background job.
    let command = format!(
        "setsid sleep {marker} & (sh -c 'sleep {marker} &' &); sleep {marker} & sleep 0.2; echo up"
    );
    for mode in [Mode::WorkspaceWrite, Mode::Full] {
        let out = w.run(mode, &command).await;
        assert!(out.content.starts_with("up\n"), "{}", out.content);
        let left = support::running_with(marker);
        assert!(left.is_empty(), "{mode}: {left:?} outlived the command");
    }
}

const PROBES: &str = r#"
import os, socket, subprocess

def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return "DENIED " + type(e).__name__

def write(path: str) -> str:
    try:
        with open(path, "w") as f:
            f.write("x")
        return "WROTE"
    except OSError as e:
        return "DENIED " + type(e).__name__

def connect(port: int) -> str:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5)
        return "CONNECTED"
    except OSError as e:
        return "DENIED " + type(e).__name__

def environment() -> str:
    return "\n".join(sorted(os.environ))

def spawn(marker: int) -> str:
    subprocess.Popen(["setsid", "sleep", str(marker)])
    subprocess.Popen(["sleep", str(marker)])
    return "spawned"
"#;

async fn python(w: &World, mode: Mode, function: &str, args: Value) -> String {
    let tool = PythonTool::new(
        PythonToolDef {
            name: function.into(),
            description: String::new(),
            source_code: PROBES.into(),
            schema: None,
        },
        PythonLimits::default(),
        PythonSandbox::new(w.sandbox(mode), w.root()),
    )
    .await
    .unwrap();
    let out: Result<ToolOutput, ToolError> = tool.call(args, ToolContext::detached("call")).await;
    out.unwrap().content
}

#[tokio::test]
async fn python_tools_are_confined_alike() {
    let w = World::new();
    let outside = w.outside.path().join("secret.txt");
    let home = w.home.path().join("secret.txt");
    let written = w.outside.path().join("py.txt");
    let marker = support::marker();
    for mode in [Mode::WorkspaceWrite, Mode::Full] {
        let confined = mode != Mode::Full;
        for path in [&w.db, &outside, &home] {
            let out = python(&w, mode, "read", json!({"path": path})).await;
            assert_eq!(
                out.starts_with("DENIED"),
                confined,
                "{mode} {path:?}: {out}"
            );
        }
        let out = python(
            &w,
            mode,
            "read",
            json!({"path": w.root().join("notes.txt")}),
        )
        .await;
        assert_eq!(out, "notes\n");
        let out = python(&w, mode, "write", json!({"path": written})).await;
        assert_eq!(out.starts_with("DENIED"), confined, "{mode}: {out}");
        let out = python(
            &w,
            mode,
            "write",
            json!({"path": w.root().join("src/py.txt")}),
        )
        .await;
        assert_eq!(out, "WROTE");
        let out = python(&w, mode, "connect", json!({"port": w.port()})).await;
        assert_eq!(out.starts_with("DENIED"), confined, "{mode}: {out}");
        let out = python(&w, mode, "environment", json!({})).await;
        assert!(
            !out.contains("API_KEY") && !out.contains("TOOLWIRE_"),
            "{out}"
        );
        let out = python(&w, mode, "spawn", json!({"marker": marker})).await;
        assert_eq!(out, "spawned");
        let left = support::running_with(marker);
        assert!(left.is_empty(), "{mode}: {left:?} outlived the call");
    }
    assert_eq!(w.accepted.load(Ordering::SeqCst), 1, "only under full");
}

#[tokio::test]
async fn without_a_helper_commands_are_refused() {
    let w = World::new();
    let tools = builtin::all(
        Arc::new(Workspace::new(w.root()).unwrap()),
        Arc::new(Sandbox::none()),
    );
    let tool = tools
        .into_iter()
        .find(|t| t.spec().name == "run_command")
        .unwrap();
    let err = tool
        .call(json!({"command": "true"}), ToolContext::detached("call"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::Refused(m) if m.contains("no sandbox helper")),
        "{err:?}"
    );
}

/// A stdio MCP server on the SDK `scripts/test` installs, with three
/// tools: `env` (the names in its environment), `read` (the file
/// `PROBE_READ`, or `DENIED` and the error code) and `write` (`PROBE_WRITE`).
const PROBE_SERVER: &str = r#"
const path = require('path');
const fs = require('fs');
const sdk = path.join(process.env.PROBE_MCP_DIR, 'node_modules/@modelcontextprotocol/sdk/dist/cjs');
const { McpServer } = require(path.join(sdk, 'server/mcp.js'));
const { StdioServerTransport } = require(path.join(sdk, 'server/stdio.js'));
const server = new McpServer({ name: 'probe', version: '1.0.0' });
const text = (t) => ({ content: [{ type: 'text', text: t }] });
const attempt = (f) => { try { return text(f()); } catch (e) { return text(`DENIED ${e.code}`); } };
server.registerTool('env', { description: 'environment names', inputSchema: {} },
  async () => text(Object.keys(process.env).sort().join(' ')));
server.registerTool('read', { description: 'reads PROBE_READ', inputSchema: {} },
  async () => attempt(() => fs.readFileSync(process.env.PROBE_READ, 'utf8')));
server.registerTool('write', { description: 'writes PROBE_WRITE', inputSchema: {} },
  async () => attempt(() => { fs.writeFileSync(process.env.PROBE_WRITE, 'x'); return 'WROTE'; }));
server.connect(new StdioServerTransport());
"#;

/// Calls each of the probe server's tools, started unconfined (`None`) or
/// in `mode`, after pointing `read` at `target`; the texts by tool name.
async fn probe_mcp(
    w: &World,
    mode: Option<Mode>,
    target: &Path,
) -> Option<std::collections::BTreeMap<String, String>> {
    use toolwire_tools::mcp::{Launch, McpServer, McpServerConfig};
    let mcp_dir = toolwire_test_support::mcp_http::mcp_dir()?;
    let mcp_dir = mcp_dir.canonicalize().unwrap();
    let env = [
        ("PROBE_MCP_DIR", mcp_dir.display().to_string()),
        ("PROBE_READ", target.display().to_string()),
        (
            "PROBE_WRITE",
            w.root().join("mcp-wrote.txt").display().to_string(),
        ),
    ];
    let config = McpServerConfig {
        args: vec!["-e".into(), PROBE_SERVER.into()],
        env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        // Asked for, and still never passed: a provider key.
        env_vars: vec!["PROBE_PASSED".into(), "OPENAI_API_KEY".into()],
        sandbox: mode,
        ..McpServerConfig::stdio("probe", "node")
    };
    let sandbox = w.sandbox(mode.unwrap_or(Mode::Full));
    // The SDK lives outside the workspace: readable by configuration, as
    // an operator would grant a server's own install directory.
    let policy = toolwire_tools::confined::Policy {
        read: vec![mcp_dir],
        ..sandbox.policy().clone()
    };
    let launch = Launch {
        sandbox: Arc::new(Sandbox::clone(&sandbox).with_policy(policy)),
        workspace: w.root(),
    };
    let server = McpServer::new(config, launch);
    let tools = server.tools().await.unwrap();
    let mut texts = std::collections::BTreeMap::new();
    for tool in tools {
        let out = tool
            .call(json!({}), ToolContext::detached("call"))
            .await
            .unwrap();
        let name = tool.spec().name.trim_start_matches("probe__").to_owned();
        texts.insert(name, out.content);
    }
    server.shutdown().await;
    Some(texts)
}

#[tokio::test]
async fn mcp_servers_see_no_keys_and_a_sandboxed_one_only_its_policy() {
    let w = World::new();
    let outside = w.outside.path().join("secret.txt");
    let Some(free) = probe_mcp(&w, None, &outside).await else {
        return;
    };
    // Unconfined: the file system is open, the environment is not.
    assert_eq!(free["read"], SECRET);
    for (mode, texts) in [
        (None, free),
        (
            Some(Mode::WorkspaceWrite),
            probe_mcp(&w, Some(Mode::WorkspaceWrite), &outside)
                .await
                .unwrap(),
        ),
    ] {
        let names: Vec<&str> = texts["env"].split(' ').collect();
        for key in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TOOLWIRE_API_KEYS"] {
            assert!(!names.contains(&key), "{mode:?}: {key} in {names:?}");
        }
        for wanted in ["PATH", "PROBE_READ", "PROBE_PASSED"] {
            assert!(
                names.contains(&wanted),
                "{mode:?}: no {wanted} in {names:?}"
            );
        }
        assert_eq!(texts["write"], "WROTE", "{mode:?}");
    }
    // workspace-write: nothing outside the workspace, nor toolwire's
    // database inside it; read-only: not even the workspace is written.
    let confined = probe_mcp(&w, Some(Mode::WorkspaceWrite), &w.db)
        .await
        .unwrap();
    assert!(confined["read"].starts_with("DENIED"), "{confined:?}");
    let confined = probe_mcp(&w, Some(Mode::WorkspaceWrite), &outside)
        .await
        .unwrap();
    assert!(confined["read"].starts_with("DENIED"), "{confined:?}");
    let read_only = probe_mcp(&w, Some(Mode::ReadOnly), &w.root().join("notes.txt"))
        .await
        .unwrap();
    assert_eq!(read_only["read"], "notes\n");
    assert!(read_only["write"].starts_with("DENIED"), "{read_only:?}");
    // full: the policy, not the server, decided.
    let full = probe_mcp(&w, Some(Mode::Full), &outside).await.unwrap();
    assert_eq!(full["read"], SECRET);
}
