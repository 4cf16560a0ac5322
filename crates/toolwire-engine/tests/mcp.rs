//! MCP tools against the real reference server
//! `@modelcontextprotocol/server-everything`, which `scripts/test` installs
//! under `target/mcp-servers` and points `TOOLWIRE_TEST_MCP_DIR` at.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolwire_core::Progress;
use toolwire_engine::tools::mcp::{McpError, McpServer, McpServerConfig, connect_all};
use toolwire_engine::tools::{
    ProgressHandle, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSource,
};

const SERVER: &str = "everything";

/// The server's config, or `None` (test skipped) when the package is not
/// installed outside CI. In CI a missing server is a failure.
fn everything() -> Option<McpServerConfig> {
    let dir = mcp_dir()?;
    let entry = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        entry.is_file(),
        "{} is missing: TOOLWIRE_TEST_MCP_DIR must hold an npm install of \
         @modelcontextprotocol/server-everything",
        entry.display()
    );
    Some(McpServerConfig {
        name: SERVER.into(),
        command: "node".into(),
        args: vec![entry.display().to_string(), "stdio".into()],
        ..Default::default()
    })
}

/// `TOOLWIRE_TEST_MCP_DIR`, or `None` (test skipped) outside CI.
fn mcp_dir() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("TOOLWIRE_TEST_MCP_DIR") else {
        if std::env::var_os("CI").is_some() {
            panic!(
                "TOOLWIRE_TEST_MCP_DIR is not set but CI is: run the tests through \
                 scripts/test, which installs @modelcontextprotocol/server-everything"
            );
        }
        eprintln!(
            "note: TOOLWIRE_TEST_MCP_DIR is not set; skipping the MCP test \
             (scripts/test installs the npm server and sets it)"
        );
        return None;
    };
    Some(PathBuf::from(dir))
}

/// A small MCP server on the SDK that server-everything is built on (so it
/// needs nothing beyond what `scripts/test` installs), for what
/// server-everything cannot be asked to do: its tools are the names in the
/// file `FIXTURE_TOOLS` when it starts, and its `sync` tool makes them match
/// the file again (the SDK sends `notifications/tools/list_changed` for each
/// tool added or removed). `crash` exits without answering. Each start
/// appends a line to `FIXTURE_SPAWNS`.
const FIXTURE_SERVER: &str = r#"
const path = require('path');
const fs = require('fs');
const sdk = path.join(process.env.FIXTURE_MCP_DIR, 'node_modules/@modelcontextprotocol/sdk/dist/cjs');
const { McpServer } = require(path.join(sdk, 'server/mcp.js'));
const { StdioServerTransport } = require(path.join(sdk, 'server/stdio.js'));
fs.appendFileSync(process.env.FIXTURE_SPAWNS, 'spawn\n');
const wanted = () => fs.readFileSync(process.env.FIXTURE_TOOLS, 'utf8').split(/\s+/).filter(Boolean);
const server = new McpServer({ name: 'fixture', version: '1.0.0' });
const registered = new Map();
const sync = () => {
  const names = wanted();
  for (const [name, tool] of registered) {
    if (!names.includes(name)) { tool.remove(); registered.delete(name); }
  }
  for (const name of names) {
    if (!registered.has(name)) {
      registered.set(name, server.registerTool(name, { description: `fixture tool ${name}`, inputSchema: {} },
        async () => ({ content: [{ type: 'text', text: `${name} ran` }] })));
    }
  }
};
sync();
server.registerTool('sync', { description: 'Makes the tools match FIXTURE_TOOLS', inputSchema: {} },
  async () => { sync(); return { content: [{ type: 'text', text: 'synced' }] }; });
server.registerTool('crash', { description: 'Exits without answering', inputSchema: {} },
  async () => process.exit(3));
server.connect(new StdioServerTransport());
"#;

/// The fixture server's config, its tool-names file and its spawn log, in
/// `dir`; `None` when the test is skipped.
fn fixture(dir: &Path, tools: &str) -> Option<(McpServerConfig, PathBuf, PathBuf)> {
    let mcp_dir = mcp_dir()?;
    let names = dir.join("tools");
    let spawns = dir.join("spawns");
    std::fs::write(&names, tools).unwrap();
    let env = [
        ("FIXTURE_MCP_DIR", mcp_dir.display().to_string()),
        ("FIXTURE_TOOLS", names.display().to_string()),
        ("FIXTURE_SPAWNS", spawns.display().to_string()),
    ];
    let config = McpServerConfig {
        name: "fixture".into(),
        command: "node".into(),
        args: vec!["-e".into(), FIXTURE_SERVER.into()],
        env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        ..Default::default()
    };
    Some((config, names, spawns))
}

fn spawn_count(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

fn registry(server: &Arc<McpServer>) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    registry.register_source(Arc::clone(server) as Arc<dyn ToolSource>);
    registry
}

fn names(registry: &ToolRegistry) -> Vec<String> {
    registry.specs().into_iter().map(|s| s.name).collect()
}

/// Waits (up to 10 s) until the registry lists what `done` wants.
async fn until_listed(registry: &ToolRegistry, what: &str, done: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names = names(registry);
        if done(&names) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}; the registry lists {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn call_named(
    registry: &ToolRegistry,
    name: &str,
    args: Value,
) -> Result<ToolOutput, ToolError> {
    let tool = registry
        .get(name)
        .unwrap_or_else(|| panic!("no tool {name} in {:?}", names(registry)));
    call(&tool, args).await
}

async fn start_error(server: &McpServer) -> McpError {
    match server.tools().await {
        Ok(tools) => panic!("expected the start to fail, got {} tools", tools.len()),
        Err(error) => error,
    }
}

fn failure(result: Result<ToolOutput, ToolError>) -> String {
    match result {
        Err(ToolError::Failed(message)) => message,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn find(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no tool {name}"))
}

async fn call(tool: &Arc<dyn Tool>, args: Value) -> Result<ToolOutput, ToolError> {
    tool.call(args, ToolContext::detached("call-1")).await
}

fn long_operation(seconds: u32) -> Value {
    json!({"duration": seconds, "steps": seconds})
}

#[tokio::test]
async fn lists_and_calls_the_everything_server() {
    let Some(config) = everything() else { return };
    let (servers, warnings) = connect_all([config]).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(servers.len(), 1);
    let registry = registry(&servers[0]);
    let specs = registry.specs();
    assert!(specs.len() >= 5, "only {} tools", specs.len());
    for spec in &specs {
        assert!(
            spec.name.starts_with("everything__"),
            "unprefixed name {}",
            spec.name
        );
        assert!(
            spec.name.len() <= 64
                && spec
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "name not API-safe: {}",
            spec.name
        );
        assert_eq!(spec.server.as_deref(), Some(SERVER));
        assert_eq!(spec.parameters["type"], "object", "{}", spec.name);
    }

    let echo = registry.get("everything__echo").expect("echo is listed");
    let spec = echo.spec();
    assert!(spec.read_only, "echo is annotated readOnlyHint");
    assert!(!spec.description.is_empty());
    assert!(spec.parameters["properties"]["message"].is_object());

    let out = call(&echo, json!({"message": "hello toolwire"}))
        .await
        .unwrap();
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.content, "Echo: hello toolwire");

    // Arguments the schema rejects: an error result the model can read.
    match call(&echo, json!({"nope": 1})).await {
        Ok(out) => {
            assert!(out.is_error, "{out:?}");
            assert!(out.content.contains("message"), "{out:?}");
        }
        Err(ToolError::InvalidArguments(message)) => assert!(message.contains("everything")),
        Err(other) => panic!("unexpected error {other:?}"),
    }
    assert!(matches!(
        call(&echo, json!("not an object")).await,
        Err(ToolError::InvalidArguments(_))
    ));

    // Non-text content is summarized.
    let out = call_named(&registry, "everything__get-tiny-image", Value::Null)
        .await
        .unwrap();
    assert!(out.content.contains("[image: image/png]"), "{out:?}");
}

#[tokio::test]
async fn a_server_that_fails_to_start_is_reported_and_others_still_connect() {
    let mut configs = vec![
        McpServerConfig {
            name: "missing".into(),
            command: "/nonexistent/toolwire-mcp-server".into(),
            ..Default::default()
        },
        McpServerConfig {
            name: "quitter".into(),
            command: "sh".into(),
            args: vec!["-c".into(), "echo 'no config found' >&2; exit 3".into()],
            ..Default::default()
        },
    ];
    let real = everything();
    configs.extend(real.clone());
    let (servers, warnings) = connect_all(configs).await;
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("MCP server `missing` could not be started"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("MCP server `quitter`") && warnings[1].contains("no config found"),
        "{warnings:?}"
    );
    if real.is_some() {
        assert_eq!(servers.len(), 1);
        assert!(registry(&servers[0]).get("everything__echo").is_some());
    } else {
        assert!(servers.is_empty());
    }
}

#[tokio::test]
async fn a_server_killed_during_a_call_fails_that_call_and_restarts_on_the_next() {
    let Some(config) = everything() else { return };
    let server = McpServer::new(config);
    let tools = server.tools().await.unwrap();
    let long = find(&tools, "everything__trigger-long-running-operation");
    let echo = find(&tools, "everything__echo");
    let first_pid = server.pid().await.expect("server runs");

    let running = tokio::spawn({
        let long = Arc::clone(&long);
        async move { call(&long, long_operation(30)).await }
    });
    // Time for the request to reach the server (the operation takes 30 s).
    tokio::time::sleep(Duration::from_secs(1)).await;
    kill(Pid::from_raw(first_pid as i32), Signal::SIGKILL).unwrap();

    let result = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the call ends when the server dies")
        .unwrap();
    match result {
        Err(ToolError::Failed(message)) => {
            assert!(
                message.contains("MCP server `everything` exited"),
                "{message}"
            );
        }
        other => panic!("expected a failure naming the server, got {other:?}"),
    }

    let out = call(&echo, json!({"message": "again"})).await.unwrap();
    assert_eq!(out.content, "Echo: again");
    let second_pid = server.pid().await.expect("restarted");
    assert_ne!(first_pid, second_pid, "a new process serves the call");
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_that_died_while_idle_is_restarted_by_the_next_call() {
    let Some(config) = everything() else { return };
    let server = McpServer::new(config);
    let tools = server.tools().await.unwrap();
    let echo = find(&tools, "everything__echo");
    let first_pid = server.pid().await.expect("server runs");
    let list_reads = server.watch_tool_list();
    let reads_before = *list_reads.borrow();

    kill(Pid::from_raw(first_pid as i32), Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.is_running().await {
        assert!(Instant::now() < deadline, "death not noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let out = call(&echo, json!({"message": "back"})).await.unwrap();
    assert_eq!(out.content, "Echo: back");
    let second_pid = server.pid().await.expect("restarted");
    assert_ne!(first_pid, second_pid);
    assert!(
        *list_reads.borrow() > reads_before,
        "the restarted server's tools are listed again"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn calls_time_out_and_can_be_cancelled() {
    let Some(config) = everything() else { return };
    let server = McpServer::new(McpServerConfig {
        timeout_secs: Some(1),
        ..config
    });
    let tools = server.tools().await.unwrap();
    let long = find(&tools, "everything__trigger-long-running-operation");
    let echo = find(&tools, "everything__echo");

    let started = Instant::now();
    let result = call(&long, long_operation(10)).await;
    assert!(matches!(result, Err(ToolError::TimedOut(1))), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let ctx = ToolContext::detached("call-2");
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let result = long.call(long_operation(10), ctx).await;
    assert!(matches!(result, Err(ToolError::Cancelled)), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // Neither a timeout nor a cancellation costs the server.
    let out = call(&echo, json!({"message": "still here"})).await.unwrap();
    assert_eq!(out.content, "Echo: still here");
    server.shutdown().await;
}

#[tokio::test]
async fn progress_notifications_arrive_as_the_calls_progress_before_its_result() {
    let Some(config) = everything() else { return };
    let server = McpServer::new(config);
    let tools = server.tools().await.unwrap();
    let long = find(&tools, "everything__trigger-long-running-operation");

    let (tx, mut rx) = mpsc::channel(64);
    let mut ctx = ToolContext::detached("call-progress");
    ctx.progress = ProgressHandle::new(ctx.call_id.clone(), tx);
    // 4 steps of 0.5 s; the server reports progress only when the request
    // carries a progress token.
    let mut running =
        tokio::spawn(async move { long.call(json!({"duration": 2, "steps": 4}), ctx).await });

    let mut before = Vec::new();
    let result = loop {
        tokio::select! {
            biased;
            result = &mut running => break result.unwrap(),
            Some((call_id, progress)) = rx.recv() => before.push((call_id, progress)),
        }
    };
    let out = result.unwrap();
    assert!(
        out.content.contains("Long running operation completed"),
        "{out:?}"
    );

    let texts: Vec<&str> = before
        .iter()
        .map(|(call_id, progress)| {
            assert_eq!(call_id.0, "call-progress");
            match progress {
                Progress::Status { text } => text.as_str(),
                other => panic!("expected a status, got {other:?}"),
            }
        })
        .collect();
    // The last step's notification races the result (each notification is
    // handled on its own task), so only the first three are certain.
    assert!(texts.len() >= 3, "progress before the result: {texts:?}");
    assert_eq!(texts[..3], ["1/4 (25%)", "2/4 (50%)", "3/4 (75%)"]);
    server.shutdown().await;
}

#[tokio::test]
async fn the_everything_servers_list_changed_makes_it_list_its_tools_again() {
    let Some(config) = everything() else { return };
    let server = McpServer::new(config);
    let mut list_reads = server.watch_tool_list();
    server.tools().await.unwrap();
    // server-everything registers its client-dependent tools once the
    // client is initialized, which sends `notifications/tools/list_changed`:
    // the start's read, then one for the notification.
    tokio::time::timeout(
        Duration::from_secs(10),
        list_reads.wait_for(|reads| *reads >= 2),
    )
    .await
    .expect("the tools are listed again after list_changed")
    .unwrap();
    let registry = registry(&server);
    assert!(
        registry
            .get("everything__simulate-research-query")
            .is_some(),
        "{:?}",
        names(&registry)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn tools_added_and_removed_by_a_server_reach_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let Some((config, tools_file, _)) = fixture(dir.path(), "alpha beta") else {
        return;
    };
    let server = McpServer::new(config);
    server.tools().await.unwrap();
    let registry = registry(&server);
    assert_eq!(
        names(&registry),
        [
            "fixture__alpha",
            "fixture__beta",
            "fixture__crash",
            "fixture__sync"
        ]
    );

    std::fs::write(&tools_file, "beta gamma").unwrap();
    let out = call_named(&registry, "fixture__sync", Value::Null)
        .await
        .unwrap();
    assert_eq!(out.content, "synced");
    until_listed(&registry, "gamma is added and alpha removed", |names| {
        names.iter().any(|n| n == "fixture__gamma") && !names.iter().any(|n| n == "fixture__alpha")
    })
    .await;
    assert!(registry.get("fixture__alpha").is_none());
    let out = call_named(&registry, "fixture__gamma", Value::Null)
        .await
        .unwrap();
    assert_eq!(out.content, "gamma ran");
    server.shutdown().await;
}

#[tokio::test]
async fn a_restarted_server_is_listed_again() {
    let dir = tempfile::tempdir().unwrap();
    let Some((config, tools_file, spawns)) = fixture(dir.path(), "alpha") else {
        return;
    };
    let server = McpServer::new(config);
    server.tools().await.unwrap();
    let registry = registry(&server);
    assert!(registry.get("fixture__alpha").is_some());

    // The next process starts with other tools and sends no list_changed
    // (nothing changes while it runs): only the read at restart sees them.
    std::fs::write(&tools_file, "delta").unwrap();
    let pid = server.pid().await.expect("server runs");
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.is_running().await {
        assert!(Instant::now() < deadline, "death not noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let out = call_named(&registry, "fixture__sync", Value::Null)
        .await
        .unwrap();
    assert_eq!(out.content, "synced");
    assert_eq!(spawn_count(&spawns), 2);
    assert!(
        registry.get("fixture__delta").is_some(),
        "{:?}",
        names(&registry)
    );
    assert!(
        registry.get("fixture__alpha").is_none(),
        "{:?}",
        names(&registry)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_backs_off_instead_of_spawning_on_every_use() {
    let dir = tempfile::tempdir().unwrap();
    let spawns = dir.path().join("spawns");
    let server = McpServer::new(McpServerConfig {
        name: "quitter".into(),
        command: "sh".into(),
        args: vec![
            "-c".into(),
            r#"echo spawn >> "$0"; echo 'no config found' >&2; exit 1"#.into(),
            spawns.display().to_string(),
        ],
        ..Default::default()
    });

    let first = start_error(&server).await;
    assert!(matches!(first, McpError::Initialize { .. }), "{first}");
    assert_eq!(spawn_count(&spawns), 1);

    let second = start_error(&server).await;
    assert_eq!(spawn_count(&spawns), 1, "no spawn while backing off");
    let McpError::BackingOff {
        failures, retry_in, ..
    } = &second
    else {
        panic!("expected a backoff, got {second}");
    };
    assert_eq!(*failures, 1);
    assert!(retry_in <= &Duration::from_secs(1), "{retry_in:?}");
    let message = second.to_string();
    for part in [
        "MCP server `quitter` is not restarted yet",
        "failed 1 time in a row",
        "restarted by the first use in",
        "no config found",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }

    // After the wait the next use tries again, and the wait doubles.
    tokio::time::sleep(*retry_in + Duration::from_millis(100)).await;
    assert!(matches!(
        start_error(&server).await,
        McpError::Initialize { .. }
    ));
    assert_eq!(spawn_count(&spawns), 2);
    match start_error(&server).await {
        McpError::BackingOff {
            failures: 2,
            retry_in,
            ..
        } => assert!(retry_in > Duration::from_secs(1), "{retry_in:?}"),
        other => panic!("expected a second backoff, got {other}"),
    }
    assert_eq!(spawn_count(&spawns), 2);
}

#[tokio::test]
async fn a_server_that_keeps_crashing_is_restarted_once_then_backs_off() {
    let dir = tempfile::tempdir().unwrap();
    let Some((config, _, spawns)) = fixture(dir.path(), "alpha") else {
        return;
    };
    let server = McpServer::new(config);
    server.tools().await.unwrap();
    let registry = registry(&server);

    // A working server that dies is restarted at once…
    let message = failure(call_named(&registry, "fixture__crash", Value::Null).await);
    assert!(
        message.contains("MCP server `fixture` exited")
            && message.contains("it restarts on next use"),
        "{message}"
    );
    // …but dying again before any call succeeds holds the next start back.
    let message = failure(call_named(&registry, "fixture__crash", Value::Null).await);
    assert_eq!(spawn_count(&spawns), 2);
    assert!(
        message.contains("it restarts on the first use in 1.0 s or later"),
        "{message}"
    );
    let message = failure(call_named(&registry, "fixture__alpha", Value::Null).await);
    assert!(
        message.contains("MCP server `fixture` is not restarted yet"),
        "{message}"
    );
    assert_eq!(spawn_count(&spawns), 2, "no spawn while backing off");

    // Once the wait is over the server comes back, and a call that succeeds
    // makes the next crash count as the first again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = call_named(&registry, "fixture__alpha", Value::Null)
        .await
        .unwrap();
    assert_eq!(out.content, "alpha ran");
    assert_eq!(spawn_count(&spawns), 3);
    let message = failure(call_named(&registry, "fixture__crash", Value::Null).await);
    assert!(message.contains("it restarts on next use"), "{message}");
    server.shutdown().await;
}
