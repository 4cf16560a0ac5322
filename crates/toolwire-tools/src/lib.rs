//! # toolwire-tools
//!
//! **Owns** what the model can call: the [`Tool`] trait and what a call
//! gets ([`ToolContext`], [`ProgressHandle`], [`Notifier`]), the
//! [`ToolRegistry`], the built-in tools confined to a workspace root
//! ([`builtin`]), the one place tools start processes ([`confined`],
//! through the sandbox helper), Python-source tools ([`python`]), the MCP
//! client ([`mcp`]) and the record of the agent's own writes
//! ([`OwnWrites`], read by the engine's file watcher).
//!
//! **Invariants.** Knows no front door, no store and no provider: a tool
//! is a spec, arguments in and a result out. Tool failures are results the
//! model sees, never panics or engine errors. Every path a built-in tool
//! touches is resolved beneath the workspace root and opened relative to
//! its fd, so a path changed after the check cannot escape; every process
//! a tool starts goes through the sandbox helper and ends with its call
//! (or, for a background command, with its task set). Schemas are JSON
//! Schema, in no front door's shape.
//!
//! **Entry points.** [`Tool`], [`ToolSpec`], [`ToolRegistry`],
//! [`builtin::all`], [`mcp::connect_all`], [`python::PythonTool`].

pub mod builtin;
pub mod confined;
pub mod mcp;
mod own_writes;
pub mod python;
mod registry;
mod tool;

pub use own_writes::OwnWrites;
pub use registry::{ToolRegistry, ToolSource};
pub use tool::{
    MAX_HELD_OUTPUT, NotificationSink, Notifier, ProgressHandle, Tool, ToolContext, ToolError,
    ToolImage, ToolOutput,
};
pub use toolwire_core::ToolSpec;
