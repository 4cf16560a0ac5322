//! MCP servers the editor passes in `session/new`: their tools reach the
//! model, and a tool's progress shows on its call.

use super::*;
use toolwire_test_support::mcp_http;

#[tokio::test]
async fn an_http_mcp_server_from_session_new_gives_the_model_its_tools() {
    let Some(mcp_dir) = mcp_http::mcp_dir() else {
        return;
    };
    let http = mcp_http::HttpServer::everything(&mcp_dir).await;
    let nowhere = mcp_http::nothing_listens();
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Echoing."
    tool_calls: [{name: everything__echo, arguments: {message: "over streamable HTTP"}}]
  - text: "It echoed."
"#,
    );
    let log = dirs.home().join("agent.log");
    let (child, transport, _) =
        spawn_logging(dirs.home(), &scripted_args(&script, &dirs.db()), Some(&log));

    let editor = Editor::new();
    let cwd = dirs.cwd();
    // Secrets in the query and the headers, which no log line may show.
    let url = format!("{}?key=s3cret", http.url);
    let unreachable = format!("{}?key=s3cret", nowhere.url);
    let (init, stop) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            let token = || vec![HttpHeader::new("Authorization", "Bearer t0ken")];
            let servers = vec![
                McpServer::Http(McpServerHttp::new("everything", url.as_str()).headers(token())),
                // Cannot be reached: left out with a warning.
                McpServer::Http(
                    McpServerHttp::new("unreachable", unreachable.as_str()).headers(token()),
                ),
                // Deprecated in MCP: left out with a warning, the session
                // goes on without it.
                McpServer::Sse(McpServerSse::new("legacy", url.as_str()).headers(token())),
            ];
            let session = cx
                .send_request(NewSessionRequest::new(cwd).mcp_servers(servers))
                .block_task()
                .await?
                .session_id;
            let stop = prompt(&cx, &session, "echo something").await?;
            Ok((init, stop))
        })
        .await;
    let mcp = &init.agent_capabilities.mcp_capabilities;
    assert!(mcp.http, "streamable HTTP is advertised");
    assert!(!mcp.sse, "SSE is not");
    assert_eq!(stop, StopReason::EndTurn);

    let updates = editor.updates();
    let call = first_tool_call(&updates).expect("a tool_call");
    assert_eq!(call.title, "everything__echo");
    assert_eq!(
        results(&updates),
        "Echo: over streamable HTTP",
        "{updates:#?}"
    );
    child.assert_valid();
    drop(child);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("SSE MCP servers are not supported") && log.contains("legacy"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "MCP server `unreachable` at {} failed to connect",
            nowhere.url
        )),
        "{log}"
    );
    for secret in ["s3cret", "t0ken"] {
        assert!(!log.contains(secret), "{secret:?} shows in the log: {log}");
        assert!(
            !format!("{updates:?}").contains(secret),
            "{secret:?} shows in an update: {updates:#?}"
        );
    }
    drop(http);
}

#[tokio::test]
async fn an_mcp_tools_progress_shows_on_its_call_until_the_result() {
    let Some(mcp_dir) = mcp_http::mcp_dir() else {
        return;
    };
    let http = mcp_http::HttpServer::everything(&mcp_dir).await;
    let dirs = Dirs::new();
    let script = write_file(
        dirs.home(),
        "script.yaml",
        r#"
steps:
  - text: "Working."
    tool_calls: [{name: everything__trigger-long-running-operation, arguments: {duration: 2, steps: 4}}]
  - text: "Done."
"#,
    );
    let (child, transport) = spawn_agent(dirs.home(), &script, &dirs.db());
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let url = http.url.clone();
    let stop = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let servers = vec![McpServer::Http(McpServerHttp::new(
                "everything",
                url.as_str(),
            ))];
            let session = cx
                .send_request(NewSessionRequest::new(cwd).mcp_servers(servers))
                .block_task()
                .await?
                .session_id;
            prompt(&cx, &session, "run the long operation").await
        })
        .await;
    assert_eq!(stop, StopReason::EndTurn);

    // The call's content, update by update: the server's progress lines
    // (0.5 s apart, so none coalesce), then the result in their place.
    let shown: Vec<String> = editor
        .updates()
        .into_iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(u) => u.fields.content,
            _ => None,
        })
        .map(|content| content.into_iter().map(content_text).collect())
        .collect();
    let progress: Vec<&str> = shown
        .iter()
        .map(String::as_str)
        .filter(|s| s.contains("(25%)") || s.contains("(50%)") || s.contains("(75%)"))
        .collect();
    assert_eq!(
        progress,
        ["1/4 (25%)", "2/4 (50%)", "3/4 (75%)"],
        "{shown:#?}"
    );
    let last = shown.last().expect("content was sent");
    assert!(
        last.contains("Long running operation completed"),
        "{shown:#?}"
    );
    child.assert_valid();
    drop(http);
}
