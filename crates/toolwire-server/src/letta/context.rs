//! `GET /v1/agents/{id}/context`: Letta's `ContextWindowOverview` of an
//! agent — what its next model step is sent (the system prompt with its
//! compiled memory, the tool definitions, the summary of what a
//! compaction covered and the active branch's messages after it) and
//! about how many tokens each part takes. Tokens are estimated (four
//! characters a token, as providers' own rules of thumb): toolwire has
//! no tokenizer of every model, and the figure is for people.

use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};
use toolwire_core::Role;

use crate::agents::blocks;
use crate::agents::ids::message_id;
use crate::agents::memory;
use crate::agents::options::agent_options;
use crate::agents::{self, models};
use crate::error::ApiResult;
use crate::letta::agents::llm_config;
use crate::state::AppState;

/// About how many tokens `text` takes.
pub fn estimate_tokens(text: &str) -> u64 {
    u64::try_from(text.len().div_ceil(4)).unwrap_or(u64::MAX)
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let agent = agents::load(&state, &id).await?;
    let conversation = state.store().conversation(agent.conversation_id).await?;
    let path = state.store().path_to(conversation.active_leaf).await?;
    let stored = path.first().map(|m| m.text()).unwrap_or_default();
    let attached = blocks::of_ids(&state.engine, &agent.block_ids).await?;
    let core = memory::compile(&state.engine, &agent, &attached);
    let system = memory::place(&stored, &core);
    let options = agent_options(&state, &agent).await?;
    let functions: Vec<Value> = options
        .tools
        .map(|r| r.specs())
        .unwrap_or_default()
        .into_iter()
        .map(|spec| {
            json!({
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            })
        })
        .collect();
    // The array's JSON text, as `Value::Array(…).to_string()` writes it,
    // without copying the definitions into one.
    let functions_tokens = estimate_tokens(&serde_json::to_string(&functions).unwrap_or_default());
    // As a step sends the path: the latest compaction's summary in place
    // of what it covered. The summary stands apart, as in Letta's
    // overview; `messages` are those sent after it.
    let view = toolwire_engine::context::view::compacted(&path);
    let summary = view
        .compaction
        .as_ref()
        .and_then(|node| node.compaction())
        .map(|(summary, _)| summary.to_owned());
    let after = if summary.is_some() { 2 } else { 1 };
    let rest = view.messages.get(after..).unwrap_or_default();
    // Every message stored on the branch, compacted or not.
    let recall = path
        .iter()
        .skip(1)
        .filter(|m| m.compaction().is_none())
        .count();
    let messages: Vec<Value> = rest
        .iter()
        .map(|m| {
            let tool_calls: Vec<Value> = m
                .tool_uses()
                .map(|(call, _server, name, arguments)| {
                    json!({
                        "id": call.0,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments.to_string()},
                    })
                })
                .collect();
            json!({
                "id": message_id(m.id),
                "agent_id": agent.id,
                "role": match m.role {
                    Role::Tool => "tool",
                    other => other.as_str(),
                },
                "content": [{"type": "text", "text": m.text()}],
                "tool_calls": if tool_calls.is_empty() { Value::Null } else { Value::Array(tool_calls) },
                "created_at": m.created_at,
            })
        })
        .collect();
    let messages_tokens: u64 = rest
        .iter()
        .map(|m| serde_json::to_string(&m.content).map_or(0, |s| estimate_tokens(&s)))
        .sum();
    let system_tokens = estimate_tokens(&stored);
    let core_tokens = estimate_tokens(&core);
    let summary_tokens = summary.as_deref().map_or(0, estimate_tokens);
    let entry = models::of_agent(state.engine.models(), agent.model.as_deref());
    let window = llm_config(&entry.info)["context_window"].clone();
    Ok(Json(json!({
        "context_window_size_max": window,
        "context_window_size_current":
            system_tokens + core_tokens + functions_tokens + summary_tokens + messages_tokens,
        "num_messages": view.messages.len(),
        "num_archival_memory": 0,
        "num_recall_memory": recall,
        "num_tokens_external_memory_summary": 0,
        "external_memory_summary": "",
        "num_tokens_system": system_tokens,
        "system_prompt": system,
        "num_tokens_core_memory": core_tokens,
        "core_memory": core,
        "num_tokens_memory_filesystem": 0,
        "memory_filesystem": null,
        "num_tokens_tool_usage_rules": 0,
        "tool_usage_rules": null,
        "num_tokens_directories": 0,
        "directories": null,
        "num_tokens_summary_memory": summary_tokens,
        "summary_memory": summary,
        "num_tokens_functions_definitions": functions_tokens,
        "functions_definitions": functions,
        "num_tokens_messages": messages_tokens,
        "messages": messages,
    })))
}
