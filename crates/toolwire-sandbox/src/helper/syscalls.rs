//! seccomp: with the network off, no socket can be made (`socket(2)`
//! fails with `EPERM` for every family: a path-named `AF_UNIX` socket
//! could reach a local database server) and no io_uring (which can make
//! sockets without `socket(2)`). `socketpair(2)` stays: it connects only
//! the process to itself.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

pub(super) fn deny_sockets() -> Result<(), String> {
    install(&[libc::SYS_socket, libc::SYS_io_uring_setup])
}

/// Installs a filter that denies nothing real (for `--probe`).
pub(super) fn probe() -> Result<(), String> {
    install(&[libc::SYS_io_uring_register])
}

fn install(denied: &[i64]) -> Result<(), String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        denied.iter().map(|&nr| (nr, Vec::new())).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}
