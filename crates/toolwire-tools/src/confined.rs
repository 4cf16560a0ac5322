//! The one place tools start processes: through the sandbox helper
//! (`toolwire-sandbox`), which confines itself and then the command, and
//! ends every descendant when the command ends or it is told to stop.
//!
//! Stopping asks the helper (SIGTERM, and SIGCONT in case the command
//! stopped it), so that it can end the descendants; one that does not
//! exit within [`GRACE`] has its whole process group killed.

use std::ffi::OsString;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
pub use toolwire_sandbox::{Helper, Limits, Mode, Policy, Sandbox, SandboxError};

use crate::ToolError;

/// How long the helper has to end the command's descendants when asked.
const GRACE: Duration = Duration::from_secs(2);

/// Where the command starts.
pub(crate) enum Cwd<'a> {
    Dir(&'a Path),
    /// The call's private temp dir.
    Temp,
}

/// A confined command: the helper's process, its temp dir, and what the
/// tool result should say about the sandbox.
pub(crate) struct Confined {
    pub(crate) child: tokio::process::Child,
    /// The helper, while it has not been reaped (never signal a pid that
    /// may have been reused).
    pid: Option<Pid>,
    pub(crate) note: Option<String>,
    _temp_dir: toolwire_sandbox::TempDir,
}

/// Why a command did not start.
#[derive(Debug)]
pub(crate) enum StartError {
    Sandbox(SandboxError),
    Spawn(std::io::Error),
}

impl From<StartError> for ToolError {
    fn from(e: StartError) -> ToolError {
        match e {
            StartError::Sandbox(e) => ToolError::Refused(e.to_string()),
            StartError::Spawn(e) => {
                ToolError::Failed(format!("could not start the sandbox helper: {e}"))
            }
        }
    }
}

impl Confined {
    /// Starts `argv` through `sandbox` for `workspace`, stdout and stderr
    /// piped, stdin piped when `stdin` (else empty).
    pub(crate) fn start(
        sandbox: &Sandbox,
        workspace: &Path,
        argv: &[OsString],
        cwd: Cwd<'_>,
        stdin: bool,
        limits: Option<Limits>,
    ) -> Result<Confined, StartError> {
        let prepared = sandbox
            .prepare(workspace, argv, limits)
            .map_err(StartError::Sandbox)?;
        let mut command = tokio::process::Command::from(prepared.command);
        match cwd {
            Cwd::Dir(dir) => command.current_dir(dir),
            Cwd::Temp => command.current_dir(prepared.temp_dir.path()),
        };
        let child = command
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: the last resort reaches every process in it.
            .process_group(0)
            .spawn()
            .map_err(StartError::Spawn)?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        Ok(Confined {
            child,
            pid,
            note: prepared.note,
            _temp_dir: prepared.temp_dir,
        })
    }

    /// The helper's status once it exits: the command's (a signal `n` as
    /// exit code `128 + n`), after every descendant has been ended.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await;
        self.pid = None;
        status
    }

    /// Ends the command and its descendants, and waits for that.
    pub(crate) async fn stop(&mut self) {
        let Some(pid) = self.pid else {
            return;
        };
        ask(pid);
        if tokio::time::timeout(GRACE, self.child.wait())
            .await
            .is_err()
        {
            let _ = killpg(pid, Signal::SIGKILL);
            let _ = self.child.wait().await;
        }
        self.pid = None;
    }

    /// The helper's pid while it runs.
    pub(crate) fn pid(&self) -> Option<Pid> {
        self.pid
    }
}

impl Drop for Confined {
    /// A call dropped mid-run: the helper is asked to end everything
    /// (it exits on its own; tokio reaps it).
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            ask(pid);
        }
    }
}

/// Tells a helper to end its command and exit.
pub(crate) fn ask(pid: Pid) {
    let _ = kill(pid, Signal::SIGTERM);
    let _ = kill(pid, Signal::SIGCONT);
}
