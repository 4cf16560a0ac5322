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
use toolwire_tools::mcp::{Launch, McpError, McpServer, McpServerConfig, connect_all};
use toolwire_tools::{
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
        command: Some("node".into()),
        args: vec![entry.display().to_string(), "stdio".into()],
        ..Default::default()
    })
}

mod mcp_mock;
mod support;

use mcp_mock::{Answer, McpMock, capture_logs};
use toolwire_test_support::mcp_http::{self, HttpServer, mcp_dir};

/// A small MCP server on the SDK that server-everything is built on (so it
/// needs nothing beyond what `scripts/test` installs), for what
/// server-everything cannot be asked to do: its tools are the names in the
/// file `FIXTURE_TOOLS` when it starts, and its `sync` tool makes them match
/// the file again (the SDK sends `notifications/tools/list_changed` for each
/// tool added or removed). `crash` exits without answering. Each start
/// appends a line to `FIXTURE_SPAWNS`. With `FIXTURE_HTTP` set it serves one
/// streamable HTTP session on the socket it gets as stdin instead of stdio
/// (see [`HttpServer::start`]), and writes `TOOLWIRE_TEST_LISTENING PORT` to
/// stderr once it listens.
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
if (process.env.FIXTURE_HTTP) {
  const http = require('http');
  const { randomUUID } = require('crypto');
  const { StreamableHTTPServerTransport } = require(path.join(sdk, 'server/streamableHttp.js'));
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID() });
  server.connect(transport).then(() => {
    const listener = http.createServer((req, res) => transport.handleRequest(req, res));
    listener.listen({ fd: 0 }, () => {
      process.stderr.write(`TOOLWIRE_TEST_LISTENING ${listener.address().port}\n`);
    });
  });
} else {
  server.connect(new StdioServerTransport());
}
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
        command: Some("node".into()),
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
    registry.specs().iter().map(|s| s.name.clone()).collect()
}

/// Waits (up to 10 s) until `server` no longer counts as running.
async fn until_stopped(server: &McpServer, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.is_running().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_listed(registry: &ToolRegistry, name: &str, listed: bool) {
    assert_eq!(
        registry.get(name).is_some(),
        listed,
        "{name}: {:?}",
        names(registry)
    );
}

/// Calls the fixture's `sync` tool, which announces a change of its tool
/// list (`notifications/tools/list_changed`).
async fn sync(registry: &ToolRegistry) {
    let out = call_named(registry, "fixture__sync", Value::Null)
        .await
        .unwrap();
    assert_eq!(out.content, "synced");
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
    let (servers, warnings) = connect_all([config], &Launch::unconfined()).await;
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
    // The image itself comes with the text, checked to be a PNG.
    assert_eq!(out.images.len(), 1, "{out:?}");
    assert_eq!(out.images[0].media_type(), "image/png");
}

#[tokio::test]
async fn a_server_that_fails_to_start_is_reported_and_others_still_connect() {
    let mut configs = vec![
        McpServerConfig {
            name: "missing".into(),
            command: Some("/nonexistent/toolwire-mcp-server".into()),
            ..Default::default()
        },
        McpServerConfig {
            name: "quitter".into(),
            command: Some("sh".into()),
            args: vec!["-c".into(), "echo 'no config found' >&2; exit 3".into()],
            ..Default::default()
        },
    ];
    let real = everything();
    configs.extend(real.clone());
    let (servers, warnings) = connect_all(configs, &Launch::unconfined()).await;
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
    let server = McpServer::new(config, Launch::unconfined());
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
    let server = McpServer::new(config, Launch::unconfined());
    let tools = server.tools().await.unwrap();
    let echo = find(&tools, "everything__echo");
    let first_pid = server.pid().await.expect("server runs");
    let list_reads = server.watch_tool_list();
    let reads_before = *list_reads.borrow();

    kill(Pid::from_raw(first_pid as i32), Signal::SIGKILL).unwrap();
    until_stopped(&server, "death not noticed").await;

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
    time_out_and_cancel(config).await;
}

/// A call of server-everything (`config`) that takes too long times out, one
/// whose turn is cancelled stops, and the server still answers.
async fn time_out_and_cancel(config: McpServerConfig) {
    let server = McpServer::new(
        McpServerConfig {
            timeout_secs: Some(1),
            ..config
        },
        Launch::unconfined(),
    );
    let tools = server.tools().await.unwrap();
    let long = find(&tools, "everything__trigger-long-running-operation");
    let echo = find(&tools, "everything__echo");

    // The guards only catch a call that waited for the 60 s operation.
    let result = tokio::time::timeout(Duration::from_secs(30), call(&long, long_operation(60)))
        .await
        .expect("the call ended at its 1 s timeout");
    assert!(matches!(result, Err(ToolError::TimedOut(1))), "{result:?}");

    let ctx = ToolContext::detached("call-2");
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let result = tokio::time::timeout(Duration::from_secs(30), long.call(long_operation(60), ctx))
        .await
        .expect("the call ended at the cancel");
    assert!(matches!(result, Err(ToolError::Cancelled)), "{result:?}");

    // Neither a timeout nor a cancellation costs the server.
    let out = call(&echo, json!({"message": "still here"})).await.unwrap();
    assert_eq!(out.content, "Echo: still here");
    server.shutdown().await;
}

#[tokio::test]
async fn progress_notifications_arrive_as_the_calls_progress_before_its_result() {
    let Some(config) = everything() else { return };
    progress_before_the_result(config).await;
}

/// server-everything (`config`) reports the progress of a long operation,
/// which arrives as the call's progress before its result.
async fn progress_before_the_result(config: McpServerConfig) {
    let server = McpServer::new(config, Launch::unconfined());
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
    let server = McpServer::new(config, Launch::unconfined());
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
    tools_follow_the_servers_list(McpServer::new(config, Launch::unconfined()), &tools_file).await;
}

/// `server` (the fixture, listing alpha and beta from `tools_file`) changes
/// its list: the registry follows.
async fn tools_follow_the_servers_list(server: Arc<McpServer>, tools_file: &Path) {
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

    std::fs::write(tools_file, "beta gamma").unwrap();
    sync(&registry).await;
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
async fn tools_added_and_removed_by_an_http_server_reach_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let Some((config, tools_file, _)) = fixture(dir.path(), "alpha beta") else {
        return;
    };
    let http = fixture_over_http(&config).await;
    // The notifications come on the session's own event stream (a GET),
    // not in answer to any request.
    let server = McpServer::new(
        McpServerConfig::http("fixture", http.url.clone()),
        Launch::unconfined(),
    );
    tools_follow_the_servers_list(server, &tools_file).await;
}

/// The fixture server `config` on streamable HTTP.
async fn fixture_over_http(config: &McpServerConfig) -> HttpServer {
    let (args, env) = (config.args.clone(), config.env.clone());
    HttpServer::start(move || {
        let mut node = tokio::process::Command::new("node");
        node.args(&args).envs(&env).env("FIXTURE_HTTP", "1");
        node
    })
    .await
}

#[tokio::test]
async fn an_http_session_whose_event_stream_is_lost_is_replaced_by_the_next_use() {
    let dir = tempfile::tempdir().unwrap();
    let Some((config, tools_file, spawns)) = fixture(dir.path(), "alpha") else {
        return;
    };
    let mut http = fixture_over_http(&config).await;
    let server = McpServer::new(
        McpServerConfig::http("fixture", http.url.clone()),
        Launch::unconfined(),
    );
    server.tools().await.unwrap();
    let registry = registry(&server);

    // rmcp gives up resuming the session's event stream after a few
    // attempts; the worker of the session goes on, and without the stream
    // no `tools/list_changed` would arrive. It counts as a lost connection.
    http.kill().await;
    until_stopped(&server, "the loss of the event stream is not noticed").await;

    // Back (a new process that knows nothing of the session): the next
    // call opens a new session, whose event stream brings the changes.
    std::fs::write(&tools_file, "delta").unwrap();
    http.restart().await;
    sync(&registry).await;
    assert_eq!(spawn_count(&spawns), 2);
    assert_listed(&registry, "fixture__delta", true);
    std::fs::write(&tools_file, "delta epsilon").unwrap();
    sync(&registry).await;
    until_listed(&registry, "epsilon is added", |names| {
        names.iter().any(|n| n == "fixture__epsilon")
    })
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_restarted_server_is_listed_again() {
    let dir = tempfile::tempdir().unwrap();
    let Some((config, tools_file, spawns)) = fixture(dir.path(), "alpha") else {
        return;
    };
    let server = McpServer::new(config, Launch::unconfined());
    server.tools().await.unwrap();
    let registry = registry(&server);
    assert!(registry.get("fixture__alpha").is_some());

    // The next process starts with other tools and sends no list_changed
    // (nothing changes while it runs): only the read at restart sees them.
    std::fs::write(&tools_file, "delta").unwrap();
    let pid = server.pid().await.expect("server runs");
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    until_stopped(&server, "death not noticed").await;

    sync(&registry).await;
    assert_eq!(spawn_count(&spawns), 2);
    assert_listed(&registry, "fixture__delta", true);
    assert_listed(&registry, "fixture__alpha", false);
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_backs_off_instead_of_spawning_on_every_use() {
    let dir = tempfile::tempdir().unwrap();
    let spawns = dir.path().join("spawns");
    let server = McpServer::new(
        McpServerConfig {
            name: "quitter".into(),
            command: Some("sh".into()),
            args: vec![
                "-c".into(),
                r#"echo spawn >> "$0"; echo 'no config found' >&2; exit 1"#.into(),
                spawns.display().to_string(),
            ],
            ..Default::default()
        },
        Launch::unconfined(),
    );

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
    let server = McpServer::new(config, Launch::unconfined());
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

// ---------------------------------------------------------------------
// Streamable HTTP.

/// server-everything on streamable HTTP (killed when dropped) and the
/// config that reaches it; `None` when the test is skipped.
async fn everything_http() -> Option<(HttpServer, McpServerConfig)> {
    let dir = mcp_dir()?;
    let http = HttpServer::everything(&dir).await;
    let config = McpServerConfig::http(SERVER, http.url.clone());
    Some((http, config))
}

/// Secrets the tests below put in URLs and headers, which no error, warning
/// or log line may show.
const SECRETS: [&str; 3] = ["s3cret", "t0ken", "hunter2"];

fn assert_no_secret(text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{secret:?} shows in {text}");
    }
}

#[tokio::test]
async fn lists_and_calls_the_everything_server_over_http() {
    let Some((http, config)) = everything_http().await else {
        return;
    };
    let (servers, warnings) = connect_all([config], &Launch::unconfined()).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(servers.len(), 1);
    let server = &servers[0];
    assert!(server.is_running().await);
    assert_eq!(
        server.pid().await,
        None,
        "no process of toolwire's serves it"
    );
    let registry = registry(server);
    let specs = registry.specs();
    assert!(specs.len() >= 5, "only {} tools", specs.len());
    assert!(specs.iter().all(|s| s.server.as_deref() == Some(SERVER)));

    let echo = registry.get("everything__echo").expect("echo is listed");
    assert!(echo.spec().read_only, "echo is annotated readOnlyHint");
    assert!(echo.spec().parameters["properties"]["message"].is_object());
    let out = call(&echo, json!({"message": "hello over http"}))
        .await
        .unwrap();
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.content, "Echo: hello over http");
    match call(&echo, json!({"nope": 1})).await {
        Ok(out) => assert!(out.is_error && out.content.contains("message"), "{out:?}"),
        Err(ToolError::InvalidArguments(message)) => assert!(message.contains("everything")),
        Err(other) => panic!("unexpected error {other:?}"),
    }
    let out = call_named(&registry, "everything__get-tiny-image", Value::Null)
        .await
        .unwrap();
    assert!(out.content.contains("[image: image/png]"), "{out:?}");
    // The image itself comes with the text, checked to be a PNG.
    assert_eq!(out.images.len(), 1, "{out:?}");
    assert_eq!(out.images[0].media_type(), "image/png");

    server.shutdown().await;
    assert!(!server.is_running().await);
    drop(http);
}

#[tokio::test]
async fn progress_arrives_over_http_before_the_result() {
    let Some((_http, config)) = everything_http().await else {
        return;
    };
    progress_before_the_result(config).await;
}

#[tokio::test]
async fn http_calls_time_out_and_can_be_cancelled() {
    let Some((_http, config)) = everything_http().await else {
        return;
    };
    time_out_and_cancel(config).await;
}

#[tokio::test]
async fn an_http_server_killed_during_a_call_fails_it_and_the_next_call_reconnects() {
    let Some(dir) = mcp_dir() else { return };
    let (logs, _capture) = capture_logs();
    let mut http = HttpServer::everything(&dir).await;
    // The server ignores the query; toolwire must not show it.
    let server = McpServer::new(
        McpServerConfig::http(SERVER, format!("{}?key=s3cret", http.url)),
        Launch::unconfined(),
    );
    let tools = server.tools().await.unwrap();
    let long = find(&tools, "everything__trigger-long-running-operation");
    let echo = find(&tools, "everything__echo");

    let running = tokio::spawn({
        let long = Arc::clone(&long);
        async move { call(&long, long_operation(30)).await }
    });
    // Time for the request to reach the server (the operation takes 30 s).
    tokio::time::sleep(Duration::from_secs(1)).await;
    http.kill().await;
    let result = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the call ends soon after the server dies")
        .unwrap();
    let message = failure(result);
    assert!(
        message.contains(&format!(
            "MCP server `everything` at {} disconnected",
            http.url
        )) && message.contains("it reconnects on next use"),
        "{message}"
    );
    assert_no_secret(&message);

    // Back where it was: the next call opens a new session.
    http.restart().await;
    let out = call(&echo, json!({"message": "again"})).await.unwrap();
    assert_eq!(out.content, "Echo: again");
    server.shutdown().await;
    assert_no_secret(&logs.text());
}

#[tokio::test]
async fn an_http_server_restarted_while_idle_serves_the_next_call_in_a_new_session() {
    let Some(dir) = mcp_dir() else { return };
    let mut http = HttpServer::everything(&dir).await;
    let server = McpServer::new(
        McpServerConfig::http(SERVER, http.url.clone()),
        Launch::unconfined(),
    );
    let tools = server.tools().await.unwrap();
    let echo = find(&tools, "everything__echo");
    let list_reads = server.watch_tool_list();
    let reads_before = *list_reads.borrow();

    // The new process knows nothing of the session. Either the call finds
    // out (400 `No valid session ID provided`: the call did not run, and
    // runs in a new session) or, if the restart took longer than the
    // resumption of the event stream, that loss was noticed first and the
    // call opens a new session anyway. Either way the call is not lost.
    http.kill().await;
    http.restart().await;
    // What the server answers to a session it does not know: the answer
    // the mock servers below give, which must be taken as a refusal.
    let answer = reqwest::Client::new()
        .post(&http.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", "no-such-session")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"message": "x"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(
        answer["error"],
        json!({"code": -32000, "message": "Bad Request: No valid session ID provided"})
    );
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        call(&echo, json!({"message": "back"})),
    )
    .await
    .expect("the call does not wait for its timeout")
    .unwrap();
    assert_eq!(out.content, "Echo: back");
    assert!(
        *list_reads.borrow() > reads_before,
        "the tools are listed again in the new session"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_http_server_where_nothing_listens_is_reported_with_its_url() {
    let (logs, _capture) = capture_logs();
    let nowhere = mcp_http::nothing_listens();
    let shown = nowhere.url.replace("http://", "http://user@");
    let url = format!("{shown}?key=s3cret#t0ken").replace("user@", "user:hunter2@");
    let (servers, warnings) = connect_all(
        [McpServerConfig::http("nowhere", url.clone())],
        &Launch::unconfined(),
    )
    .await;
    assert!(servers.is_empty());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert!(
        warning.contains(&format!(
            "MCP server `nowhere` at {} failed to connect",
            nowhere.url
        )) && warning.contains("Connection refused"),
        "{warning}"
    );
    assert_no_secret(warning);

    let server = McpServer::new(
        McpServerConfig::http("nowhere", url.clone()),
        Launch::unconfined(),
    );
    let first = start_error(&server).await;
    assert!(
        matches!(&first, McpError::Connect { server, url: at, .. } if server == "nowhere" && *at == nowhere.url),
        "{first}"
    );
    assert_no_secret(&format!("{first} {first:?} {server:?}"));
    // Not dialled again by every use.
    let second = start_error(&server).await;
    let message = second.to_string();
    assert!(
        matches!(second, McpError::BackingOff { failures: 1, .. })
            && message.contains("MCP server `nowhere` is not reconnected yet")
            && message.contains(&nowhere.url),
        "{message}"
    );
    assert_no_secret(&message);
    assert_no_secret(&logs.text());
}

#[tokio::test]
async fn http_headers_are_sent_and_an_http_error_names_the_server_and_url() {
    let (logs, _capture) = capture_logs();
    let mock = support::MockServer::start(vec![support::Reply::Status {
        code: 401,
        headers: vec![],
        body: "missing token".into(),
    }])
    .await;
    let url = format!("{}/mcp", mock.url);
    let server = McpServer::new(
        McpServerConfig {
            headers: [
                ("Authorization".to_owned(), "Bearer t0ken".to_owned()),
                ("X-Team".to_owned(), "toolwire".to_owned()),
            ]
            .into(),
            ..McpServerConfig::http("guarded", format!("{url}?key=s3cret"))
        },
        Launch::unconfined(),
    );
    let error = start_error(&server).await;
    let message = error.to_string();
    assert!(
        message.contains(&format!("MCP server `guarded` at {url} failed to connect"))
            && message.contains("401"),
        "{message}"
    );
    let received = mock.received();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].path, "/mcp?key=s3cret");
    assert_eq!(received[0].header("authorization"), Some("Bearer t0ken"));
    assert_eq!(received[0].header("x-team"), Some("toolwire"));
    assert_eq!(received[0].body["method"], "initialize");

    // Nor in the cause's chain, nor when the server or config is debugged.
    let mut chain = format!("{error:?}");
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain.push_str(&format!(" {cause}"));
        source = cause.source();
    }
    chain.push_str(&format!(" {server:?}"));
    assert_no_secret(&chain);
    assert_no_secret(&logs.text());
}

/// An HTTP server whose `tools/call` `on_call` answers, and its tool.
async fn mock_server(
    on_call: impl Fn(&mcp_mock::Received) -> Answer + Send + Sync + 'static,
) -> (McpMock, Arc<McpServer>, Arc<dyn Tool>) {
    let mock = McpMock::start(on_call).await;
    let server = McpServer::new(
        McpServerConfig::http("mock", mock.url.clone()),
        Launch::unconfined(),
    );
    let tools = server.tools().await.unwrap();
    let act = find(&tools, "mock__act");
    (mock, server, act)
}

#[tokio::test]
async fn a_call_that_fails_on_the_server_is_reported_and_never_sent_again() {
    // server-everything's own answer when handling a request throws: the
    // server may have run the call, so it must not run again. Without an
    // `id` it still answers this call, at once.
    let (mock, server, act) =
        mock_server(|_| Answer::error(500, Some(&Value::Null), -32603, "Internal server error"))
            .await;
    let message = failure(
        tokio::time::timeout(Duration::from_secs(30), call(&act, Value::Null))
            .await
            .expect("answered at once, not retried"),
    );
    assert_eq!(message, "MCP server `mock`: Internal server error");
    assert_eq!(mock.calls().len(), 1, "{:?}", mock.calls());
    // The server answered: the session is kept.
    assert!(server.is_running().await);

    // The same with 200 and no `id` at all, and with a 400 that is not
    // about the session.
    for answer in [
        Answer::error(200, None, -32603, "disk full"),
        Answer::error(
            400,
            None,
            -32000,
            "Bad Request: Unsupported protocol version",
        ),
    ] {
        let expected = answer.body["error"]["message"].as_str().unwrap().to_owned();
        let answer = std::sync::Mutex::new(Some(answer));
        let (mock, _server, act) = mock_server(move |request| {
            answer
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| Answer::text(request, "ran twice"))
        })
        .await;
        let message = failure(call(&act, Value::Null).await);
        assert_eq!(message, format!("MCP server `mock`: {expected}"));
        assert_eq!(mock.calls().len(), 1, "{:?}", mock.calls());
    }
}

/// server-everything's answer to a request in a session it does not know,
/// with the request's `id` as servers that parse the body give it.
fn no_valid_session(request: &mcp_mock::Received) -> Answer {
    Answer::error(
        400,
        Some(&request.body["id"]),
        -32000,
        "Bad Request: No valid session ID provided",
    )
}

#[tokio::test]
async fn a_call_refused_for_its_session_runs_once_in_a_new_session() {
    let (mock, server, act) = mock_server(|request| match request.session() {
        Some("s1") => no_valid_session(request),
        _ => Answer::text(request, "acted"),
    })
    .await;
    let out = call(&act, Value::Null).await.unwrap();
    assert_eq!(out.content, "acted");
    let sessions: Vec<_> = mock
        .calls()
        .iter()
        .map(|c| c.session().map(str::to_owned))
        .collect();
    assert_eq!(sessions, [Some("s1".to_owned()), Some("s2".to_owned())]);
    assert!(server.is_running().await);
    // The new session serves the next calls.
    call(&act, Value::Null).await.unwrap();
    assert_eq!(mock.calls().len(), 3);
    assert_eq!(mock.calls()[2].session(), Some("s2"));
}

#[tokio::test]
async fn a_session_refused_again_fails_the_call_with_the_servers_words_and_is_dropped() {
    let (logs, _capture) = capture_logs();
    // Refuses the first two sessions: the call's own and its retry's.
    let (mock, server, act) = mock_server(|request| match request.session() {
        Some("s1" | "s2") => no_valid_session(request),
        _ => Answer::text(request, "acted"),
    })
    .await;
    let message = failure(call(&act, Value::Null).await);
    assert!(
        message.starts_with(&format!("MCP server `mock` at {} disconnected", mock.url))
            && message.contains(
                "it does not know the session: it answered `Bad Request: No valid session \
                 ID provided` (JSON-RPC error -32000)"
            )
            && message.contains("in a second session")
            && message.contains("it reconnects on next use"),
        "{message}"
    );
    assert_eq!(mock.calls().len(), 2, "once per session");
    assert!(!server.is_running().await, "the refused session is dropped");
    assert!(
        logs.text().contains("does not know the session")
            && logs.text().contains("No valid session ID provided"),
        "the server's words are logged: {}",
        logs.text()
    );

    // Not refused for good: the next use opens another session.
    let out = call(&act, Value::Null).await.unwrap();
    assert_eq!(out.content, "acted");
    assert_eq!(mock.calls()[2].session(), Some("s3"));
}

#[tokio::test]
async fn the_new_session_of_a_refused_call_counts_against_the_calls_time() {
    let mock = McpMock::start(no_valid_session).await;
    let server = McpServer::new(
        McpServerConfig {
            timeout_secs: Some(1),
            ..McpServerConfig::http("mock", mock.url.clone())
        },
        Launch::unconfined(),
    );
    let tools = server.tools().await.unwrap();
    let act = find(&tools, "mock__act");
    // The new session's `initialize` gets no answer.
    mock.stall.store(true, std::sync::atomic::Ordering::SeqCst);
    // The stall never ends: the guard only catches a call that waits on it.
    let result = tokio::time::timeout(Duration::from_secs(30), call(&act, Value::Null))
        .await
        .expect("the call ended at its 1 s timeout");
    assert!(matches!(result, Err(ToolError::TimedOut(1))), "{result:?}");
    assert_eq!(mock.calls().len(), 1);
}

#[tokio::test]
async fn a_config_with_both_command_and_url_is_reported_without_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let spawns = dir.path().join("spawns");
    let nowhere = mcp_http::nothing_listens();
    let both = McpServerConfig {
        args: vec![
            "-c".into(),
            r#"echo spawn >> "$0""#.into(),
            spawns.display().to_string(),
        ],
        url: Some(nowhere.url.clone()),
        ..McpServerConfig::stdio("both", "sh")
    };
    let (servers, warnings) = connect_all([both], &Launch::unconfined()).await;
    assert!(servers.is_empty());
    assert_eq!(
        warnings,
        [
            "MCP server `both` is not configured right: give either `command` (a stdio server) \
          or `url` (a streamable HTTP server), not both"
        ]
    );
    assert_eq!(spawn_count(&spawns), 0);
}
