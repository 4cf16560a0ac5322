//! Built-in tools, confined to a workspace root.
//!
//! Every path argument goes through [`Workspace::resolve`] before any file
//! is touched, so the sandbox rule lives in one place; the file is then
//! opened relative to the root's fd with the kernel refusing to leave it
//! (`beneath.rs`), so a path changed after the check cannot escape either,
//! and blocking file work runs a few at a time ([`Workspace`]). `run_command` is the
//! exception by nature: what the shell does is confined by the kernel,
//! through the [`Sandbox`](crate::confined::Sandbox) it is given
//! (`confined.rs`). Its background commands live in [`BackgroundTasks`],
//! shown by `task_status`. `update_plan` touches nothing: it keeps the
//! model's task list in the conversation.

mod apply_diff;
mod beneath;
pub(crate) mod common;
mod diff;
mod list_dir;
mod plan;
mod read_file;
mod run_command;
mod search;
mod spawned;
mod tasks;
mod workspace;
mod write_file;

use std::sync::Arc;

pub use apply_diff::ApplyDiff;
pub use common::parse_args;
pub use list_dir::ListDir;
pub use plan::{
    MAX_EXPLANATION_CHARS, MAX_STEP_CHARS, MAX_STEPS, Plan, PlanStep, StepStatus, UPDATE_PLAN,
    UpdatePlan, parse_plan,
};
pub use read_file::ReadFile;
pub use run_command::{CommandArgs, RunCommand};
pub use search::Search;
pub use tasks::{BackgroundTasks, TaskStatus};
pub use workspace::Workspace;
pub use write_file::WriteFile;

pub use common::TMP_SUFFIX;

use crate::Tool;
use crate::confined::Sandbox;

/// Every built-in tool, sharing one workspace (and its record of the
/// tools' own writes) and one set of background tasks, killed when the
/// last of these tools is dropped. `run_command` runs its commands
/// through `sandbox`.
pub fn all(workspace: Arc<Workspace>, sandbox: Arc<Sandbox>) -> Vec<Arc<dyn Tool>> {
    all_with(workspace, Arc::new(BackgroundTasks::new()), sandbox)
}

/// [`all`], with `run_command`'s background tasks kept in `tasks` (so the
/// caller can tell whether any still run).
pub fn all_with(
    workspace: Arc<Workspace>,
    tasks: Arc<BackgroundTasks>,
    sandbox: Arc<Sandbox>,
) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ReadFile::new(workspace.clone())),
        Arc::new(WriteFile::new(workspace.clone())),
        Arc::new(ApplyDiff::new(workspace.clone())),
        Arc::new(ListDir::new(workspace.clone())),
        Arc::new(Search::new(workspace.clone())),
        Arc::new(RunCommand::new(workspace, tasks.clone(), sandbox)),
        Arc::new(TaskStatus::new(tasks)),
        Arc::new(UpdatePlan::new()),
    ]
}

/// The text that `diff` (a unified diff of one file, as `apply_diff` takes
/// it) makes of `old`, without writing anything: for front doors that show
/// an edit before it is approved.
pub fn preview_diff(old: &str, diff: &str) -> Result<String, String> {
    let patch = diff::parse(diff).map_err(|e| e.0)?;
    diff::apply(&patch, &diff::Text::parse(old))
        .map(|applied| applied.text.render())
        .map_err(|e| e.0)
}
