//! `run_command`: a shell command in the workspace, streamed while it runs,
//! or started in the background (see `tasks.rs`).

use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Workspace;
use super::common::{parse_args, spec};
use super::spawned::{DRAIN, Spawned, Tail};
use super::tasks::BackgroundTasks;
use super::workspace::Node;
use crate::confined::Sandbox;
use crate::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

const DEFAULT_TIMEOUT: u64 = 120;
const MAX_TIMEOUT: u64 = 3600;
pub struct RunCommand {
    workspace: Arc<Workspace>,
    tasks: Arc<BackgroundTasks>,
    sandbox: Arc<Sandbox>,
    spec: Arc<ToolSpec>,
}

/// `run_command`'s arguments, checked; shared with front doors that run
/// the command elsewhere (an editor's terminal), so both accept the same.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandArgs {
    pub command: String,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
    #[serde(default)]
    pub background: bool,
}

impl CommandArgs {
    /// Parses and checks `arguments`.
    pub fn parse(arguments: Value) -> Result<CommandArgs, ToolError> {
        let args: CommandArgs = parse_args(arguments)?;
        if let Some(timeout) = args.timeout_secs
            && !(1..=MAX_TIMEOUT).contains(&timeout)
        {
            return Err(ToolError::InvalidArguments(format!(
                "timeout_secs must be between 1 and {MAX_TIMEOUT}, got {timeout}"
            )));
        }
        Ok(args)
    }

    /// The time limit of a command in the foreground, in seconds.
    pub fn timeout_secs(&self) -> u64 {
        self.timeout_secs.unwrap_or(DEFAULT_TIMEOUT)
    }
}

impl RunCommand {
    /// `tasks` holds the commands started with `background: true` (shared
    /// with `task_status`); they are killed when it is dropped. Every
    /// command runs through `sandbox`.
    pub fn new(
        workspace: Arc<Workspace>,
        tasks: Arc<BackgroundTasks>,
        sandbox: Arc<Sandbox>,
    ) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "Shell command, run with `sh -c`."},
                "cwd": {"type": "string", "description": "Working directory, relative to the workspace root. Default: the root."},
                "timeout_secs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT, "description": "Kill the command after this many seconds. Default 120 (in the background: no limit)."},
                "background": {"type": "boolean", "description": "Run in the background: returns at once with a task id; when the command ends, its exit code and the end of its output come to you as a notification. Default false."}
            },
            "required": ["command"],
            "additionalProperties": false
        });
        let description = "Runs a shell command (`sh -c`) in the workspace and returns its exit \
            code and combined stdout/stderr (the last 64 KiB). Stdin is empty. It runs in a \
            sandbox (by default: writes only in the workspace and $TMPDIR, no network). The command and \
            everything it started are killed when it finishes, times out or is cancelled, so \
            background processes do not survive the call. With `background: true` it returns \
            at once with a task id (`task-1`); the command keeps running, also after this turn \
            ends or is cancelled (only the end of toolwire stops it), its completion (exit \
            code, last lines of output) is delivered as a notification, and `task_status` shows \
            it meanwhile.";
        RunCommand {
            workspace,
            tasks,
            sandbox,
            spec: spec("run_command", description, parameters, false),
        }
    }
}

#[async_trait]
impl Tool for RunCommand {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args = CommandArgs::parse(arguments)?;
        // Checked beneath the root's fd like the file tools' paths (a FIFO
        // named as cwd is refused, not waited on); the command itself is
        // confined by the sandbox, not by where it starts.
        let at = self.workspace.locate(args.cwd.as_deref().unwrap_or("."))?;
        let cwd = at.abs.clone();
        self.workspace
            .blocking(move |workspace| match workspace.open_node(&at)? {
                Node::Dir(_) => Ok(()),
                Node::File(..) => Err(ToolError::Refused(format!(
                    "cwd `{}` is not a directory",
                    at.shown
                ))),
            })
            .await?;

        if args.background {
            // Refused before anything starts.
            self.tasks.check_capacity()?;
            let spawned = Spawned::start(&self.sandbox, &self.workspace, &args.command, &cwd)?;
            let id = self.tasks.start(
                &args.command,
                spawned,
                args.timeout_secs,
                ctx.conversation_id,
                ctx.notifier.clone(),
            );
            return Ok(ToolOutput::ok(format!(
                "started `{}` in the background as {id}. Its exit code and the end of its \
                 output will come as a notification when it ends; `task_status` shows it \
                 meanwhile.",
                args.command
            )));
        }
        let timeout = args.timeout_secs();
        let Spawned {
            mut confined,
            mut rx,
            readers: _readers,
        } = Spawned::start(&self.sandbox, &self.workspace, &args.command, &cwd)?;
        ctx.progress.status(format!("Running `{}`", args.command));

        let mut tail = Tail::default();
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let status = loop {
            tokio::select! {
                _ = ctx.cancel.cancelled() => {
                    confined.stop().await;
                    return Err(ToolError::Cancelled);
                }
                _ = &mut deadline => {
                    confined.stop().await;
                    return Err(ToolError::TimedOut(timeout));
                }
                Some(text) = rx.recv() => {
                    ctx.progress.output(text.clone());
                    tail.push(&text);
                }
                status = confined.wait() => {
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
        ctx.progress.flush().await;
        let mut output = finish(tail, status, lingering);
        if let Some(note) = &confined.note {
            output.content.push_str(&format!("\n{note}"));
        }
        Ok(output)
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
