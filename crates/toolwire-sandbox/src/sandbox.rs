//! The parent side: how toolwire starts a confined command.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::policy::{Invocation, Limits, Mode, Policy};
use crate::support::Support;

/// Why a command was not started.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "no sandbox helper is configured, so commands are refused (toolwire runs commands only \
         confined)"
    )]
    NoHelper,
    #[error(
        "refusing to run a command in `{mode}` mode: {shortfall}. Set `accept_weaker = true` in \
         the [sandbox] table to run commands with what the kernel offers, or `mode = \"full\"`"
    )]
    Weaker { mode: Mode, shortfall: String },
    #[error("could not make the command's temp dir: {0}")]
    TempDir(#[source] std::io::Error),
    #[error("could not write the sandbox policy: {0}")]
    Policy(#[source] serde_json::Error),
}

/// How to reach the helper: `exe args… --policy JSON -- argv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper {
    pub exe: PathBuf,
    /// Arguments before `--policy` (`toolwire`'s hidden subcommand).
    pub args: Vec<OsString>,
}

impl Helper {
    /// The helper executable shipped beside `toolwire`.
    pub const EXECUTABLE: &'static str = "toolwire-sandbox";

    /// [`Helper::EXECUTABLE`] in the directory of `exe`.
    pub fn beside(exe: &Path) -> Helper {
        let name = format!("{}{}", Helper::EXECUTABLE, std::env::consts::EXE_SUFFIX);
        Helper {
            exe: exe.with_file_name(name),
            args: Vec::new(),
        }
    }
}

/// The policy, the helper and what the kernel offers it. Cheap to share
/// behind an `Arc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    helper: Option<Helper>,
    policy: Policy,
    support: Support,
    /// toolwire's environment when the sandbox was made: what the
    /// allow-list picks from.
    parent_env: Vec<(OsString, OsString)>,
}

/// A command ready to spawn through the helper, and its temp dir
/// (removed when this is dropped: keep it as long as the command runs).
#[derive(Debug)]
pub struct Prepared {
    pub command: Command,
    pub temp_dir: tempfile::TempDir,
    /// Said in the tool result when the kernel confines less than the
    /// mode means (with `accept_weaker`).
    pub note: Option<String>,
}

impl Sandbox {
    /// A sandbox starting commands through `helper`, after asking it what
    /// the kernel offers (one short process).
    pub fn new(helper: Helper, policy: Policy) -> Sandbox {
        let support = Support::probe(&helper.exe, &helper.args);
        Sandbox {
            helper: Some(helper),
            policy,
            support,
            parent_env: std::env::vars_os().collect(),
        }
    }

    /// The sandbox of the `toolwire` binary `toolwire`: through the small
    /// helper executable beside it ([`Helper::beside`]) when that answers
    /// the probe and is of this version — a command then pays for loading
    /// the helper, not all of toolwire — else through `toolwire
    /// subcommand`. The second value says why a helper beside it was
    /// passed over.
    pub fn for_toolwire(
        toolwire: &Path,
        subcommand: &str,
        policy: Policy,
    ) -> (Sandbox, Option<String>) {
        let dedicated = Helper::beside(toolwire);
        let path = dedicated.exe.clone();
        let mut passed_over = None;
        if path.is_file() {
            let sandbox = Sandbox::new(dedicated, policy.clone());
            let support = &sandbox.support;
            passed_over = Some(match &support.error {
                None if support.version == crate::VERSION => return (sandbox, None),
                None => format!(
                    "{} is version {:?}, not {}",
                    path.display(),
                    support.version,
                    crate::VERSION
                ),
                Some(error) => format!("{}: {error}", path.display()),
            });
        }
        let helper = Helper {
            exe: toolwire.to_path_buf(),
            args: vec![subcommand.into()],
        };
        (Sandbox::new(helper, policy), passed_over)
    }

    /// The same sandbox (helper, probe, environment) under another file
    /// system mode: for front doors that pick the mode per session (ACP
    /// modes) without probing the kernel again.
    pub fn with_mode(&self, mode: crate::Mode) -> Sandbox {
        let policy = Policy {
            mode,
            ..self.policy.clone()
        };
        self.clone().with_policy(policy)
    }

    /// The same sandbox with `roots` granted as the workspace is
    /// (writable in `workspace-write`, readable in `read-only`): a
    /// session's additional workspace roots.
    pub fn with_additional_roots(&self, roots: impl IntoIterator<Item = PathBuf>) -> Sandbox {
        let mut policy = self.policy.clone();
        policy.write.extend(roots);
        self.clone().with_policy(policy)
    }

    /// The helper commands start through, if any.
    pub fn helper(&self) -> Option<&Helper> {
        self.helper.as_ref()
    }

    /// The environment the allow-list picks from, instead of toolwire's
    /// own (for tests: a process cannot change its own safely).
    pub fn with_parent_env(mut self, vars: impl IntoIterator<Item = (OsString, OsString)>) -> Self {
        self.parent_env = vars.into_iter().collect();
        self
    }

    /// The same helper and kernel support under another policy (an MCP
    /// server's own mode, say).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// What a process started outside the helper may inherit of
    /// toolwire's environment (see [`crate::passed_env`]), `extra` names
    /// included.
    pub fn environment(&self, extra: &[String]) -> Vec<(OsString, OsString)> {
        crate::env::passed(self.parent_env.iter().cloned(), extra)
    }

    /// No helper: every command is refused ([`SandboxError::NoHelper`]).
    /// For front doors and tests that never run commands; unconfined MCP
    /// servers still get [`Sandbox::environment`] from toolwire's own.
    pub fn none() -> Sandbox {
        Sandbox {
            helper: None,
            policy: Policy::default(),
            support: Support::default(),
            parent_env: std::env::vars_os().collect(),
        }
    }

    /// Whether commands can run at all (a helper is configured).
    pub fn has_helper(&self) -> bool {
        self.helper.is_some()
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn support(&self) -> &Support {
        &self.support
    }

    /// The line logged at start: the policy and what the kernel gives it.
    pub fn describe(&self) -> String {
        if self.helper.is_none() {
            return "commands refused (no sandbox helper)".to_owned();
        }
        let p = &self.policy;
        let mut line = format!(
            "commands run {}, network {}; kernel: {}",
            p.mode,
            if p.network { "on" } else { "off" },
            self.support.describe()
        );
        if let Some(shortfall) = self.support.shortfall(p.mode, p.network) {
            line.push_str(&format!(
                ". WEAKER than the mode: {shortfall}{}",
                if p.accept_weaker {
                    " (accepted by the config)"
                } else {
                    "; commands will be refused (accept_weaker = false)"
                }
            ));
        }
        line
    }

    /// The command `argv` for the workspace `workspace` (canonical), run
    /// through the helper with this sandbox's policy (its limits replaced
    /// by `limits` when given). The caller sets the working directory and
    /// the standard streams.
    pub fn prepare(
        &self,
        workspace: &Path,
        argv: &[OsString],
        limits: Option<Limits>,
    ) -> Result<Prepared, SandboxError> {
        let Some(helper) = &self.helper else {
            return Err(SandboxError::NoHelper);
        };
        let shortfall = self
            .support
            .shortfall(self.policy.mode, self.policy.network);
        if let Some(shortfall) = &shortfall
            && !self.policy.accept_weaker
        {
            return Err(SandboxError::Weaker {
                mode: self.policy.mode,
                shortfall: shortfall.clone(),
            });
        }
        let temp_dir = tempfile::Builder::new()
            .prefix("toolwire-cmd-")
            .tempdir()
            .map_err(SandboxError::TempDir)?;
        // Landlock judges resolved paths; /tmp may be a link.
        let temp_path = std::fs::canonicalize(temp_dir.path()).map_err(SandboxError::TempDir)?;
        let env = crate::env::build(
            self.parent_env.iter().cloned(),
            &self.policy.env,
            &temp_path,
        );
        let mut policy = self.policy.clone();
        if let Some(limits) = limits {
            policy.limits = limits;
        }
        let invocation = Invocation {
            toolchains: crate::env::toolchains(&env),
            policy,
            workspace: workspace.to_path_buf(),
            temp_dir: temp_path,
        };
        let json = serde_json::to_string(&invocation).map_err(SandboxError::Policy)?;
        let mut command = Command::new(&helper.exe);
        command
            .args(&helper.args)
            .arg("--policy")
            .arg(json)
            .arg("--")
            .args(argv)
            .env_clear()
            .envs(env);
        Ok(Prepared {
            command,
            temp_dir,
            note: shortfall.map(|s| format!("[sandbox weaker than `{}`: {s}]", self.policy.mode)),
        })
    }
}

/// Canonical forms of `paths` (a missing file: its canonical directory
/// and its name), so that they compare with what the helper sees.
pub fn canonical(paths: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    paths
        .into_iter()
        .filter_map(|path| {
            if let Ok(path) = std::fs::canonicalize(&path) {
                return Some(path);
            }
            let absolute = std::path::absolute(&path).ok()?;
            let parent = std::fs::canonicalize(absolute.parent()?).ok()?;
            Some(parent.join(absolute.file_name()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A kernel without Landlock (as the probe would report it).
    fn without_landlock(policy: Policy) -> Sandbox {
        Sandbox {
            helper: Some(Helper {
                exe: PathBuf::from("/nonexistent/helper"),
                args: Vec::new(),
            }),
            policy,
            support: Support {
                landlock_abi: None,
                seccomp: true,
                pid_namespace: false,
                error: None,
                version: crate::VERSION.to_owned(),
            },
            parent_env: Vec::new(),
        }
    }

    #[test]
    fn a_kernel_without_landlock_refuses_confined_modes_unless_accepted() {
        let argv = [OsString::from("true")];
        let ws = Path::new("/");
        let refused = without_landlock(Policy::default()).prepare(ws, &argv, None);
        let Err(SandboxError::Weaker { mode, shortfall }) = refused else {
            panic!("not refused: {refused:?}");
        };
        assert_eq!(mode, Mode::WorkspaceWrite);
        assert!(shortfall.contains("no Landlock"), "{shortfall}");
        assert!(
            without_landlock(Policy::default())
                .describe()
                .contains("commands will be refused")
        );

        let accepted = without_landlock(Policy {
            accept_weaker: true,
            ..Policy::default()
        })
        .prepare(ws, &argv, None)
        .unwrap();
        assert!(accepted.note.unwrap().contains("no Landlock"));

        let full = without_landlock(Policy {
            mode: Mode::Full,
            ..Policy::default()
        })
        .prepare(ws, &argv, None)
        .unwrap();
        assert!(full.note.is_none());
    }

    #[test]
    fn no_helper_no_command() {
        let refused = Sandbox::none().prepare(Path::new("/"), &[OsString::from("true")], None);
        assert!(matches!(refused, Err(SandboxError::NoHelper)));
    }
}
