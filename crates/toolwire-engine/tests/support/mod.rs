//! The engine tests' support: everything shared with the other crates'
//! tests comes from `toolwire-test-support`; what is here needs this
//! crate's own helper binary, whose path only its tests know.
#![allow(dead_code, unused_imports)]

use std::sync::Arc;

pub use toolwire_test_support::*;
use toolwire_tools::confined::{Mode, Sandbox};

/// A sandbox in `mode` through this crate's helper binary (the default
/// limits), with or without the network, protecting `protected`.
pub fn sandbox_protecting(mode: Mode, network: bool, protected: &[std::path::PathBuf]) -> Sandbox {
    toolwire_test_support::sandbox::protecting(
        env!("CARGO_BIN_EXE_toolwire-engine-sandbox"),
        mode,
        network,
        protected,
    )
}

/// The default sandbox (`workspace-write`, no network).
pub fn sandbox() -> Arc<Sandbox> {
    Arc::new(sandbox_protecting(Mode::WorkspaceWrite, false, &[]))
}
