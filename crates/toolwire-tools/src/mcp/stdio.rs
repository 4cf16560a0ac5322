//! Stdio servers: spawning the process ([`McpServer::start`]), unconfined
//! or through the sandbox ([`Launch`]), always with an allow-listed
//! environment, and keeping the tail of its stderr to explain a death
//! ([`StderrTail`]).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio_util::sync::CancellationToken;
use toolwire_sandbox::{Policy, Sandbox, TempDir};

use super::{Connection, McpError, McpServer, STARTUP_TIMEOUT, cut};

/// Lines of the server's stderr kept to explain why it died.
const STDERR_TAIL_LINES: usize = 10;
/// A kept stderr line is cut here so a chatty server cannot bloat errors.
pub(super) const STDERR_LINE_MAX: usize = 400;
/// How long an error waits for the rest of a dead server's stderr.
const STDERR_SETTLE: Duration = Duration::from_millis(500);

/// Where stdio servers start from: the sandbox (its helper and policy,
/// what the kernel offers, and the environment its allow-list picks
/// from) and the workspace a sandboxed server works in.
#[derive(Debug, Clone)]
pub struct Launch {
    pub sandbox: Arc<Sandbox>,
    pub workspace: PathBuf,
}

impl Launch {
    /// No sandbox helper (a server configured with `sandbox` is refused),
    /// toolwire's environment through the allow-list, the current
    /// directory as workspace.
    pub fn unconfined() -> Launch {
        Launch {
            sandbox: Arc::new(Sandbox::none()),
            workspace: PathBuf::from("."),
        }
    }
}

impl McpServer {
    /// Spawns the process `command`, runs the MCP handshake and reads the
    /// tool list (a restarted server may offer other tools than the process
    /// before).
    pub(super) async fn start(&self, command_name: &str) -> Result<Connection, McpError> {
        let config = &self.config;
        let (mut command, temp_dir) = self.command(command_name)?;
        // Set last: the values are the config's own choice.
        command.envs(&config.env);
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
            _temp_dir: temp_dir,
        })
    }

    /// The server's command, with the allow-listed environment: as
    /// configured, or through the sandbox helper in the server's mode
    /// (then with the call's temp dir, kept while the server runs).
    fn command(
        &self,
        command_name: &str,
    ) -> Result<(tokio::process::Command, Option<TempDir>), McpError> {
        let config = &self.config;
        let launch = &self.launch;
        let Some(mode) = config.sandbox else {
            let mut command = tokio::process::Command::new(command_name);
            command
                .args(&config.args)
                .env_clear()
                .envs(launch.sandbox.environment(&config.env_vars));
            return Ok((command, None));
        };
        let policy = Policy {
            mode,
            network: config.network.unwrap_or(false),
            env: config.env_vars.clone(),
            ..launch.sandbox.policy().clone()
        };
        let sandbox = Sandbox::clone(&launch.sandbox).with_policy(policy);
        let argv: Vec<OsString> = std::iter::once(command_name)
            .chain(config.args.iter().map(String::as_str))
            .map(OsString::from)
            .collect();
        let prepared = sandbox
            .prepare(&launch.workspace, &argv, None)
            .map_err(|source| McpError::Sandbox {
                server: config.name.clone(),
                source,
            })?;
        if let Some(note) = &prepared.note {
            tracing::warn!(server = %config.name, "MCP server {note}");
        }
        let mut command = tokio::process::Command::from(prepared.command);
        command.current_dir(&launch.workspace);
        Ok((command, Some(prepared.temp_dir)))
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
