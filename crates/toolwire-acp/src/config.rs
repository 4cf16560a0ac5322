//! The session's configuration options (ACP `configOptions`): the model
//! picker. Its choices are the engine's registry; a choice is kept by the
//! engine for the conversation, so a loaded session (or the page showing
//! the same conversation) keeps it.

use agent_client_protocol::v1::schema::{
    SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelectOption,
    SetSessionConfigOptionRequest,
};
use toolwire_engine::{Engine, EngineError};

use crate::errors::{internal, invalid_params};
use crate::state::Session;

/// The id of the model option.
pub(crate) const MODEL: &str = "model";

/// The session's options, with their current values.
pub(crate) fn options(engine: &Engine, session: &Session) -> Vec<SessionConfigOption> {
    let models = engine.models();
    let current = session
        .model()
        .unwrap_or_else(|| models.default_entry().info.name.clone());
    let choices: Vec<SessionConfigSelectOption> = models
        .iter()
        .map(|e| {
            let mut choice =
                SessionConfigSelectOption::new(e.info.name.clone(), e.info.name.clone());
            if e.info.model != e.info.name {
                choice = choice.description(e.info.handle());
            }
            choice
        })
        .collect();
    vec![
        SessionConfigOption::select(MODEL, "Model", current, choices)
            .description("The model that answers this session's prompts".to_owned())
            .category(SessionConfigOptionCategory::Model),
    ]
}

/// `session/set_config_option`: checks and keeps the choice, and sets it
/// on the session.
pub(crate) async fn set(
    engine: &Engine,
    session: &Session,
    request: &SetSessionConfigOptionRequest,
) -> Result<(), agent_client_protocol::Error> {
    if request.config_id.0.as_ref() != MODEL {
        return Err(invalid_params(format!(
            "unknown config option `{}`; this agent has: {MODEL}",
            request.config_id.0
        )));
    }
    let Some(value) = request.value.as_value_id() else {
        return Err(invalid_params("the model option takes a model's name"));
    };
    let name = value.0.as_ref();
    match engine.choose_model(session.conversation, Some(name)).await {
        Ok(()) => {}
        Err(EngineError::UnknownModel(_)) => {
            return Err(invalid_params(engine.models().unknown(name)));
        }
        Err(e) => return Err(internal(e)),
    }
    session.set_model(Some(name.to_owned()));
    // Turns the engine starts itself use it too.
    engine.set_conversation_options(session.conversation, session.turn_options());
    Ok(())
}
