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

Session modes (session/set_mode, or the \"mode\" config option; kept with the
session): read-only (edits and commands refused without asking, but a
run_command allowed outright above runs, under the read-only sandbox), ask (the
policies above; the default), accept-edits (file edits run without asking,
commands ask), full-access (nothing asks; a configured \"deny\" still holds).
Each mode picks the sandbox its commands run under: read-only -> read-only,
ask and accept-edits -> the [sandbox] mode, full-access -> full. In the
config file:

  [acp]
  default_mode = \"ask\"
  [acp.modes.full-access]
  sandbox = \"workspace-write\"   # read-only | workspace-write | full

Sessions: session/list (newest first, by cwd), session/resume, session/load,
session/close and session/fork work across toolwire acp processes on one
database. Config options: mode, model, and reasoning_effort for models with
the reasoning capability. Slash commands: /fork, /model NAME, and each MCP
server's prompts as /mcp__SERVER__PROMPT. When the default model's API key
variable is unset the agent still starts and offers it as an auth method.

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
    let mut settings = args.engine.resolve()?;
    // A missing key is told to the editor (authMethods), not a failed start.
    let key = settings
        .models
        .allow_missing_keys()
        .map(|(model, env)| toolwire_acp::KeyCheck { model, env });
    // No process-wide watcher: each session watches its own cwd and tells
    // only its own conversation.
    let running = settings.start_unwatched().await?;
    let acp = toolwire_acp::AcpSettings {
        watch: settings.watch_settings(),
        sandbox: running.sandbox.clone(),
        key,
        ..settings.acp.clone()
    };
    toolwire_acp::serve_stdio(running.engine.clone(), acp).await?;
    running.stop().await;
    Ok(ExitCode::SUCCESS)
}
