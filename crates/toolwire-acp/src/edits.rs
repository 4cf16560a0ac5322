//! Edits shown as diffs. A `write_file` or `apply_diff` call carries the
//! diff it makes: in the permission request (what it would do) and, once
//! it has run, as the call's content next to its result, as editors show
//! an agent's edits. A call that runs without asking (an "always" answer,
//! an `allow` policy) shows its diff too.
//!
//! The tools are wrapped ([`ShowsDiff`]): the wrapper reads the old text
//! before the tool runs, so the diff is never taken from a file the tool
//! has already changed, and keeps it for the call's final update
//! ([`Diffs`]) once the tool succeeded. A failed edit shows its error only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::Value;
use toolwire_core::{ToolCallContent, ToolCallId};
use toolwire_tools::builtin::{Workspace, preview_diff};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

use crate::client_fs::{ClientFs, OldText, read_for_preview};
use crate::titles;

/// The tools whose calls show a diff.
const EDIT_TOOLS: [&str; 2] = ["write_file", "apply_diff"];

/// What an edit preview reads: the session's sandbox, the cwd as the editor
/// named it, and the editor's buffers when it offers reads.
#[derive(Clone)]
pub(crate) struct EditView {
    pub workspace: Arc<Workspace>,
    pub cwd: PathBuf,
    pub fs: Option<ClientFs>,
}

impl EditView {
    /// The diff a call of tool `name` with `arguments` would make:
    /// `old_text` absent for a new file. `None` for other tools, or when it
    /// cannot be worked out (the call then fails when it runs, and the
    /// user still decides from the raw input). The path goes through the
    /// sandbox first: one outside it is not read (the tool refuses it when
    /// run), and the preview says so instead of showing a diff.
    pub(crate) async fn preview(&self, name: &str, arguments: &Value) -> Option<ToolCallContent> {
        let text = |key: &str| arguments.get(key).and_then(|v| v.as_str());
        if !EDIT_TOOLS.contains(&name) {
            return None;
        }
        let path = text("path")?;
        let no_diff =
            |why: String| Some(ToolCallContent::text(format!("No diff of `{path}`: {why}")));
        let resolved = match self.workspace.resolve(path) {
            Ok(resolved) => resolved,
            Err(e) => return no_diff(e.to_string()),
        };
        let old_text = match read_for_preview(self.fs.as_ref(), &resolved).await {
            OldText::Text(text) => Some(text),
            OldText::Missing => None,
            OldText::Unavailable(why) => return no_diff(why),
        };
        let new_text = match name {
            "write_file" => text("content")?.to_owned(),
            _ => preview_diff(old_text.as_deref().unwrap_or(""), text("diff")?).ok()?,
        };
        // The changed region with its context, not the whole file: the
        // editor places it by its old text.
        let (old_text, new_text) = match old_text {
            Some(old) => {
                let (old, new) = hunk(&old, &new_text, CONTEXT_LINES);
                (Some(old.to_owned()), new.to_owned())
            }
            None => (None, new_text),
        };
        Some(ToolCallContent::Diff {
            path: titles::absolute(&self.cwd, path),
            old_text,
            new_text,
        })
    }
}

/// Unchanged lines kept around an edit's changed region (as `diff -U3`).
const CONTEXT_LINES: usize = 3;

/// The region of `old` and `new` that differs, from the first changed line
/// to the last, with `context` unchanged lines either side (fewer at the
/// file's ends): the same slices of both when nothing changed. One region
/// for all the changes, so an editor can place it by its old text alone.
pub(crate) fn hunk<'a>(old: &'a str, new: &'a str, context: usize) -> (&'a str, &'a str) {
    let old_lines: Vec<&str> = old.split_inclusive('\n').collect();
    let new_lines: Vec<&str> = new.split_inclusive('\n').collect();
    let same_head = old_lines
        .iter()
        .zip(&new_lines)
        .take_while(|(a, b)| a == b)
        .count();
    if same_head == old_lines.len() && same_head == new_lines.len() {
        return ("", "");
    }
    let room = old_lines.len().min(new_lines.len()) - same_head;
    let same_tail = old_lines
        .iter()
        .rev()
        .zip(new_lines.iter().rev())
        .take(room)
        .take_while(|(a, b)| a == b)
        .count();
    let start = same_head.saturating_sub(context);
    let tail_dropped = same_tail.saturating_sub(context);
    let slice = |text: &'a str, lines: &[&str]| -> &'a str {
        let from: usize = lines[..start].iter().map(|l| l.len()).sum();
        let to: usize = text.len()
            - lines[lines.len() - tail_dropped..]
                .iter()
                .map(|l| l.len())
                .sum::<usize>();
        &text[from..to]
    };
    (slice(old, &old_lines), slice(new, &new_lines))
}

/// The diffs of a session's edits that have run, until their call's final
/// update takes them.
#[derive(Clone, Default)]
pub(crate) struct Diffs(Arc<Mutex<HashMap<ToolCallId, ToolCallContent>>>);

impl Diffs {
    fn record(&self, id: ToolCallId, diff: ToolCallContent) {
        if let Ok(mut diffs) = self.0.lock() {
            diffs.insert(id, diff);
        }
    }

    pub(crate) fn clear(&self) {
        if let Ok(mut diffs) = self.0.lock() {
            diffs.clear();
        }
    }

    /// The diff of call `id`, if it made one; forgotten either way.
    pub(crate) fn take(&self, id: &ToolCallId) -> Option<ToolCallContent> {
        self.0.lock().ok()?.remove(id)
    }
}

/// An edit tool whose successful calls leave their diff in [`Diffs`].
pub(crate) struct ShowsDiff {
    pub inner: Arc<dyn Tool>,
    pub view: EditView,
    pub diffs: Diffs,
}

impl ShowsDiff {
    /// Wraps the session's edit tools among `tools` (by name); the others
    /// are left as they are.
    pub(crate) fn wrap(tools: &mut ToolRegistry, view: &EditView, diffs: &Diffs) {
        for name in EDIT_TOOLS {
            if let Some(inner) = tools.get(name) {
                tools.register(Arc::new(ShowsDiff {
                    inner,
                    view: view.clone(),
                    diffs: diffs.clone(),
                }));
            }
        }
    }
}

#[async_trait]
impl Tool for ShowsDiff {
    fn spec(&self) -> &Arc<ToolSpec> {
        self.inner.spec()
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let id = ctx.call_id.clone();
        let preview = self.view.preview(&self.spec().name, &arguments).await;
        let output = self.inner.call(arguments, ctx).await?;
        if let Some(diff @ ToolCallContent::Diff { .. }) = preview
            && !output.is_error
        {
            self.diffs.record(id, diff);
        }
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::hunk;

    fn lines(range: std::ops::Range<usize>) -> String {
        range.map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn a_one_line_edit_shows_its_line_with_three_of_context() {
        let old = lines(0..200);
        let new = old.replace("line 100\n", "line one hundred\n");
        let (o, n) = hunk(&old, &new, 3);
        assert_eq!(o, lines(97..104));
        assert_eq!(
            n,
            lines(97..104).replace("line 100\n", "line one hundred\n")
        );
    }

    #[test]
    fn edits_at_the_ends_and_small_files_keep_what_there_is() {
        assert_eq!(
            hunk("one\ntwo\n", "one\nthree\n", 3),
            ("one\ntwo\n", "one\nthree\n")
        );
        let old = lines(0..10);
        let appended = format!("{old}new\n");
        assert_eq!(
            hunk(&old, &appended, 3),
            (
                lines(7..10).as_str(),
                format!("{}new\n", lines(7..10)).as_str()
            )
        );
        let first = old.replacen("line 0", "zero", 1);
        assert_eq!(hunk(&old, &first, 3).0, lines(0..4));
        // No trailing newline; an unchanged file.
        assert_eq!(hunk("a\nb", "a\nc", 0), ("b", "c"));
        assert_eq!(hunk(&old, &old, 3), ("", ""));
        // Two changes far apart: one region spanning both.
        let two = old.replace("line 1\n", "x\n").replace("line 8\n", "y\n");
        assert_eq!(hunk(&old, &two, 1).0, lines(0..10));
        // Lines repeated around the change do not overlap head and tail.
        assert_eq!(hunk("a\na\n", "a\na\na\n", 0), ("", "a\n"));
    }
}
