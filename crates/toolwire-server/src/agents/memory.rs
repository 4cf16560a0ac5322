//! An agent's core memory: its blocks compiled into the system prompt the
//! model sees, as Letta compiles them (`<memory_blocks>` with each block's
//! description, metadata and value, then `<memory_metadata>`, in place of
//! `{CORE_MEMORY}` in the stored prompt or after it), and the memory tools
//! by which the agent edits its own blocks (Letta's `memory_insert`,
//! `memory_replace`, `memory_rethink`, `core_memory_append`,
//! `core_memory_replace`, with their names, arguments and errors).
//!
//! **Who owns what.** Blocks are agent state, kept by this crate as
//! records written through the engine ([`super::blocks`]). The stored
//! conversation keeps the prompt the client gave; the compiled one is
//! rendered for each model step ([`AgentMemory`], the turn's
//! [`SystemPrompt`]), so an edit made by a tool in one step is seen by
//! the next, and nothing the engine stores is rewritten. A memory tool is
//! an ordinary tool the engine runs: its call and result are stored in
//! the conversation like any other, and its edit is one stored write.

use std::fmt::Write as _;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use toolwire_engine::{Engine, KeyedLocks, SystemPrompt, WeakEngine};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

use crate::agents::blocks::{self, BlockRecord};
use crate::agents::{self, AgentRecord, models};
use crate::error::ApiResult;

/// Where Letta's prompt templates put the compiled memory.
pub const CORE_MEMORY_VARIABLE: &str = "{CORE_MEMORY}";

/// What Letta shows above a block's numbered lines (Anthropic models).
pub const LINE_NUMBER_WARNING: &str = "# NOTE: Line numbers shown below (with arrows like '1→') \
     are to help during editing. Do NOT include line number prefixes in your memory edit tool \
     calls.";

/// Letta's error for an edit of a read-only block.
pub const READ_ONLY_ERROR: &str = "Error This block is read-only and cannot be edited.";

/// The `<memory_blocks>` section of `blocks`; with `line_numbers` each
/// value line is numbered (`1→ …`), as Letta shows blocks to Anthropic
/// models. Empty when there are no blocks.
pub fn compile_blocks(blocks: &[BlockRecord], line_numbers: bool) -> String {
    if blocks.is_empty() {
        return String::new();
    }
    let size: usize = blocks
        .iter()
        .map(|b| b.value.len() + b.description.as_deref().map_or(0, str::len) + 160)
        .sum();
    let mut s = String::with_capacity(size + 128);
    s.push_str(
        "<memory_blocks>\nThe following memory blocks are currently engaged in your core memory unit:\n\n",
    );
    for (idx, block) in blocks.iter().enumerate() {
        let label = &block.label;
        let desc = block.description.as_deref().unwrap_or("");
        // Writing to a String cannot fail.
        let _ = write!(
            s,
            "<{label}>\n<description>\n{desc}\n</description>\n<metadata>"
        );
        if block.read_only {
            s.push_str("\n- read_only=true");
        }
        let _ = write!(
            s,
            "\n- chars_current={}\n- chars_limit={}\n</metadata>\n",
            blocks::chars(&block.value),
            block.limit
        );
        if line_numbers {
            let _ = write!(s, "<warning>\n{LINE_NUMBER_WARNING}\n</warning>\n<value>\n");
            if !block.value.is_empty() {
                for (i, line) in block.value.split('\n').enumerate() {
                    let _ = writeln!(s, "{}→ {line}", i + 1);
                }
            }
            s.push_str("</value>\n");
        } else {
            let _ = write!(s, "<value>\n{}\n</value>\n", block.value);
        }
        let _ = writeln!(s, "</{label}>");
        if idx != blocks.len() - 1 {
            s.push('\n');
        }
    }
    s.push_str("\n</memory_blocks>");
    s
}

/// Letta's `<memory_metadata>`. The time is that of the last memory
/// edit, which is when Letta recompiles its prompt, so the prompt stays
/// the same (and a provider's prompt cache keeps it) until memory
/// changes. Letta's count of stored messages is left out for the same
/// reason: it would change the prompt at every step.
pub fn metadata(agent_id: &str, edited: DateTime<Utc>) -> String {
    format!(
        "<memory_metadata>\n- AGENT_ID: {agent_id}\n- CONVERSATION_ID: default\n\
         - System prompt last recompiled: {}\n</memory_metadata>",
        edited.format("%Y-%m-%d %I:%M:%S %p UTC+0000")
    )
}

/// The prompt the model sees: `stored` with the compiled memory in place
/// of `{CORE_MEMORY}`, or after it (Letta appends it when the variable is
/// missing).
pub fn place(stored: &str, memory: &str) -> String {
    if stored.contains(CORE_MEMORY_VARIABLE) {
        stored.replace(CORE_MEMORY_VARIABLE, memory)
    } else if stored.is_empty() {
        memory.to_owned()
    } else {
        format!("{stored}\n\n{memory}")
    }
}

/// The compiled memory of `agent` over `blocks` (its blocks, in order).
pub fn compile(engine: &Engine, agent: &AgentRecord, blocks: &[BlockRecord]) -> String {
    let model = models::of_agent(engine.models(), agent.model.as_deref());
    let line_numbers = model.info.provider == "anthropic";
    let edited = blocks
        .iter()
        .map(|b| b.updated_at)
        .chain([agent.created_at])
        .max()
        .unwrap_or(agent.created_at);
    let section = compile_blocks(blocks, line_numbers);
    let meta = metadata(&agent.id, edited);
    if section.is_empty() {
        meta
    } else {
        format!("{section}\n\n{meta}")
    }
}

/// The system prompt of `agent` as the model sees it now, from its stored
/// one.
pub async fn system_prompt(
    engine: &Engine,
    agent: &AgentRecord,
    stored: &str,
) -> ApiResult<String> {
    let blocks = blocks::of_ids(engine, &agent.block_ids).await?;
    Ok(place(stored, &compile(engine, agent, &blocks)))
}

/// The turn hook that compiles an agent's memory into each step's prompt.
#[derive(Clone)]
pub struct AgentMemory {
    engine: WeakEngine,
    agent_id: String,
    /// The agent as the request that starts the turn read it: its first
    /// step's prompt is made from it rather than from a second read of
    /// the same record (later steps read it again: it may change during
    /// the turn). Taken once.
    read: Arc<std::sync::Mutex<Option<AgentRecord>>>,
}

impl std::fmt::Debug for AgentMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentMemory")
            .field("agent_id", &self.agent_id)
            .finish()
    }
}

impl AgentMemory {
    pub fn new(engine: &Engine, agent_id: &str) -> Arc<Self> {
        Arc::new(AgentMemory {
            engine: engine.downgrade(),
            agent_id: agent_id.to_owned(),
            read: Arc::default(),
        })
    }

    /// As [`AgentMemory::new`], for a turn a request starts with `agent`
    /// just read: its first render uses that record.
    pub fn just_read(engine: &Engine, agent: &AgentRecord) -> Arc<Self> {
        Arc::new(AgentMemory {
            engine: engine.downgrade(),
            agent_id: agent.id.clone(),
            read: Arc::new(std::sync::Mutex::new(Some(agent.clone()))),
        })
    }
}

#[async_trait]
impl SystemPrompt for AgentMemory {
    async fn render(&self, stored: &str) -> Result<String, String> {
        let engine = self
            .engine
            .upgrade()
            .ok_or_else(|| "the engine is gone".to_owned())?;
        let read = self.read.lock().ok().and_then(|mut read| read.take());
        let agent = match read {
            Some(agent) => agent,
            None => agents::load_from(&engine, &self.agent_id)
                .await
                .map_err(|e| e.message)?,
        };
        system_prompt(&engine, &agent, stored)
            .await
            .map_err(|e| e.message)
    }
}

/// Letta's memory tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryOp {
    Insert,
    Replace,
    Rethink,
    CoreAppend,
    CoreReplace,
}

impl MemoryOp {
    pub const ALL: [MemoryOp; 5] = [
        MemoryOp::Insert,
        MemoryOp::Replace,
        MemoryOp::Rethink,
        MemoryOp::CoreAppend,
        MemoryOp::CoreReplace,
    ];

    /// The ones a Letta v1 agent gets by default (`BASE_MEMORY_TOOLS_V2`).
    pub const DEFAULT: [MemoryOp; 2] = [MemoryOp::Insert, MemoryOp::Replace];

    pub fn name(self) -> &'static str {
        match self {
            MemoryOp::Insert => "memory_insert",
            MemoryOp::Replace => "memory_replace",
            MemoryOp::Rethink => "memory_rethink",
            MemoryOp::CoreAppend => "core_memory_append",
            MemoryOp::CoreReplace => "core_memory_replace",
        }
    }

    pub fn by_name(name: &str) -> Option<MemoryOp> {
        MemoryOp::ALL.into_iter().find(|op| op.name() == name)
    }

    /// The tool as the model sees it (Letta's descriptions and arguments),
    /// built once: every model request of every agent lists it.
    pub fn spec(self) -> &'static Arc<ToolSpec> {
        static SPECS: LazyLock<[Arc<ToolSpec>; 5]> =
            LazyLock::new(|| MemoryOp::ALL.map(|op| Arc::new(op.build_spec())));
        // `ALL` is in declaration order (a test checks it).
        &SPECS[self as usize]
    }

    fn build_spec(self) -> ToolSpec {
        let label = json!({"type": "string", "description": "Section of the memory to be edited, identified by its label."});
        let (description, properties, required): (&str, Value, &[&str]) = match self {
            MemoryOp::Insert => (
                "The memory_insert command allows you to insert text at a specific location in a memory block.",
                json!({
                    "label": label,
                    "new_string": {"type": "string", "description": "The text to insert. Do not include line number prefixes."},
                    "insert_line": {"type": "integer", "description": "The line number after which to insert the text (0 for beginning of file). Defaults to -1 (end of the file)."},
                }),
                &["label", "new_string"],
            ),
            MemoryOp::Replace => (
                "The memory_replace command allows you to replace a specific string in a memory block with a new string. This is used for making precise edits. Do NOT attempt to replace long strings, e.g. do not attempt to replace the entire contents of a memory block with a new string.",
                json!({
                    "label": label,
                    "old_string": {"type": "string", "description": "The text to replace (must match exactly, including whitespace and indentation)."},
                    "new_string": {"type": "string", "description": "The new text to insert in place of the old text. Do not include line number prefixes."},
                }),
                &["label", "old_string", "new_string"],
            ),
            MemoryOp::Rethink => (
                "The memory_rethink command allows you to completely rewrite the contents of a memory block. Use this tool to make large sweeping changes (e.g. when you want to condense or reorganize the memory blocks), do NOT use this tool to make small precise edits (e.g. add or remove a line, replace a specific string, etc).",
                json!({
                    "label": {"type": "string", "description": "The memory block to be rewritten, identified by its label."},
                    "new_memory": {"type": "string", "description": "The new memory contents with information integrated from existing memory blocks and the conversation context."},
                }),
                &["label", "new_memory"],
            ),
            MemoryOp::CoreAppend => (
                "Append to the contents of core memory.",
                json!({
                    "label": {"type": "string", "description": "Section of the memory to be edited."},
                    "content": {"type": "string", "description": "Content to write to the memory. All unicode (including emojis) are supported."},
                }),
                &["label", "content"],
            ),
            MemoryOp::CoreReplace => (
                "Replace the contents of core memory. To delete memories, use an empty string for new_content.",
                json!({
                    "label": {"type": "string", "description": "Section of the memory to be edited."},
                    "old_content": {"type": "string", "description": "String to replace. Must be an exact match."},
                    "new_content": {"type": "string", "description": "Content to write to the memory. All unicode (including emojis) are supported."},
                }),
                &["label", "old_content", "new_content"],
            ),
        };
        ToolSpec {
            name: self.name().to_owned(),
            server: None,
            description: description.to_owned(),
            parameters: json!({"type": "object", "properties": properties, "required": required}),
            read_only: false,
        }
    }

    /// The block's new value after this edit of `current` with
    /// `arguments`, or Letta's error for it.
    pub fn apply(self, label: &str, current: &str, arguments: &Value) -> Result<String, String> {
        let text = |key: &str| -> Result<String, String> {
            match arguments.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Ok(other.to_string()),
                None => Err(format!("missing required argument `{key}`")),
            }
        };
        match self {
            MemoryOp::CoreAppend => Ok(format!("{current}\n{}", text("content")?)),
            MemoryOp::CoreReplace => {
                let old = text("old_content")?;
                if !current.contains(&old) {
                    return Err(format!(
                        "Old content '{old}' not found in memory block '{label}'"
                    ));
                }
                Ok(current.replace(&old, &text("new_content")?))
            }
            MemoryOp::Replace => {
                let old = text("old_string")?;
                let new = text("new_string")?;
                refuse_line_numbers("old_string", &old)?;
                refuse_line_numbers("new_string", &new)?;
                let (old, new, current) =
                    (expand_tabs(&old), expand_tabs(&new), expand_tabs(current));
                match current.matches(old.as_str()).count() {
                    0 => Err(format!(
                        "No replacement was performed, old_string `{old}` did not appear verbatim in memory block with label `{label}`."
                    )),
                    1 => Ok(current.replacen(old.as_str(), &new, 1)),
                    _ => {
                        let lines: Vec<String> = current
                            .split('\n')
                            .enumerate()
                            .filter(|(_, line)| line.contains(old.as_str()))
                            .map(|(i, _)| (i + 1).to_string())
                            .collect();
                        Err(format!(
                            "No replacement was performed. Multiple occurrences of old_string `{old}` in lines [{}]. Please ensure it is unique.",
                            lines.join(", ")
                        ))
                    }
                }
            }
            MemoryOp::Insert => {
                let new = text("new_string")?;
                refuse_line_numbers("new_string", &new)?;
                let insert_line = match arguments.get("insert_line") {
                    None | Some(Value::Null) => -1,
                    Some(v) => v
                        .as_i64()
                        .ok_or_else(|| format!("`insert_line` must be an integer, not {v}"))?,
                };
                let current = expand_tabs(current);
                let new = expand_tabs(&new);
                let mut lines: Vec<&str> = current.split('\n').collect();
                let n = lines.len();
                let at = if insert_line == -1 {
                    n
                } else {
                    usize::try_from(insert_line)
                        .ok()
                        .filter(|at| *at <= n)
                        .ok_or_else(|| {
                            format!(
                                "Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the memory block: [0, {n}], or -1 to append to the end of the memory block."
                            )
                        })?
                };
                lines.splice(at..at, new.split('\n'));
                Ok(lines.join("\n"))
            }
            MemoryOp::Rethink => {
                let new = text("new_memory")?;
                refuse_line_numbers("new_memory", &new)?;
                Ok(new)
            }
        }
    }
}

/// Letta refuses the `1→ ` prefixes and the warning it shows around
/// numbered lines: they are for display.
fn refuse_line_numbers(argument: &str, text: &str) -> Result<(), String> {
    let numbered = text.split('\n').any(|line| {
        let rest = line.trim_start_matches([' ', '\t']);
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        digits > 0 && rest[digits..].starts_with('→')
    });
    if numbered {
        return Err(format!(
            "{argument} contains a line number prefix, which is not allowed. Do not include line numbers when calling memory tools (line numbers are for display purposes only)."
        ));
    }
    if text.contains(LINE_NUMBER_WARNING) {
        return Err(format!(
            "{argument} contains a line number warning, which is not allowed. Do not include line number information when calling memory tools (line numbers are for display purposes only)."
        ));
    }
    Ok(())
}

/// Python's `str.expandtabs()` (tab stops every 8 columns), which Letta
/// applies before matching.
fn expand_tabs(text: &str) -> String {
    if !text.contains('\t') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut column = 0usize;
    for c in text.chars() {
        match c {
            '\t' => {
                let spaces = 8 - column % 8;
                out.extend(std::iter::repeat_n(' ', spaces));
                column += spaces;
            }
            '\n' | '\r' => {
                out.push(c);
                column = 0;
            }
            _ => {
                out.push(c);
                column += 1;
            }
        }
    }
    out
}

/// One memory tool bound to one agent: it edits that agent's blocks.
pub struct MemoryTool {
    op: MemoryOp,
    spec: Arc<ToolSpec>,
    engine: WeakEngine,
    locks: Arc<KeyedLocks<String>>,
    agent_id: String,
}

impl MemoryTool {
    /// Memory tool `op` of agent `agent_id`, as a tool for its turns.
    pub fn shared(
        op: MemoryOp,
        engine: &Engine,
        locks: Arc<KeyedLocks<String>>,
        agent_id: &str,
    ) -> Arc<dyn Tool> {
        Arc::new(MemoryTool {
            op,
            spec: Arc::clone(op.spec()),
            engine: engine.downgrade(),
            locks,
            agent_id: agent_id.to_owned(),
        })
    }

    async fn edit(&self, engine: &Engine, arguments: &Value) -> Result<String, String> {
        let label = match arguments.get("label") {
            Some(Value::String(l)) => l.clone(),
            _ => return Err("missing required argument `label`".into()),
        };
        // The agent's lock keeps a concurrent attach or detach from
        // losing a block this call creates.
        let _agent = self.locks.hold(self.agent_id.clone()).await;
        let mut agent = agents::load_from(engine, &self.agent_id)
            .await
            .map_err(|e| e.message)?;
        let attached = blocks::of_ids(engine, &agent.block_ids)
            .await
            .map_err(|e| e.message)?;
        let Some(found) = attached.into_iter().find(|b| b.label == label) else {
            if self.op == MemoryOp::Rethink {
                // Letta's memory_rethink makes the block it names.
                let value = self.op.apply(&label, "", arguments)?;
                let block = BlockRecord::create(blocks::BlockCreate {
                    label: Some(label),
                    value: Some(value.clone()),
                    ..Default::default()
                })
                .map_err(|e| e.message)?;
                blocks::save(engine, &block).await.map_err(|e| e.message)?;
                agent.block_ids.push(block.id.clone());
                agent.updated_at = Utc::now();
                agents::save_to(engine, &agent)
                    .await
                    .map_err(|e| e.message)?;
                return Ok(value);
            }
            return Err(format!(
                "no memory block labelled `{label}`; this agent's blocks are: {}",
                blocks::of_ids(engine, &agent.block_ids)
                    .await
                    .map_err(|e| e.message)?
                    .iter()
                    .map(|b| b.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        let _block = self.locks.hold(blocks::lock_key(&found.id)).await;
        // Read again under the block's lock: another agent sharing it may
        // have changed it meanwhile.
        let block = blocks::load(engine, &found.id)
            .await
            .map_err(|e| e.message)?;
        if block.read_only {
            return Err(READ_ONLY_ERROR.into());
        }
        let value = self.op.apply(&label, &block.value, arguments)?;
        let updated = block
            .updated(blocks::BlockUpdate {
                value: Some(value.clone()),
                ..Default::default()
            })
            .map_err(|e| format!("Edit failed: {}", e.message))?;
        blocks::save(engine, &updated)
            .await
            .map_err(|e| e.message)?;
        tracing::debug!(agent = %self.agent_id, block = %updated.id, tool = self.op.name(), "memory block edited");
        Ok(value)
    }
}

#[async_trait]
impl Tool for MemoryTool {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(engine) = self.engine.upgrade() else {
            return Ok(ToolOutput::error("the server is shutting down"));
        };
        Ok(match self.edit(&engine, &arguments).await {
            Ok(value) => ToolOutput::ok(value),
            Err(message) => ToolOutput::error(message),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(label: &str, value: &str) -> BlockRecord {
        BlockRecord::create(blocks::BlockCreate {
            label: Some(label.into()),
            value: Some(value.into()),
            limit: Some(100),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn blocks_compile_as_letta_renders_them() {
        let mut persona = block("persona", "I am Sam.");
        persona.description = Some("Who I am.".into());
        persona.read_only = true;
        let human = block("human", "Name: Ada\nLikes: tea");
        let compiled = compile_blocks(&[persona, human.clone()], false);
        let expected = "<memory_blocks>\nThe following memory blocks are currently engaged in your core memory unit:\n\n\
<persona>\n<description>\nWho I am.\n</description>\n<metadata>\n- read_only=true\n- chars_current=9\n- chars_limit=100\n</metadata>\n<value>\nI am Sam.\n</value>\n</persona>\n\n\
<human>\n<description>\n".to_owned()
            + blocks::HUMAN_DESCRIPTION
            + "\n</description>\n<metadata>\n- chars_current=20\n- chars_limit=100\n</metadata>\n<value>\nName: Ada\nLikes: tea\n</value>\n</human>\n\n</memory_blocks>";
        assert_eq!(compiled, expected);

        let numbered = compile_blocks(&[human], true);
        assert!(
            numbered.contains("<value>\n1→ Name: Ada\n2→ Likes: tea\n</value>"),
            "{numbered}"
        );
        assert!(numbered.contains(LINE_NUMBER_WARNING));
        assert_eq!(compile_blocks(&[], false), "");

        assert_eq!(place("Be brief.", "M"), "Be brief.\n\nM");
        assert_eq!(place("A {CORE_MEMORY} B", "M"), "A M B");
        assert_eq!(place("", "M"), "M");
    }

    #[test]
    fn memory_tools_edit_as_letta_does() {
        let args = |v: Value| v;
        let op = MemoryOp::Insert;
        assert_eq!(
            op.apply("h", "a\nb", &args(json!({"new_string": "x"})))
                .unwrap(),
            "a\nb\nx"
        );
        assert_eq!(
            op.apply(
                "h",
                "a\nb",
                &args(json!({"new_string": "x", "insert_line": 0}))
            )
            .unwrap(),
            "x\na\nb"
        );
        assert_eq!(
            op.apply(
                "h",
                "a\nb",
                &args(json!({"new_string": "x", "insert_line": 1}))
            )
            .unwrap(),
            "a\nx\nb"
        );
        let err = op
            .apply(
                "h",
                "a\nb",
                &args(json!({"new_string": "x", "insert_line": 3})),
            )
            .unwrap_err();
        assert!(err.contains("[0, 2]"), "{err}");
        let err = op
            .apply("h", "a", &args(json!({"new_string": "1→ x"})))
            .unwrap_err();
        assert!(err.contains("line number prefix"), "{err}");

        let op = MemoryOp::Replace;
        assert_eq!(
            op.apply(
                "h",
                "Name: Ada",
                &args(json!({"old_string": "Ada", "new_string": "Bob"}))
            )
            .unwrap(),
            "Name: Bob"
        );
        let err = op
            .apply(
                "h",
                "x x",
                &args(json!({"old_string": "x", "new_string": "y"})),
            )
            .unwrap_err();
        assert!(err.contains("Multiple occurrences"), "{err}");
        let err = op
            .apply(
                "h",
                "x",
                &args(json!({"old_string": "z", "new_string": "y"})),
            )
            .unwrap_err();
        assert!(err.contains("did not appear verbatim"), "{err}");

        assert_eq!(
            MemoryOp::CoreAppend
                .apply("h", "a", &args(json!({"content": "b"})))
                .unwrap(),
            "a\nb"
        );
        assert_eq!(
            MemoryOp::CoreReplace
                .apply(
                    "h",
                    "a a",
                    &args(json!({"old_content": "a", "new_content": "b"}))
                )
                .unwrap(),
            "b b"
        );
        assert_eq!(
            MemoryOp::Rethink
                .apply("h", "old", &args(json!({"new_memory": "new"})))
                .unwrap(),
            "new"
        );
        assert_eq!(expand_tabs("a\tb"), "a       b");
        for op in MemoryOp::ALL {
            assert_eq!(MemoryOp::by_name(op.name()), Some(op));
        }
    }

    #[test]
    fn each_op_has_its_own_spec() {
        for op in MemoryOp::ALL {
            assert_eq!(op.spec().name, op.name());
        }
    }
}
