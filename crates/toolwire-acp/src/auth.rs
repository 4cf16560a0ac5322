//! Authentication (ACP `authMethods`, `authenticate`): toolwire's only
//! credential is the default model's API key, read from an environment
//! variable. When it is missing the agent still starts; `initialize`
//! offers one method naming the variable, opening a session answers
//! `auth_required` (so the editor shows the method instead of a first
//! prompt failing), and `authenticate` checks the variable again.

use agent_client_protocol::v1::Responder;
use agent_client_protocol::v1::schema::{
    AuthMethod, AuthMethodAgent, AuthenticateRequest, AuthenticateResponse,
};

use crate::AcpAgent;
use crate::errors::{AcpResult, invalid_params};

/// The default model's key, where it is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyCheck {
    /// The registry name of the default model.
    pub model: String,
    /// The environment variable its key is read from.
    pub env: String,
}

impl KeyCheck {
    /// The id of its authentication method.
    fn method_id(&self) -> String {
        format!("env:{}", self.env)
    }

    /// Whether the variable is set (not empty).
    pub fn is_set(&self) -> bool {
        std::env::var_os(&self.env).is_some_and(|v| !v.is_empty())
    }

    /// What the editor is told to do.
    fn advice(&self) -> String {
        format!(
            "the default model `{}` has no API key: set {} in the environment the editor \
             starts `toolwire acp` with, then restart the agent",
            self.model, self.env
        )
    }

    /// The method `initialize` offers.
    pub(crate) fn method(&self) -> AuthMethod {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "toolwire".into(),
            serde_json::json!({"env": self.env, "model": self.model}),
        );
        AuthMethod::Agent(
            AuthMethodAgent::new(self.method_id(), format!("Set {}", self.env))
                .description(self.advice())
                .meta(meta),
        )
    }

    /// The `auth_required` error naming the variable.
    pub(crate) fn required(&self) -> agent_client_protocol::Error {
        agent_client_protocol::Error::auth_required().data(serde_json::Value::String(self.advice()))
    }
}

impl AcpAgent {
    /// The authentication method to offer: one while the key is missing.
    pub(crate) fn auth_methods(&self) -> Vec<AuthMethod> {
        self.missing_key()
            .map(|k| vec![k.method()])
            .unwrap_or_default()
    }

    /// The key check, when the key is missing now.
    pub(crate) fn missing_key(&self) -> Option<&KeyCheck> {
        self.settings.key.as_ref().filter(|k| !k.is_set())
    }

    /// Refuses to open a session while the key is missing.
    pub(crate) fn check_key(&self) -> Result<(), agent_client_protocol::Error> {
        match self.missing_key() {
            Some(key) => Err(key.required()),
            None => Ok(()),
        }
    }

    /// `authenticate`: checks the variable again.
    pub(crate) fn authenticate(
        &self,
        request: AuthenticateRequest,
        responder: Responder<AuthenticateResponse>,
    ) -> AcpResult {
        let Some(key) = &self.settings.key else {
            return responder.respond_with_error(invalid_params(format!(
                "unknown authentication method `{}`: this agent needs none",
                request.method_id.0
            )));
        };
        if request.method_id.0.as_ref() != key.method_id() {
            return responder.respond_with_error(invalid_params(format!(
                "unknown authentication method `{}`; this agent offers `{}`",
                request.method_id.0,
                key.method_id()
            )));
        }
        if key.is_set() {
            tracing::info!(env = %key.env, "ACP authenticate: the key is set");
            responder.respond(AuthenticateResponse::new())
        } else {
            tracing::info!(env = %key.env, "ACP authenticate: the key is still missing");
            responder.respond_with_error(key.required())
        }
    }
}
