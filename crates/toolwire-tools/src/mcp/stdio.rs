//! Stdio servers: spawning the process ([`McpServer::start`]) and keeping
//! the tail of its stderr to explain a death ([`StderrTail`]).

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio_util::sync::CancellationToken;

use super::{Connection, McpError, McpServer, STARTUP_TIMEOUT, cut};

/// Lines of the server's stderr kept to explain why it died.
const STDERR_TAIL_LINES: usize = 10;
/// A kept stderr line is cut here so a chatty server cannot bloat errors.
pub(super) const STDERR_LINE_MAX: usize = 400;
/// How long an error waits for the rest of a dead server's stderr.
const STDERR_SETTLE: Duration = Duration::from_millis(500);

impl McpServer {
    /// Spawns the process `command`, runs the MCP handshake and reads the
    /// tool list (a restarted server may offer other tools than the process
    /// before).
    pub(super) async fn start(&self, command_name: &str) -> Result<Connection, McpError> {
        let config = &self.config;
        let mut command = tokio::process::Command::new(command_name);
        command.args(&config.args).envs(&config.env);
        let spawn_error = |source| McpError::Spawn {
            server: config.name.clone(),
            command: command_name.to_owned(),
            source,
        };
        // stderr is piped (not inherited) so a server cannot write into a
        // terminal UI, and so its last words can explain a crash.
        let (transport, stderr) = TokioChildProcess::builder(command)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let pid = transport.id();
        let tail = StderrTail::default();
        if let Some(stderr) = stderr {
            tail.follow(config.name.clone(), stderr);
        }
        let (client, epoch) = self.handler();
        // On error or timeout the transport is dropped, which kills the child.
        let client = match tokio::time::timeout(STARTUP_TIMEOUT, client.serve(transport)).await {
            Ok(Ok(client)) => client,
            Ok(Err(source)) => {
                tail.settle().await;
                return Err(McpError::Initialize {
                    server: config.name.clone(),
                    source: Box::new(source),
                    stderr: tail.describe(),
                });
            }
            Err(_) => {
                return Err(McpError::StartTimedOut {
                    server: config.name.clone(),
                    secs: STARTUP_TIMEOUT.as_secs(),
                    stderr: tail.describe(),
                });
            }
        };
        self.read_tool_list(client.peer(), epoch).await?;
        Ok(Connection {
            client,
            pid,
            stderr: tail,
            http: None,
        })
    }
}

/// The last lines a server wrote to stderr. Everything it writes also goes
/// to `tracing` at debug level.
#[derive(Clone, Default)]
pub(super) struct StderrTail {
    lines: Arc<StdMutex<VecDeque<String>>>,
    /// Cancelled when the reader saw the end of stderr.
    done: CancellationToken,
}

impl StderrTail {
    /// The tail of a server without stderr (HTTP): nothing to wait for.
    pub(super) fn none() -> Self {
        let tail = StderrTail::default();
        tail.done.cancel();
        tail
    }

    fn follow(&self, server: String, stderr: ChildStderr) {
        let lines = Arc::clone(&self.lines);
        let done = self.done.clone();
        tokio::spawn(async move {
            let _done = done.drop_guard();
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                tracing::debug!(server = %server, "MCP server stderr: {line}");
                let line = cut(&line, STDERR_LINE_MAX).to_owned();
                let mut lines = lines.lock().unwrap_or_else(PoisonError::into_inner);
                if lines.len() == STDERR_TAIL_LINES {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
        });
    }

    /// A dead process's last words may still be in the pipe when its death
    /// is noticed: waits (briefly) until the reader has seen the end.
    pub(super) async fn settle(&self) {
        let _ = tokio::time::timeout(STDERR_SETTLE, self.done.cancelled()).await;
    }

    /// `"; stderr: …"`, or nothing when the server wrote nothing.
    pub(super) fn describe(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.is_empty() {
            return String::new();
        }
        let joined: Vec<&str> = lines.iter().map(String::as_str).collect();
        format!("; stderr: {}", joined.join(" | "))
    }
}
