//! The document's part for memory blocks, an agent's core memory, tools
//! and context, and the MCP servers added through the API.

use serde_json::{Map, Value, json};

use super::{Operation, nullable, object, schema_ref, string, strings, timestamp, unsigned};

pub(super) const OPERATIONS: &[Operation] = &[
    (
        "get",
        "/v1/blocks",
        "list_blocks",
        "List memory blocks",
        None,
        "BlockList",
    ),
    (
        "post",
        "/v1/blocks",
        "create_block",
        "Create a memory block",
        Some("BlockCreate"),
        "Block",
    ),
    (
        "get",
        "/v1/blocks/count",
        "count_blocks",
        "Count memory blocks",
        None,
        "Count",
    ),
    (
        "get",
        "/v1/blocks/{block_id}",
        "retrieve_block",
        "Get a memory block",
        None,
        "Block",
    ),
    (
        "patch",
        "/v1/blocks/{block_id}",
        "modify_block",
        "Change a memory block (every agent that has it sees the change)",
        Some("BlockUpdate"),
        "Block",
    ),
    (
        "delete",
        "/v1/blocks/{block_id}",
        "delete_block",
        "Delete a memory block (it leaves its agents)",
        None,
        "Empty",
    ),
    (
        "get",
        "/v1/blocks/{block_id}/agents",
        "list_agents_for_block",
        "The agents that have a block",
        None,
        "AgentList",
    ),
    (
        "get",
        "/v1/agents/{agent_id}/core-memory",
        "retrieve_agent_memory",
        "An agent's core memory",
        None,
        "Memory",
    ),
    (
        "get",
        "/v1/agents/{agent_id}/core-memory/blocks",
        "list_core_memory_blocks",
        "An agent's blocks, in prompt order",
        None,
        "BlockList",
    ),
    (
        "get",
        "/v1/agents/{agent_id}/core-memory/blocks/{block_label}",
        "retrieve_core_memory_block",
        "An agent's block by label",
        None,
        "Block",
    ),
    (
        "patch",
        "/v1/agents/{agent_id}/core-memory/blocks/{block_label}",
        "modify_core_memory_block",
        "Change an agent's block by label",
        Some("BlockUpdate"),
        "Block",
    ),
    (
        "patch",
        "/v1/agents/{agent_id}/core-memory/blocks/attach/{block_id}",
        "attach_core_memory_block",
        "Give an agent a block (shared)",
        None,
        "AgentState",
    ),
    (
        "patch",
        "/v1/agents/{agent_id}/core-memory/blocks/detach/{block_id}",
        "detach_core_memory_block",
        "Take a block from an agent (the block stays)",
        None,
        "AgentState",
    ),
    (
        "get",
        "/v1/agents/{agent_id}/tools",
        "list_tools_for_agent",
        "An agent's tools",
        None,
        "ToolList",
    ),
    (
        "patch",
        "/v1/agents/{agent_id}/tools/attach/{tool_id}",
        "attach_tool_to_agent",
        "Give an agent a tool",
        None,
        "AgentState",
    ),
    (
        "patch",
        "/v1/agents/{agent_id}/tools/detach/{tool_id}",
        "detach_tool_from_agent",
        "Take a tool from an agent",
        None,
        "AgentState",
    ),
    (
        "get",
        "/v1/agents/{agent_id}/context",
        "retrieve_agent_context_window",
        "What the agent's next model step is sent, with estimated tokens",
        None,
        "ContextWindowOverview",
    ),
    (
        "get",
        "/v1/mcp-servers",
        "mcp_list_mcp_servers",
        "List the MCP servers added through the API",
        None,
        "McpServerList",
    ),
    (
        "post",
        "/v1/mcp-servers",
        "mcp_create_mcp_server",
        "Add an MCP server (stdio or streamable HTTP)",
        Some("McpServerCreate"),
        "McpServer",
    ),
    (
        "get",
        "/v1/mcp-servers/{mcp_server_id}",
        "mcp_retrieve_mcp_server",
        "Get an MCP server",
        None,
        "McpServer",
    ),
    (
        "patch",
        "/v1/mcp-servers/{mcp_server_id}",
        "mcp_update_mcp_server",
        "Change an MCP server (it restarts on next use)",
        Some("McpServerUpdate"),
        "McpServer",
    ),
    (
        "delete",
        "/v1/mcp-servers/{mcp_server_id}",
        "mcp_delete_mcp_server",
        "Remove an MCP server and its tools",
        None,
        "Empty",
    ),
    (
        "get",
        "/v1/mcp-servers/{mcp_server_id}/tools",
        "mcp_list_tools_for_mcp_server",
        "Start the server if needed and list its tools (424 if it cannot start)",
        None,
        "ToolList",
    ),
    (
        "get",
        "/v1/mcp-servers/{mcp_server_id}/tools/{tool_id}",
        "mcp_retrieve_mcp_tool",
        "One tool of an MCP server",
        None,
        "Tool",
    ),
    (
        "post",
        "/v1/mcp-servers/{mcp_server_id}/tools/{tool_id}/run",
        "mcp_run_tool",
        "Run a tool of an MCP server once",
        Some("McpToolRun"),
        "ToolExecutionResult",
    ),
    (
        "patch",
        "/v1/mcp-servers/{mcp_server_id}/refresh",
        "mcp_refresh_mcp_server_tools",
        "Restart an MCP server and read its tools again",
        None,
        "McpRefresh",
    ),
];

/// Operations whose body is required.
pub(super) const BODY_REQUIRED: &[&str] = &["create_block", "mcp_create_mcp_server"];

/// The query parameters of `id`, if it is one of these operations.
pub(super) fn query_parameters(id: &str, page: impl Fn() -> Vec<Value>) -> Option<Vec<Value>> {
    let param = |name: &str, schema: Value, description: &str| json!({"name": name, "in": "query", "required": false, "schema": schema, "description": description});
    let filters = || {
        vec![
            param("label", string(), "Only blocks of this label"),
            param("name", string(), "Only the template of this name"),
            param(
                "templates_only",
                json!({"type": "boolean"}),
                "Only templates",
            ),
            param(
                "label_search",
                string(),
                "Labels containing this (any case)",
            ),
            param(
                "value_search",
                string(),
                "Values containing this (any case)",
            ),
            param(
                "description_search",
                string(),
                "Descriptions containing this (any case)",
            ),
            param("project_id", string(), "Only blocks of this project"),
            param("tags", string(), "Only blocks with this tag"),
        ]
    };
    match id {
        "list_blocks" => {
            let mut params = page();
            params.extend(filters());
            Some(params)
        }
        "count_blocks" => Some(filters()),
        "list_agents_for_block" | "list_core_memory_blocks" | "list_tools_for_agent" => {
            Some(page())
        }
        _ => None,
    }
}

pub(super) fn schemas() -> Map<String, Value> {
    let block_fields = json!({
        "label": string(),
        "value": string(),
        "limit": unsigned(u64::MAX),
        "description": nullable(string()),
        "read_only": {"type": "boolean"},
        "metadata": nullable(json!({"type": "object"})),
        "tags": nullable(strings()),
        "hidden": nullable(json!({"type": "boolean"})),
        "is_template": {"type": "boolean"},
        "template_name": nullable(string()),
        "project_id": nullable(string()),
    });
    let mut block = block_fields.clone();
    block["id"] = string();
    block["tags"] = strings();
    block["created_at"] = timestamp();
    block["updated_at"] = timestamp();
    let mut create = block_fields.clone();
    for key in ["value", "limit", "read_only", "is_template"] {
        create[key] = nullable(create[key].clone());
    }
    create["label"] = json!({"type": "string", "pattern": "\\S"});
    let mut update = create.clone();
    update["label"] = nullable(json!({"type": "string", "pattern": "\\S"}));
    let server_type = json!({"type": "string", "enum": ["stdio", "sse", "streamable_http"]});
    let config = object(
        json!({
            "mcp_server_type": server_type,
            "command": nullable(string()),
            "args": nullable(strings()),
            "env": nullable(json!({"type": "object", "additionalProperties": {"type": "string"}})),
            "server_url": nullable(string()),
            "auth_header": nullable(string()),
            "auth_token": nullable(string()),
            "custom_headers": nullable(json!({"type": "object", "additionalProperties": {"type": "string"}})),
        }),
        &[],
    );
    let mut create_config = config.clone();
    create_config["required"] = json!(["mcp_server_type"]);
    let tokens = || unsigned(u64::MAX);
    let mut map = Map::new();
    for (name, schema) in [
        ("Count", unsigned(u64::MAX)),
        (
            "Block",
            object(
                block,
                &[
                    "id",
                    "label",
                    "value",
                    "limit",
                    "read_only",
                    "created_at",
                    "updated_at",
                ],
            ),
        ),
        (
            "BlockList",
            json!({"type": "array", "items": schema_ref("Block")}),
        ),
        ("BlockCreate", object(create, &["label"])),
        ("BlockUpdate", object(update, &[])),
        (
            "Memory",
            object(
                json!({"blocks": schema_ref("BlockList"), "file_blocks": {"type": "array"}, "prompt_template": string()}),
                &["blocks"],
            ),
        ),
        (
            "McpServer",
            object(
                json!({
                    "id": string(),
                    "server_name": string(),
                    "mcp_server_type": server_type,
                    "command": nullable(string()),
                    "args": strings(),
                    "env": {"type": "object"},
                    "server_url": nullable(string()),
                    "auth_header": nullable(string()),
                    "auth_token": nullable(string()),
                    "custom_headers": {"type": "object"},
                    "created_at": timestamp(),
                    "updated_at": timestamp(),
                }),
                &["id", "server_name", "mcp_server_type"],
            ),
        ),
        (
            "McpServerList",
            json!({"type": "array", "items": schema_ref("McpServer")}),
        ),
        (
            "McpServerCreate",
            object(
                json!({"server_name": {"type": "string", "pattern": "\\S"}, "config": create_config}),
                &["server_name", "config"],
            ),
        ),
        (
            "McpServerUpdate",
            object(
                json!({"server_name": nullable(json!({"type": "string", "pattern": "\\S"})), "config": nullable(config)}),
                &[],
            ),
        ),
        (
            "McpToolRun",
            object(json!({"args": nullable(json!({"type": "object"}))}), &[]),
        ),
        (
            "McpRefresh",
            object(json!({"tools": schema_ref("ToolList")}), &["tools"]),
        ),
        (
            "ToolExecutionResult",
            object(
                json!({
                    "status": {"type": "string", "enum": ["success", "error"]},
                    "func_return": string(),
                    "stdout": strings(),
                    "stderr": strings(),
                }),
                &["status", "func_return"],
            ),
        ),
        (
            "ContextWindowOverview",
            object(
                json!({
                    "context_window_size_max": tokens(),
                    "context_window_size_current": tokens(),
                    "num_messages": tokens(),
                    "num_archival_memory": tokens(),
                    "num_recall_memory": tokens(),
                    "num_tokens_system": tokens(),
                    "system_prompt": string(),
                    "num_tokens_core_memory": tokens(),
                    "core_memory": string(),
                    "num_tokens_functions_definitions": tokens(),
                    "functions_definitions": {"type": "array"},
                    "num_tokens_messages": tokens(),
                    "messages": {"type": "array"},
                }),
                &[
                    "context_window_size_max",
                    "context_window_size_current",
                    "num_messages",
                    "system_prompt",
                    "core_memory",
                    "functions_definitions",
                    "messages",
                ],
            ),
        ),
    ] {
        map.insert(name.to_owned(), schema);
    }
    map
}
