//! Sessions past the open-session limit: parked (their watches and MCP
//! servers let go), opened again by their next prompt, never while a
//! background command runs.

use super::*;
use toolwire_test_support::mcp_http;

/// server-everything over stdio, as a client's MCP server, when the test
/// has the npm install (`TOOLWIRE_TEST_MCP_DIR`); none otherwise.
fn everything_stdio() -> Vec<McpServer> {
    mcp_http::mcp_dir()
        .map(|dir| {
            let entry =
                dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
            vec![McpServer::Stdio(
                McpServerStdio::new("everything", "node")
                    .args(vec![entry.display().to_string(), "stdio".to_owned()]),
            )]
        })
        .unwrap_or_default()
}

/// The inotify watches process `pid` holds.
fn inotify_watches(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count()
        })
        .sum()
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| std::fs::read_to_string(p.path().join("stat")).ok())
        .filter(|stat| {
            // `pid (comm) state ppid …`; comm may hold spaces.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1) == Some(&pid.to_string())
        })
        .count()
}

/// Polls `count` until it gives `want` (a closed watcher lets go of its
/// watches on its own thread, a server process takes a moment to exit),
/// for at most 5 s; the last count.
async fn settles_to<T: PartialEq>(count: impl Fn() -> T, want: T) -> T {
    for _ in 0..100 {
        if count() == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    count()
}

/// `toolwire acp` playing `script` with at most one session open, `allow`
/// (tool names) run without asking, its log in `agent.log`: the process,
/// its transport and the log's path.
fn spawn_one_open(
    dirs: &Dirs,
    script: &Path,
    allow: &[&str],
) -> (AgentProcess, Transport, PathBuf) {
    let mut toml = "[acp]\nmax_open_sessions = 1\n[acp.permissions]\n".to_owned();
    for tool in allow {
        toml.push_str(&format!("{tool} = \"allow\"\n"));
    }
    let config = write_file(dirs.home(), "toolwire.toml", &toml);
    let log = dirs.home().join("agent.log");
    let (child, transport, _) = spawn_logging(
        dirs.home(),
        &scripted_config_args(script, &dirs.db(), &config),
        Some(&log),
    );
    (child, transport, log)
}

#[tokio::test]
async fn sessions_past_the_limit_are_parked_and_opened_again_by_their_next_prompt() {
    let dirs = Dirs::new();
    for sub in ["src", "tests", "docs"] {
        std::fs::create_dir(dirs.project().join(sub)).unwrap();
    }
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Writing."
    tool_calls: [{name: write_file, arguments: {path: "out.txt", content: "parked and back\n"}}]
  - text: "Done."
"#,
    );
    let (child, transport, log) = spawn_one_open(&dirs, &script, &["write_file"]);
    let pid = child.id().unwrap();
    let cwd = dirs.cwd();
    // Each session has its own stdio MCP server, when the test has one.
    let servers = everything_stdio();
    let with_servers = !servers.is_empty();
    let (one, three, reopened, stop) = Editor::new()
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let open = async || {
                let request = NewSessionRequest::new(cwd.clone()).mcp_servers(servers.clone());
                Ok::<_, AcpError>(cx.send_request(request).block_task().await?.session_id)
            };
            // What a session holds: watches, and server processes.
            let held = || (inotify_watches(pid), children(pid));
            let first = open().await?;
            let one = held();
            open().await?;
            open().await?;
            // One session open, one watcher: the first two were parked.
            let three = settles_to(held, one).await;
            // The first one's prompt opens it again (and parks the third).
            let stop = prompt(&cx, &first, "write it").await?;
            let reopened = settles_to(held, one).await;
            Ok((one, three, reopened, stop))
        })
        .await;
    assert_eq!(one.0, 4, "the project and its three directories");
    assert_eq!(one.1, usize::from(with_servers), "one MCP server process");
    assert_eq!(
        three, one,
        "three sessions hold one session's watches and servers"
    );
    assert_eq!(reopened, one);
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("out.txt")).unwrap(),
        "parked and back\n"
    );
    drop(child);
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(log.matches("ACP session parked").count(), 3, "{log}");
    assert!(log.contains("ACP session opened again"), "{log}");
}

#[tokio::test]
async fn a_parked_session_opens_while_the_others_prompt_and_a_cancel_while_it_opens_holds() {
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        "steps:\n  - text: \"an answer that streams a few bytes at a time\"\n    chunk_size: 4\n    delay_ms: 20\n",
    );
    let (child, transport, _) = spawn_one_open(&dirs, &script, &[]);
    let cwd = dirs.cwd();
    // Opening a session that has a stdio MCP server takes a moment.
    let servers = everything_stdio();
    let (both, cancelled) = Editor::new()
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let open = async || {
                let request = NewSessionRequest::new(cwd.clone()).mcp_servers(servers.clone());
                Ok::<_, AcpError>(cx.send_request(request).block_task().await?.session_id)
            };
            let a = open().await?;
            let b = open().await?;
            // `a` is parked; it opens while `b` prompts (one more than the
            // limit, until a prompt ends).
            let b_prompt = cx.send_request(prompt_request(&b, "talk"));
            let a_stop = prompt(&cx, &a, "talk").await?;
            let b_stop = b_prompt.block_task().await?.stop_reason;
            // `b` is parked again: a cancel sent right after its prompt, while
            // it opens, ends that prompt `cancelled`.
            let again = cx.send_request(prompt_request(&b, "talk"));
            cx.send_notification(CancelNotification::new(b))?;
            Ok(((a_stop, b_stop), again.block_task().await?.stop_reason))
        })
        .await;
    assert_eq!(both, (StopReason::EndTurn, StopReason::EndTurn));
    assert_eq!(cancelled, StopReason::Cancelled);
    drop(child);
}

#[tokio::test]
async fn a_session_whose_background_command_runs_is_not_parked() {
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Starting it."
    tool_calls: [{name: run_command, arguments: {command: "sleep 10", background: true}}]
  - text: "It runs."
"#,
    );
    let (child, transport, log) = spawn_one_open(&dirs, &script, &["run_command"]);
    let pid = child.id().unwrap();
    let cwd = dirs.cwd();
    let (one, two) = Editor::new()
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let first = new_session(&cx, cwd.clone()).await?;
            assert_eq!(prompt(&cx, &first, "start it").await?, StopReason::EndTurn);
            let one = inotify_watches(pid);
            new_session(&cx, cwd.clone()).await?;
            Ok((one, inotify_watches(pid)))
        })
        .await;
    assert_eq!(two, 2 * one, "both sessions stay open");
    drop(child);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("ACP session parked"), "{log}");
}
