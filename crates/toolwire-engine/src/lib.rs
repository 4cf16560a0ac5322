//! # toolwire-engine
//!
//! **Owns** the turn loop: providers (model calls over HTTP, and the
//! scripted provider), tools (built-in, MCP, Python-source, client-side),
//! approvals, notifications, interjections, and the per-conversation event
//! bus.
//!
//! **Invariants.** Knows no front-door wire format (no ACP or Letta names).
//! Persist, then publish: every step is stored before any client hears of
//! it. A slow subscriber never blocks a turn. A paused turn's waiting
//! calls are answered exactly once, and every tool call in the tree gets a
//! result.
//!
//! **Entry points.** [`Engine`] (`start`, `send_with`, `respond`,
//! `follow`), [`TurnOptions`], [`tools::ToolRegistry`],
//! [`provider::Provider`], [`watch::start`] (the workspace's file watcher,
//! a notification source).

mod approval;
mod bus;
mod config;
mod engine;
mod follow;
mod instance;
pub mod notify;
pub mod provider;
mod remembered;
mod shutdown;
pub mod tools;
mod turn;
pub mod watch;

pub use bus::{Observer, Subscription};
pub use config::{EngineConfig, InterjectionMode};
pub use engine::{
    Engine, EngineError, Interjection, Notified, Responded, TurnHandle, TurnOptions, TurnOutcome,
};
pub use follow::Follower;
pub use shutdown::ShutdownReport;
