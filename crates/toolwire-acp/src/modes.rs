//! The session modes (ACP `modes`, `session/set_mode`): how much runs
//! without asking, and which sandbox policy the session's commands run
//! under.
//!
//! | mode          | asks about            | refused unasked        | commands' sandbox (default) |
//! |---------------|-----------------------|------------------------|-----------------------------|
//! | `read-only`   | nothing               | every tool that writes¹| `read-only`                 |
//! | `ask`         | tools that write      | configured `deny`      | the configured policy       |
//! | `accept-edits`| commands, other tools | configured `deny`      | the configured policy       |
//! | `full-access` | nothing               | configured `deny`      | `full`                      |
//!
//! ¹ but `run_command` where the configuration allows it outright
//! (`[acp.permissions] run_command = "allow"`): it runs, under the
//! read-only sandbox.
//!
//! The mode is kept with the session (`sessions.rs`), so a session loaded
//! or resumed by another agent process has the mode it was left in.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{SessionModeId, SessionModeState};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolwire_core::{ToolKind, kind_of};
use toolwire_tools::confined::{Mode as SandboxMode, Sandbox};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// A session's mode.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SessionMode {
    /// Reads only: tools that write and commands are refused without asking.
    ReadOnly,
    /// Tools that write ask (the configured policies decide).
    #[default]
    Ask,
    /// File edits run without asking; commands and other tools ask.
    AcceptEdits,
    /// Nothing asks.
    FullAccess,
}

impl SessionMode {
    pub const ALL: [SessionMode; 4] = [
        SessionMode::ReadOnly,
        SessionMode::Ask,
        SessionMode::AcceptEdits,
        SessionMode::FullAccess,
    ];

    pub fn id(self) -> &'static str {
        match self {
            SessionMode::ReadOnly => "read-only",
            SessionMode::Ask => "ask",
            SessionMode::AcceptEdits => "accept-edits",
            SessionMode::FullAccess => "full-access",
        }
    }

    fn name(self) -> &'static str {
        match self {
            SessionMode::ReadOnly => "Read only",
            SessionMode::Ask => "Ask",
            SessionMode::AcceptEdits => "Accept edits",
            SessionMode::FullAccess => "Full access",
        }
    }

    /// The mode named `id`, or an error naming the modes there are.
    pub fn parse(id: &str) -> Result<SessionMode, String> {
        SessionMode::ALL
            .into_iter()
            .find(|m| m.id() == id)
            .ok_or_else(|| format!("unknown mode `{id}`; the modes are: {}", mode_list()))
    }

    /// The sandbox mode of its commands unless the configuration says
    /// otherwise: `None` is the configured policy.
    fn default_sandbox(self) -> Option<SandboxMode> {
        match self {
            SessionMode::ReadOnly => Some(SandboxMode::ReadOnly),
            SessionMode::Ask | SessionMode::AcceptEdits => None,
            SessionMode::FullAccess => Some(SandboxMode::Full),
        }
    }

    /// Whether a call of `tool` (read-only or not) may run without asking
    /// in this mode when the configured policy would ask.
    pub(crate) fn runs_unasked(self, tool: &str) -> bool {
        match self {
            SessionMode::FullAccess => true,
            SessionMode::AcceptEdits => kind_of(tool) == ToolKind::Edit,
            SessionMode::ReadOnly | SessionMode::Ask => false,
        }
    }

    /// Whether this mode refuses `tool` (not read-only) without asking.
    pub(crate) fn refuses_writes(self) -> bool {
        self == SessionMode::ReadOnly
    }
}

fn mode_list() -> String {
    SessionMode::ALL
        .iter()
        .map(|m| m.id())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the editor is told about the modes, `current` selected: ids and
/// names only. Every session's answer carries them, twice (here and as the
/// `mode` config option), so no descriptions: the names say it, and
/// docs/acp.md says what each mode lets run.
pub(crate) fn state(current: SessionMode) -> SessionModeState {
    SessionModeState::new(
        SessionModeId::new(current.id()),
        SessionMode::ALL
            .into_iter()
            .map(|m| agent_client_protocol::v1::schema::SessionMode::new(m.id(), m.name()))
            .collect(),
    )
}

/// The select options of the mode config option (as [`state`]).
pub(crate) fn choices() -> Vec<agent_client_protocol::v1::schema::SessionConfigSelectOption> {
    SessionMode::ALL
        .into_iter()
        .map(|m| {
            agent_client_protocol::v1::schema::SessionConfigSelectOption::new(m.id(), m.name())
        })
        .collect()
}

/// The sandbox of each mode's commands: the configured sandbox under the
/// sandbox mode each session mode picks (`[acp.modes.MODE] sandbox`, else
/// its default). Made once per agent: the kernel is probed once.
#[derive(Debug, Clone)]
pub struct ModeSandboxes {
    by_mode: BTreeMap<SessionMode, Arc<Sandbox>>,
}

impl ModeSandboxes {
    /// From the configured sandbox and the configured per-mode choices.
    pub fn new(base: &Arc<Sandbox>, chosen: &BTreeMap<SessionMode, SandboxMode>) -> Self {
        let by_mode = SessionMode::ALL
            .into_iter()
            .map(|mode| {
                let sandbox = match chosen.get(&mode).copied().or(mode.default_sandbox()) {
                    Some(m) if m != base.policy().mode => Arc::new(base.with_mode(m)),
                    _ => base.clone(),
                };
                (mode, sandbox)
            })
            .collect();
        ModeSandboxes { by_mode }
    }

    pub fn of(&self, mode: SessionMode) -> Option<&Arc<Sandbox>> {
        self.by_mode.get(&mode)
    }
}

/// `run_command` under the session's current mode's sandbox: one builtin
/// per mode (they share the workspace and the background tasks), the
/// mode read at each call, so `session/set_mode` needs no new tools.
pub(crate) struct ModeRunCommand {
    pub by_mode: BTreeMap<SessionMode, Arc<dyn Tool>>,
    pub mode: Arc<Mutex<SessionMode>>,
    pub fallback: Arc<dyn Tool>,
}

impl ModeRunCommand {
    fn current(&self) -> &Arc<dyn Tool> {
        let mode = self.mode.lock().map(|m| *m).unwrap_or_default();
        self.by_mode.get(&mode).unwrap_or(&self.fallback)
    }
}

#[async_trait]
impl Tool for ModeRunCommand {
    fn spec(&self) -> &Arc<ToolSpec> {
        self.fallback.spec()
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.current().call(arguments, ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_by_id_and_name_the_others_when_unknown() {
        for mode in SessionMode::ALL {
            assert_eq!(SessionMode::parse(mode.id()), Ok(mode));
        }
        let error = SessionMode::parse("yolo").unwrap_err();
        assert!(error.contains("`yolo`"), "{error}");
        assert!(error.contains("read-only, ask, accept-edits, full-access"));
    }

    #[test]
    fn each_mode_picks_its_sandbox_unless_configured() {
        let base = Arc::new(Sandbox::none());
        let sandboxes = ModeSandboxes::new(&base, &BTreeMap::new());
        let mode_of = |m| sandboxes.of(m).map(|s| s.policy().mode);
        assert_eq!(mode_of(SessionMode::ReadOnly), Some(SandboxMode::ReadOnly));
        assert_eq!(mode_of(SessionMode::Ask), Some(base.policy().mode));
        assert_eq!(mode_of(SessionMode::AcceptEdits), Some(base.policy().mode));
        assert_eq!(mode_of(SessionMode::FullAccess), Some(SandboxMode::Full));
        let chosen = BTreeMap::from([(SessionMode::FullAccess, SandboxMode::WorkspaceWrite)]);
        let sandboxes = ModeSandboxes::new(&base, &chosen);
        assert_eq!(
            sandboxes
                .of(SessionMode::FullAccess)
                .map(|s| s.policy().mode),
            Some(SandboxMode::WorkspaceWrite)
        );
    }

    #[test]
    fn accept_edits_runs_edits_only_and_full_access_everything() {
        assert!(SessionMode::AcceptEdits.runs_unasked("write_file"));
        assert!(SessionMode::AcceptEdits.runs_unasked("apply_diff"));
        assert!(!SessionMode::AcceptEdits.runs_unasked("run_command"));
        assert!(SessionMode::FullAccess.runs_unasked("run_command"));
        assert!(!SessionMode::Ask.runs_unasked("write_file"));
        assert!(SessionMode::ReadOnly.refuses_writes());
    }
}
