//! `run_command` in the editor's terminal: when the client advertises
//! `terminal`, a command runs through `terminal/create`, the tool call
//! shows the terminal (content `{type: "terminal", terminalId}`) and the
//! model gets its output and exit status as from the built-in tool.
//! Background commands still run here (a terminal lives only as long as
//! its call).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, KillTerminalRequest, ReleaseTerminalRequest, SessionId,
    TerminalExitStatus, TerminalOutputRequest, WaitForTerminalExitRequest,
};
use async_trait::async_trait;
use serde_json::Value;
use toolwire_core::ToolCallId;
use toolwire_tools::builtin::{CommandArgs, Workspace};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// The output the editor keeps for the model (the built-in tool's tail).
const OUTPUT_LIMIT: u64 = 64 * 1024;

/// The editor terminal of each running call, so the call's updates can
/// show it.
pub(crate) type Terminals = Arc<Mutex<HashMap<ToolCallId, String>>>;

pub(crate) struct ClientRunCommand {
    pub cx: ConnectionTo<Client>,
    pub session_id: SessionId,
    pub workspace: Arc<Workspace>,
    /// The session's cwd as the editor gave it.
    pub cwd: std::path::PathBuf,
    pub terminals: Terminals,
    /// The built-in tool: its spec, and background commands.
    pub builtin: Arc<dyn Tool>,
}

/// How waiting for the command ended.
enum Ended {
    Exited(TerminalExitStatus),
    /// The editor could not say: the terminal is still killed and
    /// released.
    WaitFailed(agent_client_protocol::Error),
    TimedOut(u64),
    Cancelled,
}

#[async_trait]
impl Tool for ClientRunCommand {
    fn spec(&self) -> &Arc<ToolSpec> {
        self.builtin.spec()
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args = CommandArgs::parse(arguments.clone())?;
        if args.background {
            return self.builtin.call(arguments, ctx).await;
        }
        let cwd = self.workspace.resolve(args.cwd.as_deref().unwrap_or("."))?;
        let timeout = args.timeout_secs();
        let failed = |what: &str, e: agent_client_protocol::Error| {
            ToolError::Failed(format!("the editor's terminal {what}: {}", e.message))
        };
        let create = CreateTerminalRequest::new(self.session_id.clone(), "sh")
            .args(vec!["-c".to_owned(), args.command.clone()])
            .cwd(crate::client_fs::editor_path(
                &self.cwd,
                &self.workspace,
                &cwd,
            ))
            .output_byte_limit(OUTPUT_LIMIT);
        let terminal_id = self
            .cx
            .send_request(create)
            .block_task()
            .await
            .map_err(|e| failed("could not start", e))?
            .terminal_id;
        if let Ok(mut terminals) = self.terminals.lock() {
            terminals.insert(ctx.call_id.clone(), terminal_id.0.to_string());
        }
        // Tells the call's updates to show the terminal.
        ctx.progress.status(format!(
            "Running `{}` in the editor's terminal",
            args.command
        ));

        let wait = self
            .cx
            .send_request(WaitForTerminalExitRequest::new(
                self.session_id.clone(),
                terminal_id.clone(),
            ))
            .block_task();
        let ended = tokio::select! {
            exited = wait => match exited {
                Ok(exited) => Ended::Exited(exited.exit_status),
                Err(e) => Ended::WaitFailed(e),
            },
            () = tokio::time::sleep(Duration::from_secs(timeout)) => Ended::TimedOut(timeout),
            () = ctx.cancel.cancelled() => Ended::Cancelled,
        };
        if !matches!(ended, Ended::Exited(_)) {
            let kill = KillTerminalRequest::new(self.session_id.clone(), terminal_id.clone());
            if let Err(e) = self.cx.send_request(kill).block_task().await {
                tracing::warn!(error = %e.message, "killing the editor's terminal");
            }
        }
        let output = self
            .cx
            .send_request(TerminalOutputRequest::new(
                self.session_id.clone(),
                terminal_id.clone(),
            ))
            .block_task()
            .await;
        // Released in any case: the editor keeps showing what the call
        // embedded, but frees the process.
        let release = ReleaseTerminalRequest::new(self.session_id.clone(), terminal_id);
        if let Err(e) = self.cx.send_request(release).block_task().await {
            tracing::warn!(error = %e.message, "releasing the editor's terminal");
        }
        match ended {
            Ended::WaitFailed(e) => Err(failed("failed", e)),
            Ended::Cancelled => Err(ToolError::Cancelled),
            Ended::TimedOut(secs) => Err(ToolError::TimedOut(secs)),
            Ended::Exited(status) => {
                let output = output.map_err(|e| failed("gave no output", e))?;
                Ok(result(&output.output, output.truncated, &status))
            }
        }
    }
}

/// The model's text, as the built-in tool words it.
fn result(output: &str, truncated: bool, status: &TerminalExitStatus) -> ToolOutput {
    let mut text = String::new();
    if truncated {
        text.push_str("[the beginning of the output was cut; showing its end]\n");
    }
    text.push_str(if output.is_empty() {
        "(no output)"
    } else {
        output
    });
    if !text.ends_with('\n') {
        text.push('\n');
    }
    match (status.exit_code, &status.signal) {
        (Some(code), _) => text.push_str(&format!("[exit code: {code}]")),
        (None, Some(signal)) => text.push_str(&format!("[killed by signal {signal}]")),
        (None, None) => text.push_str("[exit status unknown]"),
    }
    if status.exit_code == Some(0) {
        ToolOutput::ok(text)
    } else {
        ToolOutput::error(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_read_like_the_builtin_tools() {
        let out = result("hi\n", false, &TerminalExitStatus::new().exit_code(0));
        assert_eq!(out, ToolOutput::ok("hi\n[exit code: 0]"));
        let out = result(
            "",
            true,
            &TerminalExitStatus::new().signal("SIGKILL".to_owned()),
        );
        assert!(out.is_error);
        assert!(
            out.content
                .ends_with("(no output)\n[killed by signal SIGKILL]")
        );
    }
}
