//! `toolwire acp`: the Agent Client Protocol agent on stdin/stdout, until
//! the client closes stdin. Logs go to stderr only: stdout is the protocol.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::config::EngineArgs;

/// What `toolwire acp --help` says beyond the flags: the `[acp]` table of
/// the config file and the client capabilities the agent honours.
const ACP_HELP: &str = "\
Tool permissions: read-only tools (read_file, list_dir, search, update_plan,
and MCP tools annotated readOnlyHint) run without asking; other tools ask the
editor (session/request_permission), whose \"always\" answers are kept with the
session. Per tool, in the config file (--config):

  [acp.permissions]
  run_command = \"allow\"   # allow | ask | deny
  read_file = \"ask\"

Tool call updates ([acp] table, defaults shown):

  [acp]
  coalesce_ms = 50                 # changes this close together: one update (0: off)
  max_updates_per_second = 20      # per tool call (0: no limit)
  complete_objects = false         # send complete tool calls, not just changes
  output_limit_bytes = 65536       # command output shown when replaced
  call_byte_budget = 8388608       # past it, a call's output goes out once a second
  max_open_sessions = 16           # beyond: the least recently used closes until its next prompt

Client capabilities honoured: fs.readTextFile / fs.writeTextFile (read_file and
write_file go through the editor), terminal (run_command runs in an editor
terminal), _meta.terminal_output (command output as appended
_meta.terminal_output, then _meta.terminal_exit), and
_meta.toolwire.complete_tool_calls (complete tool call objects).

Notifications: the extension notification _toolwire/notify
{sessionId, text, source?, priority?: low|normal|high} reaches the model with
the next tool result; delivered notifications show as a thought. Each session
watches its own cwd: outside file changes there reach that session's model the
same way (never the database's own files; off with [notifications]
enabled = false).

Logs go to stderr: warnings, and this command's own lines (sessions, permission
answers, and each session's update metrics when the connection ends); RUST_LOG
changes that.";

#[derive(Debug, Args)]
#[command(after_long_help = ACP_HELP)]
pub struct AcpArgs {
    #[command(flatten)]
    engine: EngineArgs,
}

pub async fn run(args: &AcpArgs) -> Result<ExitCode> {
    let settings = args.engine.resolve()?;
    // No process-wide watcher: each session watches its own cwd and tells
    // only its own conversation.
    let running = settings.start_unwatched().await?;
    let acp = toolwire_acp::AcpSettings {
        watch: settings.watch_settings(),
        sandbox: running.sandbox.clone(),
        ..settings.acp.clone()
    };
    toolwire_acp::serve_stdio(running.engine.clone(), acp).await?;
    running.stop().await;
    Ok(ExitCode::SUCCESS)
}
