//! Graceful shutdown of a real `toolwire serve` process on a SQLite file:
//! SIGTERM during several streaming turns of a slow scripted model. New
//! turns are refused with 503 and Retry-After during the grace, each
//! running turn's messages are stored (the cut ones marked interrupted),
//! each stream ends with an event that says so, the process exits within
//! the grace and a margin, and after a restart the conversations go on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The first turn streams 16 bytes every 100 ms (several seconds, far
/// longer than the grace, so SIGTERM finds every turn mid-step); the next
/// one answers at once.
const SLOW_SCRIPT: &str = r#"model: slow
turns:
  - steps:
      - text: "Thinking about it, slowly, one small piece at a time, for a long while."
        chunk_size: 16
        delay_ms: 100
  - steps:
      - text: "Back again."
"#;

const GRACE_SECS: u64 = 2;

struct Serve {
    child: Child,
    base: String,
}

async fn serve(dir: &Path) -> Serve {
    std::fs::write(dir.join("slow.yaml"), SLOW_SCRIPT).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolwire"));
    command
        .arg("serve")
        .args(["--addr", "127.0.0.1:0", "--provider", "scripted"])
        .arg("--db")
        .arg(format!("sqlite://{}", dir.join("t.db").display()))
        .arg("--script")
        .arg(dir.join("slow.yaml"))
        .arg("--workspace")
        .arg(dir)
        .args(["--shutdown-grace-secs", &GRACE_SECS.to_string()])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("TOOLWIRE_") {
            command.env_remove(&key);
        }
    }
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("toolwire: serving on http://") {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("the server exited before it listened")
    })
    .await
    .expect("the server did not start within 60 s");
    // Keep draining stderr so that the server never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Serve {
        child,
        base: format!("http://{addr}"),
    }
}

impl Serve {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

async fn new_agent(http: &reqwest::Client, s: &Serve, name: &str) -> String {
    let agent: Value = http
        .post(s.url("/v1/agents"))
        .json(&json!({"name": name}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    agent["id"].as_str().unwrap().to_owned()
}

fn message(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "stream_tokens": true})
}

/// Every `data:` payload of a stream, and a signal once the first came.
async fn read_stream(
    response: reqwest::Response,
    first: tokio::sync::mpsc::Sender<()>,
) -> Vec<String> {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find('\n') {
            let line = buffer[..end].trim_end().to_owned();
            buffer.drain(..=end);
            if let Some(data) = line.strip_prefix("data: ") {
                if events.is_empty() {
                    let _ = first.send(()).await;
                }
                events.push(data.to_owned());
            }
        }
    }
    events
}

#[tokio::test]
async fn sigterm_refuses_new_turns_stores_running_ones_and_ends_their_streams() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut s = serve(dir.path()).await;
    const STREAMS: usize = 4;
    let mut agents = Vec::new();
    for i in 0..=STREAMS {
        agents.push(new_agent(&http, &s, &format!("a{i}")).await);
    }
    let late_agent = agents.pop().unwrap();

    let (first_tx, mut first_rx) = tokio::sync::mpsc::channel(STREAMS);
    let mut streams = Vec::new();
    for (i, agent) in agents.iter().enumerate() {
        let response = http
            .post(s.url(&format!("/v1/agents/{agent}/messages/stream")))
            .json(&message(&format!("question {i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        streams.push(tokio::spawn(read_stream(response, first_tx.clone())));
    }
    for _ in 0..STREAMS {
        first_rx.recv().await.unwrap();
    }

    let pid = nix::unistd::Pid::from_raw(i32::try_from(s.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let signalled = Instant::now();
    // During the grace a new turn is refused, saying when to come back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = http
        .post(s.url(&format!("/v1/agents/{late_agent}/messages")))
        .json(&json!({"messages": [{"role": "user", "content": "too late"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().get("retry-after").is_some());
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "SHUTTING_DOWN", "{body}");

    for stream in streams {
        let events = stream.await.unwrap();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{events:?}"
        );
        let parsed: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let error = parsed
            .iter()
            .find(|m| m["message_type"] == "error_message")
            .unwrap_or_else(|| panic!("no error_message in {parsed:?}"));
        assert_eq!(error["error_type"], "interrupted", "{error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("interrupted by shutdown"),
            "{error}"
        );
        let stop = parsed
            .iter()
            .find(|m| m["message_type"] == "stop_reason")
            .unwrap_or_else(|| panic!("no stop_reason in {parsed:?}"));
        assert_eq!(stop["stop_reason"], "error");
    }
    let status = tokio::time::timeout(Duration::from_secs(GRACE_SECS + 10), s.child.wait())
        .await
        .expect("the server did not exit within the grace and a margin")
        .unwrap();
    assert!(status.success(), "{status}");
    // A lower bound on a real timer cannot flake (the timeout above is the
    // only upper bound, a hang guard).
    assert!(
        signalled.elapsed() >= Duration::from_secs(GRACE_SECS),
        "the turns were cut before the grace ended"
    );

    // Restarted on the same file: every turn's user message is there with
    // the part of the answer that was streamed, and the conversation goes
    // on.
    let s = serve(dir.path()).await;
    let plain = reqwest::Client::new();
    for (i, agent) in agents.iter().enumerate() {
        let list: Value = plain
            .get(s.url(&format!("/v1/agents/{agent}/messages?order=asc")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let list = list.as_array().unwrap();
        let user: Vec<&Value> = list
            .iter()
            .filter(|m| m["message_type"] == "user_message")
            .collect();
        assert_eq!(user.len(), 1, "{list:?}");
        assert!(
            user[0]["content"]
                .to_string()
                .contains(&format!("question {i}"))
        );
        let partial = list
            .iter()
            .find(|m| m["message_type"] == "assistant_message")
            .unwrap_or_else(|| panic!("the cut answer was not stored: {list:?}"));
        assert!(
            partial["content"].to_string().contains("Thinking"),
            "{partial}"
        );

        let response = plain
            .post(s.url(&format!("/v1/agents/{agent}/messages/stream")))
            .json(&message("and now?"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let events = read_stream(response, tx).await;
        assert!(
            events.iter().any(|e| e.contains("\"end_turn\"")),
            "{events:?}"
        );
    }
    let late: Value = plain
        .get(s.url(&format!("/v1/agents/{late_agent}/messages?order=asc")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        !late.to_string().contains("too late"),
        "a refused message was stored: {late}"
    );
}
