//! From toolwire's core types to ACP v1 schema types. Pure: no I/O.

use agent_client_protocol::v1::schema as acp;
use toolwire_core::event::Location;
use toolwire_core::{
    StopReason, ToolCallContent, ToolCallPatch, ToolCallState, ToolCallStatus, ToolKind,
};
use toolwire_tools::builtin::{StepStatus, parse_plan};

/// How a prompt turn ended, as ACP says it; `None` for the engine's
/// failures, which answer the prompt with a JSON-RPC error instead.
pub fn stop_reason(reason: StopReason) -> Option<acp::StopReason> {
    match reason {
        StopReason::EndTurn => Some(acp::StopReason::EndTurn),
        StopReason::MaxSteps => Some(acp::StopReason::MaxTurnRequests),
        StopReason::Cancelled => Some(acp::StopReason::Cancelled),
        // A token or cost budget: ACP's nearest.
        StopReason::BudgetExceeded => Some(acp::StopReason::MaxTokens),
        // Paused turns are answered through `session/request_permission`
        // and go on; one still paused here could not be asked about.
        StopReason::RequiresApproval
        | StopReason::Error
        | StopReason::LlmApiError
        | StopReason::Interrupted => None,
    }
}

/// The `plan` of an `update_plan` call's arguments (`None` if the tool
/// would refuse them): one entry per step, in order, of medium priority.
pub fn plan(arguments: &serde_json::Value) -> Option<acp::Plan> {
    let plan = parse_plan(arguments).ok()?;
    let entries = plan
        .plan
        .into_iter()
        .map(|step| {
            let status = match step.status {
                StepStatus::Pending => acp::PlanEntryStatus::Pending,
                StepStatus::InProgress => acp::PlanEntryStatus::InProgress,
                StepStatus::Completed => acp::PlanEntryStatus::Completed,
            };
            acp::PlanEntry::new(step.step, acp::PlanEntryPriority::Medium, status)
        })
        .collect();
    Some(acp::Plan::new(entries))
}

fn kind(kind: ToolKind) -> acp::ToolKind {
    match kind {
        ToolKind::Read => acp::ToolKind::Read,
        ToolKind::Edit => acp::ToolKind::Edit,
        ToolKind::Delete => acp::ToolKind::Delete,
        ToolKind::Move => acp::ToolKind::Move,
        ToolKind::Search => acp::ToolKind::Search,
        ToolKind::Execute => acp::ToolKind::Execute,
        ToolKind::Think => acp::ToolKind::Think,
        ToolKind::Fetch => acp::ToolKind::Fetch,
        ToolKind::Other => acp::ToolKind::Other,
    }
}

fn status(status: ToolCallStatus) -> acp::ToolCallStatus {
    match status {
        ToolCallStatus::Pending => acp::ToolCallStatus::Pending,
        ToolCallStatus::InProgress => acp::ToolCallStatus::InProgress,
        ToolCallStatus::Completed => acp::ToolCallStatus::Completed,
        ToolCallStatus::Failed => acp::ToolCallStatus::Failed,
    }
}

fn content(items: &[ToolCallContent]) -> Vec<acp::ToolCallContent> {
    items
        .iter()
        .map(|item| match item {
            ToolCallContent::Text { text } => text_block(text).into(),
            ToolCallContent::Diff {
                path,
                old_text,
                new_text,
            } => acp::ToolCallContent::Diff(
                acp::Diff::new(path.clone(), new_text.clone()).old_text(old_text.clone()),
            ),
            ToolCallContent::Terminal { terminal_id } => {
                acp::ToolCallContent::Terminal(acp::Terminal::new(terminal_id.clone()))
            }
        })
        .collect()
}

fn locations(items: &[Location]) -> Vec<acp::ToolCallLocation> {
    items
        .iter()
        .map(|l| acp::ToolCallLocation::new(l.path.clone()).line(l.line))
        .collect()
}

/// A text content block.
pub fn text_block(text: &str) -> acp::ContentBlock {
    acp::ContentBlock::Text(acp::TextContent::new(text.to_owned()))
}

/// The `tool_call` announcing a call in `state`.
pub fn tool_call(state: &ToolCallState) -> acp::ToolCall {
    acp::ToolCall::new(state.id.0.clone(), state.title.clone())
        .kind(kind(state.kind))
        .status(status(state.status))
        .content(content(&state.content))
        .locations(locations(&state.locations))
        .raw_input(state.raw_input.clone())
        .raw_output(state.raw_output.clone())
}

/// The `tool_call_update` carrying exactly the fields of `patch`.
pub fn tool_call_update(patch: &ToolCallPatch) -> acp::ToolCallUpdate {
    let mut fields = acp::ToolCallUpdateFields::new()
        .title(patch.title.clone())
        .kind(patch.kind.map(kind))
        .status(patch.status.map(status))
        .content(patch.content.as_deref().map(content))
        .locations(patch.locations.as_deref().map(locations));
    if let Some(raw) = &patch.raw_input {
        fields = fields.raw_input(raw.clone());
    }
    if let Some(raw) = &patch.raw_output {
        fields = fields.raw_output(raw.clone());
    }
    acp::ToolCallUpdate::new(patch.id.0.clone(), fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_has_only_the_patched_fields() {
        let patch = ToolCallPatch::new("c1").status(ToolCallStatus::InProgress);
        let json = serde_json::to_value(tool_call_update(&patch)).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"toolCallId": "c1", "status": "in_progress"})
        );
    }

    #[test]
    fn a_plan_keeps_its_steps_in_order_with_their_statuses() {
        let args = serde_json::json!({"explanation": "e", "plan": [
            {"step": "Read", "status": "completed"},
            {"step": "Fix", "status": "in_progress"},
            {"step": "Test", "status": "pending"}
        ]});
        let json = serde_json::to_value(plan(&args)).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"entries": [
                {"content": "Read", "priority": "medium", "status": "completed"},
                {"content": "Fix", "priority": "medium", "status": "in_progress"},
                {"content": "Test", "priority": "medium", "status": "pending"}
            ]})
        );
        let refused = serde_json::json!({"plan": [
            {"step": "a", "status": "in_progress"},
            {"step": "b", "status": "in_progress"}
        ]});
        assert!(plan(&refused).is_none());
    }
}
