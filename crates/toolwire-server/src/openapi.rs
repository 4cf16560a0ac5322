//! `GET /openapi.json`: an OpenAPI 3.1 document of the API, built from the
//! same route list the router serves (a test checks they agree).

mod memory;

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
        "LettaStreamEvent",
    ),
    (
        "post",
        "/v1/agents/{agent_id}/messages/cancel",
        "cancel_run",
        "Cancel the running turn and clear a waiting approval",
        Some("CancelRequest"),
        "CancelResponse",
    ),
    (
        "post",
        "/v1/agents/{agent_id}/notifications",
        "notify_agent",
        "Tell the agent about something: it arrives with the next tool result \
         (or starts a turn, for a waking source)",
        Some("NotificationRequest"),
        "NotificationResponse",
    ),
    (
        "post",
        "/v1/agents/{agent_id}/summarize",
        "summarize_agent",
        "Compact the agent's conversation: its older messages summarised into a compaction \
         node of the tree (they stay stored)",
        Some("SummarizeRequest"),
        "Compaction",
    ),
    (
        "get",
        "/v1/models",
        "list_models",
        "List the configured models (the default first), as Letta lists its LLMs",
        None,
        "ModelList",
    ),
    (
        "get",
        "/v1/blobs/{sha256}",
        "get_blob",
        "A stored image's bytes, by the SHA-256 its messages name",
        None,
        "Blob",
    ),
    // The live view (src/live/PROTOCOL.md); its WebSocket is not HTTP
    // and is not listed.
    (
        "get",
        "/v1/conversations",
        "list_conversations",
        "List conversations, newest first",
        None,
        "ConversationList",
    ),
    (
        "post",
        "/v1/conversations",
        "create_conversation",
        "Create a conversation",
        Some("ConversationCreate"),
        "ConversationSummary",
    ),
    (
        "get",
        "/v1/conversations/{conversation_id}/tree",
        "get_conversation_tree",
        "Every message of a conversation as a tree",
        None,
        "Tree",
    ),
    (
        "get",
        "/v1/conversations/{conversation_id}/messages/{message_id}",
        "get_conversation_message",
        "One message whole, with its siblings",
        None,
        "MessageView",
    ),
    (
        "get",
        "/v1/conversations/{conversation_id}/messages",
        "get_conversation_messages",
        "Several messages whole, in the order asked (ids: 1 to 200, comma-separated)",
        None,
        "MessageViewList",
    ),
    (
        "post",
        "/v1/conversations/{conversation_id}/messages",
        "send_conversation_message",
        "Send a user message (under the active leaf by default) and start a turn",
        Some("SendRequest"),
        "TurnAccepted",
    ),
    (
        "post",
        "/v1/conversations/{conversation_id}/messages/{message_id}/edit",
        "edit_conversation_message",
        "Edit a user message (a new sibling) and start a turn from it",
        Some("EditRequest"),
        "TurnAccepted",
    ),
    (
        "post",
        "/v1/conversations/{conversation_id}/messages/{message_id}/regenerate",
        "regenerate_conversation_message",
        "A new answer in place of an assistant message, by the model named if one is",
        Some("RegenerateRequest"),
        "RunAccepted",
    ),
    (
        "get",
        "/v1/conversations/{conversation_id}/model",
        "get_conversation_model",
        "The model a conversation's turns use, the one chosen for it, and the models there are",
        None,
        "ConversationModel",
    ),
    (
        "put",
        "/v1/conversations/{conversation_id}/model",
        "set_conversation_model",
        "Choose the model of a conversation's next turns (null: its agent's or the default)",
        Some("ModelChoice"),
        "ConversationModel",
    ),
    (
        "post",
        "/v1/conversations/{conversation_id}/fork",
        "fork_conversation",
        "A new conversation holding the path to a message",
        Some("MessageRef"),
        "ConversationSummary",
    ),
    (
        "post",
        "/v1/conversations/{conversation_id}/compact",
        "compact_conversation",
        "Compact the active branch: a run that stores a compaction node (its end comes over the socket)",
        Some("CompactRequest"),
        "RunAccepted",
    ),
    (
        "put",
        "/v1/conversations/{conversation_id}/active_leaf",
        "set_active_leaf",
        "Go on from another branch",
        Some("MessageRef"),
        "Tree",
    ),
];

/// The status of an operation's success: most answer 200.
fn ok_status(id: &str) -> &'static str {
    match id {
        "create_conversation" | "fork_conversation" => "201",
        "send_conversation_message"
        | "edit_conversation_message"
        | "regenerate_conversation_message"
        | "compact_conversation" => "202",
        _ => "200",
    }
}

/// Links from an operation's success to others: the ids it returns are
/// the ones those take (so that a client, or a fuzzer, can follow them).
fn links(id: &str) -> Option<Value> {
    let conversation = |op: &str| json!({"operationId": op, "parameters": {"conversation_id": "$response.body#/id"}});
    let message = |op: &str| {
        json!({"operationId": op, "parameters": {
            "conversation_id": "$request.path.conversation_id",
            "message_id": "$response.body#/message_id",
        }})
    };
    match id {
        "create_conversation" | "fork_conversation" => Some(json!({
            "GetTree": conversation("get_conversation_tree"),
            "Send": conversation("send_conversation_message"),
        })),
        "send_conversation_message" | "edit_conversation_message" => Some(json!({
            "GetMessage": message("get_conversation_message"),
            "Edit": message("edit_conversation_message"),
        })),
        _ => None,
    }
}

/// Operations whose body is required (the others read none as `{}`).
const BODY_REQUIRED: &[&str] = &[
    "modify_approval",
    "send_conversation_message",
    "edit_conversation_message",
    "fork_conversation",
    "set_active_leaf",
    "set_conversation_model",
];

/// The live view's schemas (PROTOCOL.md).
fn live_schemas() -> Map<String, Value> {
    let uuid = || json!({"type": "string", "format": "uuid"});
    let nullable_number = json!({"type": ["number", "null"]});
    let node_properties = json!({
        "id": uuid(),
        "parent_id": nullable(uuid()),
        "children": {"type": "array", "items": uuid()},
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "summary": {"type": "string", "maxLength": 201},
        "status": {"type": "string"},
        "usage": nullable(object(json!({
            "prompt_tokens": unsigned(u64::MAX),
            "completion_tokens": unsigned(u64::MAX),
            "cached_tokens": unsigned(u64::MAX),
            "cache_write_tokens": unsigned(u64::MAX),
        }), &["prompt_tokens", "completion_tokens"])),
        "cost": nullable_number,
        "model": nullable(string()),
        "created_at": timestamp(),
        "tool_calls": {"type": "array", "items": object(json!({
            "tool_call_id": string(), "tool_name": string(),
        }), &["tool_call_id", "tool_name"])},
        "notifications": unsigned(u32::MAX.into()),
        "compaction": object(json!({
            "through": uuid(),
            "covered": unsigned(u32::MAX.into()),
            "tokens_before": unsigned(u64::MAX),
            "tokens_after": unsigned(u64::MAX),
        }), &["through", "covered", "tokens_before", "tokens_after"]),
    });
    let node_required = [
        "id",
        "parent_id",
        "children",
        "role",
        "summary",
        "status",
        "usage",
        "cost",
        "model",
        "created_at",
        "tool_calls",
        "notifications",
    ];
    let mut view_properties = node_properties.clone();
    view_properties["content_blocks"] = json!({"type": "array", "items": {
        "type": "object",
        "description": "A content block in the core's form, by `type`: text, reasoning, tool_use, tool_result, image, notification or compaction",
        "properties": {"type": {"type": "string", "enum": ["text", "reasoning", "tool_use", "tool_result", "image", "notification", "compaction"]}},
        "required": ["type"],
    }});
    view_properties["siblings"] = object(
        json!({"index": unsigned(u32::MAX.into()), "ids": {"type": "array", "items": uuid()}}),
        &["index", "ids"],
    );
    let mut view_required = node_required.to_vec();
    view_required.extend(["content_blocks", "siblings"]);
    // Text with something in it: blank text is refused (400).
    let text = json!({"type": "string", "pattern": "\\S"});
    let mut schemas = Map::new();
    for (name, schema) in [
        (
            "ConversationSummary",
            object(
                json!({
                    "id": uuid(),
                    "title": nullable(string()),
                    "created_at": timestamp(),
                    "updated_at": timestamp(),
                    "agent_id": string(),
                    "forked_from": object(json!({"conversation_id": uuid(), "message_id": uuid()}), &["conversation_id", "message_id"]),
                }),
                &["id", "title", "created_at"],
            ),
        ),
        (
            "ConversationList",
            object(
                json!({
                    "conversations": {"type": "array", "items": schema_ref("ConversationSummary")},
                }),
                &["conversations"],
            ),
        ),
        (
            "ConversationCreate",
            object(json!({"title": nullable(string())}), &[]),
        ),
        ("Node", object(node_properties, &node_required)),
        ("MessageView", object(view_properties, &view_required)),
        (
            "MessageViewList",
            object(
                json!({"messages": {"type": "array", "items": schema_ref("MessageView")}}),
                &["messages"],
            ),
        ),
        (
            "Tree",
            object(
                json!({
                    "conversation_id": uuid(),
                    "root_id": uuid(),
                    "active_leaf": uuid(),
                    "total_cost": {"type": "number"},
                    "running": {"type": "boolean"},
                    "last_seq": unsigned(u64::MAX),
                    "nodes": {"type": "array", "items": schema_ref("Node")},
                }),
                &[
                    "conversation_id",
                    "root_id",
                    "active_leaf",
                    "total_cost",
                    "running",
                    "last_seq",
                    "nodes",
                ],
            ),
        ),
        (
            "SendRequest",
            object(
                json!({
                    "text": string(),
                    "parent_id": nullable(uuid()),
                    "model": nullable(string()),
                    "images": {"type": "array", "items": object(
                        json!({"data": string(), "media_type": nullable(string())}),
                        &["data"],
                    )},
                }),
                &[],
            ),
        ),
        (
            "EditRequest",
            object(
                json!({"text": text, "model": nullable(string())}),
                &["text"],
            ),
        ),
        (
            "RegenerateRequest",
            object(json!({"model": nullable(string())}), &[]),
        ),
        (
            "CompactRequest",
            object(json!({"model": nullable(string())}), &[]),
        ),
        (
            "ModelChoice",
            object(json!({"model": nullable(string())}), &["model"]),
        ),
        (
            "ConversationModel",
            object(
                json!({
                    "model": string(),
                    "chosen": nullable(string()),
                    "default": string(),
                    "models": {"type": "array", "items": object(json!({
                        "name": string(),
                        "provider": string(),
                        "model": string(),
                        "handle": string(),
                        "context_window": nullable(unsigned(u64::MAX)),
                        "vision": {"type": "boolean"},
                        "tools": {"type": "boolean"},
                        "reasoning": {"type": "boolean"},
                    }), &["name", "provider", "model", "handle"])},
                }),
                &["model", "chosen", "default", "models"],
            ),
        ),
        (
            "MessageRef",
            object(json!({"message_id": uuid()}), &["message_id"]),
        ),
        (
            "TurnAccepted",
            object(
                json!({"run_id": uuid(), "message_id": uuid()}),
                &["run_id", "message_id"],
            ),
        ),
        (
            "RunAccepted",
            object(json!({"run_id": uuid()}), &["run_id"]),
        ),
    ] {
        schemas.insert(name.to_owned(), schema);
    }
    schemas
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

/// `schema`, or `null` (the server reads every optional field of a request
/// as absent when it is `null`).
fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn strings() -> Value {
    json!({"type": "array", "items": {"type": "string"}})
}

/// A whole number from 0 to `max`.
fn unsigned(max: u64) -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": max})
}

fn timestamp() -> Value {
    json!({"type": "string", "format": "date-time"})
}

/// The query parameters of operation `id`, beyond its path.
fn query_parameters(id: &str) -> Vec<Value> {
    let param = |name: &str, schema: Value, description: &str| json!({"name": name, "in": "query", "required": false, "schema": schema, "description": description});
    let page = || {
        vec![
            param("after", string(), "Items strictly after this id"),
            param("before", string(), "Items strictly before this id"),
            param(
                "limit",
                unsigned(u64::MAX),
                "At most this many items (0 counts as 1)",
            ),
            param(
                "order",
                json!({"type": "string", "enum": ["asc", "desc"]}),
                "By creation: oldest (asc) or newest (desc) first",
            ),
        ]
    };
    match id {
        "list_tools" => {
            let mut params = page();
            params.push(param("name", string(), "Only the tool of this name"));
            params.push(param(
                "search",
                string(),
                "Only tools whose name contains this (any case)",
            ));
            params
        }
        "list_agents" => {
            let mut params = page();
            params.push(param("name", string(), "Only agents of this name"));
            params.push(param("tags", string(), "Only agents with this tag"));
            params
        }
        other if memory::query_parameters(other, page).is_some() => {
            memory::query_parameters(other, page).unwrap_or_default()
        }
        "list_messages" => page(),
        "get_conversation_messages" => vec![json!({
            "name": "ids",
            "in": "query",
            "required": true,
            "schema": string(),
            "description": "Message ids, comma-separated (1 to 200)",
        })],
        "modify_approval" => vec![param(
            "requires_approval",
            json!({"type": "boolean"}),
            "As the body's requires_approval, which wins",
        )],
        _ => Vec::new(),
    }
}

fn schemas() -> Value {
    let message = json!({
        "type": "object",
        "description": "A Letta message, discriminated by message_type",
        "properties": {
            "id": {"type": "string"},
            "date": timestamp(),
            "message_type": {"type": "string", "enum": [
                "system_message", "user_message", "reasoning_message", "assistant_message",
                "tool_call_message", "tool_return_message", "approval_request_message",
                "approval_response_message", "stop_reason", "usage_statistics",
                "error_message", "ping"
            ]},
            "run_id": {"type": ["string", "null"]},
        },
        "required": ["message_type"],
    });
    // A user message (`type` absent or `message`), an approval answer or
    // client tool results; other types are refused.
    let message_create = json!({
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["message", "approval", "tool_return"]},
            "role": {"type": "string", "enum": ["user", "system"], "default": "user"},
            "content": {"anyOf": [{"type": "string"}, {"type": "array"}],
                        "description": "A string, or parts whose `text` counts; required by a user message"},
            "approvals": {"type": "array", "items": {"type": "object"}},
            "approve": {"type": "boolean"},
            "reason": {"type": "string"},
            "tool_returns": {"type": "array", "items": {"type": "object"}},
        },
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
            "args_json_schema": {"type": ["object", "null"]},
            "tags": strings(),
            "default_requires_approval": {"type": "boolean"},
            "source_code": {"type": ["string", "null"]},
            "source_type": {"type": ["string", "null"]},
            "tool_type": {"type": "string", "description": "Letta's ToolType: `custom` (Python source), `letta_builtin` (toolwire's own tools) or `external_mcp`"},
            "return_char_limit": nullable(unsigned(u64::MAX)),
            "metadata_": {"description": "As the client gave it"},
            "created_at": timestamp(),
            "updated_at": timestamp(),
        }), &["id", "name", "description", "json_schema", "tags", "tool_type", "created_at", "updated_at"]),
        "ToolList": {"type": "array", "items": schema_ref("Tool")},
        "ToolCreate": object(json!({
            "source_code": {"type": "string", "description": "Python; the tool is its last top-level function"},
            "name": nullable(string()),
            "description": nullable(string()),
            "json_schema": nullable(json!({"type": "object"})),
            "args_json_schema": nullable(json!({"type": "object"})),
            "tags": nullable(strings()),
            "default_requires_approval": nullable(json!({"type": "boolean"})),
            "source_type": nullable(json!({"type": "string", "enum": ["python"]})),
            "return_char_limit": nullable(unsigned(u64::MAX)),
        }), &["source_code"]),
        "ToolUpdate": object(json!({
            "source_code": nullable(string()),
            "name": nullable(string()),
            "description": nullable(string()),
            "json_schema": nullable(json!({"type": "object"})),
            "args_json_schema": nullable(json!({"type": "object"})),
            "tags": nullable(strings()),
            "default_requires_approval": nullable(json!({"type": "boolean"})),
            "source_type": nullable(json!({"type": "string", "enum": ["python"]})),
            "return_char_limit": nullable(unsigned(u64::MAX)),
        }), &[]),
        "AgentState": object(json!({
            "id": {"type": "string"}, "name": {"type": "string"},
            "description": {"type": ["string", "null"]},
            "system": {"type": "string"}, "model": {"type": "string"},
            "agent_type": {"type": "string"},
            "llm_config": schema_ref("LlmModel"),
            "model_settings": {"type": "object"},
            "tools": schema_ref("ToolList"),
            "tool_ids": strings(),
            "tool_rules": {"type": "array"},
            "tags": strings(),
            "memory": {"type": "object"},
            "blocks": {"type": "array"},
            "conversation_id": {"type": "string", "format": "uuid"},
            "approvals": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "approval_timeout_seconds": nullable(unsigned(u64::MAX)),
            "created_at": timestamp(),
            "updated_at": timestamp(),
        }), &["id", "name", "system", "model", "tools", "tool_ids", "tool_rules", "tags", "conversation_id", "created_at", "updated_at"]),
        "AgentList": {"type": "array", "items": schema_ref("AgentState")},
        "LlmModel": object(json!({
            "handle": string(),
            "model": string(),
            "name": string(),
            "display_name": string(),
            "model_endpoint_type": {"type": "string", "enum": ["openai", "anthropic"]},
            "provider_type": {"type": "string", "enum": ["openai", "anthropic"]},
            "provider_name": string(),
            "model_type": {"const": "llm"},
            "context_window": unsigned(u64::MAX),
            "max_context_window": unsigned(u64::MAX),
            "max_tokens": nullable(unsigned(u32::MAX.into())),
            "enable_reasoner": {"type": "boolean"},
            "parallel_tool_calls": {"type": "boolean"},
        }), &["handle", "model", "model_endpoint_type", "context_window"]),
        "ModelList": {"type": "array", "items": schema_ref("LlmModel")},
        "AgentCreate": object(json!({
            "name": nullable(string()), "system": nullable(string()),
            "description": nullable(string()),
            "model": nullable(json!({"type": "string", "description": "A model handle (provider/model, as GET /v1/models lists them), a configured model's name, or a model id"})),
            "model_settings": nullable(json!({"type": "object"})),
            "llm_config": nullable(json!({"type": "object", "description": "Deprecated: its handle, else its model, names the model when `model` does not"})),
            "tool_ids": nullable(strings()),
            "tools": nullable(json!({"type": "array", "items": {"type": "string"}, "description": "Tool names"})),
            "tool_rules": nullable(json!({"type": "array", "items": {"type": "object"}})),
            "include_base_tools": nullable(json!({"type": "boolean", "default": true})),
            "tags": nullable(strings()),
            "memory_blocks": nullable(json!({"type": "array", "items": schema_ref("BlockCreate")})),
            "block_ids": nullable(strings()),
            "embedding": nullable(string()),
            "approval_timeout_seconds": nullable(unsigned(u64::MAX)),
        }), &[]),
        // `requires_approval` may come in the query instead (the body wins).
        "ApprovalSetting": object(json!({
            "requires_approval": {"type": "boolean"},
        }), &["requires_approval"]),
        "LettaMessage": message,
        "MessageList": {"type": "array", "items": schema_ref("LettaMessage")},
        "MessageCreate": message_create,
        "LettaRequest": letta_request(),
        "StopReason": object(json!({
            "message_type": {"const": "stop_reason"},
            "stop_reason": {"type": "string", "enum": [
                "end_turn", "max_steps", "cancelled", "llm_api_error", "requires_approval", "error"
            ]},
        }), &["message_type", "stop_reason"]),
        "LettaResponse": object(json!({
            "messages": schema_ref("MessageList"),
            "stop_reason": schema_ref("StopReason"),
            "usage": object(json!({"message_type": {"const": "usage_statistics"}}), &["message_type"]),
        }), &["messages", "stop_reason", "usage"]),
        // One server-sent event (what a client parses from the stream).
        "LettaStreamEvent": object(json!({
            "data": {"anyOf": [
                {
                    "type": "string",
                    "description": "A LettaMessage as JSON",
                    "contentMediaType": "application/json",
                    "contentSchema": schema_ref("LettaMessage"),
                },
                {"const": "[DONE]", "description": "The end of the stream"},
            ]},
            "event": {"type": "string"},
            "id": {"type": "string"},
        }), &["data"]),
        "CancelRequest": object(json!({"run_ids": nullable(strings())}), &[]),
        "SummarizeRequest": object(json!({
            "max_message_length": nullable(unsigned(u64::MAX)),
            "compaction_settings": nullable(json!({
                "type": "object",
                "properties": {"mode": nullable(json!({
                    "type": "string",
                    "enum": ["all", "sliding_window", "self_compact_all", "self_compact_sliding_window"],
                }))},
            })),
        }), &[]),
        // Letta's `CompactionResponse`; the node's fields when one was
        // stored (not when there was nothing to compact).
        "Compaction": object(json!({
            "summary": string(),
            "num_messages_before": unsigned(u64::MAX),
            "num_messages_after": unsigned(u64::MAX),
            "message_id": {"type": "string", "format": "uuid"},
            "covered": unsigned(u32::MAX.into()),
            "tokens_before": unsigned(u64::MAX),
            "tokens_after": unsigned(u64::MAX),
        }), &["summary", "num_messages_before", "num_messages_after"]),
        "NotificationRequest": object(json!({
            "source": nullable(json!({"type": "string"})),
            "text": {"type": "string", "minLength": 1},
            "priority": nullable(json!({"type": "string", "enum": ["low", "normal", "high"]})),
        }), &["text"]),
        "NotificationResponse": object(json!({
            "status": {"type": "string", "enum": ["queued", "waking", "dropped"]},
        }), &["status"]),
        "CancelResponse": object(json!({
            "status": {"type": "string", "enum": ["cancelled", "nothing_to_cancel"]},
            "cancelled_run": {"type": "boolean"},
            "cleared_approval": {"type": "boolean"},
        }), &["status", "cancelled_run", "cleared_approval"]),
    })
}

/// The body of a send: something to send (messages or input) is required;
/// a request whose messages hold no text, approval or tool result is still
/// refused (400).
fn letta_request() -> Value {
    let mut request = object(
        json!({
            "messages": nullable(json!({"type": "array", "items": schema_ref("MessageCreate")})),
            "input": nullable(json!({"anyOf": [{"type": "string"}, {"type": "array"}]})),
            "max_steps": nullable(unsigned(u32::MAX.into())),
            "client_tools": nullable(json!({"type": "array", "items": object(json!({
                "name": {"type": "string"}, "description": nullable(string()),
                "parameters": {"description": "JSON schema of the arguments"},
            }), &["name"])})),
            "include_return_message_types": nullable(strings()),
            "stream_tokens": nullable(json!({"type": "boolean"})),
            "include_pings": nullable(json!({"type": "boolean"})),
            "streaming": nullable(json!({"type": "boolean"})),
        }),
        &[],
    );
    request["anyOf"] = json!([
        {"required": ["messages"], "properties": {"messages": {"type": "array", "minItems": 1}}},
        {"required": ["input"], "properties": {"input": {"anyOf": [
            {"type": "string", "minLength": 1}, {"type": "array", "minItems": 1},
        ]}}},
    ]);
    request["examples"] = json!([
        {"messages": [{"role": "user", "content": "What is in this directory?"}]},
        {"input": "Hello", "stream_tokens": true},
        {"messages": [{"type": "approval", "approve": true}]},
    ]);
    request
}

/// The media types of an operation's 200 response.
fn ok_content(id: &str, response: &str) -> Value {
    let json = json!({"schema": schema_ref(response)});
    // The schema of a `text/event-stream` is that of each event (as OpenAPI
    // 3.2's itemSchema).
    let stream = json!({"schema": schema_ref("LettaStreamEvent")});
    match id {
        "send_message" => json!({"application/json": json, "text/event-stream": stream}),
        "send_message_streaming" => json!({"text/event-stream": stream}),
        "get_blob" => json!({
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
            "image/gif": {"schema": {"type": "string", "format": "binary"}},
            "image/webp": {"schema": {"type": "string", "format": "binary"}},
        }),
        _ => json!({"application/json": json}),
    }
}

/// Every schema: the Letta API's and the live view's.
fn all_schemas() -> Value {
    let mut all = schemas();
    if let Value::Object(map) = &mut all {
        map.extend(live_schemas());
        map.extend(crate::letta::api_doc::schemas());
        map.extend(memory::schemas());
    }
    all
}

/// The document.
pub(crate) fn build() -> Value {
    let mut paths = Map::new();
    for (method, path, id, summary, request, response) in
        OPERATIONS.iter().chain(memory::OPERATIONS)
    {
        let mut params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        params.extend(query_parameters(id));
        let mut op = json!({
            "operationId": id,
            "summary": summary,
            "parameters": params,
            "responses": {
                ok_status(id): {"description": "OK", "content": ok_content(id, response)},
                "default": {"description": "An error", "content": {"application/json": {"schema": schema_ref("Error")}}},
            },
        });
        if let Some(links) = links(id) {
            op["responses"][ok_status(id)]["links"] = links;
        }
        // Refusals of the browser checks (src/origin.rs, src/extract.rs).
        op["responses"]["403"] = json!({"description": "The Host is not a name of this server, or a web page of another origin tried to change state", "content": {"application/json": {"schema": schema_ref("Error")}}});
        if let Some(request) = request {
            op["responses"]["415"] = json!({"description": "A body not sent as application/json", "content": {"application/json": {"schema": schema_ref("Error")}}});
            op["requestBody"] = json!({
                "required": BODY_REQUIRED.contains(id) || memory::BODY_REQUIRED.contains(id),
                "content": {"application/json": {"schema": schema_ref(request)}},
            });
        }
        if let Value::Object(entry) = paths.entry(path.to_string()).or_insert_with(|| json!({})) {
            entry.insert(method.to_string(), op);
        }
    }
    crate::letta::api_doc::amend(&mut paths);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "toolwire",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "toolwire's Letta-compatible API: tools, agents and messages, with human approval and client-side tools; and the live view's conversation trees.",
        },
        "components": {
            "schemas": all_schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    })
}

pub(crate) async fn document() -> Json<Value> {
    Json(build())
}
