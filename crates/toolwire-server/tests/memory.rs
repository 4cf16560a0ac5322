//! Memory blocks and MCP servers through the Letta door, over real HTTP:
//! an agent's blocks reach the model compiled into its system prompt, its
//! memory tools edit them (stored at once, seen by the next step, by the
//! API and by the agents sharing the block), limits and read-only blocks
//! hold, unknown ids are 404; MCP servers added through the API run their
//! tools for agents, again after a restart, and one that cannot start
//! costs only its tools. The model is a mock server on loopback speaking
//! OpenAI's wire format.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{Value, json};
use support::Server;
use toolwire_test_support::mcp_http::mcp_dir;
use toolwire_test_support::{Call, MockServer, Reply, openai_sse};

/// The system prompt of the model request `request`.
fn system_of(request: &toolwire_test_support::Request) -> String {
    let first = &request.body["messages"][0];
    assert_eq!(first["role"], "system", "{}", request.body);
    first["content"].as_str().unwrap().to_owned()
}

fn calling(name: &str, arguments: Value) -> Reply {
    Reply::sse(openai_sse(
        "",
        &[Call {
            id: "call_1",
            name,
            arguments,
        }],
    ))
}

async fn send(s: &Server, agent: &str, text: &str) -> Value {
    let (status, reply) = s
        .call(
            "POST",
            &format!("/v1/agents/{agent}/messages"),
            Some(json!({"messages": [{"role": "user", "content": text}]})),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    reply
}

fn tool_return(reply: &Value) -> &Value {
    reply["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["message_type"] == "tool_return_message")
        .unwrap_or_else(|| panic!("no tool return in {reply}"))
}

#[tokio::test]
async fn blocks_reach_the_model_and_its_memory_tool_edits_are_stored() {
    let mock = MockServer::start(vec![
        calling(
            "memory_insert",
            json!({"label": "human", "new_string": "Likes: tea"}),
        ),
        Reply::sse(openai_sse("Noted.", &[])),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_openai(&dir.path().join("t.db"), &mock.url).await;
    let (status, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({
                "name": "ada",
                "system": "Be brief.",
                "memory_blocks": [
                    {"label": "human", "value": "Name: Ada", "limit": 100},
                    {"label": "persona", "value": "I am Sam.", "read_only": true},
                ],
            })),
        )
        .await;
    assert_eq!(status, 200, "{agent}");
    let id = agent["id"].as_str().unwrap();
    let tool_names: Vec<&str> = agent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(tool_names.contains(&"memory_insert"), "{tool_names:?}");
    assert!(tool_names.contains(&"memory_replace"), "{tool_names:?}");
    assert_eq!(agent["memory"]["blocks"][0]["label"], "human");
    assert_eq!(agent["blocks"][1]["read_only"], true);

    let reply = send(&s, id, "I like tea.").await;
    let ret = tool_return(&reply);
    assert_eq!(ret["status"], "success", "{reply}");
    assert_eq!(ret["tool_return"], "Name: Ada\nLikes: tea");

    let sent = mock.received();
    assert_eq!(sent.len(), 2);
    let first = system_of(&sent[0]);
    assert!(
        first.starts_with("Be brief.\n\n<memory_blocks>\n"),
        "{first}"
    );
    assert!(
        first.contains("<human>\n<description>\nThe human block:"),
        "{first}"
    );
    assert!(
        first.contains(
            "- chars_current=9\n- chars_limit=100\n</metadata>\n<value>\nName: Ada\n</value>"
        ),
        "{first}"
    );
    assert!(first.contains("- read_only=true"), "{first}");
    assert!(first.contains(&format!("- AGENT_ID: {id}")), "{first}");
    // The step after the edit sees it.
    let second = system_of(&sent[1]);
    assert!(
        second.contains("<value>\nName: Ada\nLikes: tea\n</value>"),
        "{second}"
    );
    // Stored at once, seen through the API; the stored prompt is the
    // client's.
    let (status, block) = s
        .call(
            "GET",
            &format!("/v1/agents/{id}/core-memory/blocks/human"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{block}");
    assert_eq!(block["value"], "Name: Ada\nLikes: tea");
    let (_, agent) = s.call("GET", &format!("/v1/agents/{id}"), None).await;
    assert_eq!(agent["system"], "Be brief.");
    let (_, context) = s
        .call("GET", &format!("/v1/agents/{id}/context"), None)
        .await;
    assert!(
        context["system_prompt"]
            .as_str()
            .unwrap()
            .contains("Likes: tea"),
        "{context}"
    );
    assert!(context["num_tokens_core_memory"].as_u64().unwrap() > 0);

    // A second agent sharing the block sees the first one's edit; a
    // change through the API is seen by both.
    let block_id = block["id"].as_str().unwrap();
    let (status, other) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"name": "bob", "block_ids": [block_id], "include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{other}");
    assert_eq!(other["blocks"][0]["value"], "Name: Ada\nLikes: tea");
    let (status, _) = s
        .call(
            "PATCH",
            &format!("/v1/blocks/{block_id}"),
            Some(json!({"value": "Name: Ada Lovelace"})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, agents) = s
        .call("GET", &format!("/v1/blocks/{block_id}/agents"), None)
        .await;
    assert_eq!(agents.as_array().unwrap().len(), 2, "{agents}");
    for agent in agents.as_array().unwrap() {
        assert_eq!(agent["blocks"][0]["value"], "Name: Ada Lovelace");
    }
    // Detached, the block stays; deleted, it leaves the agent.
    let other_id = other["id"].as_str().unwrap();
    let (status, detached) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{other_id}/core-memory/blocks/detach/{block_id}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{detached}");
    assert_eq!(detached["blocks"], json!([]));
    let (status, _) = s
        .call("DELETE", &format!("/v1/blocks/{block_id}"), None)
        .await;
    assert_eq!(status, 200);
    let (_, agent) = s.call("GET", &format!("/v1/agents/{id}"), None).await;
    assert_eq!(agent["blocks"].as_array().unwrap().len(), 1, "{agent}");
    s.stop().await;
}

#[tokio::test]
async fn limits_read_only_blocks_and_unknown_ids_are_refused() {
    let mock = MockServer::start(vec![
        calling(
            "memory_replace",
            json!({"label": "persona", "old_string": "Sam", "new_string": "Max"}),
        ),
        Reply::sse(openai_sse("I cannot.", &[])),
        calling(
            "memory_insert",
            json!({"label": "human", "new_string": "x".repeat(20)}),
        ),
        Reply::sse(openai_sse("Too long.", &[])),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_openai(&dir.path().join("t.db"), &mock.url).await;

    let (status, err) = s
        .call(
            "POST",
            "/v1/blocks",
            Some(json!({"label": "human", "value": "testing testing", "limit": 10})),
        )
        .await;
    assert_eq!(status, 422, "{err}");
    assert!(
        err["detail"]
            .as_str()
            .unwrap()
            .contains("limit of 10 characters"),
        "{err}"
    );
    let (status, block) = s
        .call(
            "POST",
            "/v1/blocks",
            Some(json!({"label": "human", "value": "Ada", "limit": 10})),
        )
        .await;
    assert_eq!(status, 200, "{block}");
    assert_eq!(block["limit"], 10);
    let block_id = block["id"].as_str().unwrap();
    let (status, err) = s
        .call(
            "PATCH",
            &format!("/v1/blocks/{block_id}"),
            Some(json!({"value": "testing testing testing"})),
        )
        .await;
    // Over the block's stored limit: Letta's handler's 400; value and
    // limit in one body: its request validation's 422.
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["limit"], 10);
    assert_eq!(err["code"], "BLOCK_LIMIT_EXCEEDED");
    let (status, err) = s
        .call(
            "PATCH",
            &format!("/v1/blocks/{block_id}"),
            Some(json!({"value": "testing testing testing", "limit": 12})),
        )
        .await;
    assert_eq!(status, 422, "{err}");
    assert!(
        err["detail"]
            .as_str()
            .unwrap()
            .contains("limit of 12 characters"),
        "{err}"
    );

    for (method, path) in [
        (
            "GET",
            "/v1/blocks/block-00000000-0000-0000-0000-000000000000",
        ),
        (
            "PATCH",
            "/v1/blocks/block-00000000-0000-0000-0000-000000000000",
        ),
        ("DELETE", "/v1/blocks/not-a-block"),
        (
            "GET",
            "/v1/mcp-servers/mcp_server-00000000-0000-0000-0000-000000000000",
        ),
        (
            "GET",
            "/v1/mcp-servers/mcp_server-00000000-0000-0000-0000-000000000000/tools",
        ),
    ] {
        let body = (method == "PATCH").then(|| json!({"value": "x"}));
        let (status, err) = s.call(method, path, body).await;
        assert_eq!(status, 404, "{method} {path}: {err}");
        assert!(
            err["detail"].as_str().unwrap().contains("not found"),
            "{err}"
        );
    }

    let (_, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({
                "block_ids": [block_id],
                "memory_blocks": [{"label": "persona", "value": "I am Sam.", "read_only": true}],
            })),
        )
        .await;
    let id = agent["id"].as_str().unwrap();
    let (status, err) = s
        .call(
            "GET",
            &format!("/v1/agents/{id}/core-memory/blocks/nope"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{err}");
    let (status, err) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{id}/core-memory/blocks/attach/block-00000000-0000-0000-0000-000000000000"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{err}");

    // The model's edit of a read-only block is an error it is told, and
    // the block is unchanged.
    let reply = send(&s, id, "Call yourself Max.").await;
    let ret = tool_return(&reply);
    assert_eq!(ret["status"], "error", "{reply}");
    assert!(
        ret["tool_return"].as_str().unwrap().contains("read-only"),
        "{reply}"
    );
    // Over the limit: the error names it; nothing is stored.
    let reply = send(&s, id, "Remember a lot.").await;
    let ret = tool_return(&reply);
    assert_eq!(ret["status"], "error", "{reply}");
    assert!(
        ret["tool_return"].as_str().unwrap().contains("limit of 10"),
        "{reply}"
    );
    let (_, blocks) = s
        .call("GET", &format!("/v1/agents/{id}/core-memory/blocks"), None)
        .await;
    let values: Vec<&str> = blocks
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["Ada", "I am Sam."]);
    s.stop().await;
}

/// server-everything over stdio, as an API server's config.
fn everything_config() -> Option<Value> {
    let dir = mcp_dir()?;
    let entry = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(entry.is_file(), "{} is missing", entry.display());
    Some(json!({
        "mcp_server_type": "stdio",
        "command": "node",
        "args": [entry.display().to_string(), "stdio"],
    }))
}

#[tokio::test]
async fn mcp_servers_run_their_tools_for_agents_and_come_back_after_a_restart() {
    let Some(config) = everything_config() else {
        return;
    };
    let mock = MockServer::start(vec![
        calling("echo", json!({"message": "hi there"})),
        Reply::sse(openai_sse("Echoed.", &[])),
        calling("echo", json!({"message": "hi there"})),
        Reply::sse(openai_sse("Echoed.", &[])),
        Reply::sse(openai_sse("Here.", &[])),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let s = Server::start_openai(&db, &mock.url).await;
    let (status, server) = s
        .call(
            "POST",
            "/v1/mcp-servers",
            Some(json!({"server_name": "everything", "config": config})),
        )
        .await;
    assert_eq!(status, 200, "{server}");
    assert_eq!(server["command"], "node");
    let server_id = server["id"].as_str().unwrap().to_owned();
    let (status, tools) = s
        .call("GET", &format!("/v1/mcp-servers/{server_id}/tools"), None)
        .await;
    assert_eq!(status, 200, "{tools}");
    let echo = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .unwrap_or_else(|| panic!("no echo in {tools}"))
        .clone();
    assert_eq!(echo["tool_type"], "external_mcp");
    let echo_id = echo["id"].as_str().unwrap();
    let (status, ran) = s
        .call(
            "POST",
            &format!("/v1/mcp-servers/{server_id}/tools/{echo_id}/run"),
            Some(json!({"args": {"message": "direct"}})),
        )
        .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["status"], "success");
    assert!(
        ran["func_return"].as_str().unwrap().contains("direct"),
        "{ran}"
    );

    let (_, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"include_base_tools": false, "tool_ids": [echo_id]})),
        )
        .await;
    let id = agent["id"].as_str().unwrap().to_owned();
    let reply = send(&s, &id, "Echo hi there.").await;
    let ret = tool_return(&reply);
    assert_eq!(ret["status"], "success", "{reply}");
    assert!(
        ret["tool_return"].as_str().unwrap().contains("hi there"),
        "{reply}"
    );
    // The model was shown the tool by the server's name for it.
    let tools_sent = &mock.received()[0].body["tools"];
    assert_eq!(tools_sent[0]["function"]["name"], "echo", "{tools_sent}");
    s.stop().await;

    // Another process on the same database: the server is still there and
    // its tool runs again.
    let s = Server::start_openai(&db, &mock.url).await;
    let (_, servers) = s.call("GET", "/v1/mcp-servers", None).await;
    assert_eq!(servers[0]["id"], server_id.as_str(), "{servers}");
    let reply = send(&s, &id, "Echo hi there.").await;
    assert_eq!(tool_return(&reply)["status"], "success", "{reply}");

    // A server that cannot start: listing its tools says why (424), and
    // the agent whose tool it was still answers, without it.
    let (status, broken) = s
        .call(
            "PATCH",
            &format!("/v1/mcp-servers/{server_id}"),
            Some(json!({"config": {"mcp_server_type": "stdio", "command": "/nonexistent/mcp-server"}})),
        )
        .await;
    assert_eq!(status, 200, "{broken}");
    let (status, err) = s
        .call("GET", &format!("/v1/mcp-servers/{server_id}/tools"), None)
        .await;
    assert_eq!(status, 424, "{err}");
    assert!(
        err["detail"].as_str().unwrap().contains("everything"),
        "{err}"
    );
    let mock_before = mock.received().len();
    let (status, reply) = s
        .call(
            "POST",
            &format!("/v1/agents/{id}/messages"),
            Some(json!({"messages": [{"role": "user", "content": "Still there?"}]})),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let sent = mock.received();
    assert!(sent.len() > mock_before);
    assert!(
        sent[mock_before].body["tools"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{}",
        sent[mock_before].body
    );

    let (status, _) = s
        .call("DELETE", &format!("/v1/mcp-servers/{server_id}"), None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = s.call("GET", &format!("/v1/tools/{echo_id}"), None).await;
    assert_eq!(status, 404, "the server's tools go with it");
    s.stop().await;
}
