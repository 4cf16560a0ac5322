//! The JSON-RPC errors the agent answers with.

pub(crate) type AcpResult = Result<(), agent_client_protocol::Error>;

pub(crate) fn invalid_params(message: impl Into<String>) -> agent_client_protocol::Error {
    let message: String = message.into();
    agent_client_protocol::Error::invalid_params().data(serde_json::Value::String(message))
}

pub(crate) fn internal(message: impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::internal_error()
        .data(serde_json::Value::String(message.to_string()))
}
