//! A shell command started confined, its output read as it comes (whole
//! characters), and the end of that output kept: shared by `run_command`
//! in the foreground and its background tasks.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Workspace;
use super::common::unfinished_char;
use crate::ToolError;
use crate::confined::{Confined, Cwd, Sandbox};

/// The end of a build log is where the error is; keep that part.
const TAIL: usize = 64 * 1024;
/// How long output may still arrive after the shell exits, from children
/// that inherited its pipes.
pub(super) const DRAIN: Duration = Duration::from_millis(500);

/// A started `sh -c COMMAND`, confined, and its output (stdout and
/// stderr as they come).
pub(super) struct Spawned {
    pub(super) confined: Confined,
    pub(super) rx: mpsc::Receiver<String>,
    /// Aborted when dropped.
    pub(super) readers: [Option<Reader>; 2],
}

impl Spawned {
    pub(super) fn start(
        sandbox: &Sandbox,
        workspace: &Workspace,
        command: &str,
        cwd: &Path,
    ) -> Result<Spawned, ToolError> {
        let argv = ["sh".into(), "-c".into(), command.into()];
        // The additional roots are the workspace's as much as its root.
        let additional: Vec<_> = workspace.roots().skip(1).map(Path::to_path_buf).collect();
        let widened;
        let sandbox = if additional.is_empty() {
            sandbox
        } else {
            widened = sandbox.with_additional_roots(additional);
            &widened
        };
        let mut confined =
            Confined::start(sandbox, workspace.root(), &argv, Cwd::Dir(cwd), false, None)?;
        let (tx, rx) = mpsc::channel::<String>(64);
        let readers = [
            confined
                .child
                .stdout
                .take()
                .map(|out| Reader::spawn(out, tx.clone())),
            confined
                .child
                .stderr
                .take()
                .map(|err| Reader::spawn(err, tx.clone())),
        ];
        Ok(Spawned {
            confined,
            rx,
            readers,
        })
    }
}

/// A pipe reader task, aborted with the call so a pipe held open by an
/// escaped process cannot keep it alive.
pub(super) struct Reader(JoinHandle<()>);

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

/// The last `cap` bytes of the output ([`TAIL`] by default), and how much
/// came before them.
pub(super) struct Tail {
    text: String,
    cut: usize,
    cap: usize,
}

impl Default for Tail {
    fn default() -> Self {
        Tail::new(TAIL)
    }
}

impl Tail {
    pub(super) fn new(cap: usize) -> Self {
        Tail {
            text: String::new(),
            cut: 0,
            cap,
        }
    }

    pub(super) fn push(&mut self, s: &str) {
        self.text.push_str(s);
        // Trim in batches so a chatty command does not copy on every chunk.
        if self.text.len() > 2 * self.cap {
            self.trim();
        }
    }

    /// The output kept (up to twice the cap), and whether earlier output
    /// was cut.
    pub(super) fn text(&self) -> (&str, bool) {
        (&self.text, self.cut > 0)
    }

    fn trim(&mut self) {
        if self.text.len() <= self.cap {
            return;
        }
        let excess = self.text.len() - self.cap;
        let mut at = excess;
        while !self.text.is_char_boundary(at) {
            at += 1;
        }
        self.text.drain(..at);
        self.cut += at;
    }

    pub(super) fn finish(mut self) -> String {
        self.trim();
        if self.cut == 0 {
            return self.text;
        }
        // Start at a line so the first shown line is whole.
        let start = self.text.find('\n').map_or(0, |i| i + 1);
        let start = if start > self.cap / 2 { 0 } else { start };
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
