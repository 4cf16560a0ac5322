//! `toolwire chat` driven through its standard input, as a script or a
//! person at a pipe would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running chat; its stdout and stderr are kept apart (lines of the two
/// may interleave in any order).
struct Session {
    child: Child,
    stdin: ChildStdin,
    outputs: [Arc<Mutex<String>>; 2],
}

impl Session {
    fn start(dir: &std::path::Path, script: &str) -> Session {
        std::fs::write(dir.join("script.yaml"), script).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolwire"))
            .current_dir(dir)
            .args(["chat", "--provider", "scripted", "--script", "script.yaml"])
            .env_remove("RUST_LOG")
            .env("XDG_DATA_HOME", dir.join(".xdg"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let outputs = [
            Arc::new(Mutex::new(String::new())),
            Arc::new(Mutex::new(String::new())),
        ];
        let pipes = [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ];
        for (mut pipe, output) in pipes.into_iter().zip(outputs.clone()) {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    output
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let stdin = child.stdin.take().unwrap();
        Session {
            child,
            stdin,
            outputs,
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    fn count(&self, text: &str) -> usize {
        self.outputs
            .iter()
            .map(|o| o.lock().unwrap().matches(text).count())
            .sum()
    }

    /// Waits until stdout or stderr holds `text` `times` times in all.
    fn wait_for(&self, text: &str, times: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.count(text) < times {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in:\n--- stdout\n{}\n--- stderr\n{}",
                self.outputs[0].lock().unwrap(),
                self.outputs[1].lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn chat_streams_edits_regenerates_and_switches_branches() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::start(
        dir.path(),
        r#"
steps:
  - text: "Listing."
    tool_calls: [{name: list_dir, arguments: {}}]
  - text: "Here is the listing."
"#,
    );
    s.wait_for("Type a message", 1);
    s.send("what is here?");
    s.wait_for("→ Calling list_dir…", 1);
    s.wait_for("Here is the listing.", 1);
    s.send("/edit what is there?");
    s.wait_for("Here is the listing.", 2);
    s.send("/regenerate");
    s.wait_for("Here is the listing.", 3);
    s.send("/branches");
    s.wait_for("3. [assistant]", 1);
    s.send("/switch 1");
    s.wait_for("(on branch 1:", 1);
    s.send("/nonsense");
    s.wait_for("unknown command /nonsense", 1);
    s.send("/quit");
    let status = s.child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn a_line_typed_during_a_turn_is_an_interjection() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::start(
        dir.path(),
        r#"
steps:
  - tool_calls: [{name: run_command, arguments: {command: "sleep 1"}}]
  - text: "Saw your note."
"#,
    );
    s.wait_for("Type a message", 1);
    s.send("run it");
    s.wait_for("→ Calling run_command…", 1);
    s.send("also, hurry");
    s.wait_for("(noted: the agent sees this after the running tool)", 1);
    s.wait_for("» you (during the turn): also, hurry", 1);
    s.wait_for("Saw your note.", 1);
    drop(s.stdin);
    assert!(s.child.wait().unwrap().success(), "end of input quits");
}
