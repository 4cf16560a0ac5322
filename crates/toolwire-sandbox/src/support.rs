//! What the kernel offers, as the helper finds it (`--probe`): asked once
//! at start so that toolwire can say what its commands run under.

use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::policy::Mode;

/// The kernel's means, as seen by a process like the commands' helper.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Support {
    /// Landlock's ABI version; `None` when the kernel has none.
    pub landlock_abi: Option<i32>,
    /// A seccomp filter could be installed.
    pub seccomp: bool,
    /// New PID and mount namespaces could be made (root or
    /// `CAP_SYS_ADMIN`): descendants end with PID 1, `/proc` is private.
    pub pid_namespace: bool,
    /// Why the probe itself failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The helper's version ([`crate::VERSION`]): a helper executable of
    /// another version may read policies differently, so it is not used
    /// (an older one reports none).
    #[serde(default)]
    pub version: String,
}

impl Support {
    /// Runs `exe args… --probe` and reads its answer.
    pub fn probe(exe: &Path, args: &[std::ffi::OsString]) -> Support {
        let output = Command::new(exe)
            .args(args)
            .arg("--probe")
            .env_clear()
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        match output {
            Ok(out) if out.status.success() => serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| Support::failed(format!("unreadable probe answer: {e}"))),
            Ok(out) => Support::failed(format!(
                "the probe failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Support::failed(format!("could not run {}: {e}", exe.display())),
        }
    }

    fn failed(error: String) -> Support {
        Support {
            error: Some(error),
            ..Support::default()
        }
    }

    /// Landlock can confine the file system (ABI 1+) and TCP (ABI 4+).
    pub fn landlock(&self) -> bool {
        self.landlock_abi.is_some_and(|abi| abi >= 1)
    }

    /// One line for the start log: what commands run under.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.landlock_abi {
            Some(abi) if abi >= 4 => parts.push(format!("Landlock ABI {abi} (files, TCP)")),
            Some(abi) if abi >= 1 => {
                parts.push(format!("Landlock ABI {abi} (files only: TCP needs ABI 4)"))
            }
            _ => parts.push("no Landlock".to_owned()),
        }
        parts.push(
            if self.seccomp {
                "seccomp"
            } else {
                "no seccomp"
            }
            .to_owned(),
        );
        parts.push(
            if self.pid_namespace {
                "PID namespace with its own /proc"
            } else {
                "no PID namespace (descendants ended through the reaper; /proc shows the machine's processes)"
            }
            .to_owned(),
        );
        if let Some(error) = &self.error {
            parts.push(format!("probe error: {error}"));
        }
        parts.join(", ")
    }

    /// What `mode` loses on this kernel, if anything.
    pub fn shortfall(&self, mode: Mode, network: bool) -> Option<String> {
        if !mode.confines() {
            return None;
        }
        let mut missing = Vec::new();
        if !self.landlock() {
            missing.push("the kernel has no Landlock: the file system is not confined");
        }
        if !network && !self.seccomp && self.landlock_abi.is_none_or(|abi| abi < 4) {
            missing.push("neither seccomp nor Landlock ABI 4: the network is not cut");
        }
        (!missing.is_empty()).then(|| missing.join("; "))
    }
}
