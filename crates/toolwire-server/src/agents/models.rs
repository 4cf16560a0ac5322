//! Which model answers a conversation's turns started here: the model
//! chosen for it (the page's picker, or an editor's: the engine keeps the
//! choice), else its agent's, else the registry's default; and one turn
//! may name its own ("regenerate with…"). Names are the registry's; a
//! name it lacks is refused with the ones it has.

use serde_json::{Value, json};
use toolwire_core::ConversationId;
use toolwire_engine::TurnOptions;
use toolwire_providers::ModelEntry;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The registry name of a model a client named, or a 400 listing them.
pub fn known(state: &AppState, name: &str) -> ApiResult<String> {
    match state.engine.models().get(name) {
        Some(entry) => Ok(entry.info.name.clone()),
        None => Err(ApiError::bad_request(format!(
            "no model named `{}` is configured; the models are: {}",
            name.chars().take(100).collect::<String>(),
            state
                .engine
                .models()
                .iter()
                .map(|e| e.info.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
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
