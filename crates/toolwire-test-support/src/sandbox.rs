//! Sandboxes as the tests of a crate with a sandbox helper binary build
//! them. The helper's path comes from the calling test
//! (`env!("CARGO_BIN_EXE_…")` exists only in that crate's tests).

use std::path::PathBuf;

use toolwire_tools::confined::{Helper, Mode, Policy, Sandbox};

/// A sandbox through the helper binary `exe` with `policy`.
pub fn through(exe: &str, policy: Policy) -> Sandbox {
    Sandbox::new(
        Helper {
            exe: exe.into(),
            args: Vec::new(),
        },
        policy,
    )
}

/// A sandbox through `exe` in `mode` (the default limits), with or without
/// the network, protecting `protected`.
pub fn protecting(exe: &str, mode: Mode, network: bool, protected: &[PathBuf]) -> Sandbox {
    through(
        exe,
        Policy {
            mode,
            network,
            protected: toolwire_sandbox::canonical(protected.iter().cloned()),
            ..Policy::default()
        },
    )
}
