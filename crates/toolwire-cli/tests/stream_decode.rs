//! `toolwire stream decode`, run as a user would: the real binary, a file
//! or standard input, JSON lines out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

fn toolwire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolwire"))
}

fn fixture(path: &str) -> String {
    format!(
        "{}/../toolwire-stream/tests/fixtures/{path}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8(stdout.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn decodes_a_file_in_one_byte_chunks_with_offsets() {
    let out = toolwire()
        .args(["stream", "decode", "--format", "xml", "--chunk-size", "1"])
        .arg(fixture("xml/one-call.txt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = lines(&out.stdout);
    let input = std::fs::read_to_string(fixture("xml/one-call.txt")).unwrap();
    let started = events
        .iter()
        .find(|e| e["type"] == "tool_call_started")
        .unwrap();
    assert_eq!(started["name"], "apply_diff");
    assert_eq!(started["server"], "filesystem");
    let name_end = input.find("</tool_name>").unwrap() + "</tool_name>".len();
    assert_eq!(started["offset"], name_end);
    let ready = events
        .iter()
        .find(|e| e["type"] == "tool_call_ready")
        .unwrap();
    assert_eq!(ready["arguments"]["path"], "src/lib.rs");
    let offsets: Vec<u64> = events
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(*offsets.last().unwrap(), input.len() as u64);
}

#[test]
fn reads_standard_input_whole_by_default() {
    let mut child = toolwire()
        .args(["stream", "decode", "--format", "anthropic"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = std::fs::read(fixture("anthropic/tool-use.sse")).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let events = lines(&out.stdout);
    assert!(events.iter().all(|e| e["offset"] == input.len()));
    assert!(events.iter().any(|e| e["type"] == "tool_call_ready"));
}

#[test]
fn bad_flags_and_missing_files_are_clear_errors() {
    let out = toolwire()
        .args(["stream", "decode", "--format", "gemini"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("openai-chat"));

    let out = toolwire()
        .args([
            "stream",
            "decode",
            "--format",
            "xml",
            "--chunk-size",
            "0",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());

    let out = toolwire()
        .args(["stream", "decode", "--format", "xml", "no/such/file.txt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no/such/file.txt"), "{err}");
}

#[test]
fn help_documents_every_flag() {
    let out = toolwire()
        .args(["stream", "decode", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--format", "--chunk-size", "openai-responses", "[FILE]"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
