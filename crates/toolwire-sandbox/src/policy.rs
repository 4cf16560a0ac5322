//! What a confined command may do: the policy as configured, and the
//! invocation the parent hands the helper (the policy plus this call's
//! workspace and private temp dir).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How far a command reaches into the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Reads what commands need (system directories, the workspace, the
    /// toolchains); writes nothing.
    ReadOnly,
    /// As `read-only`, and writes the workspace and the call's temp dir.
    #[default]
    WorkspaceWrite,
    /// No file-system or network confinement (limits, the environment
    /// allow-list and the end of every descendant still apply).
    Full,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ReadOnly => "read-only",
            Mode::WorkspaceWrite => "workspace-write",
            Mode::Full => "full",
        }
    }

    /// Whether this mode needs Landlock to mean what it says.
    pub fn confines(self) -> bool {
        self != Mode::Full
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read-only" => Ok(Mode::ReadOnly),
            "workspace-write" => Ok(Mode::WorkspaceWrite),
            "full" => Ok(Mode::Full),
            other => Err(format!(
                "unknown sandbox mode `{other}`: expected read-only, workspace-write or full"
            )),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Resource limits, each per process of the command (the kernel's
/// rlimits); `None` leaves the limit as inherited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Processes (threads included) the command may start on top of those
    /// already running on the machine: `RLIMIT_NPROC` counts per user.
    pub processes: Option<u64>,
    /// Largest file a process may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size: Option<u64>,
    /// CPU seconds per process (`RLIMIT_CPU`).
    pub cpu_seconds: Option<u64>,
    /// Address space per process, in bytes (`RLIMIT_AS`).
    pub memory: Option<u64>,
}

impl Limits {
    /// The defaults for shell commands: generous enough for builds
    /// (compilers reserve large address spaces, so no memory limit).
    pub fn commands() -> Limits {
        Limits {
            processes: Some(4096),
            file_size: Some(4096 * MIB),
            cpu_seconds: None,
            memory: None,
        }
    }
}

pub(crate) const MIB: u64 = 1024 * 1024;

/// The configured policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub mode: Mode,
    /// TCP/UDP and socket creation allowed (off by default).
    pub network: bool,
    /// Extra directories (or files) readable, besides the system ones,
    /// the workspace and the toolchains found on `PATH`.
    pub read: Vec<PathBuf>,
    /// Extra directories writable in `workspace-write`.
    pub write: Vec<PathBuf>,
    /// Environment variables passed through besides the allow-list.
    pub env: Vec<String>,
    pub limits: Limits,
    /// Files no command may open, wherever they are (toolwire's
    /// database and its `-wal`/`-shm`/`-journal` siblings, the config
    /// file, key files), even inside a granted directory.
    pub protected: Vec<PathBuf>,
    /// Run `read-only`/`workspace-write` commands even where the kernel
    /// cannot confine them (no Landlock), saying so in each result.
    pub accept_weaker: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: Mode::WorkspaceWrite,
            network: false,
            read: Vec::new(),
            write: Vec::new(),
            env: Vec::new(),
            limits: Limits::commands(),
            protected: Vec::new(),
            accept_weaker: false,
        }
    }
}

/// What the helper is told for one call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invocation {
    pub policy: Policy,
    /// The workspace root (canonical).
    pub workspace: PathBuf,
    /// The call's private temp dir (`TMPDIR`).
    pub temp_dir: PathBuf,
    /// Read grants found by the parent: toolchain roots on `PATH` and the
    /// like (the helper runs with the allow-listed environment only).
    pub toolchains: Vec<PathBuf>,
}
