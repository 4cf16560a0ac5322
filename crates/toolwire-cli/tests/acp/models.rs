//! The model picker: `configOptions` over the config's models, switched
//! between two prompts with `session/set_config_option`, refused with a
//! clear error for what is not there, and kept for a loaded session.

use agent_client_protocol::v1::schema::{
    NewSessionRequest, SessionConfigKind, SessionConfigOption, SessionConfigSelectOptions,
    SetSessionConfigOptionRequest,
};

use super::*;

/// A config of two scripted models, each answering with its name.
fn two_models(home: &Path) -> Vec<String> {
    let table = |name: &str| {
        let script = write_file(
            home,
            &format!("{name}.yaml"),
            &format!("steps: [{{text: \"{name} answers.\"}}]\n"),
        );
        format!(
            "[models.{name}]\nprovider = \"scripted\"\nmodel = \"{name}-1\"\nscript = {:?}\n",
            script.to_str().unwrap()
        )
    };
    let config = write_file(
        home,
        "toolwire.toml",
        &format!(
            "default_model = \"alpha\"\n{}{}",
            table("alpha"),
            table("beta")
        ),
    );
    strings(&[
        "--db",
        &sqlite_in(home),
        "--config",
        config.to_str().unwrap(),
    ])
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

fn answers(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(chunk) => Some(text_of(&chunk.content)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_model_picker_switches_models_between_prompts_and_is_kept() {
    let dirs = Dirs::new();
    let args = two_models(dirs.home());
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
            let switched = cx
                .send_request(SetSessionConfigOptionRequest::new(
                    session.clone(),
                    "model",
                    "beta",
                ))
                .block_task()
                .await?;
            let switched = model_option(&switched.config_options);
            assert_eq!(
                prompt(&cx, &session, "and now?").await?,
                StopReason::EndTurn
            );
            let unknown_option = cx
                .send_request(SetSessionConfigOptionRequest::new(
                    session.clone(),
                    "mode",
                    "beta",
                ))
                .block_task()
                .await
                .unwrap_err();
            let unknown_model = cx
                .send_request(SetSessionConfigOptionRequest::new(
                    session.clone(),
                    "model",
                    "gamma",
                ))
                .block_task()
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
    let data = |e: &AcpError| e.data.clone().unwrap_or_default().to_string();
    assert!(
        data(&unknown_option).contains("`mode`"),
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
            let loaded = cx
                .send_request(LoadSessionRequest::new(session.clone(), cwd))
                .block_task()
                .await?;
            assert_eq!(
                prompt(&cx, &session, "you again?").await?,
                StopReason::EndTurn
            );
            Ok(model_option(&loaded.config_options.unwrap_or_default()))
        })
        .await;
    drop(child);
    assert_eq!(loaded.0, "beta");
    assert!(
        answers(&editor.updates()).ends_with("beta answers."),
        "{:?}",
        answers(&editor.updates())
    );
}
