//! `POST /v1/agents/{id}/notifications`: what a client posts reaches the
//! agent, and Letta clients see it as a system message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::json;
use support::{Server, types};
use toolwire_server::ServerSettings;

#[tokio::test]
async fn a_posted_notification_reaches_the_agent_and_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("t.db"),
        "steps:\n  - text: \"Noted.\"\n",
        ServerSettings::default(),
    )
    .await;
    let (_, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"include_base_tools": false})),
        )
        .await;
    let id = agent["id"].as_str().unwrap();
    let (status, body) = s
        .call(
            "POST",
            &format!("/v1/agents/{id}/notifications"),
            Some(json!({"source": "ci", "text": "deploy <b>finished</b>", "priority": "high"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["status"], "queued",
        "passive: it waits for the next turn"
    );

    let (status, reply) = s
        .call(
            "POST",
            &format!("/v1/agents/{id}/messages"),
            Some(json!({"messages": [{"role": "user", "content": "news?"}]})),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let messages = reply["messages"].as_array().unwrap();
    assert_eq!(types(messages), ["system_message", "assistant_message"]);
    assert_eq!(
        messages[0]["content"],
        "<notifications count=\"1\">\n- [ci] deploy &lt;b&gt;finished&lt;/b&gt;\n</notifications>"
    );
    let (_, history) = s
        .call("GET", &format!("/v1/agents/{id}/messages?order=asc"), None)
        .await;
    assert_eq!(
        types(history.as_array().unwrap()),
        [
            "system_message",
            "user_message",
            "system_message",
            "assistant_message"
        ]
    );

    for (body, says) in [
        (json!({"source": "ci"}), "text is required"),
        (json!({"text": "x", "priority": "urgent"}), "priority"),
    ] {
        let (status, error) = s
            .call(
                "POST",
                &format!("/v1/agents/{id}/notifications"),
                Some(body),
            )
            .await;
        assert_eq!(status, 400);
        assert!(error["message"].as_str().unwrap().contains(says), "{error}");
    }
    let (status, _) = s
        .call(
            "POST",
            "/v1/agents/agent-00000000-0000-0000-0000-000000000000/notifications",
            Some(json!({"text": "x"})),
        )
        .await;
    assert_eq!(status, 404);
    s.stop().await;
}
