//! # toolwire-engine
//!
//! **Owns** the turn loop (a model step through a
//! [`Provider`](toolwire_providers::Provider), the tool calls it asks for
//! through a [`ToolRegistry`](toolwire_tools::ToolRegistry), the stored
//! messages), approvals, notifications and their sources (the workspace's
//! file watcher), interjections, the per-conversation event bus and its
//! followers, instance heartbeats, crash recovery and shutdown. Providers
//! live in `toolwire-providers`, tools in `toolwire-tools`.
//!
//! **Invariants.** Knows no front-door wire format (no ACP or Letta names).
//! Persist, then publish: every step is stored before any client hears of
//! it. A slow subscriber never blocks a turn. A paused turn's waiting
//! calls are answered exactly once, and every tool call in the tree gets a
//! result (a crash's open calls when the next engine starts; none is ever
//! sent to a model without one). A model call is bounded in time and
//! output whatever the server does (`StreamLimits`, `max_step_*`); a panic
//! in a turn ends it with an error and releases its conversation.
//!
//! Instances on one database act as one (`engine/cluster.rs`): a turn runs only
//! with its conversation's lease (never two turns in a conversation,
//! whichever instances are asked), events another instance stores reach
//! the followers here, and commands for a turn reach the instance that
//! runs it.
//!
//! The engine owns every change to a conversation: front doors read the
//! store, and write through [`Engine`] (turns; `fork`, `set_active_leaf`,
//! `set_system_prompt`, refused while a turn runs, `edit.rs`; their own
//! records, `records.rs`).
//!
//! Requests stay within the model's context window ([`context`]): the
//! older part of a branch is summarised into a compaction node of the
//! tree (nothing stored changes; a branch from before it sends the
//! originals), oversized tool results are sent cut; budgets stop a turn.
//!
//! **Entry points.** [`Engine`] (`start`, `send_with`, `respond`,
//! `follow`, `compact`), [`TurnOptions`], [`watch::start`] (the
//! workspace's file watcher, a notification source).

mod approval;
mod bus;
mod chosen_model;
mod config;
pub mod context;
mod edit;
mod engine;
mod error;
mod follow;
mod instance;
mod interjections;
mod kept_paths;
mod keyed_locks;
pub mod notify;
mod records;
mod recover;
mod remembered;
mod shutdown;
mod turn;
pub mod watch;

pub use bus::{Observer, Subscription};
pub use config::{EngineConfig, InterjectionMode};
pub use engine::{Engine, Interjection, Notified, Responded, TurnHandle, WeakEngine};
pub use error::EngineError;
pub use follow::Follower;
pub use keyed_locks::{Held, KeyedLocks};
pub use shutdown::ShutdownReport;
pub use turn::{RunRecords, SystemPrompt, TurnOptions, TurnOutcome};
