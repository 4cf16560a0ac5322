//! The OpenAPI description of Letta's runs and conversations routes
//! (`runs.rs`, `conversations.rs`, and the paths shared with the live
//! view, `crate::conversations`): added to the document `crate::openapi`
//! builds, and amending its entries for the shared paths.

use serde_json::{Map, Value, json};

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn json_content(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

fn sse_content() -> Value {
    json!({"text/event-stream": {"schema": schema_ref("LettaStreamEvent")}})
}

fn param(name: &str, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": schema, "description": description})
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}})
}

fn page_params() -> Vec<Value> {
    vec![
        param("after", json!({"type": "string"}), "Items after this id"),
        param("before", json!({"type": "string"}), "Items before this id"),
        param(
            "limit",
            json!({"type": "integer", "minimum": 0}),
            "At most this many items",
        ),
        param(
            "order",
            json!({"type": "string", "enum": ["asc", "desc"]}),
            "By creation: oldest (asc) or newest (desc) first",
        ),
    ]
}

fn error_responses(op: &mut Value) {
    let error = json!({"description": "An error", "content": json_content(schema_ref("Error"))});
    op["responses"]["default"] = error;
    op["responses"]["403"] = json!({"description": "The Host is not a name of this server, or a web page of another origin tried to change state", "content": json_content(schema_ref("Error"))});
}

/// One operation: `params` beyond the path's, a JSON body schema, the
/// success status and its content.
fn operation(
    id: &str,
    summary: &str,
    path: &str,
    mut params: Vec<Value>,
    body: Option<Value>,
    status: &str,
    content: Value,
) -> Value {
    let mut all: Vec<Value> = path
        .split('/')
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
        .map(path_param)
        .collect();
    all.append(&mut params);
    let mut op = json!({
        "operationId": id,
        "summary": summary,
        "parameters": all,
        "responses": {status: {"description": "OK", "content": content}},
    });
    error_responses(&mut op);
    if let Some(body) = body {
        op["requestBody"] = json!({"required": false, "content": json_content(body)});
        op["responses"]["415"] = json!({"description": "A body not sent as application/json", "content": json_content(schema_ref("Error"))});
    }
    op
}

fn insert(paths: &mut Map<String, Value>, method: &str, path: &str, op: Value) {
    if let Value::Object(entry) = paths.entry(path.to_owned()).or_insert_with(|| json!({})) {
        entry.insert(method.to_owned(), op);
    }
}

/// Adds the runs and Letta conversations operations to `paths`, and
/// amends the shared conversations paths.
pub(crate) fn amend(paths: &mut Map<String, Value>) {
    let run_filters = vec![
        param("agent_id", json!({"type": "string"}), "Runs of this agent"),
        param(
            "agent_ids",
            json!({"type": "array", "items": {"type": "string"}}),
            "Runs of these agents (repeated)",
        ),
        param(
            "statuses",
            json!({"type": "array", "items": {"type": "string", "enum": ["created", "running", "completed", "failed", "cancelled"]}}),
            "Runs in these statuses (repeated)",
        ),
        param(
            "background",
            json!({"type": "boolean"}),
            "Runs started (or not) with background: true",
        ),
        param(
            "stop_reason",
            json!({"type": "string"}),
            "Runs that stopped for this reason",
        ),
        param(
            "conversation_id",
            json!({"type": "string"}),
            "Runs of this conversation",
        ),
        param("active", json!({"type": "boolean"}), "Only running runs"),
    ];
    let mut list_params = page_params();
    list_params.extend(run_filters);
    insert(
        paths,
        "post",
        "/v1/agents/{agent_id}/messages/async",
        operation(
            "create_agent_message_async",
            "Start a run and answer at once with it; the run goes on without the request",
            "/v1/agents/{agent_id}/messages/async",
            vec![],
            Some(schema_ref("LettaRequest")),
            "200",
            json_content(schema_ref("Run")),
        ),
    );
    insert(
        paths,
        "get",
        "/v1/runs",
        operation(
            "list_runs",
            "List runs, newest first",
            "/v1/runs",
            list_params,
            None,
            "200",
            json_content(json!({"type": "array", "items": schema_ref("Run")})),
        ),
    );
    insert(
        paths,
        "get",
        "/v1/runs/{run_id}",
        operation(
            "retrieve_run",
            "Get a run",
            "/v1/runs/{run_id}",
            vec![],
            None,
            "200",
            json_content(schema_ref("Run")),
        ),
    );
    insert(
        paths,
        "get",
        "/v1/runs/{run_id}/messages",
        operation(
            "list_run_messages",
            "The messages a run stored, oldest first",
            "/v1/runs/{run_id}/messages",
            page_params(),
            None,
            "200",
            json_content(schema_ref("MessageList")),
        ),
    );
    insert(
        paths,
        "get",
        "/v1/runs/{run_id}/usage",
        operation(
            "retrieve_run_usage",
            "A run's tokens",
            "/v1/runs/{run_id}/usage",
            vec![],
            None,
            "200",
            json_content(schema_ref("RunUsage")),
        ),
    );
    insert(
        paths,
        "get",
        "/v1/runs/{run_id}/steps",
        operation(
            "list_run_steps",
            "A run's steps (model calls), newest first",
            "/v1/runs/{run_id}/steps",
            page_params(),
            None,
            "200",
            json_content(json!({"type": "array", "items": schema_ref("Step")})),
        ),
    );
    insert(
        paths,
        "post",
        "/v1/runs/{run_id}/stream",
        operation(
            "retrieve_run_stream",
            "A run's stream, each message with its seq_id, from just after starting_after",
            "/v1/runs/{run_id}/stream",
            vec![],
            Some(schema_ref("RunStreamRequest")),
            "200",
            sse_content(),
        ),
    );
    insert(
        paths,
        "get",
        "/v1/runs/{run_id}/stream",
        operation(
            "stream_run",
            "A run's stream (as the POST), for EventSource",
            "/v1/runs/{run_id}/stream",
            vec![
                param(
                    "starting_after",
                    json!({"type": "integer", "minimum": 0}),
                    "Resume after this seq_id",
                ),
                param(
                    "include_pings",
                    json!({"type": "boolean"}),
                    "Pings while nothing else is sent",
                ),
            ],
            None,
            "200",
            sse_content(),
        ),
    );
    insert(
        paths,
        "post",
        "/v1/runs/{run_id}/cancel",
        operation(
            "cancel_run_by_id",
            "Stop a run, if it is the one running in its conversation",
            "/v1/runs/{run_id}/cancel",
            vec![],
            None,
            "200",
            json_content(schema_ref("Run")),
        ),
    );
    let agent_param = || {
        param(
            "agent_id",
            json!({"type": "string"}),
            "With the id `default`: the agent's own conversation",
        )
    };
    insert(
        paths,
        "get",
        "/v1/conversations/{conversation_id}",
        operation(
            "retrieve_conversation",
            "Get a conversation (Letta's Conversation)",
            "/v1/conversations/{conversation_id}",
            vec![agent_param()],
            None,
            "200",
            json_content(schema_ref("LettaConversation")),
        ),
    );
    insert(
        paths,
        "post",
        "/v1/conversations/{conversation_id}/stream",
        operation(
            "retrieve_conversation_stream",
            "The stream of the conversation's latest run, from just after starting_after",
            "/v1/conversations/{conversation_id}/stream",
            vec![agent_param()],
            Some(schema_ref("RunStreamRequest")),
            "200",
            sse_content(),
        ),
    );
    insert(
        paths,
        "post",
        "/v1/conversations/{conversation_id}/cancel",
        operation(
            "cancel_conversation",
            "Stop the turn running in a conversation",
            "/v1/conversations/{conversation_id}/cancel",
            vec![agent_param()],
            None,
            "200",
            json_content(schema_ref("ConversationCancel")),
        ),
    );
    amend_shared(paths);
}

/// The paths the live view shares with Letta's conversations API: both
/// shapes documented.
fn amend_shared(paths: &mut Map<String, Value>) {
    if let Some(op) = paths
        .get_mut("/v1/conversations")
        .and_then(|p| p.get_mut("get"))
    {
        op["summary"] = json!(
            "List conversations: the live view's object, or with any of Letta's parameters Letta's array"
        );
        op["responses"]["200"]["content"]["application/json"]["schema"] = json!({"anyOf": [
            schema_ref("ConversationList"),
            {"type": "array", "items": schema_ref("LettaConversation")},
        ]});
        if let Some(params) = op["parameters"].as_array_mut() {
            params.extend(page_params());
            params.push(param(
                "agent_id",
                json!({"type": "string"}),
                "Letta's list: the conversations made for this agent",
            ));
        }
    }
    if let Some(op) = paths
        .get_mut("/v1/conversations")
        .and_then(|p| p.get_mut("post"))
    {
        op["summary"] = json!(
            "Create a conversation: the live view's (201), or with ?agent_id= one more of the agent's (200, Letta's Conversation)"
        );
        op["responses"]["200"] = json!({"description": "Letta's create", "content": json_content(schema_ref("LettaConversation"))});
        op["requestBody"]["content"]["application/json"]["schema"] = json!({"anyOf": [
            schema_ref("ConversationCreate"),
            schema_ref("LettaConversationCreate"),
        ]});
        if let Some(params) = op["parameters"].as_array_mut() {
            params.push(param(
                "agent_id",
                json!({"type": "string"}),
                "Letta's create: the agent the conversation is for",
            ));
        }
    }
    if let Some(op) = paths
        .get_mut("/v1/conversations/{conversation_id}/messages")
        .and_then(|p| p.get_mut("get"))
    {
        op["summary"] = json!(
            "With ?ids=: several messages whole (the live view); without: the active branch as Letta's messages"
        );
        op["responses"]["200"]["content"]["application/json"]["schema"] = json!({"anyOf": [
            schema_ref("MessageViewList"),
            schema_ref("MessageList"),
        ]});
        if let Some(params) = op["parameters"].as_array_mut() {
            for p in params.iter_mut() {
                if p["name"] == "ids" {
                    p["required"] = json!(false);
                }
            }
            params.extend(page_params());
            params.push(param(
                "agent_id",
                json!({"type": "string"}),
                "With the id `default`: the agent's own conversation",
            ));
        }
    }
    if let Some(op) = paths
        .get_mut("/v1/conversations/{conversation_id}/messages")
        .and_then(|p| p.get_mut("post"))
    {
        op["summary"] = json!(
            "Send: {text} starts a turn (202, the live view); Letta's body runs the owning agent's turn here, streamed unless streaming: false"
        );
        op["requestBody"]["content"]["application/json"]["schema"] = json!({"anyOf": [
            schema_ref("SendRequest"),
            schema_ref("LettaRequest"),
        ]});
        op["responses"]["200"] = json!({"description": "Letta's send", "content": {
            "application/json": {"schema": schema_ref("LettaResponse")},
            "text/event-stream": {"schema": schema_ref("LettaStreamEvent")},
        }});
        if let Some(params) = op["parameters"].as_array_mut() {
            params.push(param(
                "agent_id",
                json!({"type": "string"}),
                "With the id `default`: the agent's own conversation",
            ));
        }
    }
}

/// The schemas of these operations.
pub(crate) fn schemas() -> Map<String, Value> {
    let nullable = |t: &str| json!({"type": [t, "null"]});
    let mut map = Map::new();
    map.insert(
        "Run".into(),
        json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "agent_id": {"type": "string"},
                "conversation_id": nullable("string"),
                "background": {"type": "boolean"},
                "status": {"type": "string", "enum": ["created", "running", "completed", "failed", "cancelled"]},
                "stop_reason": nullable("string"),
                "created_at": {"type": "string", "format": "date-time"},
                "completed_at": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
                "total_duration_ns": nullable("integer"),
                "metadata": nullable("object"),
                "cancelled": {"type": "boolean"},
            },
            "required": ["id", "agent_id", "status", "created_at"],
        }),
    );
    map.insert(
        "RunUsage".into(),
        json!({
            "type": "object",
            "properties": {
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
                "cached_tokens": {"type": "integer"},
                "cache_read_tokens": {"type": "integer"},
                "cache_creation_tokens": {"type": "integer"},
            },
            "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        }),
    );
    map.insert(
        "Step".into(),
        json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "run_id": {"type": "string"},
                "agent_id": nullable("string"),
                "model": nullable("string"),
                "status": {"type": "string", "enum": ["success", "failed"]},
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
            },
            "required": ["id", "run_id", "status"],
        }),
    );
    map.insert(
        "RunStreamRequest".into(),
        json!({
            "type": "object",
            "properties": {
                "starting_after": {"type": "integer", "minimum": 0},
                "include_pings": nullable("boolean"),
                "poll_interval": nullable("number"),
                "batch_size": nullable("integer"),
            },
        }),
    );
    map.insert(
        "LettaConversation".into(),
        json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "agent_id": {"type": "string"},
                "summary": nullable("string"),
                "archived": {"type": "boolean"},
                "created_at": {"type": "string", "format": "date-time"},
                "updated_at": {"type": "string", "format": "date-time"},
                "last_message_at": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
                "in_context_message_ids": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["id", "agent_id"],
        }),
    );
    map.insert(
        "LettaConversationCreate".into(),
        json!({
            "type": "object",
            "properties": {"summary": nullable("string")},
        }),
    );
    map.insert(
        "ConversationCancel".into(),
        json!({
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": ["cancelled", "nothing_to_cancel"]},
                "cancelled_run": {"type": "boolean"},
            },
            "required": ["status", "cancelled_run"],
        }),
    );
    map
}
