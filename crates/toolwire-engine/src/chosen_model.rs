//! The model chosen for a conversation (an editor's model picker, the
//! page's): a setting kept beside the conversation, shared by every door
//! that opens it. The engine only keeps it; which choice wins over a
//! Letta agent's own model is the door's to say, in the options it
//! gives the turn ([`crate::TurnOptions::model`]).

use serde_json::{Value, json};
use toolwire_core::ConversationId;

use crate::engine::Engine;
use crate::error::EngineError;

/// The kind of the record holding a conversation's choice.
const KIND: &str = "conversation_model";

impl Engine {
    /// Chooses registry model `model` for `conversation` (`None`: no
    /// choice). A name the registry lacks is refused.
    pub async fn choose_model(
        &self,
        conversation: ConversationId,
        model: Option<&str>,
    ) -> Result<(), EngineError> {
        let id = conversation.to_string();
        match model {
            Some(name) => {
                if self.models().get(name).is_none() {
                    return Err(EngineError::UnknownModel(name.to_owned()));
                }
                self.put_record(KIND, &id, &json!({"model": name})).await
            }
            None => self.delete_record(KIND, &id).await.map(|_| ()),
        }
    }

    /// The model chosen for `conversation`, if one was and the registry
    /// still has it: a model dropped from the config since is passed over
    /// (with a warning) rather than failing every turn.
    pub async fn chosen_model(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<String>, EngineError> {
        let Some(doc) = self
            .store()
            .document(KIND, &conversation.to_string())
            .await?
        else {
            return Ok(None);
        };
        let Some(name) = doc.body.get("model").and_then(Value::as_str) else {
            return Ok(None);
        };
        if self.models().get(name).is_none() {
            tracing::warn!(%conversation, model = name, "the model chosen for the conversation is no longer configured");
            return Ok(None);
        }
        Ok(Some(name.to_owned()))
    }
}
