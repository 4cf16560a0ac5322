//! Which model answers a conversation: the model chosen for it (the live
//! view's picker, kept as a record beside the conversation), else its
//! agent's, else the registry's default; and one turn may name its own
//! ("regenerate with…"). Names are the registry's; a name it lacks is
//! refused with the ones it has.

use serde_json::{Value, json};
use toolwire_core::ConversationId;
use toolwire_engine::TurnOptions;
use toolwire_providers::ModelEntry;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The kind of a conversation's model choice record (id: the
/// conversation's).
pub const KIND: &str = "conversation_model";

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

/// The model chosen for `conversation`, if one was and the registry
/// still has it (a model dropped from the config since is passed over,
/// with a warning, rather than failing every turn).
pub async fn chosen(state: &AppState, conversation: ConversationId) -> ApiResult<Option<String>> {
    let Some(doc) = state
        .store()
        .document(KIND, &conversation.to_string())
        .await?
    else {
        return Ok(None);
    };
    let Some(name) = doc.body.get("model").and_then(Value::as_str) else {
        return Ok(None);
    };
    if state.engine.models().get(name).is_none() {
        tracing::warn!(%conversation, model = name, "the model chosen for the conversation is no longer configured; the default answers");
        return Ok(None);
    }
    Ok(Some(name.to_owned()))
}

/// Chooses `model` for `conversation` (`None`: back to its agent's or the
/// default).
pub async fn choose(
    state: &AppState,
    conversation: ConversationId,
    model: Option<&str>,
) -> ApiResult<()> {
    let id = conversation.to_string();
    match model {
        Some(name) => {
            let name = known(state, name)?;
            state
                .engine
                .put_record(KIND, &id, &json!({"model": name}))
                .await?;
        }
        None => {
            state.engine.delete_record(KIND, &id).await?;
        }
    }
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
