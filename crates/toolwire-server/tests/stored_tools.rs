//! The stored tool records are read again only when they changed (a
//! version record written with every change), and a change made through
//! another server on the same database reaches the next message here.
//! Real HTTP over loopback; the model is a mock server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{Value, json};
use support::Server;
use toolwire_test_support::{Call, MockServer, Reply, openai_sse};

fn types(reply: &Value) -> Vec<String> {
    reply["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_tool_changed_through_another_server_is_seen_by_the_next_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    // Both servers share one mock; only `here` sends messages: an
    // answer, then a call of the memory tool (named below).
    let name = "memory_insert";
    let mock = MockServer::start(vec![
        Reply::sse(openai_sse("Hello.", &[])),
        Reply::sse(openai_sse(
            "",
            &[Call {
                id: "call_1",
                name,
                arguments: json!({"label": "human", "new_str": "likes tea"}),
            }],
        )),
    ])
    .await;
    let here = Server::start_openai(&db, &mock.url).await;
    let there = Server::start_openai(&db, &mock.url).await;

    let (status, tools) = here.call("GET", "/v1/tools", None).await;
    assert_eq!(status, 200, "{tools}");
    let memory = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool_type"] == "letta_memory_core" && t["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {tools}"))
        .clone();
    let id = memory["id"].as_str().unwrap().to_owned();
    let (status, agent) = here.call("POST", "/v1/agents", Some(json!({}))).await;
    assert_eq!(status, 200, "{agent}");
    let agent = agent["id"].as_str().unwrap().to_owned();
    let messages = format!("/v1/agents/{agent}/messages");
    let hello = json!({"messages": [{"role": "user", "content": "hello"}]});

    // A first message: the stored tools read (and kept) here.
    let (status, reply) = here.call("POST", &messages, Some(hello.clone())).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(types(&reply), ["assistant_message"]);

    // The other server makes the tool wait for approval.
    let (status, changed) = there
        .call(
            "PATCH",
            &format!("/v1/tools/{id}"),
            Some(json!({"default_requires_approval": true})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");

    // The next message here calls it: it waits, as the change says.
    let (status, reply) = here.call("POST", &messages, Some(hello)).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(types(&reply), ["approval_request_message"], "{reply}");

    // And the tool as this server lists it shows the change.
    let (_, tool) = here.call("GET", &format!("/v1/tools/{id}"), None).await;
    assert_eq!(tool["default_requires_approval"], true, "{tool}");
    here.stop().await;
    there.stop().await;
}
