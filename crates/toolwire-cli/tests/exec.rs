//! `toolwire exec`, run as a user would: the real binary, a real SQLite
//! file, the scripted provider, and a process killed mid-turn.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolwire_core::{ContentBlock, ConversationId, Role, StopReason};

fn toolwire(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolwire"));
    // The default database goes to the per-user data directory: this
    // test's, never the real one.
    cmd.current_dir(dir)
        .env_remove("RUST_LOG")
        .env("XDG_DATA_HOME", dir.join(".xdg"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TOOLWIRE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn script(dir: &Path, yaml: &str) -> String {
    let path = dir.join("script.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

const READ_THEN_ANSWER: &str = r#"
steps:
  - text: "Reading."
    tool_calls: [{name: read_file, arguments: {path: "notes.txt"}}]
  - text: "The notes say hello."
"#;

#[test]
fn answers_on_stdout_activity_on_stderr_and_exit_zero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
    let script = script(dir.path(), READ_THEN_ANSWER);
    let out = toolwire(dir.path())
        .args([
            "exec",
            "--provider",
            "scripted",
            "--script",
            &script,
            "what do the notes say?",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "Reading.\nThe notes say hello.\n");
    assert!(
        stderr.contains("→ Calling read_file…") && stderr.contains("path: notes.txt"),
        "{stderr}"
    );
    assert!(
        dir.path().join(".xdg/toolwire/toolwire.db").exists(),
        "default database in the per-user data directory"
    );
    assert!(!dir.path().join("toolwire.db").exists());
}

#[test]
fn a_database_left_in_the_working_directory_is_kept_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
    let script = script(dir.path(), READ_THEN_ANSWER);
    let run = || {
        toolwire(dir.path())
            .args(["exec", "--provider", "scripted", "--script", &script, "hi"])
            .output()
            .unwrap()
    };
    // Made where the default was before it moved, by --db.
    let db = "sqlite://toolwire.db";
    let made = toolwire(dir.path())
        .args([
            "exec",
            "--db",
            db,
            "--provider",
            "scripted",
            "--script",
            &script,
            "hi",
        ])
        .output()
        .unwrap();
    assert!(made.status.success());
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("using ./toolwire.db from the working directory")
            && stderr.contains("mv toolwire.db*"),
        "{stderr}"
    );
    assert!(!dir.path().join(".xdg/toolwire/toolwire.db").exists());
}

#[test]
fn json_mode_prints_every_event_and_conversations_continue() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
    let script = script(dir.path(), READ_THEN_ANSWER);
    let db = format!("sqlite://{}", dir.path().join("t.db").display());
    let out = toolwire(dir.path())
        .args([
            "exec",
            "--json",
            "--db",
            &db,
            "--provider",
            "scripted",
            "--script",
            &script,
            "hi",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let events: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "every event, in order"
    );
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for t in [
        "turn_started",
        "tool_call_started",
        "argument_field",
        "tool_execution_completed",
        "final_response",
    ] {
        assert!(types.contains(&t), "{t} missing from {types:?}");
    }
    assert_eq!(events.last().unwrap()["reason"], "end_turn");
    let conversation = events[0]["conversation_id"].as_str().unwrap().to_owned();

    // A second turn in the same conversation sees the first.
    let out = toolwire(dir.path())
        .args([
            "exec",
            "--json",
            "--db",
            &db,
            "--provider",
            "scripted",
            "--script",
            &script,
        ])
        .args(["--conversation", &conversation, "and again?"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: Value = serde_json::from_str(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["conversation_id"], conversation.as_str());
}

#[test]
fn failures_exit_non_zero_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path(), "steps:\n  - error: \"model overloaded\"\n");
    let out = toolwire(dir.path())
        .args(["exec", "--provider", "scripted", "--script", &script, "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("llm_api_error") && stderr.contains("model overloaded"),
        "{stderr}"
    );

    let out = toolwire(dir.path())
        .args(["exec", "--conversation", "not-a-uuid", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid conversation id"));

    let out = toolwire(dir.path())
        .args(["exec", "--db", "mysql://x", "hi"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
}

/// The process is killed while a tool runs, after an earlier tool
/// completed. On restart every completed step is in the tree and the turn
/// is marked interrupted.
#[tokio::test]
async fn a_crash_mid_turn_keeps_completed_steps_and_marks_the_turn_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
    let script = script(
        dir.path(),
        r#"
turns:
  - steps:
      - tool_calls: [{name: read_file, arguments: {path: "notes.txt"}}]
      - text: "Now a long one."
        tool_calls: [{name: run_command, arguments: {command: "sleep 60"}}]
      - text: "never reached"
  - steps:
      - text: "Back after the restart."
"#,
    );
    let db_path = dir.path().join("crash.db");
    let db = format!("sqlite://{}", db_path.display());
    let mut child = toolwire(dir.path())
        .args([
            "exec",
            "--json",
            "--db",
            &db,
            "--provider",
            "scripted",
            "--script",
            &script,
            "go",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Read events until the long tool has started, then kill the process.
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut conversation = None;
        for line in std::io::BufReader::new(stdout).lines() {
            let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
            if event["type"] == "turn_started" {
                conversation = event["conversation_id"].as_str().map(str::to_owned);
            }
            if event["type"] == "tool_execution_started" && event["name"] == "run_command" {
                return conversation;
            }
        }
        None
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let conversation: ConversationId = reader
        .join()
        .unwrap()
        .expect("the long tool started")
        .parse()
        .unwrap();

    // Restart: a new process opens the same database.
    let out = toolwire(dir.path())
        .args([
            "exec",
            "--db",
            &db,
            "--provider",
            "scripted",
            "--script",
            &script,
        ])
        .args(["--conversation", &conversation.to_string(), "status?"])
        .output()
        .unwrap();
    assert!(out.status.code().is_some());

    let store = toolwire_store::open(&db).await.unwrap();
    let events = store.events_since(conversation, 0, 10_000).await.unwrap();
    let interrupted = events.iter().find_map(|e| match &e.event {
        toolwire_core::AgentEvent::Stopped {
            run_id,
            reason: StopReason::Interrupted,
            ..
        } => Some(*run_id),
        _ => None,
    });
    let run = store
        .run(interrupted.expect("an interrupted stop event"))
        .await
        .unwrap();
    assert_eq!(run.stop_reason, Some(StopReason::Interrupted));

    // The first turn's completed steps: user, assistant with read_file,
    // its result, then the assistant message with run_command.
    let first_user = events
        .iter()
        .find_map(|e| match &e.event {
            toolwire_core::AgentEvent::TurnStarted { message, .. } => Some(message.id),
            _ => None,
        })
        .unwrap();
    let mut node = store.children(first_user).await.unwrap();
    let assistant = node.remove(0);
    assert_eq!(assistant.tool_uses().next().unwrap().2, "read_file");
    let result = store.children(assistant.id).await.unwrap().remove(0);
    assert_eq!(result.role, Role::Tool);
    let ContentBlock::ToolResult { content, .. } = &result.content[0] else {
        panic!()
    };
    assert!(content.contains("hello"));
    let second = store.children(result.id).await.unwrap().remove(0);
    assert_eq!(second.text(), "Now a long one.");
    assert_eq!(second.tool_uses().next().unwrap().2, "run_command");
}

/// The processes whose command line holds `word` (zombies left out).
fn running_with(word: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'))
            });
            !zombie
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|w| w == word.as_bytes()))
        })
        .collect()
}

/// The hidden helper subcommand, end to end: the model's `run_command`
/// runs confined by `toolwire` itself (current_exe), with the database in
/// the workspace, keys in toolwire's environment and a loopback server.
#[test]
fn exec_runs_commands_in_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside-secret").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let marker = format!("{}", 800_000_000 + std::process::id());
    // Output words are computed ($((…))) so that the command's own text,
    // which the events carry too, cannot match them.
    let command = format!(
        "env; cat toolwire.db >/dev/null 2>&1 && echo DB-$((1+1)) || echo DB-$((2+2)); \
         cat {out}/secret.txt || echo OUT-$((2+2)); \
         echo x > {out}/w.txt && echo WRITE-$((1+1)); \
         python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\" \
         >/dev/null 2>&1 && echo NET-$((1+1)) || echo NET-$((2+2)); \
         setsid sleep {marker} & echo started",
        out = outside.path().display()
    );
    let yaml = format!(
        "steps:\n  - text: \"Running.\"\n    tool_calls: [{{name: run_command, arguments: {{command: {}}}}}]\n  - text: \"Done.\"\n",
        serde_json::to_string(&command).unwrap()
    );
    let script = script(dir.path(), &yaml);
    let run = |mode: &str| {
        let out = toolwire(dir.path())
            .env("OPENAI_API_KEY", "sk-e2e-openai")
            .env("ANTHROPIC_API_KEY", "sk-e2e-anthropic")
            .env("TOOLWIRE_API_KEYS", "tw-e2e-key")
            .args([
                "exec",
                "--json",
                "--db",
                "sqlite://toolwire.db",
                "--sandbox",
                mode,
                "--provider",
                "scripted",
                "--script",
                &script,
                "go",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };

    let events = run("workspace-write");
    assert!(events.contains("started"), "{events}");
    for denied in ["DB-4", "OUT-4", "NET-4"] {
        assert!(events.contains(denied), "{denied} missing: {events}");
    }
    for key in [
        "sk-e2e-openai",
        "sk-e2e-anthropic",
        "tw-e2e-key",
        "TOOLWIRE_",
    ] {
        assert!(!events.contains(key), "{key} reached the command: {events}");
    }
    assert!(!events.contains("WRITE-2") && !events.contains("outside-secret"));
    assert!(!outside.path().join("w.txt").exists());
    assert_eq!(
        running_with(&marker),
        Vec::<u32>::new(),
        "setsid child left behind"
    );

    // The policy decides: the same command under full.
    let events = run("full");
    for allowed in ["DB-2", "outside-secret", "WRITE-2", "NET-2"] {
        assert!(events.contains(allowed), "{allowed} missing: {events}");
    }
    assert!(!events.contains("sk-e2e-openai"));
    assert_eq!(running_with(&marker), Vec::<u32>::new());
}

/// `--provider openai-responses` speaks the Responses API: a tool loop
/// against a mock `/responses` server, the call and its output sent back
/// as items, the usage (cached tokens included) in `--json`'s events.
#[tokio::test(flavor = "multi_thread")]
async fn exec_with_openai_responses_runs_a_tool_loop() {
    use toolwire_test_support::{Call, MockServer, Reply, responses_sse};

    let server = MockServer::start(vec![
        Reply::sse(responses_sse(
            "Reading.",
            &[Call {
                id: "call_notes",
                name: "read_file",
                arguments: serde_json::json!({"path": "notes.txt"}),
            }],
        )),
        Reply::sse(responses_sse("The notes say hello.", &[])),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
    let db = format!("sqlite://{}", dir.path().join("t.db").display());
    let mut cmd = toolwire(dir.path());
    cmd.env("OPENAI_API_KEY", "sk-test").args([
        "exec",
        "--json",
        "--db",
        &db,
        "--provider",
        "openai-responses",
        "--base-url",
        &server.url,
        "--model",
        "o4-mini",
        "what do the notes say?",
    ]);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = events
        .iter()
        .find(|e| e["type"] == "final_response")
        .expect("a final response");
    assert_eq!(last["usage"]["prompt_tokens"], 200);
    assert_eq!(last["usage"]["cached_tokens"], 80);

    let received = server.received();
    assert_eq!(received.len(), 2);
    assert!(received.iter().all(|r| r.path == "/responses"));
    assert_eq!(received[0].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(received[0].body["model"], "o4-mini");
    let items = received[1].body["input"].as_array().unwrap();
    let call = items
        .iter()
        .find(|i| i["type"] == "function_call")
        .expect("the call is sent back");
    assert_eq!(
        (&call["call_id"], &call["name"]),
        (&Value::from("call_notes"), &Value::from("read_file"))
    );
    let output = items
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .expect("its output is sent");
    assert_eq!(output["call_id"], "call_notes");
    assert!(
        output["output"].as_str().unwrap().contains("hello"),
        "{output}"
    );
}

/// `provider = "openai-responses"` in a config file means the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_config_file_names_the_responses_provider() {
    use toolwire_test_support::{MockServer, Reply, responses_sse};

    let server = MockServer::start(vec![Reply::sse(responses_sse("Hi.", &[]))]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolwire.toml");
    std::fs::write(
        &config,
        format!(
            "provider = \"openai-responses\"\nmodel = \"o4-mini\"\nbase_url = \"{}\"\n",
            server.url
        ),
    )
    .unwrap();
    let db = format!("sqlite://{}", dir.path().join("t.db").display());
    let mut cmd = toolwire(dir.path());
    cmd.args(["exec", "--db", &db, "--config"])
        .arg(&config)
        .arg("hello");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Hi."));
    let received = server.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/responses");
    assert_eq!(received[0].body["input"][0]["content"][0]["text"], "hello");
}

/// toolwire's process is non-dumpable: a command that walks up its
/// ancestors through `/proc` is refused toolwire's `environ` (the provider
/// keys), while the helper's, between the two, reads fine. toolwire runs
/// as an ordinary user (through `setpriv` when the test runs as root): no
/// PID namespace for the helper, so the command sees the machine's `/proc`
/// — the case where nothing else keeps it out.
#[test]
fn a_command_cannot_read_toolwire_environment() {
    use std::os::unix::fs::MetadataExt;
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    let as_root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    // The key, and the words the command prints, are computed in the shell
    // ($((…))): the command's text, which the events carry, matches none.
    let command = "p=$(awk '{print $4}' /proc/self/stat); \
         while [ \"${p:-0}\" -gt 1 ]; do \
           if tr '\\0' '\\n' < /proc/$p/environ > \"$TMPDIR/env\" 2>/dev/null; then \
             echo \"pid $p: read-$((1+1))\"; \
             grep -q \"sk-e2e-$((4000+242))\" \"$TMPDIR/env\" && echo KEY-$((1+1)); \
           else echo \"pid $p: denied-$((1+1))\"; fi; \
           p=$(awk '{print $4}' /proc/$p/stat); \
         done";
    let yaml = format!(
        "steps:\n  - text: \"Running.\"\n    tool_calls: [{{name: run_command, arguments: {{command: {}}}}}]\n  - text: \"Done.\"\n",
        serde_json::to_string(command).unwrap()
    );
    let script = script(dir.path(), &yaml);
    if as_root {
        for path in [dir.path(), Path::new(&script)] {
            std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
        }
    }
    let run = |mode: &str| {
        let toolwire_bin = env!("CARGO_BIN_EXE_toolwire");
        let mut cmd = if as_root {
            // setpriv executes toolwire in its own process: the same PID.
            let mut cmd = Command::new("setpriv");
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(toolwire_bin);
            cmd
        } else {
            Command::new(toolwire_bin)
        };
        // The environment and directory `toolwire()` sets.
        let base = toolwire(dir.path());
        for (key, value) in base.get_envs() {
            match value {
                Some(value) => cmd.env(key, value),
                None => cmd.env_remove(key),
            };
        }
        cmd.current_dir(dir.path());
        let child = cmd
            .env("OPENAI_API_KEY", "sk-e2e-4242")
            .args([
                "exec",
                "--json",
                "--sandbox",
                mode,
                "--provider",
                "scripted",
                "--script",
                &script,
                "go",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) runs toolwire as nobody when the test runs as root");
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (pid, String::from_utf8(out.stdout).unwrap())
    };

    for mode in ["workspace-write", "full"] {
        let (pid, events) = run(mode);
        // Reading works (the command's own shell, the helper)…
        assert!(events.contains("read-2"), "{mode}: nothing read: {events}");
        // …but not toolwire's environment.
        assert!(
            events.contains(&format!("pid {pid}: denied-2")),
            "{mode}: toolwire's environ (pid {pid}) was not refused: {events}"
        );
        assert!(
            !events.contains("KEY-2") && !events.contains("sk-e2e-4242"),
            "{mode}: the key was read: {events}"
        );
    }
}

/// Commands start through the small `toolwire-sandbox` beside the binary
/// (cargo builds it there); a `toolwire` without it runs them through its
/// own hidden subcommand, confined the same.
#[test]
fn without_its_helper_beside_it_toolwire_runs_commands_through_itself() {
    let dir = tempfile::tempdir().unwrap();
    let alone = tempfile::tempdir().unwrap();
    let copy = alone.path().join("toolwire");
    std::fs::copy(env!("CARGO_BIN_EXE_toolwire"), &copy).unwrap();
    let yaml = "steps:\n  - text: \"Running.\"\n    tool_calls: [{name: run_command, arguments: {command: \"echo ran-$((40+2)); cat toolwire.db || echo DB-$((2+2))\"}}]\n  - text: \"Done.\"\n";
    let script = script(dir.path(), yaml);
    std::fs::write(dir.path().join("toolwire.db"), "").unwrap();
    let run = |bin: &Path| {
        let mut cmd = Command::new(bin);
        for (key, value) in toolwire(dir.path()).get_envs() {
            match value {
                Some(value) => cmd.env(key, value),
                None => cmd.env_remove(key),
            };
        }
        let out = cmd
            .current_dir(dir.path())
            .env("RUST_LOG", "info")
            .args([
                "exec",
                "--json",
                "--db",
                "sqlite://toolwire.db",
                "--provider",
                "scripted",
                "--script",
                &script,
                "go",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };

    let (events, log) = run(Path::new(env!("CARGO_BIN_EXE_toolwire")));
    let beside = Path::new(env!("CARGO_BIN_EXE_toolwire")).with_file_name("toolwire-sandbox");
    assert!(
        log.contains(&format!("(helper: {})", beside.display())),
        "{log}"
    );
    assert!(
        events.contains("ran-42") && events.contains("DB-4"),
        "{events}"
    );

    let (events, log) = run(&copy);
    assert!(
        log.contains(&format!("(helper: {} __sandbox)", copy.display())),
        "{log}"
    );
    assert!(
        events.contains("ran-42") && events.contains("DB-4"),
        "{events}"
    );
}
