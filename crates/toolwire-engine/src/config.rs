//! How an engine behaves.

use toolwire_core::PriceTable;

use crate::notify::NotificationSettings;
use toolwire_providers::ToolFormat;

/// Where a user message sent during a turn goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InterjectionMode {
    /// A new user message in the tree, after the running tools' results;
    /// the next assistant message answers it.
    #[default]
    NewMessage,
    /// A high-priority notification from `user`: appended, with whatever
    /// else waits, to the result of the tool that completes next.
    Reminder,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The system prompt of new conversations.
    pub system_prompt: String,
    /// Model calls per turn before it stops with `max_steps`.
    pub max_steps: u32,
    /// Bytes of text, reasoning and call arguments one model call may
    /// stream before the step is cut with an error: what the step holds,
    /// what is stored of it and what its events log carry stay under it.
    pub max_step_output_bytes: usize,
    /// Stream events one model call may produce before the step is cut
    /// (each is a row in the event log).
    pub max_step_events: usize,
    /// Tool calls of one step that run at the same time.
    pub tool_concurrency: usize,
    pub tool_format: ToolFormat,
    pub interjections: InterjectionMode,
    pub prices: PriceTable,
    /// Events a subscriber may fall behind before it must resync from the
    /// store.
    pub event_capacity: usize,
    /// After a cancel, how long running tools get to stop before they are
    /// aborted (their calls then answered as cancelled).
    pub tool_cancel_grace: std::time::Duration,
    /// Notifications: on by default.
    pub notifications: NotificationSettings,
    /// How often the engine tells the store that it is alive (its
    /// instance's heartbeat), so that other processes on the same database
    /// leave its turns alone.
    pub heartbeat_interval: std::time::Duration,
    /// How long another process may go without a heartbeat before its
    /// unfinished turns count as orphaned, when the engine starts. Well
    /// above `heartbeat_interval`: a busy runtime or a database locked by a
    /// writer delays beats, and hosts' clocks differ a little.
    pub stale_owner_after: std::time::Duration,
    /// Keeping requests within their model's window: compaction and
    /// oversized tool results.
    pub context: crate::context::ContextSettings,
    /// Token and cost budgets (none set by default).
    pub budgets: crate::context::Budgets,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            system_prompt: "You are a helpful assistant with tools. Use them when they help."
                .into(),
            max_steps: 50,
            // 8× what a 128k-token answer holds (~512 KiB): never reached
            // by a model that stops, and a runaway stops within seconds.
            max_step_output_bytes: 4 * 1024 * 1024,
            // Above one event per token of a 128k-token answer.
            max_step_events: 250_000,
            tool_concurrency: 8,
            tool_format: ToolFormat::Native,
            interjections: InterjectionMode::NewMessage,
            prices: PriceTable::default(),
            event_capacity: 256,
            tool_cancel_grace: std::time::Duration::from_secs(5),
            notifications: NotificationSettings::default(),
            heartbeat_interval: std::time::Duration::from_secs(10),
            stale_owner_after: std::time::Duration::from_secs(30),
            context: crate::context::ContextSettings::default(),
            budgets: crate::context::Budgets::default(),
        }
    }
}
