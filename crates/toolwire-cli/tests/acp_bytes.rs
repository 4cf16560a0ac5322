//! `toolwire acp` on bytes that are not UTF-8: the line gets a JSON-RPC
//! parse error and the agent reads on (it used to end at the first such
//! byte).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[tokio::test]
async fn a_line_that_is_not_utf8_gets_a_parse_error_and_the_agent_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolwire"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("TOOLWIRE_") {
            command.env_remove(&key);
        }
    }
    let mut child = command
        .current_dir(dir.path())
        .env("RUST_LOG", "warn")
        .arg("acp")
        .args(["--provider", "scripted", "--db"])
        .arg(format!("sqlite://{}", dir.path().join("acp.db").display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();

    let initialize = |id: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{}}}}}}"#
        )
    };
    // One byte that is not UTF-8, inside an otherwise valid request.
    let mut bad = initialize(1).into_bytes();
    let at = bad.len() - 3;
    bad.insert(at, 0xff);
    bad.push(b'\n');
    stdin.write_all(&bad).await.unwrap();
    stdin
        .write_all(format!("{}\n", initialize(2)).as_bytes())
        .await
        .unwrap();
    stdin.flush().await.unwrap();

    let mut answers = Vec::new();
    while answers.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
            .await
            .expect("no answer within 30 s")
            .unwrap()
            .expect("the agent ended");
        answers.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let error = &answers[0]["error"];
    assert_eq!(error["code"], -32700, "{answers:?}");
    assert!(
        error["data"]["line"]
            .as_str()
            .unwrap()
            .contains("invalid UTF-8"),
        "{error}"
    );
    assert_eq!(answers[1]["id"], 2, "{answers:?}");
    assert!(
        answers[1]["result"]["protocolVersion"].is_number(),
        "{answers:?}"
    );
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}
