//! The model picker: `configOptions` over the config's models (two mock
//! model servers on loopback), switched between two prompts with
//! `session/set_config_option`, refused with a clear error for what is
//! not there, and kept for a loaded session.

use agent_client_protocol::v1::schema::{
    NewSessionRequest, SessionConfigKind, SessionConfigOption, SessionConfigSelectOptions,
};

use super::*;

/// Two mock models over loopback HTTP (OpenAI's wire format), each
/// answering with its name, and a config naming them.
pub(super) async fn two_models(
    home: &Path,
) -> (Vec<String>, support::MockServer, support::MockServer) {
    use support::{MockServer, Reply, openai_sse};
    let alpha = MockServer::start(vec![Reply::sse(openai_sse("alpha answers.", &[]))]).await;
    let beta = MockServer::start(vec![Reply::sse(openai_sse("beta answers.", &[]))]).await;
    let table = |name: &str, url: &str| {
        format!(
            "[models.{name}]\nprovider = \"openai\"\nmodel = \"{name}-1\"\nbase_url = \"{url}\"\n"
        )
    };
    let config = write_file(
        home,
        "toolwire.toml",
        &format!(
            "default_model = \"alpha\"\n{}{}",
            table("alpha", &alpha.url),
            table("beta", &beta.url)
        ),
    );
    let args = strings(&[
        "--db",
        &sqlite_in(home),
        "--config",
        config.to_str().unwrap(),
    ]);
    (args, alpha, beta)
}

/// The model ids the requests `server` received asked for.
pub(super) fn asked(server: &support::MockServer) -> Vec<String> {
    server
        .received()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The model option's current value and choices.
fn model_option(options: &[SessionConfigOption]) -> (String, Vec<String>) {
    let option = options
        .iter()
        .find(|o| o.id.0.as_ref() == "model")
        .expect("a model option");
    let SessionConfigKind::Select(select) = &option.kind else {
        panic!("the model option is a select: {option:?}");
    };
    let SessionConfigSelectOptions::Ungrouped(choices) = &select.options else {
        panic!("ungrouped choices: {select:?}");
    };
    (
        select.current_value.0.to_string(),
        choices.iter().map(|c| c.value.0.to_string()).collect(),
    )
}

pub(super) fn answers(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(chunk) => Some(text_of(&chunk.content)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_picker_switches_models_between_prompts_and_is_kept() {
    let dirs = Dirs::new();
    let (args, alpha, beta) = two_models(dirs.home()).await;
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let (offered, switched, unknown_option, unknown_model, session) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let new = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let session = new.session_id.clone();
            let offered = model_option(&new.config_options.unwrap_or_default());
            assert_eq!(prompt(&cx, &session, "who?").await?, StopReason::EndTurn);
            let switched = set_option(&cx, &session, "model", "beta").await?;
            let switched = model_option(&switched.config_options);
            assert_eq!(
                prompt(&cx, &session, "and now?").await?,
                StopReason::EndTurn
            );
            let unknown_option = set_option(&cx, &session, "speed", "beta")
                .await
                .unwrap_err();
            let unknown_model = set_option(&cx, &session, "model", "gamma")
                .await
                .unwrap_err();
            // Still usable, still beta.
            assert_eq!(prompt(&cx, &session, "still?").await?, StopReason::EndTurn);
            Ok((offered, switched, unknown_option, unknown_model, session))
        })
        .await;
    drop(child);
    assert_eq!(
        offered,
        (
            "alpha".to_owned(),
            vec!["alpha".to_owned(), "beta".to_owned()]
        )
    );
    assert_eq!(switched.0, "beta");
    assert_eq!(
        answers(&editor.updates()),
        "alpha answers.beta answers.beta answers."
    );
    // Each prompt went to the server of the model chosen, asking its id.
    assert_eq!(asked(&alpha), ["alpha-1"]);
    assert_eq!(asked(&beta), ["beta-1", "beta-1"]);
    let data = |e: &AcpError| e.data.clone().unwrap_or_default().to_string();
    assert!(
        data(&unknown_option).contains("`speed`"),
        "{unknown_option:?}"
    );
    assert!(
        data(&unknown_model).contains("`gamma`") && data(&unknown_model).contains("alpha, beta"),
        "{unknown_model:?}"
    );

    // Another agent process loads the session with its choice.
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let loaded = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let loaded = load_session(&cx, &session, cwd).await?;
            assert_eq!(
                prompt(&cx, &session, "you again?").await?,
                StopReason::EndTurn
            );
            Ok(model_option(&loaded.config_options.unwrap_or_default()))
        })
        .await;
    drop(child);
    assert_eq!(loaded.0, "beta");
    assert_eq!(asked(&alpha), ["alpha-1"]);
    assert_eq!(asked(&beta), ["beta-1", "beta-1", "beta-1"]);
    assert!(
        answers(&editor.updates()).ends_with("beta answers."),
        "{:?}",
        answers(&editor.updates())
    );
}
