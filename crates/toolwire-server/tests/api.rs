//! The Letta-compatible API over real HTTP: resources, approvals, client
//! tools, streams, restarts, keys and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, types};
use toolwire_server::ServerSettings;

const DICE: &str = r#"
def roll_dice(sides: int, times: int = 1) -> str:
    """Rolls dice.

    Args:
        sides: How many sides each die has.
        times: How many dice to roll.
    """
    return f"rolled {times}d{sides}: 4"
"#;

/// Turn 0 calls the tool, then answers; later turns answer at once.
const CALLS_DICE: &str = r#"
turns:
  - steps:
      - text: "Rolling."
        tool_calls:
          - {id: call_1, name: roll_dice, arguments: {sides: 6}}
      - text: "You rolled a 4."
  - steps:
      - text: "Noted."
"#;

async fn server(dir: &tempfile::TempDir, script: &str) -> Server {
    Server::start(&dir.path().join("t.db"), script, ServerSettings::default()).await
}

/// A Python tool, and an agent with only it whose calls wait for approval.
async fn agent_with_dice(s: &Server, approval: bool) -> String {
    let (status, tool) = s
        .call("POST", "/v1/tools/", Some(json!({"source_code": DICE})))
        .await;
    assert_eq!(status, 200, "{tool}");
    assert_eq!(tool["name"], "roll_dice");
    assert_eq!(
        tool["json_schema"]["parameters"]["required"],
        json!(["sides"])
    );
    let (status, agent) = s
        .call(
            "POST",
            "/v1/agents/",
            Some(json!({"name": "dice", "tool_ids": [tool["id"]], "include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{agent}");
    let id = agent["id"].as_str().unwrap().to_owned();
    if approval {
        let (status, agent) = s
            .call(
                "PATCH",
                &format!("/v1/agents/{id}/tools/approval/roll_dice"),
                Some(json!({"requires_approval": true})),
            )
            .await;
        assert_eq!(status, 200, "{agent}");
    }
    id
}

/// An agent with no tools; its id.
async fn plain_agent(s: &Server) -> String {
    let (status, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{agent}");
    agent["id"].as_str().unwrap().to_owned()
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

fn approve(call: &str, approve: bool, reason: Option<&str>) -> Value {
    json!({"messages": [{"type": "approval", "approvals": [
        {"type": "approval", "tool_call_id": call, "approve": approve, "reason": reason}
    ]}]})
}

#[tokio::test]
async fn a_call_waits_for_approval_and_runs_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    let agent = agent_with_dice(&s, true).await;
    let messages = format!("/v1/agents/{agent}/messages");

    let (status, paused) = s.call("POST", &messages, Some(user("roll"))).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["stop_reason"]["stop_reason"], "requires_approval");
    let list = paused["messages"].as_array().unwrap();
    assert_eq!(
        types(list),
        ["assistant_message", "approval_request_message"]
    );
    let request = &list[1];
    assert_eq!(request["tool_call"]["name"], "roll_dice");
    assert_eq!(request["tool_call"]["tool_call_id"], "call_1");
    let arguments: Value =
        serde_json::from_str(request["tool_call"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"sides": 6}));

    // A plain message now: 409, with the waiting request's id.
    let response = s
        .http
        .post(s.url(&messages))
        .json(&user("hello?"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 409);
    assert_eq!(response.headers()["x-should-retry"], "false");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "PENDING_APPROVAL");
    assert_eq!(body["pending_request_id"], request["id"]);

    // The wrong call: 400 naming the expected one.
    let (status, body) = s
        .call("POST", &messages, Some(approve("call_9", true, None)))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("call_1"),
        "{body}"
    );

    let (status, done) = s
        .call("POST", &messages, Some(approve("call_1", true, None)))
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["stop_reason"]["stop_reason"], "end_turn");
    let list = done["messages"].as_array().unwrap();
    assert_eq!(
        types(list),
        ["tool_return_message", "assistant_message"],
        "only what the turn made (as Letta: no echo of the answer)"
    );
    assert_eq!(
        list[0]["tool_return"], "rolled 1d6: 4",
        "the Python tool ran"
    );
    assert_eq!(list[0]["status"], "success");
    assert_eq!(list[1]["content"], "You rolled a 4.");
    assert_eq!(done["usage"]["message_type"], "usage_statistics");

    // The same answer again: applied already, nothing runs.
    let (status, again) = s
        .call("POST", &messages, Some(approve("call_1", true, None)))
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["messages"], json!([]));
    // An answer with nothing waiting: Letta's 400.
    let (status, body) = s
        .call("POST", &messages, Some(approve("call_7", true, None)))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("No tool call is currently awaiting approval"),
        "{body}"
    );

    // The history, oldest first: the branch as it is stored.
    let (status, history) = s.call("GET", &format!("{messages}?order=asc"), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        types(history.as_array().unwrap()),
        [
            "system_message",
            "user_message",
            "assistant_message",
            "approval_request_message",
            "approval_response_message",
            "tool_return_message",
            "assistant_message"
        ],
        "the history keeps the request and its answer"
    );
    let response = &history.as_array().unwrap()[4];
    assert_eq!(
        response["approvals"],
        json!([{"type": "approval", "tool_call_id": "call_1", "approve": true}])
    );
    s.stop().await;
}

#[tokio::test]
async fn a_denial_is_the_tool_result_and_a_message_may_follow() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    let agent = agent_with_dice(&s, true).await;
    let messages = format!("/v1/agents/{agent}/messages");
    s.call("POST", &messages, Some(user("roll"))).await;
    let mut body = approve("call_1", false, Some("not now"));
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "Just say something."}));
    let (status, done) = s.call("POST", &messages, Some(body)).await;
    assert_eq!(status, 200, "{done}");
    let list = done["messages"].as_array().unwrap();
    let ret = list
        .iter()
        .find(|m| m["message_type"] == "tool_return_message")
        .unwrap();
    assert_eq!(
        ret["tool_return"],
        "Error: request to call tool denied. User reason: not now"
    );
    assert_eq!(ret["status"], "error");
    assert!(
        !types(list).contains(&"user_message".to_owned()),
        "the user's own message is not echoed"
    );
    assert_eq!(list.last().unwrap()["content"], "Noted.");
    s.stop().await;
}

#[tokio::test]
async fn a_client_tool_is_answered_by_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
turns:
  - steps:
      - tool_calls:
          - {id: call_c, name: ask_user, arguments: {question: "color?"}}
      - text: "Teal it is."
"#;
    let s = server(&dir, script).await;
    let messages = format!("/v1/agents/{}/messages", plain_agent(&s).await);
    let mut body = user("pick");
    body["client_tools"] = json!([{"name": "ask_user", "description": "Asks the user",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"}}}}]);
    let (status, paused) = s.call("POST", &messages, Some(body)).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["stop_reason"]["stop_reason"], "requires_approval");
    assert_eq!(
        types(paused["messages"].as_array().unwrap()),
        ["approval_request_message"]
    );
    let answer = json!({"messages": [{"type": "approval", "approvals": [
        {"type": "tool", "tool_call_id": "call_c", "tool_return": "teal", "status": "success"}
    ]}]});
    let (status, done) = s.call("POST", &messages, Some(answer)).await;
    assert_eq!(status, 200, "{done}");
    let list = done["messages"].as_array().unwrap();
    let ret = list
        .iter()
        .find(|m| m["message_type"] == "tool_return_message")
        .unwrap();
    assert_eq!(ret["tool_return"], "teal");
    assert_eq!(list.last().unwrap()["content"], "Teal it is.");
    s.stop().await;
}

#[tokio::test]
async fn a_pause_survives_a_restart_and_cancel_clears_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    let agent = agent_with_dice(&s, true).await;
    let messages = format!("/v1/agents/{agent}/messages");
    s.call("POST", &messages, Some(user("roll"))).await;
    s.stop().await;

    let s = server(&dir, CALLS_DICE).await;
    let (status, history) = s.call("GET", &messages, None).await;
    assert_eq!(status, 200);
    // Letta's order: the newest messages, oldest first.
    assert_eq!(
        history.as_array().unwrap().last().unwrap()["message_type"],
        "approval_request_message",
        "still waiting: {history}"
    );
    let (status, _) = s.call("POST", &messages, Some(user("hello?"))).await;
    assert_eq!(status, 409);

    let (status, cancelled) = s
        .call("POST", &format!("{messages}/cancel"), Some(json!({})))
        .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["cleared_approval"], true);
    let (status, after) = s.call("POST", &messages, Some(user("hello?"))).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["stop_reason"]["stop_reason"], "end_turn");
    s.stop().await;
}

#[tokio::test]
async fn an_approval_times_out_as_a_denial() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    let agent = agent_with_dice(&s, true).await;
    let (status, _) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{agent}"),
            Some(json!({"approval_timeout_seconds": 1})),
        )
        .await;
    assert_eq!(status, 200);
    let messages = format!("/v1/agents/{agent}/messages");
    let (_, paused) = s.call("POST", &messages, Some(user("roll"))).await;
    assert_eq!(paused["stop_reason"]["stop_reason"], "requires_approval");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, history) = s.call("GET", &format!("{messages}?order=asc"), None).await;
        let timed_out = history.as_array().unwrap().iter().any(|m| {
            m["tool_return"] == "Error: request to call tool denied. User reason: timed out"
        });
        // The turn goes on after the denial: wait for its answer too.
        let answered =
            history.as_array().unwrap().last().unwrap()["message_type"] == "assistant_message";
        if timed_out && answered {
            assert_eq!(
                history.as_array().unwrap().last().unwrap()["content"],
                "You rolled a 4."
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never timed out: {history}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn a_stream_is_letta_sse() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
steps:
  - text: "Hello there, friend."
    chunk_size: 4
"#;
    let s = server(&dir, script).await;
    let messages = format!("/v1/agents/{}/messages", plain_agent(&s).await);
    let mut body = user("hi");
    body["stream_tokens"] = json!(true);
    let (data, other) = s.stream(&format!("{messages}/stream"), body).await;
    assert!(other.is_empty(), "only data lines: {other:?}");
    assert_eq!(data.last().unwrap(), "[DONE]");
    let parsed: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let kinds = types(&parsed);
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["stop_reason", "usage_statistics"]
    );
    let chunks: Vec<&Value> = parsed
        .iter()
        .filter(|m| m["message_type"] == "assistant_message")
        .collect();
    assert!(chunks.len() > 1, "token chunks: {chunks:?}");
    let text: String = chunks
        .iter()
        .map(|c| c["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Hello there, friend.");
    // Every chunk carries the id of the message it became.
    let (_, history) = s.call("GET", &messages, None).await;
    let stored = history.as_array().unwrap().last().unwrap();
    assert_eq!(stored["content"], "Hello there, friend.");
    assert!(chunks.iter().all(|c| c["id"] == stored["id"]));

    // `streaming: true` on the plain route streams too; a type filter
    // keeps only what was asked (and the closing messages).
    let mut body = user("again");
    body["streaming"] = json!(true);
    body["include_return_message_types"] = json!(["assistant_message"]);
    let (data, _) = s.stream(&messages, body).await;
    let parsed: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        types(&parsed),
        ["assistant_message", "stop_reason", "usage_statistics"]
    );
    s.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_json_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    let check = |(status, body): (u16, Value), want: u16, code: &str, says: &str| {
        assert_eq!(status, want, "{body}");
        assert_eq!(body["code"], code, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says), "{message:?} should say {says:?}");
        assert_eq!(body["detail"], body["message"]);
    };
    check(
        s.call("GET", "/v2/nothing", None).await,
        404,
        "NOT_FOUND",
        "/v2/nothing",
    );
    let unknown = "agent-01a201d7-f6c5-7124-836e-583bf0e142ea";
    check(
        s.call("GET", &format!("/v1/agents/{unknown}"), None).await,
        404,
        "NOT_FOUND",
        unknown,
    );
    check(
        s.call("GET", "/v1/agents/..%2F..%2Fetc", None).await,
        404,
        "NOT_FOUND",
        "agent",
    );
    check(
        s.call("GET", "/v1/tools/tool-x", None).await,
        404,
        "NOT_FOUND",
        "tool-x",
    );
    let response = s
        .http
        .post(s.url("/v1/agents"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    check(
        (status, response.json().await.unwrap()),
        422,
        "INVALID_BODY",
        "not valid",
    );
    let huge = "x".repeat(9 * 1024 * 1024);
    let response = s
        .http
        .post(s.url("/v1/tools"))
        .header("content-type", "application/json")
        .body(format!("{{\"source_code\": \"{huge}\"}}"))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    check(
        (status, response.json().await.unwrap()),
        413,
        "BODY_TOO_LARGE",
        "too large",
    );
    check(
        s.call("GET", "/v1/agents?limit=lots", None).await,
        400,
        "BAD_REQUEST",
        "limit",
    );
    check(
        s.call("POST", "/v1/tools", Some(json!({"source_code": "x = 1"})))
            .await,
        400,
        "BAD_REQUEST",
        "defines no function",
    );
    check(
        s.call(
            "POST",
            "/v1/tools",
            Some(json!({"source_code": "def f(:\n  pass"})),
        )
        .await,
        400,
        "BAD_REQUEST",
        "syntax",
    );
    let agent = agent_with_dice(&s, false).await;
    let messages = format!("/v1/agents/{agent}/messages");
    check(
        s.call("POST", &messages, Some(json!({}))).await,
        400,
        "BAD_REQUEST",
        "nothing to send",
    );
    check(
        s.call(
            "POST",
            &messages,
            Some(json!({"messages": [{"role": "tool", "content": "x"}]})),
        )
        .await,
        400,
        "BAD_REQUEST",
        "role `tool`",
    );
    check(
        s.call(
            "POST",
            &messages,
            Some(json!({"messages": [{"type": "bogus"}]})),
        )
        .await,
        400,
        "BAD_REQUEST",
        "unknown message type `bogus`",
    );
    check(
        s.call("GET", &format!("{messages}?order=up"), None).await,
        400,
        "BAD_REQUEST",
        "order",
    );
    check(
        s.call("POST", "/v1/tools", Some(json!({"source_code": DICE})))
            .await,
        409,
        "TOOL_NAME_TAKEN",
        "roll_dice",
    );
    // Trailing slashes are the same routes.
    let (status, agents) = s.call("GET", "/v1/agents/", None).await;
    assert_eq!(status, 200);
    assert_eq!(agents.as_array().unwrap().len(), 1);
    s.stop().await;
}

#[tokio::test]
async fn pages_follow_their_cursors_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    for i in 0..5 {
        let (status, _) = s
            .call(
                "POST",
                "/v1/agents",
                Some(json!({"name": format!("a{i}"), "include_base_tools": false})),
            )
            .await;
        assert_eq!(status, 200);
    }
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/agents?limit=2&after={a}"),
            None => "/v1/agents?limit=2".to_owned(),
        };
        let (_, page) = s.call("GET", &path, None).await;
        let page = page.as_array().unwrap().clone();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        names.extend(page.iter().map(|a| a["name"].as_str().unwrap().to_owned()));
        after = Some(page.last().unwrap()["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(names, ["a0", "a1", "a2", "a3", "a4"]);
    s.stop().await;
}

#[tokio::test]
async fn keys_are_required_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ServerSettings {
        api_keys: vec!["sk-test".into()],
        ..ServerSettings::default()
    };
    let s = Server::start(&dir.path().join("t.db"), CALLS_DICE, settings).await;
    let (status, body) = s.call("GET", "/v1/agents", None).await;
    assert_eq!(status, 401);
    assert!(body["message"].as_str().unwrap().contains("Bearer"));
    let status = |key: &'static str| {
        let request = s.http.get(s.url("/v1/agents")).bearer_auth(key).send();
        async move { request.await.unwrap().status().as_u16() }
    };
    assert_eq!(status("sk-wrong").await, 401);
    assert_eq!(status("sk-test").await, 200);
    s.stop().await;
}

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    let (status, doc) = s.call("GET", "/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for route in [
        "/v1/tools",
        "/v1/tools/{tool_id}",
        "/v1/agents",
        "/v1/agents/{agent_id}",
        "/v1/agents/{agent_id}/messages",
        "/v1/agents/{agent_id}/messages/stream",
        "/v1/agents/{agent_id}/messages/cancel",
        "/v1/agents/{agent_id}/tools/approval/{tool_name}",
    ] {
        assert!(paths.contains_key(route), "{route} is not documented");
    }
    // Every documented operation is served (an unknown id, not an
    // unknown route).
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            let concrete = path
                .replace("{tool_id}", "tool-00000000-0000-0000-0000-000000000000")
                .replace("{agent_id}", "agent-00000000-0000-0000-0000-000000000000")
                .replace("{tool_name}", "x");
            let body = (method != "get" && method != "delete").then(|| json!({}));
            let (status, body) = s.call(&method.to_uppercase(), &concrete, body).await;
            assert_ne!(
                body["message"].as_str().map(|m| m.starts_with("no route")),
                Some(true),
                "{method} {path} is documented but not served"
            );
            assert_ne!(status, 405, "{method} {path}");
        }
    }
    s.stop().await;
}

/// Edges the schema-driven fuzz run of `scripts/test` led to: text with
/// U+0000 (which PostgreSQL cannot store: a 500 there) is refused up front
/// on every backend, and an approval timeout too long for a date never
/// fires (u64::MAX used to wrap to "at once", and a timeout past chrono's
/// range panicked the task that watches the pause).
#[tokio::test]
async fn nul_text_is_refused_and_huge_timeouts_never_fire() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(&dir, CALLS_DICE).await;
    let (status, body) = s
        .call("POST", "/v1/agents", Some(json!({"name": "a\u{0}b"})))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "INVALID_BODY");
    assert!(body["message"].as_str().unwrap().contains("NUL"), "{body}");
    // A backslash followed by "u0000" is no NUL.
    let (status, agent) = s
        .call("POST", "/v1/agents", Some(json!({"name": "a\\u0000b"})))
        .await;
    assert_eq!(status, 200, "{agent}");
    assert_eq!(agent["name"], "a\\u0000b");

    let first = agent_with_dice(&s, true).await;
    let (status, body) = s
        .call(
            "POST",
            &format!("/v1/agents/{first}/messages"),
            Some(user("roll\u{0}")),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, _) = s
        .call(
            "PATCH",
            &format!("/v1/agents/{first}"),
            Some(json!({"approval_timeout_seconds": u64::MAX})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, tools) = s.call("GET", "/v1/tools?name=roll_dice", None).await;
    let (status, second) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({
                "tool_ids": [tools[0]["id"]],
                "include_base_tools": false,
                "tool_rules": [{"type": "requires_approval", "tool_name": "roll_dice"}],
                "approval_timeout_seconds": i64::MAX / 1000 + 1,
            })),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    let second = second["id"].as_str().unwrap().to_owned();
    for agent in [&first, &second] {
        let (_, paused) = s
            .call(
                "POST",
                &format!("/v1/agents/{agent}/messages"),
                Some(user("roll")),
            )
            .await;
        assert_eq!(paused["stop_reason"]["stop_reason"], "requires_approval");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for agent in [&first, &second] {
        let (_, history) = s
            .call("GET", &format!("/v1/agents/{agent}/messages"), None)
            .await;
        assert_eq!(
            history.as_array().unwrap().last().unwrap()["message_type"],
            "approval_request_message",
            "{history}"
        );
    }
    // The server is still whole: a pause can still be answered.
    let (_, answered) = s
        .call(
            "POST",
            &format!("/v1/agents/{second}/messages"),
            Some(json!({
                "messages": [{"type": "approval", "approve": true}]
            })),
        )
        .await;
    assert_eq!(
        answered["stop_reason"]["stop_reason"], "end_turn",
        "{answered}"
    );
    s.stop().await;
}

#[tokio::test]
async fn python_tools_that_crash_or_hang_are_tool_errors() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
turns:
  - steps:
      - tool_calls:
          - {id: call_crash, name: crash, arguments: {}}
          - {id: call_hang, name: hang, arguments: {}}
      - text: "Both failed."
"#;
    let settings = ServerSettings {
        python: toolwire_tools::python::PythonLimits {
            timeout: Duration::from_secs(1),
            ..Default::default()
        },
        ..ServerSettings::default()
    };
    let s = Server::start(&dir.path().join("t.db"), script, settings).await;
    // An invalid schema is refused when the tool is made.
    let (status, body) = s
        .call(
            "POST",
            "/v1/tools",
            Some(json!({"source_code": "def f(x):\n    return x\n", "json_schema": {"parameters": "nope"}})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let mut ids = Vec::new();
    for source in [
        "def crash() -> str:\n    \"\"\"Crashes.\"\"\"\n    raise ValueError('no dice')\n",
        "def hang() -> str:\n    \"\"\"Hangs.\"\"\"\n    import time\n    time.sleep(60)\n    return 'never'\n",
    ] {
        let (status, tool) = s
            .call("POST", "/v1/tools", Some(json!({"source_code": source})))
            .await;
        assert_eq!(status, 200, "{tool}");
        ids.push(tool["id"].clone());
    }
    let (_, agent) = s
        .call(
            "POST",
            "/v1/agents",
            Some(json!({"tool_ids": ids, "include_base_tools": false})),
        )
        .await;
    let messages = format!("/v1/agents/{}/messages", agent["id"].as_str().unwrap());
    let (status, reply) = s.call("POST", &messages, Some(user("go"))).await;
    assert_eq!(status, 200, "{reply}");
    // The step's two results, in one message (as Letta's server sends them).
    let groups: Vec<&Value> = reply["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["message_type"] == "tool_return_message")
        .collect();
    assert_eq!(groups.len(), 1);
    let returns: Vec<&Value> = groups[0]["tool_returns"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(returns.len(), 2);
    let of = |id: &str| returns.iter().find(|r| r["tool_call_id"] == id).unwrap();
    assert_eq!(of("call_crash")["status"], "error");
    let crash = of("call_crash")["tool_return"].as_str().unwrap();
    assert!(crash.contains("ValueError: no dice"), "{crash}");
    assert_eq!(of("call_hang")["status"], "error");
    let hang = of("call_hang")["tool_return"].as_str().unwrap();
    assert!(hang.contains("timed out after 1 s"), "{hang}");
    assert_eq!(reply["stop_reason"]["stop_reason"], "end_turn");
    // The server is unharmed.
    let (status, _) = s.call("GET", "/v1/agents", None).await;
    assert_eq!(status, 200);
    s.stop().await;
}

#[tokio::test]
async fn stopping_the_server_ends_open_streams() {
    let dir = tempfile::tempdir().unwrap();
    // A slow answer: about 20 s of chunks, far past the grace.
    let script = "steps:\n  - text: \"a slow answer that takes its time\"\n    chunk_size: 1\n    delay_ms: 200\n";
    let settings = ServerSettings {
        shutdown_grace: Duration::from_secs(1),
        ..ServerSettings::default()
    };
    let s = Server::start(&dir.path().join("t.db"), script, settings).await;
    let url = s.url(&format!(
        "/v1/agents/{}/messages/stream",
        plain_agent(&s).await
    ));
    let reader = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .json(&user("hi"))
            .send()
            .await
            .unwrap();
        response.text().await.unwrap_or_default()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::time::timeout(Duration::from_secs(10), s.stop())
        .await
        .expect("the server stops with a stream open");
    let text = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .unwrap()
        .unwrap();
    // Cut after the grace: said by a final event, not by a broken body.
    assert!(text.contains("interrupted by shutdown"), "{text}");
    assert!(text.contains("\"error_type\":\"interrupted\""), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}
