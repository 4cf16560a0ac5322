//! Which model answers a conversation's turns started here: the model
//! chosen for it (the page's picker, or an editor's: the engine keeps the
//! choice), else its agent's, else the registry's default; and one turn
//! may name its own ("regenerate with…"). Names are the registry's; a
//! name it lacks is refused with the ones it has.
//!
//! An agent's own `model` is what the client gave (a Letta handle
//! `provider/model`, a registry name or a bare model id), resolved here.
//! A deployment of one model answers every agent with it, whatever handle
//! the agent names (Letta clients name `openai/gpt-4o-mini` out of habit;
//! a server with one scripted or local model has nothing else to give).
//! With several models, a handle that names none of them is refused when
//! the agent is created or changed.

use serde_json::{Value, json};
use toolwire_core::ConversationId;
use toolwire_engine::TurnOptions;
use toolwire_providers::{ModelEntry, Models};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The registry name of a model a client named, or a 400 listing them.
pub fn known(state: &AppState, name: &str) -> ApiResult<String> {
    let models = state.engine.models();
    match models.get(name) {
        Some(entry) => Ok(entry.info.name.clone()),
        None => Err(ApiError::bad_request(models.unknown(name))),
    }
}

/// The model chosen for `conversation`, if any (the engine keeps it).
pub async fn chosen(state: &AppState, conversation: ConversationId) -> ApiResult<Option<String>> {
    Ok(state.engine.chosen_model(conversation).await?)
}

/// Chooses `model` for `conversation` (`None`: back to its agent's or the
/// default).
pub async fn choose(
    state: &AppState,
    conversation: ConversationId,
    model: Option<&str>,
) -> ApiResult<()> {
    let model = model.map(|name| known(state, name)).transpose()?;
    state
        .engine
        .choose_model(conversation, model.as_deref())
        .await?;
    Ok(())
}

/// `options` with the conversation's chosen model, when there is one.
pub async fn apply_chosen(
    state: &AppState,
    conversation: ConversationId,
    options: &mut TurnOptions,
) -> ApiResult<()> {
    if let Some(name) = chosen(state, conversation).await? {
        options.model = Some(name);
    }
    Ok(())
}

/// A model as clients list it.
pub fn describe(entry: &ModelEntry) -> Value {
    let info = &entry.info;
    json!({
        "name": info.name,
        "provider": info.provider,
        "model": info.model,
        "handle": info.handle(),
        "context_window": info.context_window,
        "vision": info.capabilities.vision,
        "tools": info.capabilities.tools,
        "reasoning": info.capabilities.reasoning,
    })
}

/// The model `handle` means, if the registry has it; else the only model
/// of a registry of one.
fn lenient<'m>(models: &'m Models, handle: &str) -> Option<&'m ModelEntry> {
    models.resolve(handle).or_else(|| only(models))
}

fn only(models: &Models) -> Option<&ModelEntry> {
    let mut all = models.iter();
    match (all.next(), all.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

/// The model `handle` means, or Letta's 404 naming the handles there are.
pub fn resolve_handle<'m>(models: &'m Models, handle: &str) -> ApiResult<&'m ModelEntry> {
    if let Some(entry) = models.resolve(handle) {
        return Ok(entry);
    }
    if let Some(only) = only(models) {
        tracing::warn!(
            handle,
            model = %only.info.name,
            "the agent's model is not configured; the only model answers it"
        );
        return Ok(only);
    }
    Err({
        let handles: Vec<String> = models.iter().map(|e| e.info.handle()).collect();
        ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!(
                "Handle {} not found, must be one of {handles:?} (or a model name: {})",
                // A client's word, echoed no longer than a handle can be.
                handle.chars().take(200).collect::<String>(),
                models.names()
            ),
        )
    })
}

/// The model of an agent whose `model` is `handle` (the default without
/// one). A handle that no longer resolves (the configuration changed since
/// the agent was made) gets the default, with a warning: the agent keeps
/// working, and its JSON shows the model that answers.
pub fn of_agent<'m>(models: &'m Models, handle: Option<&str>) -> &'m ModelEntry {
    let Some(handle) = handle else {
        return models.default_entry();
    };
    lenient(models, handle).unwrap_or_else(|| {
        let default = models.default_entry();
        tracing::debug!(
            handle,
            model = %default.info.name,
            "the agent's model is no longer configured; the default model answers it"
        );
        default
    })
}
