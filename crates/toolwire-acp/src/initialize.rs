//! `initialize` answered without the fields equal to their schema
//! defaults. The protocol crate serialises every capability flag, so its
//! answer carries `"image":false`, `"audio":false`, `"sse":false`,
//! `"auth":{}`, `"authMethods":[]` and the like, bytes every editor reads
//! once per agent and that say nothing the schema's defaults do not (each
//! of those fields defaults to `false`, `{}` or `[]`). The request is the
//! crate's own `InitializeRequest`; only its answer's JSON is trimmed.

use agent_client_protocol::v1::schema::{InitializeRequest, InitializeResponse};
use agent_client_protocol::{JsonRpcMessage, JsonRpcRequest, JsonRpcResponse, UntypedMessage};
use serde_json::Value;

/// `initialize`, answered with [`Answer`].
#[derive(Debug, Clone)]
pub(crate) struct Initialize(pub InitializeRequest);

impl JsonRpcMessage for Initialize {
    fn matches_method(method: &str) -> bool {
        InitializeRequest::matches_method(method)
    }

    fn method(&self) -> &str {
        self.0.method()
    }

    fn to_untyped_message(&self) -> Result<UntypedMessage, agent_client_protocol::Error> {
        self.0.to_untyped_message()
    }

    fn parse_message(method: &str, params: &Value) -> Result<Self, agent_client_protocol::Error> {
        InitializeRequest::parse_message(method, params).map(Initialize)
    }
}

impl JsonRpcRequest for Initialize {
    type Response = Answer;
}

/// An `initialize` answer, serialised without its default-valued fields.
#[derive(Debug, Clone)]
pub(crate) struct Answer(pub InitializeResponse);

impl JsonRpcResponse for Answer {
    fn into_json(self, method: &str) -> Result<Value, agent_client_protocol::Error> {
        let mut value = self.0.into_json(method)?;
        trim(&mut value);
        Ok(value)
    }

    fn from_json(method: &str, value: Value) -> Result<Self, agent_client_protocol::Error> {
        InitializeResponse::from_json(method, value).map(Answer)
    }
}

/// Drops what equals its schema default: `authMethods: []`; in
/// `agentCapabilities`, every `false` flag at any depth (not in `_meta`,
/// whose values are ours), and `auth` and `sessionCapabilities` when empty
/// (their default is `{}`; an empty object deeper, `"list": {}`, says a
/// method is supported and stays).
fn trim(response: &mut Value) {
    let Some(response) = response.as_object_mut() else {
        return;
    };
    if response
        .get("authMethods")
        .is_some_and(|m| m.as_array().is_some_and(Vec::is_empty))
    {
        response.remove("authMethods");
    }
    let Some(capabilities) = response
        .get_mut("agentCapabilities")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    capabilities.retain(|key, v| {
        if key == "_meta" {
            return true;
        }
        drop_false(v);
        let empty = v.as_object().is_some_and(serde_json::Map::is_empty);
        !(v == &Value::Bool(false) || (empty && (key == "auth" || key == "sessionCapabilities")))
    });
}

/// Drops the `false` flags of `value`'s objects, at any depth.
fn drop_false(value: &mut Value) {
    if let Some(object) = value.as_object_mut() {
        object.retain(|key, v| {
            if key == "_meta" {
                return true;
            }
            drop_false(v);
            v != &Value::Bool(false)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{
        AgentCapabilities, McpCapabilities, PromptCapabilities, SessionCapabilities,
        SessionListCapabilities,
    };

    #[test]
    fn defaults_are_left_out_and_what_differs_stays() {
        let mut meta = serde_json::Map::new();
        meta.insert("toolwire".into(), serde_json::json!({"on": false}));
        let response = InitializeResponse::new(agent_client_protocol::schema::ProtocolVersion::V1)
            .agent_capabilities(
                AgentCapabilities::new()
                    .load_session(true)
                    .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
                    .mcp_capabilities(McpCapabilities::new().http(true))
                    .session_capabilities(
                        SessionCapabilities::new().list(SessionListCapabilities::new()),
                    )
                    .meta(meta),
            );
        let value = Answer(response.clone()).into_json("initialize").unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": true,
                    "promptCapabilities": {"embeddedContext": true},
                    "mcpCapabilities": {"http": true},
                    // An empty capability object that says "supported" stays.
                    "sessionCapabilities": {"list": {}},
                    "_meta": {"toolwire": {"on": false}}
                }
            })
        );
        // It reads back as the same answer.
        let back = InitializeResponse::from_json("initialize", value).unwrap();
        assert_eq!(back, response);
    }
}
