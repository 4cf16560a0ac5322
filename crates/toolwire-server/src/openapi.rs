//! `GET /openapi.json`: an OpenAPI 3.1 document of the API, built from the
//! same route list the router serves (a test checks they agree).

use axum::Json;
use serde_json::{Map, Value, json};

/// One documented operation: method, path, operation id, summary, request
/// schema, response schema.
type Operation = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
);

const OPERATIONS: &[Operation] = &[
    (
        "get",
        "/v1/tools",
        "list_tools",
        "List tools (built-in, MCP and Python-source)",
        None,
        "ToolList",
    ),
    (
        "post",
        "/v1/tools",
        "create_tool",
        "Create a Python-source tool",
        Some("ToolCreate"),
        "Tool",
    ),
    (
        "put",
        "/v1/tools",
        "upsert_tool",
        "Create a tool, or update the one of the same name",
        Some("ToolCreate"),
        "Tool",
    ),
    (
        "get",
        "/v1/tools/{tool_id}",
        "retrieve_tool",
        "Get a tool",
        None,
        "Tool",
    ),
    (
        "patch",
        "/v1/tools/{tool_id}",
        "modify_tool",
        "Change a tool",
        Some("ToolUpdate"),
        "Tool",
    ),
    (
        "delete",
        "/v1/tools/{tool_id}",
        "delete_tool",
        "Delete a Python-source tool",
        None,
        "Empty",
    ),
    (
        "get",
        "/v1/agents",
        "list_agents",
        "List agents",
        None,
        "AgentList",
    ),
    (
        "post",
        "/v1/agents",
        "create_agent",
        "Create an agent (and its conversation)",
        Some("AgentCreate"),
        "AgentState",
    ),
    (
        "get",
        "/v1/agents/{agent_id}",
        "retrieve_agent",
        "Get an agent",
        None,
        "AgentState",
    ),
    (
        "patch",
        "/v1/agents/{agent_id}",
        "modify_agent",
        "Change an agent",
        Some("AgentCreate"),
        "AgentState",
    ),
    (
        "delete",
        "/v1/agents/{agent_id}",
        "delete_agent",
        "Delete an agent (its conversation is kept)",
        None,
        "Empty",
    ),
    (
        "patch",
        "/v1/agents/{agent_id}/tools/approval/{tool_name}",
        "modify_approval",
        "Whether the agent's calls of a tool wait for approval",
        Some("ApprovalSetting"),
        "AgentState",
    ),
    (
        "get",
        "/v1/agents/{agent_id}/messages",
        "list_messages",
        "The agent's history: its conversation's active branch",
        None,
        "MessageList",
    ),
    (
        "post",
        "/v1/agents/{agent_id}/messages",
        "send_message",
        "Send a message or answer waiting tool calls (JSON, or SSE with streaming: true)",
        Some("LettaRequest"),
        "LettaResponse",
    ),
    (
        "post",
        "/v1/agents/{agent_id}/messages/stream",
        "send_message_streaming",
        "As send_message, as a server-sent event stream",
        Some("LettaRequest"),
        "LettaStream",
    ),
    (
        "post",
        "/v1/agents/{agent_id}/messages/cancel",
        "cancel_run",
        "Cancel the running turn and clear a waiting approval",
        Some("CancelRequest"),
        "CancelResponse",
    ),
];

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn schemas() -> Value {
    let message = json!({
        "type": "object",
        "description": "A Letta message, discriminated by message_type",
        "properties": {
            "id": {"type": "string"},
            "date": {"type": "string", "format": "date-time"},
            "message_type": {"type": "string", "enum": [
                "system_message", "user_message", "reasoning_message", "assistant_message",
                "tool_call_message", "tool_return_message", "approval_request_message",
                "approval_response_message", "stop_reason", "usage_statistics",
                "error_message", "ping"
            ]},
        },
        "required": ["message_type"],
    });
    json!({
        "Empty": {"type": "object"},
        "Error": object(json!({
            "code": {"type": "string"},
            "message": {"type": "string"},
            "detail": {"type": "string"},
            "pending_request_id": {"type": "string"},
        }), &["code", "message"]),
        "Tool": object(json!({
            "id": {"type": "string"}, "name": {"type": "string"},
            "description": {"type": "string"}, "json_schema": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "default_requires_approval": {"type": "boolean"},
            "source_code": {"type": ["string", "null"]},
            "source_type": {"type": ["string", "null"]},
            "tool_type": {"type": "string"},
        }), &["id", "name"]),
        "ToolList": {"type": "array", "items": schema_ref("Tool")},
        "ToolCreate": object(json!({
            "source_code": {"type": "string"}, "description": {"type": "string"},
            "json_schema": {"type": "object"}, "args_json_schema": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "default_requires_approval": {"type": "boolean"},
            "source_type": {"type": "string", "enum": ["python"]},
        }), &["source_code"]),
        "ToolUpdate": object(json!({
            "source_code": {"type": "string"}, "description": {"type": "string"},
            "json_schema": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "default_requires_approval": {"type": "boolean"},
        }), &[]),
        "AgentState": object(json!({
            "id": {"type": "string"}, "name": {"type": "string"},
            "system": {"type": "string"}, "model": {"type": "string"},
            "tools": schema_ref("ToolList"),
            "tool_rules": {"type": "array", "items": {"type": "object"}},
            "conversation_id": {"type": "string", "format": "uuid"},
            "approval_timeout_seconds": {"type": ["integer", "null"]},
        }), &["id", "name", "conversation_id"]),
        "AgentList": {"type": "array", "items": schema_ref("AgentState")},
        "AgentCreate": object(json!({
            "name": {"type": "string"}, "system": {"type": "string"},
            "model": {"type": "string"},
            "tool_ids": {"type": "array", "items": {"type": "string"}},
            "tools": {"type": "array", "items": {"type": "string"}},
            "tool_rules": {"type": "array", "items": {"type": "object"}},
            "include_base_tools": {"type": "boolean", "default": true},
            "approval_timeout_seconds": {"type": "integer"},
        }), &[]),
        "ApprovalSetting": object(json!({"requires_approval": {"type": "boolean"}}), &["requires_approval"]),
        "LettaMessage": message,
        "MessageList": {"type": "array", "items": schema_ref("LettaMessage")},
        "LettaRequest": object(json!({
            "messages": {"type": "array", "items": {"type": "object"}},
            "input": {"oneOf": [{"type": "string"}, {"type": "array"}]},
            "max_steps": {"type": "integer"},
            "client_tools": {"type": "array", "items": object(json!({
                "name": {"type": "string"}, "description": {"type": "string"},
                "parameters": {"type": "object"},
            }), &["name"])},
            "include_return_message_types": {"type": "array", "items": {"type": "string"}},
            "stream_tokens": {"type": "boolean"},
            "include_pings": {"type": "boolean"},
            "streaming": {"type": "boolean"},
        }), &[]),
        "LettaResponse": object(json!({
            "messages": schema_ref("MessageList"),
            "stop_reason": {"type": "object"},
            "usage": {"type": "object"},
        }), &["messages", "stop_reason", "usage"]),
        "LettaStream": {"type": "string", "description": "text/event-stream: one LettaMessage per data line, then [DONE]"},
        "CancelRequest": object(json!({"run_ids": {"type": "array", "items": {"type": "string"}}}), &[]),
        "CancelResponse": {"type": "object"},
    })
}

/// The document.
pub(crate) fn build() -> Value {
    let mut paths = Map::new();
    for (method, path, id, summary, request, response) in OPERATIONS {
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "operationId": id,
            "summary": summary,
            "parameters": params,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": schema_ref(response)}}},
                "default": {"description": "An error", "content": {"application/json": {"schema": schema_ref("Error")}}},
            },
        });
        if let Some(request) = request {
            op["requestBody"] =
                json!({"content": {"application/json": {"schema": schema_ref(request)}}});
        }
        if let Value::Object(entry) = paths.entry(path.to_string()).or_insert_with(|| json!({})) {
            entry.insert(method.to_string(), op);
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "toolwire",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "toolwire's Letta-compatible API: tools, agents and messages, with human approval and client-side tools.",
        },
        "components": {
            "schemas": schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    })
}

pub(crate) async fn document() -> Json<Value> {
    Json(build())
}
