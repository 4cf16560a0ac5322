//! What a crash left open is answered before any model hears of it. A
//! turn cut mid-tool (the process killed) leaves an assistant message
//! whose calls have no result; OpenAI and Anthropic refuse every later
//! request holding such a call (HTTP 400), so the conversation would be
//! stuck. When a run is found interrupted, each of its open calls gets a
//! result saying it was not run, stored before the next model request,
//! and the turn's messages show it as interrupted in every door (they read
//! the stored status).

use std::collections::{HashMap, HashSet};

use toolwire_core::{
    AgentEvent, ContentBlock, ConversationId, Message, MessageStatus, NOT_RUN_AFTER_STOP, Progress,
    Role, RunId, ToolCallId,
};
use toolwire_store::{RunRecord, Store, StoreError};

use crate::bus::EventBus;

/// The end of a cut call's output kept in its result.
const KEPT_OUTPUT: usize = 8 * 1024;

/// Events read per page when looking for a cut call's output.
const PAGE: u32 = 1000;

/// The result of a call cut while it ran, with the output it had shown.
fn cut_short(output: &str) -> String {
    format!(
        "Cut short: toolwire stopped before this call finished. Its output until then:\n{output}"
    )
}

/// The calls in `path` that no later message of `path` answers, in order.
pub(crate) fn open_calls(path: &[Message]) -> Vec<(ToolCallId, String)> {
    let answered = answered(path);
    path.iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| m.tool_uses())
        .filter(|(id, ..)| !answered.contains(id))
        .map(|(id, _, name, _)| (id.clone(), name.to_owned()))
        .collect()
}

/// The calls on `path` that have a result.
pub(crate) fn answered(path: &[Message]) -> HashSet<&ToolCallId> {
    path.iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id),
            _ => None,
        })
        .collect()
}

/// Answers the open calls on `run`'s conversation's active path and marks
/// the run's last assistant message interrupted. Returns how many calls
/// it answered.
pub(crate) async fn answer_open_calls(
    store: &dyn Store,
    bus: &EventBus,
    run: &RunRecord,
) -> Result<usize, StoreError> {
    let conversation = store.conversation(run.conversation_id).await?;
    let path = store.path_to(conversation.active_leaf).await?;
    // The run's own messages: those stored since it started (the same
    // instance's clock wrote both).
    let own_from = path
        .iter()
        .position(|m| m.created_at >= run.started_at && m.role != Role::System)
        .unwrap_or(path.len());
    if let Some(last) = path[own_from..]
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .filter(|m| m.status == MessageStatus::Complete)
    {
        let mut marked = last.clone();
        marked.status = MessageStatus::Interrupted;
        store.update(&marked).await?;
    }
    let open = open_calls(&path);
    if open.is_empty() {
        return Ok(0);
    }
    let ids: HashSet<&ToolCallId> = open.iter().map(|(id, _)| id).collect();
    let mut outputs = partial_outputs(store, run.conversation_id, run.id, &ids).await?;
    let mut leaf = conversation.active_leaf;
    for (call_id, name) in &open {
        let content = match outputs.remove(call_id) {
            Some(output) if !output.trim().is_empty() => cut_short(&output),
            _ => NOT_RUN_AFTER_STOP.to_owned(),
        };
        let mut result = Message::new(
            run.conversation_id,
            Some(leaf),
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: call_id.clone(),
                content: content.clone(),
                is_error: true,
                images: Vec::new(),
            }],
        );
        result.status = MessageStatus::Interrupted;
        result.duration_ms = Some(0);
        let event = AgentEvent::ToolExecutionFailed {
            run_id: run.id,
            call_id: call_id.clone(),
            error: content,
            message: result.clone(),
        };
        bus.store_message(&result, vec![event]).await?;
        tracing::info!(run = %run.id, call = %call_id, tool = %name, "an interrupted turn's call was answered as not run");
        leaf = result.id;
    }
    Ok(open.len())
}

/// The output `run` showed for each of `calls` (its progress events in the
/// log), the last [`KEPT_OUTPUT`] bytes of each. Read only after a crash
/// left calls open, so a long log costs only then.
async fn partial_outputs(
    store: &dyn Store,
    conversation: ConversationId,
    run: RunId,
    calls: &HashSet<&ToolCallId>,
) -> Result<HashMap<ToolCallId, String>, StoreError> {
    let mut outputs: HashMap<ToolCallId, String> = HashMap::new();
    let mut after = 0;
    loop {
        let page = store.events_since(conversation, after, PAGE).await?;
        for stored in &page {
            after = stored.seq;
            if let AgentEvent::ToolExecutionProgress {
                run_id,
                call_id,
                progress: Progress::Output { text },
            } = &stored.event
                && *run_id == run
                && calls.contains(call_id)
            {
                let kept = outputs.entry(call_id.clone()).or_default();
                kept.push_str(text);
                if kept.len() > 2 * KEPT_OUTPUT {
                    *kept = tail(kept, KEPT_OUTPUT).to_owned();
                }
            }
        }
        if page.len() < PAGE as usize {
            break;
        }
    }
    for kept in outputs.values_mut() {
        *kept = tail(kept, KEPT_OUTPUT).to_owned();
    }
    Ok(outputs)
}

/// The last `max` bytes of `s` (fewer, to start on a character).
fn tail(s: &str, max: usize) -> &str {
    &s[s.ceil_char_boundary(s.len().saturating_sub(max))..]
}
