//! `run_command`: a shell command in the workspace, streamed while it runs.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Workspace;
use super::common::{io_error, parse_args, spec};
use crate::tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

const DEFAULT_TIMEOUT: u64 = 120;
const MAX_TIMEOUT: u64 = 3600;
/// The end of a build log is where the error is; keep that part.
const TAIL: usize = 64 * 1024;
/// How long output may still arrive after the shell exits, from children
/// that inherited its pipes.
const DRAIN: Duration = Duration::from_millis(500);

pub struct RunCommand {
    workspace: Arc<Workspace>,
    spec: ToolSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

impl RunCommand {
    pub fn new(workspace: Arc<Workspace>) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "Shell command, run with `sh -c`."},
                "cwd": {"type": "string", "description": "Working directory, relative to the workspace root. Default: the root."},
                "timeout_secs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT, "description": "Kill the command after this many seconds. Default 120."}
            },
            "required": ["command"],
            "additionalProperties": false
        });
        let description = "Runs a shell command (`sh -c`) in the workspace and returns its exit \
            code and combined stdout/stderr (the last 64 KiB). Stdin is empty. The command and \
            everything it started are killed when it finishes, times out or is cancelled, so \
            background processes do not survive the call.";
        RunCommand {
            workspace,
            spec: spec("run_command", description, parameters, false),
        }
    }
}

#[async_trait]
impl Tool for RunCommand {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        let timeout = args.timeout_secs.unwrap_or(DEFAULT_TIMEOUT);
        if !(1..=MAX_TIMEOUT).contains(&timeout) {
            return Err(ToolError::InvalidArguments(format!(
                "timeout_secs must be between 1 and {MAX_TIMEOUT}, got {timeout}"
            )));
        }
        let cwd = self.workspace.resolve(args.cwd.as_deref().unwrap_or("."))?;
        match tokio::fs::metadata(&cwd).await {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(ToolError::Refused(format!(
                    "cwd `{}` is not a directory",
                    self.workspace.display(&cwd)
                )));
            }
            Err(e) => return Err(io_error(&self.workspace, &cwd, e)),
        }

        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&args.command)
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so one signal reaches every process it starts.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ToolError::Failed(format!("could not start `sh`: {e}")))?;
        let mut group = GroupKiller(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .map(Pid::from_raw),
        );
        ctx.progress.status(format!("Running `{}`", args.command));

        let (tx, mut rx) = mpsc::channel::<String>(64);
        let _readers = [
            child
                .stdout
                .take()
                .map(|out| Reader::spawn(out, tx.clone())),
            child
                .stderr
                .take()
                .map(|err| Reader::spawn(err, tx.clone())),
        ];
        drop(tx);

        let mut tail = Tail::default();
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let status = loop {
            tokio::select! {
                _ = ctx.cancel.cancelled() => {
                    group.kill();
                    let _ = child.wait().await;
                    return Err(ToolError::Cancelled);
                }
                _ = &mut deadline => {
                    group.kill();
                    let _ = child.wait().await;
                    return Err(ToolError::TimedOut(timeout));
                }
                Some(text) = rx.recv() => {
                    ctx.progress.output(text.clone());
                    tail.push(&text);
                }
                status = child.wait() => {
                    break status.map_err(|e| ToolError::Failed(format!("waiting for the command failed: {e}")))?;
                }
            }
        };

        let drain_until = tokio::time::Instant::now() + DRAIN;
        let mut lingering = false;
        loop {
            match tokio::time::timeout_at(drain_until, rx.recv()).await {
                Ok(Some(text)) => {
                    ctx.progress.output(text.clone());
                    tail.push(&text);
                }
                Ok(None) => break,
                Err(_) => {
                    lingering = true;
                    break;
                }
            }
        }
        group.kill();
        Ok(finish(tail, status, lingering))
    }
}

fn finish(tail: Tail, status: ExitStatus, lingering: bool) -> ToolOutput {
    use std::os::unix::process::ExitStatusExt;
    let mut text = tail.finish();
    if text.is_empty() {
        text.push_str("(no output)");
    }
    if !text.ends_with('\n') {
        text.push('\n');
    }
    if lingering {
        text.push_str("[background processes still holding the output were killed]\n");
    }
    match (status.code(), status.signal()) {
        (Some(code), _) => text.push_str(&format!("[exit code: {code}]")),
        (None, Some(signal)) => text.push_str(&format!("[killed by signal {signal}]")),
        (None, None) => text.push_str("[exit status unknown]"),
    }
    if status.success() {
        ToolOutput::ok(text)
    } else {
        ToolOutput::error(text)
    }
}

/// Kills the command's process group once: on cancel, timeout, the end of
/// the command, or when the call's future is dropped mid-run.
struct GroupKiller(Option<Pid>);

impl GroupKiller {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH (group already gone) is the normal case after a clean exit.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A pipe reader task, aborted with the call so a pipe held open by an
/// escaped process cannot keep it alive.
struct Reader(JoinHandle<()>);

impl Reader {
    fn spawn(
        mut pipe: impl AsyncRead + Unpin + Send + 'static,
        tx: mpsc::Sender<String>,
    ) -> Reader {
        Reader(tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut carry = Vec::new();
            loop {
                let n = match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                carry.extend_from_slice(&buf[..n]);
                let text = take_utf8(&mut carry);
                if !text.is_empty() && tx.send(text).await.is_err() {
                    return;
                }
            }
            if !carry.is_empty() {
                let _ = tx.send(String::from_utf8_lossy(&carry).into_owned()).await;
            }
        }))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Decodes what is complete, keeping a character split across reads for
/// the next one; invalid bytes become U+FFFD.
fn take_utf8(carry: &mut Vec<u8>) -> String {
    let rest = carry.split_off(carry.len() - unfinished_char(carry));
    let text = String::from_utf8_lossy(carry).into_owned();
    *carry = rest;
    text
}

/// Length of a multi-byte character cut off at the end of `bytes`.
fn unfinished_char(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let len = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if len > back { back } else { 0 };
    }
    0
}

/// The last [`TAIL`] bytes of the output, and how much came before them.
#[derive(Default)]
struct Tail {
    text: String,
    cut: usize,
}

impl Tail {
    fn push(&mut self, s: &str) {
        self.text.push_str(s);
        // Trim in batches so a chatty command does not copy on every chunk.
        if self.text.len() > 2 * TAIL {
            self.trim();
        }
    }

    fn trim(&mut self) {
        if self.text.len() <= TAIL {
            return;
        }
        let excess = self.text.len() - TAIL;
        let mut at = excess;
        while !self.text.is_char_boundary(at) {
            at += 1;
        }
        self.text.drain(..at);
        self.cut += at;
    }

    fn finish(mut self) -> String {
        self.trim();
        if self.cut == 0 {
            return self.text;
        }
        // Start at a line so the first shown line is whole.
        let start = self.text.find('\n').map_or(0, |i| i + 1);
        let start = if start > TAIL / 2 { 0 } else { start };
        let cut = self.cut + start;
        let kept = self.text.len() - start;
        format!(
            "[first {cut} bytes of output cut; showing the last {kept} bytes]\n{}",
            &self.text[start..]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_reads() {
        let mut carry = "aé".as_bytes()[..2].to_vec();
        assert_eq!(take_utf8(&mut carry), "a");
        carry.extend_from_slice(&"é".as_bytes()[1..]);
        assert_eq!(take_utf8(&mut carry), "é");
        let mut bad = vec![b'x', 0xff, b'y', 0xc3];
        assert_eq!(take_utf8(&mut bad), "x\u{fffd}y");
        assert_eq!(bad, vec![0xc3]);
    }

    #[test]
    fn tail_keeps_the_end() {
        let mut tail = Tail::default();
        for i in 0..20_000 {
            tail.push(&format!("line {i}\n"));
        }
        let out = tail.finish();
        assert!(out.starts_with("[first "), "{}", &out[..80]);
        assert!(out.ends_with("line 19999\n"));
        assert!(out.len() < TAIL + 100);
    }
}
