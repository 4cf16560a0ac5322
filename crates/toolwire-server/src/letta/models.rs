//! `/v1/models`: the configured models as Letta lists its LLMs (its
//! `Model`: an `LLMConfig` with a handle, a name and a provider), so that
//! a client can offer them and create agents with their handles.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use crate::error::ApiResult;
use crate::letta::agents::{endpoint_type, llm_config};
use crate::state::AppState;

/// `GET /v1/models`: every configured model, the default first.
pub async fn list(State(state): State<AppState>) -> ApiResult<Json<Vec<Value>>> {
    let models = state.engine.models();
    let default = &models.default_entry().info.name;
    let ordered = models
        .iter()
        .filter(|e| &e.info.name == default)
        .chain(models.iter().filter(|e| &e.info.name != default));
    Ok(Json(
        ordered
            .map(|entry| {
                let info = &entry.info;
                let mut model = llm_config(info);
                if let Some(object) = model.as_object_mut() {
                    object.insert("name".into(), json!(info.model));
                    object.insert("provider_type".into(), json!(endpoint_type(&info.provider)));
                    object.insert("model_type".into(), json!("llm"));
                    object.insert(
                        "max_context_window".into(),
                        object["context_window"].clone(),
                    );
                }
                model
            })
            .collect(),
    ))
}
