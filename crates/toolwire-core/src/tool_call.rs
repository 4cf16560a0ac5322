//! Tool calls as clients see them, and what to send when one changes.
//!
//! **Owns** [`ToolCallState`] (everything a client shows of one call),
//! [`ToolCallPatch`] (an update: the call's id plus only what changed) and
//! [`ToolCallTracker`], which remembers the last state *sent* for each call
//! and turns the engine's changes into patches: deep field-by-field diffs,
//! validated status transitions, optional coalescing with a per-call rate
//! limit, a compatibility mode that sends complete objects, byte metrics,
//! and a bounded model of a command's streamed output.
//!
//! **Invariant.** For every call, the announced state followed by every
//! emitted patch, applied in order with [`ToolCallPatch::apply_to`], gives
//! exactly the tracker's last sent state. A patch is emitted only when that
//! state changed (or output was appended), and the status only moves
//! forward: pending → in_progress → completed | failed, or straight to a
//! final status; nothing is accepted for a call after its final status.
//!
//! Pure: no I/O, no async, no wire names. Time comes in as an [`Instant`],
//! so an async front door sleeps until [`ToolCallTracker::next_deadline`]
//! and calls [`ToolCallTracker::due`], and tests run on a simulated clock.
//! Each front door renders states and patches in its own wire format.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::Location;
use crate::ids::ToolCallId;

/// What a tool does, so a client can pick an icon and a presentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Reads files.
    Read,
    /// Changes files.
    Edit,
    /// Removes files.
    Delete,
    /// Moves or renames files.
    Move,
    /// Searches files or the web.
    Search,
    /// Runs a command.
    Execute,
    /// Plans or reasons, touching nothing.
    Think,
    /// Fetches from the network.
    Fetch,
    /// Anything else.
    #[default]
    Other,
}

/// Where a call is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallStatus {
    /// Announced; not running yet (still streaming, or awaiting approval).
    #[default]
    Pending,
    /// Running.
    InProgress,
    /// Finished with a result.
    Completed,
    /// Finished with an error.
    Failed,
}

impl ToolCallStatus {
    /// Completed or failed: the call's last status.
    pub fn is_terminal(self) -> bool {
        matches!(self, ToolCallStatus::Completed | ToolCallStatus::Failed)
    }

    /// The name it is sent under.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallStatus::Pending => "pending",
            ToolCallStatus::InProgress => "in_progress",
            ToolCallStatus::Completed => "completed",
            ToolCallStatus::Failed => "failed",
        }
    }

    /// Whether a call whose status is `self` may report `next`: staying
    /// put or moving forward, never back, and nothing after a final status.
    pub fn can_become(self, next: ToolCallStatus) -> bool {
        !self.is_terminal() && (next == self || next.rank() > self.rank())
    }

    fn rank(self) -> u8 {
        match self {
            ToolCallStatus::Pending => 0,
            ToolCallStatus::InProgress => 1,
            ToolCallStatus::Completed | ToolCallStatus::Failed => 2,
        }
    }
}

impl fmt::Display for ToolCallStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One item a call shows: text, a file diff, or a terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolCallContent {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// `old_text` is absent for a new file.
    Diff {
        /// The file's path.
        path: String,
        /// The text before the edit (absent for a new file).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        old_text: Option<String>,
        /// The text after the edit.
        new_text: String,
    },
    /// Output shown live; its bytes come as [`TerminalOutput`].
    Terminal {
        /// The terminal whose output the call shows.
        terminal_id: String,
    },
}

impl ToolCallContent {
    /// A text item.
    pub fn text(text: impl Into<String>) -> Self {
        ToolCallContent::Text { text: text.into() }
    }
}

/// Everything a client shows of one tool call.
///
/// `raw_input` / `raw_output` of `null` are the same as absent (the
/// tracker stores them as absent), because no wire can tell them apart in
/// a patch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallState {
    /// The call's id, as the model gave it.
    pub id: ToolCallId,
    /// What the editor shows for the call.
    pub title: String,
    /// What sort of work it does (for the editor's icon).
    pub kind: ToolKind,
    /// Where it is in its life.
    pub status: ToolCallStatus,
    /// What it shows: text, diffs, a terminal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub content: Vec<ToolCallContent>,
    /// The places it touches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<Location>,
    /// Its arguments as the model wrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_input: Option<Value>,
    /// Its result as the tool gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<Value>,
}

impl ToolCallState {
    /// A pending call with nothing to show yet.
    pub fn new(id: impl Into<ToolCallId>, title: impl Into<String>, kind: ToolKind) -> Self {
        ToolCallState {
            id: id.into(),
            title: title.into(),
            kind,
            status: ToolCallStatus::Pending,
            content: Vec::new(),
            locations: Vec::new(),
            raw_input: None,
            raw_output: None,
        }
    }

    /// The patch that turns `self` into `newer`: the fields whose values
    /// differ (deeply: one changed character inside a content item or a
    /// nested JSON value counts). Ids are not compared; the patch carries
    /// `newer`'s. A value removed from `raw_input`/`raw_output` comes as
    /// `null`.
    pub fn diff(&self, newer: &ToolCallState) -> ToolCallPatch {
        fn changed<T: PartialEq + Clone>(old: &T, new: &T) -> Option<T> {
            (old != new).then(|| new.clone())
        }
        fn changed_value(old: &Option<Value>, new: &Option<Value>) -> Option<Value> {
            (old != new).then(|| new.clone().unwrap_or(Value::Null))
        }
        ToolCallPatch {
            id: newer.id.clone(),
            title: changed(&self.title, &newer.title),
            kind: changed(&self.kind, &newer.kind),
            status: changed(&self.status, &newer.status),
            content: changed(&self.content, &newer.content),
            locations: changed(&self.locations, &newer.locations),
            raw_input: changed_value(&self.raw_input, &newer.raw_input),
            raw_output: changed_value(&self.raw_output, &newer.raw_output),
            terminal_output: None,
        }
    }

    fn normalize(&mut self) {
        // `null` and absent must be one value, or a diff against a state
        // rebuilt from patches would find a change that is not there.
        if self.raw_input.as_ref().is_some_and(Value::is_null) {
            self.raw_input = None;
        }
        if self.raw_output.as_ref().is_some_and(Value::is_null) {
            self.raw_output = None;
        }
    }
}

/// Output appended to a call's terminal since the last patch, for clients
/// that show appended output (see [`TrackerConfig::appended_output`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalOutput {
    /// The terminal the output belongs to.
    pub terminal_id: String,
    /// The bytes appended, as text.
    pub data: String,
}

/// An update of one call: its id and only the fields that change. Absent
/// fields keep their value; present ones replace it whole (`content` and
/// `locations` included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallPatch {
    /// The call it updates.
    pub id: ToolCallId,
    /// The new title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The new kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolKind>,
    /// The new status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ToolCallStatus>,
    /// The new content, whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ToolCallContent>>,
    /// The new locations, whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locations: Option<Vec<Location>>,
    /// `null` clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_input: Option<Value>,
    /// `null` clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<Value>,
    /// Not a state field: output to append to the call's terminal. Only
    /// the tracker sets it (from [`ToolCallTracker::append_output`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_output: Option<TerminalOutput>,
}

impl ToolCallPatch {
    /// A patch that changes nothing yet; add fields with the builders.
    pub fn new(id: impl Into<ToolCallId>) -> Self {
        ToolCallPatch {
            id: id.into(),
            title: None,
            kind: None,
            status: None,
            content: None,
            locations: None,
            raw_input: None,
            raw_output: None,
            terminal_output: None,
        }
    }

    /// Every field of `state` (what compatibility mode sends); absent raw
    /// values as `null`.
    pub fn complete(state: &ToolCallState) -> Self {
        ToolCallPatch {
            id: state.id.clone(),
            title: Some(state.title.clone()),
            kind: Some(state.kind),
            status: Some(state.status),
            content: Some(state.content.clone()),
            locations: Some(state.locations.clone()),
            // `null` for absent: a complete object must also say that a
            // value was cleared.
            raw_input: Some(state.raw_input.clone().unwrap_or(Value::Null)),
            raw_output: Some(state.raw_output.clone().unwrap_or(Value::Null)),
            terminal_output: None,
        }
    }

    /// Sets the title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the kind.
    pub fn kind(mut self, kind: ToolKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Sets the status.
    pub fn status(mut self, status: ToolCallStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Replaces the content.
    pub fn content(mut self, content: Vec<ToolCallContent>) -> Self {
        self.content = Some(content);
        self
    }

    /// Replaces the locations.
    pub fn locations(mut self, locations: Vec<Location>) -> Self {
        self.locations = Some(locations);
        self
    }

    /// Sets the raw input.
    pub fn raw_input(mut self, raw_input: Value) -> Self {
        self.raw_input = Some(raw_input);
        self
    }

    /// Sets the raw output.
    pub fn raw_output(mut self, raw_output: Value) -> Self {
        self.raw_output = Some(raw_output);
        self
    }

    /// Nothing but the id.
    pub fn is_empty(&self) -> bool {
        self.title.is_none()
            && self.kind.is_none()
            && self.status.is_none()
            && self.content.is_none()
            && self.locations.is_none()
            && self.raw_input.is_none()
            && self.raw_output.is_none()
            && self.terminal_output.is_none()
    }

    /// Writes the patch's fields into `state` (what a client does).
    /// `terminal_output` is not state and the id is not checked.
    pub fn apply_to(&self, state: &mut ToolCallState) {
        if let Some(title) = &self.title {
            state.title.clone_from(title);
        }
        if let Some(kind) = self.kind {
            state.kind = kind;
        }
        if let Some(status) = self.status {
            state.status = status;
        }
        if let Some(content) = &self.content {
            state.content.clone_from(content);
        }
        if let Some(locations) = &self.locations {
            state.locations.clone_from(locations);
        }
        if let Some(raw_input) = &self.raw_input {
            state.raw_input = Some(raw_input.clone());
        }
        if let Some(raw_output) = &self.raw_output {
            state.raw_output = Some(raw_output.clone());
        }
        state.normalize();
    }
}

/// Why the tracker refused a call or an update.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrackerError {
    /// The call was announced before.
    #[error("tool call `{0}` was already announced")]
    AlreadyAnnounced(ToolCallId),
    /// An update of a call never announced.
    #[error("tool call `{0}` is unknown: announce it (the tool_call) before updating it")]
    Unknown(ToolCallId),
    /// A status earlier than the one the call has.
    #[error("tool call `{id}` cannot go from {from} back to {to}")]
    StatusBackwards {
        /// The call.
        id: ToolCallId,
        /// The status it has.
        from: ToolCallStatus,
        /// The earlier status it was asked to go back to.
        to: ToolCallStatus,
    },
    /// An update after the call's final status.
    #[error("tool call `{id}` is already {status}; nothing may follow its final status")]
    Finished {
        /// The call.
        id: ToolCallId,
        /// Its final status.
        status: ToolCallStatus,
    },
    #[error(
        "tool call `{0}`: an update cannot carry terminal_output (the tracker makes it); pass output to append_output"
    )]
    /// A patch carrying terminal output, which only the tracker writes.
    OutputInPatch(ToolCallId),
}

/// How the tracker sends updates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerConfig {
    /// Buffer changes and emit them from [`ToolCallTracker::due`]. Off:
    /// every `update` / `append_output` returns its patch at once.
    pub coalesce: bool,
    /// Changes to one call this close to the first unsent one merge into
    /// one patch (later values win).
    pub window: Duration,
    /// Patches per call per second (0: no limit). Patches that change the
    /// status are not held for it, so they can exceed it (at most twice
    /// per call: to in_progress and to the final status).
    pub max_per_second: u32,
    /// Compatibility mode: every patch carries the complete object, for
    /// clients that replace rather than merge.
    pub complete_objects: bool,
    /// The client shows appended output: [`ToolCallTracker::append_output`]
    /// sends only the new bytes (as `terminal_output`). Off: the output is
    /// replaced content holding the last `output_limit` bytes.
    pub appended_output: bool,
    /// Bytes of output kept in replaced content.
    pub output_limit: usize,
    /// Bytes of patches one call may send at the `max_per_second` rate;
    /// past them its patches that leave the status alone go out at most
    /// once per [`OVER_BUDGET_INTERVAL`] (coalescing only). Bounds the
    /// bytes of a replaced output that runs for minutes. `None`: no budget.
    pub call_byte_budget: Option<u64>,
    /// Replaced output is bounded in total: its replacements send at most
    /// [`REPLACED_OUTPUT_RATIO`] times the output, plus
    /// [`REPLACED_OUTPUT_ALLOWANCE`] (past it the next waits until the
    /// output has grown enough). Off: only the rate bounds them.
    pub bound_replaced_output: bool,
}

/// Replaced output (a client without appended output) is sent whole, up to
/// `output_limit`, each time: in total, a call's replacements send at most
/// this many times its output, plus [`REPLACED_OUTPUT_ALLOWANCE`]. Past
/// it, the next replacement waits until the output has grown enough; the
/// final update is never held.
pub const REPLACED_OUTPUT_RATIO: f64 = 1.5;

/// Bytes of replacements a call may send beyond [`REPLACED_OUTPUT_RATIO`]
/// times its output, so that short output shows as it comes.
pub const REPLACED_OUTPUT_ALLOWANCE: u64 = 32 * 1024;

/// How often a call past its [`TrackerConfig::call_byte_budget`] may send
/// a patch that leaves its status alone.
pub const OVER_BUDGET_INTERVAL: Duration = Duration::from_secs(1);

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig {
            coalesce: false,
            window: Duration::from_millis(50),
            max_per_second: 20,
            complete_objects: false,
            appended_output: false,
            output_limit: OUTPUT_LIMIT,
            call_byte_budget: None,
            bound_replaced_output: false,
        }
    }
}

impl TrackerConfig {
    /// The defaults with coalescing on (50 ms window, 20 patches/s/call).
    pub fn coalescing() -> Self {
        TrackerConfig {
            coalesce: true,
            ..TrackerConfig::default()
        }
    }

    /// Shortest time between two rate-limited patches of one call, rounded
    /// up so that N patches never fit in less than a second.
    fn min_interval(&self) -> Option<Duration> {
        (self.max_per_second > 0).then(|| {
            let nanos = 1_000_000_000u64.div_ceil(u64::from(self.max_per_second));
            Duration::from_nanos(nanos)
        })
    }
}

/// What the tracker has sent, counted. Bytes are serde_json lengths of
/// the patch objects (the front door's envelope is not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrackerMetrics {
    /// Calls announced, and the bytes of their initial states.
    pub announced: u64,
    /// Bytes of those initial states.
    pub announce_bytes: u64,
    /// Patches emitted.
    pub updates_sent: u64,
    /// Changes merged into a patch that was already waiting.
    pub coalesced: u64,
    /// Emissions dropped because nothing differed from what was sent.
    pub suppressed: u64,
    /// Bytes of the patches emitted…
    pub patch_bytes: u64,
    /// …and of the complete objects they stand for (equal in
    /// compatibility mode).
    pub complete_bytes: u64,
}

impl TrackerMetrics {
    /// Fraction of the complete objects' bytes the patches saved.
    pub fn saved(&self) -> f64 {
        if self.complete_bytes == 0 {
            0.0
        } else {
            1.0 - self.patch_bytes as f64 / self.complete_bytes as f64
        }
    }
}

/// The output a client is shown when it is replaced rather than appended
/// (by default), and what a front door keeps of a running call's output.
pub const OUTPUT_LIMIT: usize = 64 * 1024;

/// The last `limit` bytes of a command's output and how much was cut: what
/// a client that is shown output whole (not appended) is sent, and what a
/// front door keeps of a running call's output.
#[derive(Debug, Default, Clone)]
pub struct OutputTail {
    // Grows to twice the limit before it is cut, so appending costs
    // amortized O(data), not a 64 KiB move per line.
    buf: String,
    dropped: u64,
}

impl OutputTail {
    /// Appends `data`, dropping what falls out of the last `limit` bytes.
    pub fn push(&mut self, data: &str, limit: usize) {
        self.buf.push_str(data);
        if self.buf.len() > limit.saturating_mul(2) {
            let cut = cut_point(&self.buf, self.buf.len() - limit);
            self.dropped += cut as u64;
            self.buf.drain(..cut);
        }
    }

    /// The last `limit` bytes (from a line start), after a line saying how
    /// many bytes were cut before them, if any were.
    pub fn render(&self, limit: usize) -> String {
        let cut = if self.buf.len() > limit {
            cut_point(&self.buf, self.buf.len() - limit)
        } else {
            0
        };
        let dropped = self.dropped + cut as u64;
        if dropped == 0 {
            self.buf.clone()
        } else {
            format!("… {dropped} bytes truncated …\n{}", &self.buf[cut..])
        }
    }
}

/// Where to cut `s` so at most `s.len() - at` bytes stay: a char boundary
/// at or after `at`, moved to the next line start when there is one, so
/// the tail starts with a whole line.
fn cut_point(s: &str, at: usize) -> usize {
    let at = s.ceil_char_boundary(at);
    if at == 0 || s.as_bytes().get(at - 1) == Some(&b'\n') {
        return at;
    }
    match s[at..].find('\n') {
        Some(i) if at + i + 1 < s.len() => at + i + 1,
        _ => at,
    }
}

/// A call's unsent output.
#[derive(Debug, Default)]
struct Output {
    /// Appended-output mode: bytes not sent yet.
    appended: String,
    /// Replaced-content mode: the tail, and whether it changed since it
    /// was last written into the state.
    tail: Option<OutputTail>,
    dirty: bool,
    /// Index in `target.content` of the text item holding the tail.
    slot: Option<usize>,
    /// The content is a status line put there by
    /// [`ToolCallTracker::status_line`], for the next one to replace.
    status_line: bool,
    /// Replaced-content mode: bytes of output so far, and bytes of the
    /// tails sent (each replacement sends its whole tail again).
    seen: u64,
    replaced: u64,
}

#[derive(Debug)]
struct Call {
    /// Announce order, so patches of several calls come out in a stable
    /// order.
    seq: u64,
    sent: ToolCallState,
    /// `sent` with every change since applied: what the client should see.
    target: ToolCallState,
    /// When the first unsent change came; `None`: nothing unsent.
    pending_since: Option<Instant>,
    last_emit: Option<Instant>,
    output: Output,
    /// Bytes of the patches sent for it (the budget's measure).
    bytes_sent: u64,
}

/// Remembers the last state sent for each tool call and decides what to
/// send next. See the module documentation for its invariant.
///
/// Without coalescing, [`update`](Self::update) returns each change's
/// patch at once. With it, changes wait in a per-call buffer: the caller
/// polls [`due`](Self::due) at [`next_deadline`](Self::next_deadline), and
/// [`flush`](Self::flush) / [`flush_all`](Self::flush_all) force them out
/// (at the end of a turn, say). A status change is never dropped and never
/// waits longer than the window; if two land in one window (in_progress,
/// then completed), the later one wins like any field, and the client sees
/// the call go straight to its final status (a valid transition).
#[derive(Debug)]
pub struct ToolCallTracker {
    config: TrackerConfig,
    calls: HashMap<ToolCallId, Call>,
    // Finished calls keep only their final status, so late updates get a
    // clear error while their (possibly large) states are freed.
    finished: HashMap<ToolCallId, ToolCallStatus>,
    next_seq: u64,
    metrics: TrackerMetrics,
}

impl Default for ToolCallTracker {
    fn default() -> Self {
        ToolCallTracker::new(TrackerConfig::default())
    }
}

impl ToolCallTracker {
    /// A tracker with no calls, sending as `config` says.
    pub fn new(config: TrackerConfig) -> Self {
        ToolCallTracker {
            config,
            calls: HashMap::new(),
            finished: HashMap::new(),
            next_seq: 0,
            metrics: TrackerMetrics::default(),
        }
    }

    /// How it sends updates.
    pub fn config(&self) -> &TrackerConfig {
        &self.config
    }

    /// What it has sent so far.
    pub fn metrics(&self) -> &TrackerMetrics {
        &self.metrics
    }

    /// What the client was last sent for a call still running (`None` for
    /// unknown and finished calls).
    pub fn last_sent(&self, id: &ToolCallId) -> Option<&ToolCallState> {
        self.calls.get(id).map(|c| &c.sent)
    }

    /// What the client is to see for a call still running: what was sent
    /// with every change since applied, sent or not (`None` for unknown
    /// and finished calls). A change built on a field's current value
    /// (an argument added to `raw_input`) starts from here, not from
    /// [`last_sent`](Self::last_sent), or a coalesced change would be lost.
    pub fn current(&self, id: &ToolCallId) -> Option<&ToolCallState> {
        self.calls.get(id).map(|c| &c.target)
    }

    /// The final status of a finished call.
    pub fn finished(&self, id: &ToolCallId) -> Option<ToolCallStatus> {
        self.finished.get(id).copied()
    }

    /// The calls announced and not finished yet (no final status, sent
    /// or waiting), in announce order.
    pub fn unfinished(&self) -> Vec<ToolCallId> {
        let mut open: Vec<(u64, &ToolCallId)> = self
            .calls
            .iter()
            .filter(|(_, call)| !call.target.status.is_terminal())
            .map(|(id, call)| (call.seq, id))
            .collect();
        open.sort_unstable();
        open.into_iter().map(|(_, id)| id.clone()).collect()
    }

    /// Whether any call has changes waiting.
    pub fn has_pending(&self) -> bool {
        self.calls.values().any(|c| c.pending_since.is_some())
    }

    /// Drops everything known about a call (unsent changes too), so its id
    /// may be announced again.
    pub fn forget(&mut self, id: &ToolCallId) {
        self.calls.remove(id);
        self.finished.remove(id);
    }

    /// Registers a new call. Returns what to send as the initial tool call:
    /// always the complete state.
    pub fn announce(&mut self, mut state: ToolCallState) -> Result<ToolCallState, TrackerError> {
        if self.calls.contains_key(&state.id) || self.finished.contains_key(&state.id) {
            return Err(TrackerError::AlreadyAnnounced(state.id));
        }
        state.normalize();
        self.metrics.announced += 1;
        self.metrics.announce_bytes += json_len(&state);
        if state.status.is_terminal() {
            self.finished.insert(state.id.clone(), state.status);
            return Ok(state);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.calls.insert(
            state.id.clone(),
            Call {
                seq,
                sent: state.clone(),
                target: state.clone(),
                pending_since: None,
                last_emit: None,
                output: Output::default(),
                bytes_sent: 0,
            },
        );
        Ok(state)
    }

    /// Records a change and returns the patch to send now, if any: at once
    /// without coalescing (`None` when nothing differs from what was sent);
    /// with coalescing, only when this call's buffer is due at `now` (the
    /// rest comes from [`due`](Self::due)).
    pub fn update(
        &mut self,
        patch: ToolCallPatch,
        now: Instant,
    ) -> Result<Option<ToolCallPatch>, TrackerError> {
        let id = patch.id.clone();
        self.push(patch, now)?;
        Ok(self.emit_if_ready(&id, now))
    }

    /// Records a change without emitting anything.
    pub fn push(&mut self, patch: ToolCallPatch, now: Instant) -> Result<(), TrackerError> {
        if patch.terminal_output.is_some() {
            return Err(TrackerError::OutputInPatch(patch.id));
        }
        let call = self.live_call(&patch.id)?;
        if let Some(to) = patch.status {
            let from = call.target.status;
            if !from.can_become(to) {
                return Err(TrackerError::StatusBackwards {
                    id: patch.id,
                    from,
                    to,
                });
            }
        }
        if patch.content.is_some() {
            // The caller's content replaces the whole list, output item
            // included; only output appended later puts it back (at the
            // end), so a final content set by the caller stays as given.
            call.output.slot = None;
            call.output.dirty = false;
            call.output.status_line = false;
        }
        patch.apply_to(&mut call.target);
        let merged = mark_pending(call, now);
        self.metrics.coalesced += u64::from(merged);
        Ok(())
    }

    /// Appends a command's output (decode bytes lossily first) and returns
    /// the patch to send now, if any (as [`update`](Self::update)).
    ///
    /// With [`TrackerConfig::appended_output`], the patch carries only the
    /// new data as `terminal_output`, and the call's content gets a
    /// terminal item (id: the call's id) if it has none. Otherwise the
    /// output is a text item at the end of the content, replaced each time,
    /// holding the last `output_limit` bytes (cut at a line start) after a
    /// line "… N bytes truncated …". Either way the coalescing and rate
    /// limit bound how often it is sent.
    pub fn append_output(
        &mut self,
        id: &ToolCallId,
        data: &str,
        now: Instant,
    ) -> Result<Option<ToolCallPatch>, TrackerError> {
        let appended = self.config.appended_output;
        let limit = self.config.output_limit;
        let call = self.live_call(id)?;
        if std::mem::take(&mut call.output.status_line) {
            // The output shows what the tool is doing now.
            call.target.content.clear();
        }
        if appended {
            if terminal_id(&call.target).is_none() {
                call.target.content.push(ToolCallContent::Terminal {
                    terminal_id: call.target.id.0.clone(),
                });
            }
            call.output.appended.push_str(data);
        } else {
            call.output
                .tail
                .get_or_insert_with(OutputTail::default)
                .push(data, limit);
            call.output.dirty = true;
            call.output.seen += data.len() as u64;
        }
        let merged = mark_pending(call, now);
        self.metrics.coalesced += u64::from(merged);
        Ok(self.emit_if_ready(id, now))
    }

    /// Shows a running tool's passing status line ("3/10 (30%): indexing")
    /// as the call's content while it has nothing else to show: no output
    /// yet and no content the caller set. The next status line replaces
    /// it; output and any content the caller sets take its place. Returns
    /// the patch to send now, if any (as [`update`](Self::update)); a line
    /// that would hide something is not shown, and that is no error.
    pub fn status_line(
        &mut self,
        id: &ToolCallId,
        text: &str,
        now: Instant,
    ) -> Result<Option<ToolCallPatch>, TrackerError> {
        let call = self.live_call(id)?;
        let nothing_else = call.target.content.is_empty()
            && call.output.tail.is_none()
            && call.output.appended.is_empty();
        if !call.output.status_line && !nothing_else {
            return Ok(None);
        }
        call.output.status_line = true;
        call.target.content = vec![ToolCallContent::text(text)];
        let merged = mark_pending(call, now);
        self.metrics.coalesced += u64::from(merged);
        Ok(self.emit_if_ready(id, now))
    }

    /// The patches whose window has passed and whose call's rate allows
    /// one (a status change is never held for the rate), in the order they
    /// became due.
    pub fn due(&mut self, now: Instant) -> Vec<ToolCallPatch> {
        let mut ready: Vec<(Instant, u64, ToolCallId)> = self
            .calls
            .iter()
            .filter_map(|(id, call)| {
                let at = self.ready_at(call)?;
                (!self.config.coalesce || at <= now).then(|| (at, call.seq, id.clone()))
            })
            .collect();
        // (time, announce order) is unique, so the id never decides.
        ready.sort_unstable();
        ready
            .into_iter()
            .filter_map(|(_, _, id)| self.emit(&id, now))
            .collect()
    }

    /// When the next buffered patch becomes due, if any is waiting.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.calls.values().filter_map(|c| self.ready_at(c)).min()
    }

    /// Sends a call's waiting changes now, whatever the window and rate.
    pub fn flush(
        &mut self,
        id: &ToolCallId,
        now: Instant,
    ) -> Result<Option<ToolCallPatch>, TrackerError> {
        if self.calls.contains_key(id) {
            Ok(self.emit(id, now))
        } else if self.finished.contains_key(id) {
            Ok(None)
        } else {
            Err(TrackerError::Unknown(id.clone()))
        }
    }

    /// Sends every call's waiting changes now, in announce order.
    pub fn flush_all(&mut self, now: Instant) -> Vec<ToolCallPatch> {
        let mut waiting: Vec<(u64, ToolCallId)> = self
            .calls
            .iter()
            .filter(|(_, c)| c.pending_since.is_some())
            .map(|(id, c)| (c.seq, id.clone()))
            .collect();
        waiting.sort_unstable();
        waiting
            .into_iter()
            .filter_map(|(_, id)| self.emit(&id, now))
            .collect()
    }

    fn live_call(&mut self, id: &ToolCallId) -> Result<&mut Call, TrackerError> {
        if let Some(&status) = self.finished.get(id) {
            return Err(TrackerError::Finished {
                id: id.clone(),
                status,
            });
        }
        let call = self
            .calls
            .get_mut(id)
            .ok_or_else(|| TrackerError::Unknown(id.clone()))?;
        // A final status still in the buffer counts: the call is over.
        if call.target.status.is_terminal() {
            return Err(TrackerError::Finished {
                id: id.clone(),
                status: call.target.status,
            });
        }
        Ok(call)
    }

    /// When a call's buffer may go out: the end of its window, and for
    /// changes that leave the status alone also the rate's next slot.
    fn ready_at(&self, call: &Call) -> Option<Instant> {
        let since = call.pending_since?;
        if !self.config.coalesce {
            return Some(since);
        }
        let window_end = since + self.config.window;
        if call.target.status != call.sent.status {
            return Some(window_end);
        }
        if self.config.bound_replaced_output
            && replacement_over_budget(&call.output, self.config.output_limit)
        {
            // Held until the output grows enough to pay for its tail, or
            // the call ends (its final status is never held).
            return None;
        }
        let over_budget = self
            .config
            .call_byte_budget
            .is_some_and(|budget| call.bytes_sent >= budget);
        let interval = if over_budget {
            Some(
                self.config
                    .min_interval()
                    .map_or(OVER_BUDGET_INTERVAL, |i| i.max(OVER_BUDGET_INTERVAL)),
            )
        } else {
            self.config.min_interval()
        };
        let slot = call
            .last_emit
            .zip(interval)
            .map(|(last, interval)| last + interval);
        Some(slot.map_or(window_end, |slot| slot.max(window_end)))
    }

    fn emit_if_ready(&mut self, id: &ToolCallId, now: Instant) -> Option<ToolCallPatch> {
        let call = self.calls.get(id)?;
        if !self.config.coalesce
            && self.config.bound_replaced_output
            && call.target.status == call.sent.status
            && replacement_over_budget(&call.output, self.config.output_limit)
        {
            return None;
        }
        let at = self.ready_at(call)?;
        if self.config.coalesce && at > now {
            return None;
        }
        self.emit(id, now)
    }

    /// Diffs a call's buffered state against what was sent and, if they
    /// differ, makes that the sent state and returns the patch.
    fn emit(&mut self, id: &ToolCallId, now: Instant) -> Option<ToolCallPatch> {
        let limit = self.config.output_limit;
        let call = self.calls.get_mut(id)?;
        call.pending_since.take()?;
        render_output(call, limit);
        let data = std::mem::take(&mut call.output.appended);
        let mut patch = call.sent.diff(&call.target);
        if !data.is_empty() {
            patch.terminal_output = Some(TerminalOutput {
                terminal_id: terminal_id(&call.target)
                    .unwrap_or(&call.target.id.0)
                    .to_owned(),
                data,
            });
        }
        if patch.is_empty() {
            self.metrics.suppressed += 1;
            return None;
        }
        let mut complete = ToolCallPatch::complete(&call.target);
        complete.terminal_output = patch.terminal_output.take();
        self.metrics.complete_bytes += json_len(&complete);
        let out = if self.config.complete_objects {
            complete
        } else {
            patch.terminal_output = complete.terminal_output;
            patch
        };
        let bytes = json_len(&out);
        self.metrics.updates_sent += 1;
        self.metrics.patch_bytes += bytes;
        call.bytes_sent += bytes;
        if call.target.status.is_terminal() {
            self.finished.insert(id.clone(), call.target.status);
            self.calls.remove(id);
        } else {
            call.sent.clone_from(&call.target);
            call.last_emit = Some(now);
        }
        Some(out)
    }
}

/// Opens the call's buffer or joins it; true when it joined (a merge).
fn mark_pending(call: &mut Call, now: Instant) -> bool {
    if call.pending_since.is_some() {
        true
    } else {
        call.pending_since = Some(now);
        false
    }
}

/// Writes the output tail into the call's content, if it changed. Done
/// at emission, not per append, so a burst of lines costs one render.
fn render_output(call: &mut Call, limit: usize) {
    let output = &mut call.output;
    let Some(tail) = output.tail.as_ref().filter(|_| output.dirty) else {
        return;
    };
    output.dirty = false;
    let rendered = tail.render(limit);
    output.replaced += rendered.len() as u64;
    let item = ToolCallContent::text(rendered);
    let content = &mut call.target.content;
    match output.slot {
        Some(i) if i < content.len() => content[i] = item,
        _ => {
            content.push(item);
            output.slot = Some(content.len() - 1);
        }
    }
}

/// Whether sending a call's replaced output now would take the tails it
/// sent past [`REPLACED_OUTPUT_RATIO`] times its output (plus
/// [`REPLACED_OUTPUT_ALLOWANCE`]): the bound is on the total, not per
/// second, so output that trickles in for minutes does not send its tail
/// again and again.
fn replacement_over_budget(output: &Output, limit: usize) -> bool {
    if !output.dirty || output.tail.is_none() {
        return false;
    }
    let next = output.seen.min(limit as u64);
    let allowed = REPLACED_OUTPUT_RATIO * output.seen as f64 + REPLACED_OUTPUT_ALLOWANCE as f64;
    (output.replaced + next) as f64 > allowed
}

fn terminal_id(state: &ToolCallState) -> Option<&str> {
    state.content.iter().find_map(|c| match c {
        ToolCallContent::Terminal { terminal_id } => Some(terminal_id.as_str()),
        _ => None,
    })
}

/// Serialized length without building the string.
fn json_len<T: Serialize>(value: &T) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Our types always serialize (string keys only); a failure would only
    // make the metrics low, never lose an update.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_whole_lines_and_char_boundaries() {
        let s = "aaa\nbbb\nccc\n";
        assert_eq!(&s[cut_point(s, 2)..], "bbb\nccc\n");
        assert_eq!(&s[cut_point(s, 4)..], "bbb\nccc\n");
        let s = "héllo";
        assert_eq!(&s[cut_point(s, 2)..], "llo");
    }

    #[test]
    fn tail_is_bounded_and_counts_what_it_cut() {
        let mut tail = OutputTail::default();
        for _ in 0..1000 {
            tail.push("0123456789\n", 100);
        }
        assert!(tail.buf.len() <= 200);
        let text = tail.render(100);
        let (head, kept) = text.split_once('\n').unwrap();
        assert!(kept.len() <= 100 && kept.starts_with("0123"));
        assert_eq!(head, format!("… {} bytes truncated …", 11_000 - kept.len()));
    }

    /// Patches of a call sending 2 KB of replaced output every 50 ms for
    /// 5 s, with a budget of `budget` bytes.
    /// Patches of a call appending 2 KB every 50 ms for 5 s (appended
    /// output: replaced output has its own bound in total, below).
    fn patches_over_five_seconds(budget: Option<u64>) -> u64 {
        let mut t = ToolCallTracker::new(TrackerConfig {
            call_byte_budget: budget,
            appended_output: true,
            ..TrackerConfig::coalescing()
        });
        let id = ToolCallId::from("c");
        let mut s = ToolCallState::new("c", "Run make", ToolKind::Execute);
        s.status = ToolCallStatus::InProgress;
        assert!(t.announce(s).is_ok());
        let start = Instant::now();
        for i in 0..100u32 {
            let at = start + Duration::from_millis(50) * i;
            t.due(at);
            assert!(t.append_output(&id, &"x".repeat(2047), at).is_ok());
        }
        let end = start + Duration::from_secs(5);
        assert!(
            t.update(
                ToolCallPatch::new("c").status(ToolCallStatus::Completed),
                end
            )
            .is_ok()
        );
        while let Some(deadline) = t.next_deadline() {
            t.due(deadline);
        }
        assert_eq!(t.finished(&id), Some(ToolCallStatus::Completed));
        t.metrics().updates_sent
    }

    #[test]
    fn replaced_output_trickling_in_sends_at_most_one_and_a_half_times_itself() {
        let mut t = ToolCallTracker::new(TrackerConfig {
            bound_replaced_output: true,
            ..TrackerConfig::coalescing()
        });
        let id = ToolCallId::from("c");
        let mut s = ToolCallState::new("c", "Run make", ToolKind::Execute);
        s.status = ToolCallStatus::InProgress;
        assert!(t.announce(s).is_ok());
        let start = Instant::now();
        let line = format!("{}\n", "x".repeat(79));
        let (mut sent, mut patches) = (0u64, 0u32);
        // 3,500 lines of 80 bytes, 50 every 50 ms.
        for i in 0..70u32 {
            let at = start + Duration::from_millis(50) * i;
            for patch in t.due(at) {
                sent += json_len(&patch);
                patches += 1;
            }
            if let Ok(Some(patch)) = t.append_output(&id, &line.repeat(50), at) {
                sent += json_len(&patch);
                patches += 1;
            }
        }
        let output = 3_500 * 80;
        let bound = REPLACED_OUTPUT_RATIO * output as f64 + REPLACED_OUTPUT_ALLOWANCE as f64;
        assert!(
            (sent as f64) < bound * 1.05,
            "{sent} bytes in {patches} patches"
        );
        assert!(
            patches >= 4,
            "it still shows the output as it comes: {patches}"
        );
        // Without the bound each of the ~70 windows would re-send its tail.
        assert!(sent < 70 * 64 * 1024 / 4, "{sent}");
    }

    #[test]
    fn a_call_past_its_budget_slows_to_one_patch_a_second() {
        let free = patches_over_five_seconds(None);
        let budgeted = patches_over_five_seconds(Some(8_000));
        assert!(free >= 50, "{free}");
        // A few at the full rate until 8 kB are out, then one a second,
        // and the final status.
        assert!(budgeted <= 12, "{budgeted}");
    }

    #[test]
    fn status_moves_forward_only() {
        use ToolCallStatus::*;
        assert!(Pending.can_become(InProgress) && Pending.can_become(Failed));
        assert!(InProgress.can_become(InProgress) && InProgress.can_become(Completed));
        assert!(!InProgress.can_become(Pending));
        assert!(!Completed.can_become(Completed) && !Failed.can_become(Completed));
    }
}
