//! The session's configuration options (ACP `configOptions`): the mode
//! (the same as `session/set_mode`), the model picker, and the reasoning
//! effort where the session's model reasons. The models are the engine's
//! registry; a model choice is kept by the engine for the conversation,
//! so a loaded session (or the page showing the same conversation) keeps
//! it; the mode and the effort are kept with the session (`sessions.rs`).

use std::sync::atomic::Ordering;

use agent_client_protocol::v1::schema::{
    SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelectOption,
    SetSessionConfigOptionRequest,
};
use toolwire_engine::{Engine, EngineError};
use toolwire_providers::ReasoningEffort;

use crate::errors::{internal, invalid_params};
use crate::modes::{self, SessionMode};
use crate::sessions;
use crate::state::Session;

/// The id of the model option.
pub(crate) const MODEL: &str = "model";

/// The id of the mode option (the same as `session/set_mode`).
pub(crate) const MODE: &str = "mode";

/// The id of the reasoning effort option.
pub(crate) const EFFORT: &str = "reasoning_effort";

/// The effort choice that sends none: the provider's default.
const DEFAULT_EFFORT: &str = "default";

/// Whether registry model `name` (the default model when `None`) reasons.
pub(crate) fn reasons(engine: &Engine, name: Option<&str>) -> bool {
    let models = engine.models();
    name.and_then(|n| models.get(n))
        .unwrap_or_else(|| models.default_entry())
        .info
        .capabilities
        .reasoning
}

/// The session's options, with their current values. Every session's
/// answer carries them: names and choices, no descriptions where the name
/// says it (a model's choice names its provider model when that differs).
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
    let mut options = vec![
        SessionConfigOption::select(MODE, "Mode", session.mode().id(), modes::choices())
            .category(SessionConfigOptionCategory::Mode),
        SessionConfigOption::select(MODEL, "Model", current, choices)
            .category(SessionConfigOptionCategory::Model),
    ];
    if session.model_reasons.load(Ordering::SeqCst) {
        let current = session
            .effort()
            .map_or(DEFAULT_EFFORT, ReasoningEffort::as_str);
        let mut choices = vec![
            SessionConfigSelectOption::new(DEFAULT_EFFORT, "Default")
                .description("The provider's own default".to_owned()),
        ];
        choices.extend(ReasoningEffort::ALL.into_iter().map(|e| {
            let name = match e {
                ReasoningEffort::Low => "Low",
                ReasoningEffort::Medium => "Medium",
                ReasoningEffort::High => "High",
            };
            SessionConfigSelectOption::new(e.as_str(), name)
        }));
        options.push(
            SessionConfigOption::select(EFFORT, "Reasoning effort", current, choices)
                .description("How hard the model thinks before it answers".to_owned())
                .category(SessionConfigOptionCategory::ThoughtLevel),
        );
    }
    options
}

/// `session/set_config_option`: checks and keeps the choice, and sets it
/// on the session.
pub(crate) async fn set(
    engine: &Engine,
    session: &Session,
    request: &SetSessionConfigOptionRequest,
) -> Result<(), agent_client_protocol::Error> {
    let option = request.config_id.0.as_ref();
    let value = request.value.as_value_id().map(|v| v.0.to_string());
    match option {
        MODE => {
            let value = value.ok_or_else(|| invalid_params("the mode option takes a mode's id"))?;
            let mode = SessionMode::parse(&value).map_err(invalid_params)?;
            sessions::apply_mode(engine, session, mode).await;
            Ok(())
        }
        MODEL => {
            let name =
                value.ok_or_else(|| invalid_params("the model option takes a model's name"))?;
            set_model(engine, session, &name).await
        }
        EFFORT if session.model_reasons.load(Ordering::SeqCst) => {
            let value = value.ok_or_else(|| {
                invalid_params("the reasoning_effort option takes default, low, medium or high")
            })?;
            let effort = match value.as_str() {
                DEFAULT_EFFORT => None,
                other => Some(ReasoningEffort::parse(other).ok_or_else(|| {
                    invalid_params(format!(
                        "unknown reasoning effort `{other}`; the choices are: default, low, \
                         medium, high"
                    ))
                })?),
            };
            session.set_effort(effort);
            engine.set_conversation_options(session.conversation, session.turn_options());
            sessions::update(
                engine,
                session.conversation,
                &session.cwd,
                session.mode(),
                |r| r.reasoning_effort = effort,
            )
            .await;
            Ok(())
        }
        EFFORT => Err(invalid_params(
            "the session's model does not reason: it has no reasoning_effort option",
        )),
        other => Err(invalid_params(format!(
            "unknown config option `{other}`; this agent has: {MODE}, {MODEL}, {EFFORT} (for \
             models that reason)"
        ))),
    }
}

/// Sets the session's model by registry name (`/model` too).
pub(crate) async fn set_model(
    engine: &Engine,
    session: &Session,
    name: &str,
) -> Result<(), agent_client_protocol::Error> {
    match engine.choose_model(session.conversation, Some(name)).await {
        Ok(()) => {}
        Err(EngineError::UnknownModel(_)) => {
            return Err(invalid_params(engine.models().unknown(name)));
        }
        Err(e) => return Err(internal(e)),
    }
    session.set_model(Some(name.to_owned()));
    session
        .model_reasons
        .store(reasons(engine, Some(name)), Ordering::SeqCst);
    // Turns the engine starts itself use it too.
    engine.set_conversation_options(session.conversation, session.turn_options());
    Ok(())
}
