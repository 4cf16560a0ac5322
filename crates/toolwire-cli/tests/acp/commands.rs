//! The reasoning effort option (where the model reasons: in the request
//! the mock model receives), slash commands (`available_commands_update`,
//! `/compact`, `/model`, `/fork`, an MCP server's prompt) and authentication when the
//! default model's key is missing.

use agent_client_protocol::v1::schema::{
    AuthenticateRequest, AvailableCommand, ListSessionsRequest, NewSessionRequest,
    SessionConfigOption,
};

use super::models::{answers, asked};
use super::*;

fn data(e: &AcpError) -> String {
    e.data.clone().unwrap_or_default().to_string()
}

fn has_option(options: &[SessionConfigOption], id: &str) -> bool {
    options.iter().any(|o| o.id.0.as_ref() == id)
}

/// The commands of the last `available_commands_update`.
fn commands(updates: &[SessionUpdate]) -> Vec<AvailableCommand> {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AvailableCommandsUpdate(c) => Some(c.available_commands.clone()),
            _ => None,
        })
        .next_back()
        .unwrap_or_default()
}

/// Two mock models, `thinker` reasoning; their config.
async fn thinker_and_plain(home: &Path) -> (Vec<String>, support::MockServer, support::MockServer) {
    use support::{MockServer, Reply, openai_sse};
    let thinker = MockServer::start(vec![Reply::sse(openai_sse("thought.", &[]))]).await;
    let plain = MockServer::start(vec![Reply::sse(openai_sse("plain.", &[]))]).await;
    let config = write_file(
        home,
        "toolwire.toml",
        &format!(
            "default_model = \"thinker\"\n\
             [models.thinker]\nprovider = \"openai\"\nmodel = \"o-test\"\nbase_url = \"{}\"\nreasoning = true\n\
             [models.plain]\nprovider = \"openai\"\nmodel = \"plain-1\"\nbase_url = \"{}\"\n",
            thinker.url, plain.url
        ),
    );
    let args = strings(&[
        "--db",
        &sqlite_in(home),
        "--config",
        config.to_str().unwrap(),
    ]);
    (args, thinker, plain)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reasoning_effort_reaches_the_request_of_a_model_that_reasons() {
    let dirs = Dirs::new();
    let (args, thinker, plain) = thinker_and_plain(dirs.home()).await;
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let (offered, after_switch, bad_value, on_plain) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let new = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let session = new.session_id.clone();
            let offered = has_option(&new.config_options.unwrap_or_default(), "reasoning_effort");
            prompt(&cx, &session, "default effort").await?;
            set_option(&cx, &session, "reasoning_effort", "high").await?;
            prompt(&cx, &session, "think hard").await?;
            let bad_value = set_option(&cx, &session, "reasoning_effort", "extreme")
                .await
                .unwrap_err();
            let switched = set_option(&cx, &session, "model", "plain").await?;
            let after_switch = has_option(&switched.config_options, "reasoning_effort");
            prompt(&cx, &session, "plainly").await?;
            let on_plain = set_option(&cx, &session, "reasoning_effort", "low")
                .await
                .unwrap_err();
            Ok((offered, after_switch, bad_value, on_plain))
        })
        .await;
    drop(child);
    assert!(offered, "a model that reasons has the option");
    assert!(!after_switch, "a model that does not has none");
    let efforts: Vec<_> = thinker
        .received()
        .iter()
        .map(|r| r.body.get("reasoning_effort").cloned())
        .collect();
    assert_eq!(efforts, [None, Some(serde_json::json!("high"))]);
    let plain_bodies = plain.received();
    assert_eq!(plain_bodies.len(), 1);
    assert!(plain_bodies[0].body.get("reasoning_effort").is_none());
    assert!(data(&bad_value).contains("`extreme`"), "{bad_value:?}");
    assert!(data(&on_plain).contains("does not reason"), "{on_plain:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn slash_commands_switch_the_model_and_fork() {
    let dirs = Dirs::new();
    let (args, alpha, beta) = super::models::two_models(dirs.home()).await;
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let watching = editor.clone();
    let (listed, unknown_model, offered) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd.clone()).await?;
            prompt(&cx, &session, "first").await?;
            assert_eq!(
                prompt(&cx, &session, "/model beta").await?,
                StopReason::EndTurn
            );
            prompt(&cx, &session, "second").await?;
            assert_eq!(prompt(&cx, &session, "/fork").await?, StopReason::EndTurn);
            let unknown_model = cx
                .send_request(prompt_request(&session, "/model gamma"))
                .block_task()
                .await
                .unwrap_err();
            // A slash word that names no command is a prompt like any.
            prompt(&cx, &session, "/etc/hosts looks odd").await?;
            let listed = cx
                .send_request(ListSessionsRequest::new())
                .block_task()
                .await?
                .sessions;
            let offered = commands(&watching.updates());
            Ok((listed, unknown_model, offered))
        })
        .await;
    drop(child);
    let names: Vec<_> = offered.iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, ["compact", "fork", "model"], "{offered:?}");
    // /model switched the model: the next prompts went to beta, and the
    // command itself to no model.
    assert_eq!(asked(&alpha), ["alpha-1"]);
    assert_eq!(asked(&beta), ["beta-1", "beta-1"]);
    let said = answers(&editor.updates());
    assert!(said.contains("Model: beta."), "{said}");
    assert!(said.contains("Forked this session into"), "{said}");
    assert!(
        data(&unknown_model).contains("`gamma`"),
        "{unknown_model:?}"
    );
    assert!(
        editor
            .updates()
            .iter()
            .any(|u| matches!(u, SessionUpdate::ConfigOptionUpdate(_))),
        "/model tells the picker"
    );
    // The fork is in the history, beside the session.
    assert_eq!(listed.len(), 2, "{listed:?}");
    let beta_bodies = beta.received();
    let last = beta_bodies.last().unwrap().body["messages"].to_string();
    assert!(last.contains("/etc/hosts looks odd"), "{last}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_servers_prompts_are_commands() {
    let Some(mcp_dir) = toolwire_test_support::mcp_http::mcp_dir() else {
        return;
    };
    let http = toolwire_test_support::mcp_http::HttpServer::everything(&mcp_dir).await;
    let dirs = Dirs::new();
    let (args, alpha, _beta) = super::models::two_models(dirs.home()).await;
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let url = http.url.clone();
    let watching = editor.clone();
    let (offered, missing_argument) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let session = cx
                .send_request(
                    NewSessionRequest::new(cwd)
                        .mcp_servers(vec![McpServer::Http(McpServerHttp::new("everything", url))]),
                )
                .block_task()
                .await?
                .session_id;
            prompt(&cx, &session, "/mcp__everything__args-prompt Oslo").await?;
            prompt(
                &cx,
                &session,
                "/mcp__everything__args-prompt city=Bergen state=Vestland",
            )
            .await?;
            let missing_argument = cx
                .send_request(prompt_request(&session, "/mcp__everything__args-prompt"))
                .block_task()
                .await
                .unwrap_err();
            prompt(&cx, &session, "/mcp__everything__simple-prompt").await?;
            Ok((commands(&watching.updates()), missing_argument))
        })
        .await;
    drop(child);
    let args_prompt = offered
        .iter()
        .find(|c| c.name == "mcp__everything__args-prompt")
        .unwrap_or_else(|| panic!("{offered:?}"));
    assert!(
        args_prompt.description.contains("arguments"),
        "{args_prompt:?}"
    );
    assert!(
        offered
            .iter()
            .any(|c| c.name == "mcp__everything__simple-prompt")
    );
    let sent: Vec<String> = alpha
        .received()
        .iter()
        .map(|r| r.body["messages"].as_array().unwrap().last().unwrap()["content"].to_string())
        .collect();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(sent[0].contains("What's weather in Oslo?"), "{sent:?}");
    assert!(
        sent[1].contains("What's weather in Bergen, Vestland?"),
        "{sent:?}"
    );
    assert!(
        sent[2].contains("This is a simple prompt without arguments."),
        "{sent:?}"
    );
    assert!(
        data(&missing_argument).contains("city"),
        "{missing_argument:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_key_is_an_auth_method_not_a_failed_prompt() {
    let dirs = Dirs::new();
    let args = strings(&[
        "--provider",
        "openai",
        "--model",
        "gpt-test",
        "--api-key-env",
        "TOOLWIRE_TEST_NO_SUCH_KEY",
        "--db",
        &dirs.db(),
    ]);
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let (methods, refused, authenticated, unknown_method) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            let refused = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await
                .unwrap_err();
            let method = init.auth_methods[0].id().clone();
            let authenticated = cx
                .send_request(AuthenticateRequest::new(method))
                .block_task()
                .await
                .unwrap_err();
            let unknown_method = cx
                .send_request(AuthenticateRequest::new("password"))
                .block_task()
                .await
                .unwrap_err();
            Ok((init.auth_methods, refused, authenticated, unknown_method))
        })
        .await;
    drop(child);
    assert_eq!(methods.len(), 1, "{methods:?}");
    assert!(
        methods[0].name().contains("TOOLWIRE_TEST_NO_SUCH_KEY"),
        "{methods:?}"
    );
    assert!(
        methods[0]
            .description()
            .is_some_and(|d| d.contains("TOOLWIRE_TEST_NO_SUCH_KEY")),
        "{methods:?}"
    );
    // auth_required (-32000), naming the variable; authenticate checks
    // again and still finds it missing.
    for e in [&refused, &authenticated] {
        assert_eq!(i32::from(e.code), -32000, "{e:?}");
        assert!(data(e).contains("TOOLWIRE_TEST_NO_SUCH_KEY"), "{e:?}");
    }
    assert!(
        data(&unknown_method).contains("`password`"),
        "{unknown_method:?}"
    );

    // A model at a server of its own (base_url) needs no key: nothing is
    // offered and sessions open.
    let (child, transport) = {
        let mut cmd_args = args.clone();
        cmd_args.extend(strings(&["--base-url", "http://127.0.0.1:9"]));
        let (child, transport, _) = spawn_with(dirs.home(), &cmd_args);
        (child, transport)
    };
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let methods = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            new_session(&cx, cwd).await?;
            Ok(init.auth_methods)
        })
        .await;
    drop(child);
    assert!(
        methods.is_empty(),
        "a local server needs no key: {methods:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn compact_summarises_the_older_prompts_and_later_requests_send_the_summary() {
    use support::{MockServer, Reply, openai_sse};
    let dirs = Dirs::new();
    // One model with a small window, so that the first prompt falls out of
    // the newest part kept verbatim; every answer (the summary too) is the
    // same text.
    let model = MockServer::start(vec![Reply::sse(openai_sse("Noted: SUMMARY-TEXT.", &[]))]).await;
    let config = write_file(
        dirs.home(),
        "toolwire.toml",
        &format!(
            "default_model = \"small\"\n[models.small]\nprovider = \"openai\"\n\
             model = \"small-1\"\nbase_url = \"{}\"\ncontext_window = 4000\n",
            model.url
        ),
    );
    let args = strings(&[
        "--db",
        &sqlite_in(dirs.home()),
        "--config",
        config.to_str().unwrap(),
    ]);
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let watching = editor.clone();
    let long = |mark: &str| format!("{mark} {}", "words to fill the window ".repeat(120));
    let offered = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd.clone()).await?;
            prompt(&cx, &session, &long("FIRST-MARK")).await?;
            prompt(&cx, &session, &long("SECOND-MARK")).await?;
            assert_eq!(
                prompt(&cx, &session, "/compact").await?,
                StopReason::EndTurn
            );
            prompt(&cx, &session, "THIRD-MARK").await?;
            Ok(commands(&watching.updates()))
        })
        .await;
    drop(child);
    let names: Vec<_> = offered.iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, ["compact", "fork", "model"], "{offered:?}");
    let said = answers(&editor.updates());
    assert!(said.contains("Compacted: "), "{said}");
    // Two prompts, the summarising call, the third prompt.
    let bodies = model.received();
    assert_eq!(bodies.len(), 4, "{bodies:?}");
    let summary_request = bodies[2].body["messages"].to_string();
    assert!(summary_request.contains("FIRST-MARK"), "{summary_request}");
    let last = bodies[3].body["messages"].to_string();
    assert!(last.contains("THIRD-MARK"), "{last}");
    assert!(last.contains("SUMMARY-TEXT"), "{last}");
    assert!(
        !last.contains("FIRST-MARK"),
        "covered, sent as the summary: {last}"
    );
}
