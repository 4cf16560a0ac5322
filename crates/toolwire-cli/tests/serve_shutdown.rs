//! Graceful shutdown of a real `toolwire serve` process on a SQLite file:
//! SIGTERM during several streaming turns of a slow scripted model. New
//! turns are refused with 503 and Retry-After during the grace, each
//! running turn's messages are stored (the cut ones marked interrupted),
//! each stream ends with an event that says so, the process exits within
//! the grace and a margin, and after a restart the conversations go on.
//! Requests that arrive as it stops, on a kept-alive connection or waiting
//! in the kernel's accept queue, are refused with 503, never cut.
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
    serve_with(dir, &[]).await
}

async fn serve_with(dir: &Path, extra: &[&std::ffi::OsStr]) -> Serve {
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
        .args(extra)
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

/// Writes `request` on a raw connection.
async fn send_raw(tcp: &mut tokio::net::TcpStream, request: &str) {
    use tokio::io::AsyncWriteExt;
    tcp.write_all(request.as_bytes()).await.unwrap();
}

/// One response's head (lowercased) and body from a raw connection: the
/// body by its Content-Length; an error or the connection's end before
/// a whole response is `Err` with what came.
async fn read_raw(tcp: &mut tokio::net::TcpStream) -> Result<(String, String), String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&got[end + 4..end + 4 + length]).into_owned();
                return Ok((head, body));
            }
        }
        match tcp.read(&mut buffer).await {
            Ok(0) => return Err(format!("the connection ended after {text:?}")),
            Ok(n) => got.extend_from_slice(&buffer[..n]),
            Err(e) => return Err(format!("{e} after {text:?}")),
        }
    }
}

/// A refusal while stopping: 503 saying when to come back, connection
/// closed after it.
fn assert_refused(what: &str, answer: Result<(String, String), String>) {
    let (head, body) =
        answer.unwrap_or_else(|e| panic!("{what}: no answer, the connection broke: {e}"));
    assert!(head.starts_with("http/1.1 503"), "{what}: {head}");
    assert!(head.contains("retry-after:"), "{what}: {head}");
    assert!(head.contains("connection: close"), "{what}: {head}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["code"], "SHUTTING_DOWN", "{what}: {body}");
}

#[tokio::test]
async fn requests_arriving_as_the_server_stops_are_refused_not_cut() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    // Two connections at most: a third waits in the kernel's queue.
    let config = dir.path().join("toolwire.toml");
    std::fs::write(&config, "max_connections = 2\n").unwrap();
    let mut s = serve_with(dir.path(), &["--config".as_ref(), config.as_os_str()]).await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    let get = format!("GET /v1/agents HTTP/1.1\r\nHost: {addr}\r\n\r\n");

    // Two kept-alive connections, each after one answered request: `half`
    // then sends half of its next request's head; `idle` sends nothing.
    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    for tcp in [&mut half, &mut idle] {
        send_raw(tcp, &get).await;
        let (head, _) = read_raw(tcp).await.unwrap();
        assert!(head.starts_with("http/1.1 200"), "{head}");
    }
    send_raw(
        &mut half,
        &format!("GET /v1/agents HTTP/1.1\r\nHost: {addr}\r\n"),
    )
    .await;
    // The kernel completes this one's handshake; at the cap the server
    // does not take it, so its request waits unread.
    let mut queued = tokio::net::TcpStream::connect(&addr).await.unwrap();
    send_raw(&mut queued, &get).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // No turn runs: the server stops taking requests at once.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(s.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();

    // The queued request is taken and refused, not reset with the
    // listener.
    let answer = tokio::time::timeout(Duration::from_secs(20), read_raw(&mut queued))
        .await
        .expect("the queued request got nothing within 20 s");
    assert_refused("the request in the accept queue", answer);
    // The idle kept-alive connection is closed (well before its 30 s idle
    // timeout), which also says the server is stopping.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), idle.read_to_end(&mut rest))
        .await
        .expect("the idle connection was not closed within 20 s");
    assert!(
        closed.is_ok() && rest.is_empty(),
        "the idle connection got {rest:?} ({closed:?})"
    );
    // The half-sent request, completed now, is answered: refused.
    send_raw(&mut half, "\r\n").await;
    let answer = tokio::time::timeout(Duration::from_secs(20), read_raw(&mut half))
        .await
        .expect("the half-sent request got nothing within 20 s");
    assert_refused("the request half sent on a kept-alive connection", answer);

    let status = tokio::time::timeout(Duration::from_secs(20), s.child.wait())
        .await
        .expect("the server did not exit within 20 s")
        .unwrap();
    assert!(status.success(), "{status}");
}
