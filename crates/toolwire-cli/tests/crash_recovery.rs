//! A crash mid-tool must not brick the conversation on real providers: the
//! real binary with a mock OpenAI server on loopback calls a slow command,
//! is killed with SIGKILL while it runs, and is started again on the same
//! SQLite file. The next request the model gets answers every call, and
//! the stored messages show the cut turn as interrupted. Words typed into
//! the cut turn reach the model once after the restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
// The mock model server (real HTTP, OpenAI's wire format).
use tokio::io::AsyncBufReadExt;
use toolwire_core::{ContentBlock, ConversationId, MessageStatus, Role};
use toolwire_test_support::{Call, MockServer, Reply, openai_sse};

const NOT_RUN: &str = "Not run: toolwire stopped before this call finished.";

/// `toolwire SUBCOMMAND` (`exec`, `chat`) on `db` with the mock model at
/// `url`, configured by nothing else.
fn toolwire(subcommand: &str, dir: &Path, db: &str, url: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolwire"));
    cmd.current_dir(dir).env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("TOOLWIRE_") || k.ends_with("_API_KEY") {
            cmd.env_remove(k);
        }
    }
    cmd.args([
        subcommand,
        "--db",
        db,
        "--provider",
        "openai",
        "--base-url",
        url,
        "--model",
        "gpt-test",
    ]);
    cmd.kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_mid_tool_every_call_has_a_result_and_the_turn_shows_interrupted() {
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Running it.",
            &[
                Call {
                    id: "call_talk",
                    name: "run_command",
                    arguments: json!({"command": "echo started; sleep 30"}),
                },
                Call {
                    id: "call_sleep",
                    name: "run_command",
                    arguments: json!({"command": "sleep 30"}),
                },
            ],
        )),
        Reply::sse(openai_sse("Back after the restart.", &[])),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("crash.db").display());

    let mut child = toolwire("exec", dir.path(), &db, &server.url)
        .args(["--json", "run it"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut conversation = None;
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let event: Value = serde_json::from_str(&line).unwrap();
            if event["type"] == "turn_started" {
                conversation = event["conversation_id"].as_str().map(str::to_owned);
            }
            // Killed once the first command has shown some output (kept
            // in its result) while both still run.
            // The output, not the status line ("Running `echo started…`"),
            // which comes first and names the word too.
            if event["type"] == "tool_execution_progress"
                && event["call_id"] == "call_talk"
                && event["progress"]["kind"] == "output"
                && event["progress"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("started"))
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(started, Ok(true), "the slow commands started");
    // SIGKILL: nothing of the process runs after this.
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let conversation: ConversationId = conversation.unwrap().parse().unwrap();

    // Restart on the same file and send the next message.
    let out = toolwire("exec", dir.path(), &db, &server.url)
        .args(["--conversation", &conversation.to_string(), "status?"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Back after the restart."
    );

    // The model's request after the restart: every call has its result,
    // right after the assistant message that made it.
    let received = server.received();
    assert_eq!(received.len(), 2);
    let messages = received[1].body["messages"].as_array().unwrap().clone();
    let calls: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(calls, ["call_talk", "call_sleep"]);
    let at = messages
        .iter()
        .position(|m| m["tool_calls"].is_array())
        .unwrap();
    for (i, id) in calls.iter().enumerate() {
        assert_eq!(messages[at + 1 + i]["role"], "tool");
        assert_eq!(messages[at + 1 + i]["tool_call_id"], *id);
    }
    let talk = messages[at + 1]["content"].as_str().unwrap();
    assert!(
        talk.starts_with("Cut short: toolwire stopped before this call finished.")
            && talk.contains("started"),
        "the output shown before the kill is kept: {talk}"
    );
    assert_eq!(messages[at + 2]["content"], NOT_RUN);
    assert_eq!(messages[at + 3]["role"], "user");
    assert_eq!(messages[at + 3]["content"], "status?");

    // Stored: the call's message and its result show the turn as
    // interrupted (every door reads this status).
    let store = toolwire_store::open(&db).await.unwrap();
    let stored = store.messages(conversation).await.unwrap();
    let asked = stored
        .iter()
        .find(|m| m.role == Role::Assistant && m.tool_uses().count() == 2)
        .unwrap();
    assert_eq!(asked.status, MessageStatus::Interrupted);
    let results: Vec<_> = stored
        .iter()
        .filter(|m| {
            m.content.iter().any(|b| {
                matches!(b, ContentBlock::ToolResult { tool_use_id, is_error: true, .. }
                    if tool_use_id.0.starts_with("call_"))
            })
        })
        .collect();
    assert_eq!(results.len(), 2, "each cut call's result is stored");
    for result in &results {
        assert_eq!(result.status, MessageStatus::Interrupted);
    }
    // Right under the calls, one after the other.
    assert_eq!(results[0].parent_id, Some(asked.id));
    assert_eq!(results[1].parent_id, Some(results[0].id));
}

fn times_in(request: &toolwire_test_support::Request, text: &str) -> usize {
    request.body.to_string().matches(text).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn words_interjected_into_a_killed_turn_reach_the_model_once_after_the_restart() {
    let server = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Running it.",
            &[Call {
                id: "call_sleep",
                name: "run_command",
                arguments: json!({"command": "sleep 30"}),
            }],
        )),
        Reply::sse(openai_sse("Noted the cat.", &[])),
        Reply::sse(openai_sse("Still noted.", &[])),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("crash.db").display());

    let mut child = toolwire("chat", dir.path(), &db, &server.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    use tokio::io::AsyncWriteExt;
    stdin.write_all(b"run it\n").await.unwrap();
    // The call runs (the model was asked once): the words are an
    // interjection, kept once chat says it noted them.
    tokio::time::timeout(Duration::from_secs(30), async {
        while server.received().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    })
    .await
    .unwrap();
    stdin.write_all(b"and mind the cat\n").await.unwrap();
    let mut conversation = None;
    let noted = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // The banner: "toolwire chat · model … · conversation ID".
            if let Some((_, id)) = line.split_once("· conversation ") {
                conversation = Some(id.trim().to_owned());
            }
            if line.starts_with("(noted") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(noted, Ok(true), "the words were taken as an interjection");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let conversation = conversation.expect("chat names its conversation");

    for (prompt, answer) in [("status?", "Noted the cat."), ("again?", "Still noted.")] {
        let out = toolwire("exec", dir.path(), &db, &server.url)
            .args(["--conversation", &conversation, prompt])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), answer);
    }
    let received = server.received();
    assert_eq!(received.len(), 3);
    assert_eq!(times_in(&received[0], "mind the cat"), 0);
    // After the restart the words reach the model once, and once only
    // after that (in the history, not again as news).
    assert_eq!(
        times_in(&received[1], "mind the cat"),
        1,
        "{}",
        received[1].body
    );
    assert_eq!(
        times_in(&received[2], "mind the cat"),
        1,
        "{}",
        received[2].body
    );
}
