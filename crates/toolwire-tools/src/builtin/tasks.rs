//! Background tasks: commands `run_command` started with `background:
//! true`, and the `task_status` tool that shows them.
//!
//! A task runs confined (`confined.rs`), its output kept in a bounded
//! buffer (the tail). When it ends, the conversation that started it gets a
//! `background_task` notification (through the call's
//! [`Notifier`](crate::Notifier)): the command, its exit code and
//! the last lines of its output. Cancelling a turn does not stop its tasks;
//! dropping the [`BackgroundTasks`] (with the engine's tools) kills every
//! one still running.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use toolwire_core::{ConversationId, Incoming, Priority};

use super::common::{floor_char_boundary, parse_args, spec};
use super::spawned::{DRAIN, Spawned, Tail};
use crate::{Notifier, Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// The source name of a task's notification.
pub const SOURCE: &str = "background_task";

/// Tasks running at once, per registry.
const MAX_RUNNING: usize = 16;
/// Ended tasks kept for `task_status` (the oldest go first).
const MAX_ENDED: usize = 64;
/// Output kept per task.
const OUTPUT_TAIL: usize = 16 * 1024;
/// The end of the output in the notification and in `task_status` for
/// one task…
const LAST_LINES: usize = 20;
const LAST_CHARS: usize = 2000;
/// …and per task in the list of all.
const LIST_LINES: usize = 5;
const LIST_CHARS: usize = 500;
/// The command as shown in notifications.
const COMMAND_CHARS: usize = 120;

/// How a task stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Running,
    Exited(i32),
    Signalled(i32),
    TimedOut(u64),
    Failed(String),
}

impl Status {
    fn describe(&self) -> String {
        match self {
            Status::Running => "running".into(),
            Status::Exited(code) => format!("exited {code}"),
            Status::Signalled(signal) => format!("killed by signal {signal}"),
            Status::TimedOut(secs) => format!("timed out after {secs} s (killed)"),
            Status::Failed(e) => format!("failed: {e}"),
        }
    }

    /// What the notification says happened.
    fn ending(&self) -> String {
        match self {
            Status::Running => "is still running".into(),
            Status::Exited(code) => format!("finished (exit {code})"),
            Status::Signalled(signal) => format!("was killed by signal {signal}"),
            Status::TimedOut(secs) => format!("timed out after {secs} s and was killed"),
            Status::Failed(e) => format!("failed: {e}"),
        }
    }
}

/// What a task's supervisor and the registry share.
struct State {
    status: Status,
    ended: Option<Instant>,
    output: Tail,
}

struct Task {
    id: String,
    conversation: ConversationId,
    command: String,
    started: Instant,
    state: Arc<Mutex<State>>,
    /// The sandbox helper, told to end the command with the registry if
    /// still running.
    helper: Option<nix::unistd::Pid>,
    supervisor: JoinHandle<()>,
}

impl Task {
    fn running(&self) -> bool {
        lock(&self.state).status == Status::Running
    }
}

/// The background tasks of one set of built-in tools (ids `task-1`,
/// `task-2`, … in start order). Dropping it kills those still running.
#[derive(Default)]
pub struct BackgroundTasks {
    next: AtomicU64,
    tasks: Mutex<Vec<Task>>,
}

impl std::fmt::Debug for BackgroundTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_list().entries(tasks.iter().map(|t| &t.id)).finish()
    }
}

impl BackgroundTasks {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock_tasks(&self) -> MutexGuard<'_, Vec<Task>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many tasks still run.
    pub fn running(&self) -> usize {
        self.lock_tasks().iter().filter(|t| t.running()).count()
    }

    /// Refuses when [`MAX_RUNNING`] tasks run.
    pub(super) fn check_capacity(&self) -> Result<(), ToolError> {
        let running = self.running();
        if running >= MAX_RUNNING {
            return Err(ToolError::Refused(format!(
                "{running} background tasks are running already (at most {MAX_RUNNING}); \
                 wait for one to end (task_status shows them)"
            )));
        }
        Ok(())
    }

    /// Supervises `spawned` until it ends (or `timeout_secs` pass); then
    /// `notifier` tells `conversation`. Returns the task's id.
    pub(super) fn start(
        &self,
        command: &str,
        spawned: Spawned,
        timeout_secs: Option<u64>,
        conversation: ConversationId,
        notifier: Notifier,
    ) -> String {
        let id = format!("task-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let state = Arc::new(Mutex::new(State {
            status: Status::Running,
            ended: None,
            output: Tail::new(OUTPUT_TAIL),
        }));
        let helper = spawned.confined.pid();
        let started = Instant::now();
        let supervisor = tokio::spawn(supervise(
            spawned,
            state.clone(),
            timeout_secs,
            Ending {
                notifier,
                conversation,
                command: command.to_owned(),
                started,
            },
        ));
        let mut tasks = self.lock_tasks();
        tasks.push(Task {
            id: id.clone(),
            conversation,
            command: command.to_owned(),
            started,
            state,
            helper,
            supervisor,
        });
        // Forget the oldest ended tasks past the limit.
        let ended = tasks.iter().filter(|t| !t.running()).count();
        if ended > MAX_ENDED {
            let mut extra = ended - MAX_ENDED;
            tasks.retain(|t| {
                if extra > 0 && !t.running() {
                    extra -= 1;
                    false
                } else {
                    true
                }
            });
        }
        id
    }

    /// The tasks `conversation` started, oldest first, as `task_status`
    /// shows them (`only`: one id).
    fn report(
        &self,
        conversation: ConversationId,
        only: Option<&str>,
    ) -> Result<String, ToolError> {
        let tasks = self.lock_tasks();
        let mine: Vec<&Task> = tasks
            .iter()
            .filter(|t| t.conversation == conversation)
            .collect();
        if let Some(id) = only {
            let Some(task) = mine.iter().find(|t| t.id == id) else {
                let known: Vec<&str> = mine.iter().map(|t| t.id.as_str()).collect();
                return Err(ToolError::Refused(if known.is_empty() {
                    format!("no background task `{id}`: this conversation has started none")
                } else {
                    format!(
                        "no background task `{id}` in this conversation; its tasks: {}",
                        known.join(", ")
                    )
                }));
            };
            return Ok(describe(task, LAST_LINES, LAST_CHARS));
        }
        if mine.is_empty() {
            return Ok("No background tasks in this conversation.".into());
        }
        Ok(mine
            .iter()
            .map(|t| describe(t, LIST_LINES, LIST_CHARS))
            .collect::<Vec<_>>()
            .join("\n\n"))
    }
}

impl Drop for BackgroundTasks {
    fn drop(&mut self) {
        let tasks = std::mem::take(self.tasks.get_mut().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            if task.running()
                && let Some(helper) = task.helper
            {
                crate::confined::ask(helper);
            }
            // Its supervisor's drop asks the helper too, if the signal
            // above came too early or late.
            task.supervisor.abort();
        }
    }
}

/// One task for `task_status`: id, command, state, runtime, output tail.
fn describe(task: &Task, lines: usize, chars: usize) -> String {
    let state = lock(&task.state);
    let runtime = state
        .ended
        .unwrap_or_else(Instant::now)
        .duration_since(task.started);
    let mut text = format!(
        "{}: `{}` — {}, {} {}",
        task.id,
        task.command,
        state.status.describe(),
        if state.status == Status::Running {
            "running for"
        } else {
            "ran"
        },
        seconds(runtime)
    );
    let (output, cut) = state.output.text();
    let (tail, more) = last_lines(output, lines, chars);
    if tail.is_empty() {
        text.push_str(if state.status == Status::Running {
            "\n(no output yet)"
        } else {
            "\n(no output)"
        });
    } else {
        let what = if more || cut {
            "last lines of output"
        } else {
            "output"
        };
        text.push_str(&format!("\n{what}:\n{tail}"));
    }
    text
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The last `max_lines` non-blank lines of `text` within `max_chars`
/// (trailing spaces trimmed), and whether anything before them was left
/// out.
fn last_lines(text: &str, max_lines: usize, max_chars: usize) -> (String, bool) {
    let all: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    let mut kept: Vec<&str> = Vec::new();
    let mut size = 0;
    for line in all.iter().rev().take(max_lines) {
        let len = line.chars().count() + 1;
        if size + len > max_chars {
            if kept.is_empty() {
                // One long line: its end.
                let skip = line
                    .chars()
                    .count()
                    .saturating_sub(max_chars.saturating_sub(1));
                let at = line.char_indices().nth(skip).map_or(0, |(i, _)| i);
                kept.push(&line[at..]);
            }
            break;
        }
        size += len;
        kept.push(line);
    }
    let more = kept.len() < all.len()
        || kept
            .first()
            .zip(all.last())
            .is_some_and(|(k, l)| k.len() < l.len());
    kept.reverse();
    (kept.join("\n"), more)
}

/// What the notification needs once the task ends.
struct Ending {
    notifier: Notifier,
    conversation: ConversationId,
    command: String,
    started: Instant,
}

async fn supervise(
    spawned: Spawned,
    state: Arc<Mutex<State>>,
    timeout_secs: Option<u64>,
    ending: Ending,
) {
    let Spawned {
        mut confined,
        mut rx,
        readers: _readers,
    } = spawned;
    let deadline = timeout_secs.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let status = loop {
        tokio::select! {
            Some(text) = rx.recv() => lock(&state).output.push(&text),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                confined.stop().await;
                break Status::TimedOut(timeout_secs.unwrap_or_default());
            }
            status = confined.wait() => break match status {
                Ok(status) => exit_status(status),
                Err(e) => Status::Failed(format!("waiting for the command failed: {e}")),
            },
        }
    };
    // Output still in the pipes, for a moment (as in the foreground).
    let drain_until = tokio::time::Instant::now() + DRAIN;
    while let Ok(Some(text)) = tokio::time::timeout_at(drain_until, rx.recv()).await {
        lock(&state).output.push(&text);
    }
    if let Some(note) = &confined.note {
        lock(&state).output.push(&format!("\n{note}\n"));
    }
    let text = {
        let mut state = lock(&state);
        state.status = status;
        state.ended = Some(Instant::now());
        notification_text(&ending, &state)
    };
    ending
        .notifier
        .notify(
            ending.conversation,
            Incoming::text(SOURCE, Priority::Normal, text),
        )
        .await;
}

fn exit_status(status: std::process::ExitStatus) -> Status {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Status::Exited(code),
        (None, Some(signal)) => Status::Signalled(signal),
        (None, None) => Status::Failed("exit status unknown".into()),
    }
}

/// "`cargo test` finished (exit 0) after 3.2 s: <last lines>", within the
/// notification's size (lines joined with " ⏎ ": a notification is one
/// line).
fn notification_text(ending: &Ending, state: &State) -> String {
    let command = if ending.command.chars().count() > COMMAND_CHARS {
        let cut = floor_char_boundary(&ending.command, COMMAND_CHARS);
        format!("{}…", &ending.command[..cut])
    } else {
        ending.command.clone()
    };
    let runtime = state
        .ended
        .unwrap_or_else(Instant::now)
        .duration_since(ending.started);
    let head = format!(
        "`{command}` {} after {}",
        state.status.ending(),
        seconds(runtime)
    );
    let budget = LAST_CHARS.saturating_sub(head.chars().count() + 4);
    let (output, cut) = state.output.text();
    let (tail, more) = last_lines(output, LAST_LINES, budget);
    if tail.is_empty() {
        return format!("{head}, no output");
    }
    let tail = tail.replace('\n', " ⏎ ");
    if more || cut {
        format!("{head}: …{tail}")
    } else {
        format!("{head}: {tail}")
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// `task_status`: the background tasks of this conversation.
pub struct TaskStatus {
    tasks: Arc<BackgroundTasks>,
    spec: Arc<ToolSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    task_id: Option<String>,
}

impl TaskStatus {
    pub fn new(tasks: Arc<BackgroundTasks>) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "task_id": {"type": "string", "description": "One task (`task-1`) with more of its output. Default: every task of this conversation."}
            },
            "additionalProperties": false
        });
        let description = "Lists the background tasks this conversation started with \
            run_command (`background: true`): id, command, running or exit code, runtime and \
            the last lines of output. Tasks keep running when a turn ends or is cancelled.";
        TaskStatus {
            tasks,
            spec: spec("task_status", description, parameters, true),
        }
    }
}

#[async_trait]
impl Tool for TaskStatus {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        self.tasks
            .report(ctx.conversation_id, args.task_id.as_deref())
            .map(ToolOutput::ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keep_the_end() {
        let text = (1..=30)
            .map(|i| format!("line {i}  \n"))
            .collect::<String>();
        let (tail, more) = last_lines(&text, 3, 1000);
        assert_eq!(tail, "line 28\nline 29\nline 30");
        assert!(more);
        let (tail, more) = last_lines("a\n\nb\n", 20, 1000);
        assert_eq!((tail.as_str(), more), ("a\nb", false));
        let (tail, more) = last_lines(&"x".repeat(50), 20, 10);
        assert_eq!(tail, "x".repeat(9));
        assert!(more);
        let (tail, more) = last_lines("", 20, 10);
        assert_eq!((tail.as_str(), more), ("", false));
    }
}
