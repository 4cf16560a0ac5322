//! toolwire-sandbox: confines the commands toolwire runs for the model
//! (`run_command`, Python-source tools) with the kernel's own means.
//!
//! It owns the policy ([`Policy`]: `read-only`, `workspace-write`,
//! `full`), the parent side ([`Sandbox`]: the helper's command line, an
//! environment built from an allow-list, a private temp dir per call, the
//! kernel probe) and the helper ([`helper::main`]), which confines itself
//! and then starts the command as its child; and keeping toolwire's own
//! process out of its commands' reach ([`protect_process`]).
//!
//! Invariant: a command is only ever started through the helper, with an
//! environment built from the allow-list; a [`Sandbox`] without a helper
//! refuses every command rather than run it unconfined. Depends on no
//! toolwire crate.

mod env;
mod policy;
mod protect;
mod sandbox;
mod support;

#[cfg(target_os = "linux")]
pub mod helper;

pub use env::{build as build_env, forbidden as forbidden_env, passed as passed_env, toolchains};
pub use policy::{Invocation, Limits, Mode, Policy};
pub use protect::protect_process;
pub use sandbox::{Helper, Prepared, Sandbox, SandboxError, canonical};
pub use support::Support;
pub use tempfile::TempDir;

/// This crate's version, which the helper reports when probed: toolwire
/// uses a helper executable only when it is of its own version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
