//! Keeping toolwire's own process out of its commands' reach.
//!
//! Where the kernel gives the helper no PID namespace (toolwire run by an
//! ordinary user), a command sees the machine's `/proc`, and
//! `/proc/PID/environ` of a process of the same user is readable to it:
//! toolwire's holds the provider keys. A non-dumpable process has its
//! `/proc/PID/*` files owned by root and guarded by the ptrace check
//! (`CAP_SYS_PTRACE`, which the helper drops), so that read fails; the
//! process itself still reads its own `/proc/self` (the kernel lets a
//! thread group through its own check). A child keeps the flag until it
//! executes a program: the helper and the commands are dumpable again and
//! hold only the allow-listed environment.

/// Makes this process non-dumpable: no core dump, no ptrace attach and no
/// `/proc/PID/environ`, `mem`, `fd`… for other processes of the user.
/// Call it before any tool runs.
#[cfg(target_os = "linux")]
pub fn protect_process() -> std::io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::from)
}

/// Elsewhere there is no helper (commands are refused), so nothing to
/// protect from.
#[cfg(not(target_os = "linux"))]
pub fn protect_process() -> std::io::Result<()> {
    Ok(())
}
