//! What a `session/prompt` carries and gets back beyond text: images (in
//! the mock model's request, stored, replayed on load; refused with a clear
//! error for a model without vision, over the size limit or malformed),
//! the context meter and title (`usage_update`, `PromptResponse.usage`,
//! `session_info_update`), prompts sent while a turn runs (queued, or
//! interjected into the running turn), and the editor's other folders of
//! a multi-root project (`additionalDirectories`).

use agent_client_protocol::v1::schema::{
    ImageContent, ListSessionsRequest, NewSessionRequest, PromptResponse,
};
use base64::Engine as _;

use super::*;
use support::{Call, MockServer, Reply, openai_sse};

/// The bytes of a PNG (its signature is what the store checks).
fn png() -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend_from_slice(b"\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0");
    bytes
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A config of two OpenAI-format models at `url`: `eye` (the default, with
/// vision, a context window and a price) and `blind` (neither).
fn config(home: &Path, url: &str) -> PathBuf {
    config_defaulting_to(home, url, "eye")
}

/// [`config`] with `default` (`eye` or `blind`) the default model.
fn config_defaulting_to(home: &Path, url: &str, default: &str) -> PathBuf {
    write_file(
        home,
        "toolwire.toml",
        &format!(
            "default_model = \"{default}\"\n\
             [models.eye]\nprovider = \"openai\"\nmodel = \"eye-1\"\nbase_url = \"{url}\"\n\
             vision = true\ncontext_window = 128000\nprice = {{ input = 2.0, output = 8.0 }}\n\
             [models.blind]\nprovider = \"openai\"\nmodel = \"blind-1\"\nbase_url = \"{url}\"\n"
        ),
    )
}

fn config_args(home: &Path, config: &Path) -> Vec<String> {
    strings(&[
        "--db",
        &sqlite_in(home),
        "--config",
        config.to_str().unwrap(),
    ])
}

fn image_prompt(session: &SessionId, text: &str, data: String) -> PromptRequest {
    PromptRequest::new(
        session.clone(),
        vec![
            ContentBlock::Text(TextContent::new(text)),
            ContentBlock::Image(ImageContent::new(data, "image/png")),
        ],
    )
}

/// The error's `data`, as text.
fn says(e: &AcpError) -> String {
    e.data.clone().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_reaches_the_model_is_stored_and_replayed_or_is_refused_clearly() {
    let dirs = Dirs::new();
    let mock = MockServer::start(vec![Reply::sse(openai_sse("A red dot.", &[]))]).await;
    let args = config_args(dirs.home(), &config(dirs.home(), &mock.url));
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let image = png();
    let data = base64(&image);
    let (offered, session, errors) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            let session = new_session(&cx, cwd).await?;
            let stop = cx
                .send_request(image_prompt(&session, "What is this?", data.clone()))
                .block_task()
                .await?
                .stop_reason;
            assert_eq!(stop, StopReason::EndTurn);
            let mut errors = Vec::new();
            // Not base64; a data URI that is not one; over the size limit.
            for bad in [
                ImageContent::new("not base64!", "image/png"),
                ImageContent::new("", "image/png").uri("data:image/png,AAAA".to_owned()),
                ImageContent::new(base64(&vec![0u8; 5 * 1024 * 1024 + 1]), "image/png"),
            ] {
                let request = PromptRequest::new(
                    session.clone(),
                    vec![
                        ContentBlock::Text(TextContent::new("see")),
                        ContentBlock::Image(bad),
                    ],
                );
                errors.push(cx.send_request(request).block_task().await.unwrap_err());
            }
            // A model that cannot see.
            set_option(&cx, &session, "model", "blind").await?;
            errors.push(
                cx.send_request(image_prompt(&session, "And this?", data))
                    .block_task()
                    .await
                    .unwrap_err(),
            );
            // Still usable.
            assert_eq!(
                prompt(&cx, &session, "just text").await?,
                StopReason::EndTurn
            );
            Ok((
                init.agent_capabilities.prompt_capabilities.image,
                session,
                errors,
            ))
        })
        .await;
    drop(child);
    assert!(offered, "the default model can see images");
    // The model was sent the image in its format (OpenAI: a data URL).
    let received = mock.received();
    assert_eq!(received.len(), 2, "the refused prompts reached no model");
    let parts = &received[0].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|m| m["role"] == "user")
        .unwrap()["content"];
    assert_eq!(parts[0]["text"], "What is this?", "{parts}");
    assert_eq!(
        parts[1]["image_url"]["url"],
        format!("data:image/png;base64,{}", base64(&image)),
        "{parts}"
    );
    assert_eq!(received[1].body["model"], "blind-1");
    let errors: Vec<String> = errors.iter().map(says).collect();
    assert!(
        errors[0].contains("prompt block 1") && errors[0].contains("base64"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("data URI") && errors[1].contains(";base64"),
        "{errors:?}"
    );
    assert!(errors[2].contains("over the limit"), "{errors:?}");
    assert!(
        errors[3].contains("`blind` cannot see images"),
        "{errors:?}"
    );

    // Another agent process replays the prompt with its image.
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            load_session(&cx, &session, cwd).await?;
            Ok(())
        })
        .await;
    drop(child);
    let replayed: Vec<ContentBlock> = editor
        .updates()
        .into_iter()
        .filter_map(|u| match u {
            SessionUpdate::UserMessageChunk(chunk) => Some(chunk.content),
            _ => None,
        })
        .collect();
    let images: Vec<&ImageContent> = replayed
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Image(i) => Some(i),
            _ => None,
        })
        .collect();
    assert_eq!(images.len(), 1, "{replayed:?}");
    assert_eq!(images[0].mime_type, "image/png");
    assert_eq!(images[0].data, base64(&image));
}

#[tokio::test(flavor = "multi_thread")]
async fn images_are_offered_as_the_default_model_sees_and_follow_the_sessions_model() {
    let dirs = Dirs::new();
    let mock = MockServer::start(vec![Reply::sse(openai_sse("A red dot.", &[]))]).await;
    let config = config_defaulting_to(dirs.home(), &mock.url, "blind");
    let (child, transport, _) = spawn_with(dirs.home(), &config_args(dirs.home(), &config));
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let data = base64(&png());
    let (offered, refused, stop) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            let session = new_session(&cx, cwd).await?;
            // The session's model (the default) cannot see: an error
            // naming it, nothing sent to a model.
            let refused = cx
                .send_request(image_prompt(&session, "What is this?", data.clone()))
                .block_task()
                .await
                .unwrap_err();
            // Switched to a model that can, the session takes the image.
            set_option(&cx, &session, "model", "eye").await?;
            let stop = cx
                .send_request(image_prompt(&session, "And now?", data))
                .block_task()
                .await?
                .stop_reason;
            Ok((
                init.agent_capabilities.prompt_capabilities.image,
                refused,
                stop,
            ))
        })
        .await;
    drop(child);
    // `eye` can see, but new sessions start on `blind`: not offered.
    assert!(!offered, "images offered though the default model is blind");
    assert_eq!(i32::from(refused.code), -32602, "{refused:?}");
    assert!(
        says(&refused).contains("`blind` cannot see images"),
        "{refused:?}"
    );
    assert_eq!(stop, StopReason::EndTurn);
    let received = mock.received();
    assert_eq!(received.len(), 1, "the refused prompt reached no model");
    assert_eq!(received[0].body["model"], "eye-1");
    let user = received[0].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|m| m["role"] == "user")
        .unwrap()["content"]
        .clone();
    assert!(
        user[1]["image_url"]["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("data:image/png;base64,")),
        "{user}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_and_the_title_reach_the_editor() {
    let dirs = Dirs::new();
    let mock = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Looking.",
            &[Call {
                id: "c1",
                name: "list_dir",
                arguments: serde_json::json!({"path": "."}),
            }],
        )),
        Reply::sse(openai_sse("Nothing there.", &[])),
    ])
    .await;
    let args = config_args(dirs.home(), &config(dirs.home(), &mock.url));
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let (responses, listed) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let mut responses: Vec<PromptResponse> = Vec::new();
            for text in [
                "\n  What is in   this folder, and which of its files were changed last week?\nBe brief.",
                "Again?",
            ] {
                responses.push(
                    cx.send_request(prompt_request(&session, text))
                        .block_task()
                        .await?,
                );
            }
            let listed = cx
                .send_request(ListSessionsRequest::new())
                .block_task()
                .await?;
            Ok((responses, listed))
        })
        .await;
    drop(child);
    let updates = editor.updates();
    let titles: Vec<String> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::SessionInfoUpdate(info) => {
                Some(serde_json::to_value(info).unwrap()["title"].to_string())
            }
            _ => None,
        })
        .collect();
    // The first line, its spaces collapsed, cut at 60 characters.
    assert_eq!(
        titles,
        ["\"What is in this folder, and which of its files were changed…\""],
        "one title, from the first prompt"
    );
    // session/list names the session as the editor was told.
    assert_eq!(listed.sessions.len(), 1, "{listed:?}");
    assert_eq!(
        listed.sessions[0]
            .title
            .as_ref()
            .map(|t| serde_json::to_value(t).unwrap().to_string()),
        Some(titles[0].clone())
    );
    let usage: Vec<(u64, u64, f64)> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::UsageUpdate(u) => {
                Some((u.used, u.size, u.cost.as_ref().map_or(-1.0, |c| c.amount)))
            }
            _ => None,
        })
        .collect();
    // One per model call (two, then one): 100 + 20 tokens each, in a
    // 128,000-token window; the cost grows by (100 × 2 + 20 × 8) / 1e6
    // (cached tokens at the input price: no cached price is set).
    assert_eq!(usage.len(), 3, "{usage:?}");
    for (n, (used, size, cost)) in usage.iter().enumerate() {
        assert_eq!((*used, *size), (120, 128_000));
        let expected = (n + 1) as f64 * 360e-6;
        assert!((cost - expected).abs() < 1e-9, "{usage:?}");
    }
    let turn = responses[0].usage.as_ref().expect("the turn's usage");
    assert_eq!(
        (
            turn.input_tokens,
            turn.output_tokens,
            turn.total_tokens,
            turn.cached_read_tokens
        ),
        (200, 40, 240, Some(80))
    );
    assert_eq!(
        responses[1].usage.as_ref().map(|u| u.total_tokens),
        Some(120)
    );
}

/// A model whose first answer streams slowly (a second and more), so that a
/// second prompt comes while the first one's turn runs; `first` is what it
/// streams.
async fn slow_first(first: String, then: Vec<Reply>) -> MockServer {
    let mut replies = vec![Reply::Sse {
        body: first,
        chunk: 48,
        delay: Duration::from_millis(120),
    }];
    replies.extend(then);
    MockServer::start(replies).await
}

/// Two prompts, the second sent once the first one's turn shows its first
/// words; each prompt's answer with the agent message text seen by then,
/// and every message the agent wrote, in wire order.
async fn two_prompts_at_once(
    args: &[String],
    home: &Path,
    cwd: PathBuf,
) -> (Vec<(StopReason, String)>, Vec<serde_json::Value>) {
    let (child, transport, _) = spawn_with(home, args);
    let editor = Editor::new();
    let seen = editor.updates.clone();
    let answered = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let first = cx.send_request(prompt_request(&session, "first question"));
            first_words(&seen).await;
            let second = cx.send_request(prompt_request(&session, "second question"));
            let text = |seen: &Arc<Mutex<Vec<SessionUpdate>>>| words(&seen.lock().unwrap());
            // Which answer the client reads first is not asserted: answers
            // sent together may be polled in either order by `join!`. What
            // each prompt's answer saw by then says when it came.
            let (s1, s2) = (seen.clone(), seen.clone());
            let (a, b) = tokio::join!(
                async move {
                    let r = first.block_task().await;
                    r.map(|r| (r.stop_reason, text(&s1)))
                },
                async move {
                    let r = second.block_task().await;
                    r.map(|r| (r.stop_reason, text(&s2)))
                }
            );
            Ok(vec![a?, b?])
        })
        .await;
    let wire = child.check.messages();
    drop(child);
    (answered, wire)
}

/// [`config`] with `prompt_while_running = "interject"`.
fn interjecting(home: &Path, url: &str) -> PathBuf {
    let config = config(home, url);
    let mut toml = std::fs::read_to_string(&config).unwrap();
    toml.push_str("[acp]\nprompt_while_running = \"interject\"\n");
    std::fs::write(&config, toml).unwrap();
    config
}

/// Waits (4 s at most) for the agent's first words in `seen`.
async fn first_words(seen: &Arc<Mutex<Vec<SessionUpdate>>>) {
    for _ in 0..200 {
        if !words(&seen.lock().unwrap()).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The agent's words in `updates`, joined.
fn words(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(c) => Some(text_of(&c.content)),
            _ => None,
        })
        .collect()
}

/// Asserts that the last user message of `request` contains `words`.
fn assert_last_user_words(request: &support::Received, words: &str) {
    let users = user_texts(request);
    assert!(users.last().is_some_and(|u| u.contains(words)), "{users:?}");
}

/// The user messages of a request to the mock.
fn user_texts(request: &support::Received) -> Vec<String> {
    request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_during_a_turn_is_queued_and_answered_after_it() {
    let dirs = Dirs::new();
    let mock = slow_first(
        openai_sse(&"The first answer, slowly. ".repeat(12), &[]),
        vec![Reply::sse(openai_sse("The second answer.", &[]))],
    )
    .await;
    let args = config_args(dirs.home(), &config(dirs.home(), &mock.url));
    let (answers, wire) = two_prompts_at_once(&args, dirs.home(), dirs.cwd()).await;
    assert_eq!(answers[0].0, StopReason::EndTurn);
    assert_eq!(answers[1].0, StopReason::EndTurn);
    let first_answer = "The first answer, slowly. ".repeat(12);
    assert!(answers[0].1.starts_with(&first_answer), "{answers:?}");
    assert!(answers[1].1.ends_with("The second answer."), "{answers:?}");
    // On the wire (the client may poll answers sent together in either
    // order): the first turn's words, its answer, then the queued turn's
    // words and its answer; nothing of one turn inside the other.
    let mut words = String::new();
    let mut order = Vec::new();
    for message in &wire {
        if let Some(reason) = message["result"]["stopReason"].as_str() {
            order.push(format!("answer {reason} after {} bytes", words.len()));
        }
        let update = &message["params"]["update"];
        if update["sessionUpdate"] == "agent_message_chunk" {
            words.push_str(update["content"]["text"].as_str().unwrap_or_default());
        }
    }
    assert_eq!(words, format!("{first_answer}The second answer."));
    assert_eq!(
        order,
        [
            format!("answer end_turn after {} bytes", first_answer.len()),
            format!("answer end_turn after {} bytes", words.len()),
        ],
        "{wire:#?}"
    );
    // Two turns, the second after the first: it read the first answer.
    let received = mock.received();
    assert_eq!(received.len(), 2);
    let second = received[1].body["messages"].to_string();
    assert!(
        second.find("The first answer").unwrap() < second.find("second question").unwrap(),
        "{second}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_during_a_turn_can_land_in_the_running_turn() {
    let dirs = Dirs::new();
    // The running turn lists the folder, slowly written, then answers.
    let mock = slow_first(
        openai_sse(
            &"Let me look around first. ".repeat(10),
            &[Call {
                id: "c1",
                name: "list_dir",
                arguments: serde_json::json!({"path": "."}),
            }],
        ),
        vec![Reply::sse(openai_sse("Answered both.", &[]))],
    )
    .await;
    let config = interjecting(dirs.home(), &mock.url);
    let args = config_args(dirs.home(), &config);
    let (answers, _) = two_prompts_at_once(&args, dirs.home(), dirs.cwd()).await;
    assert_eq!(answers[0].0, StopReason::EndTurn, "{answers:?}");
    assert_eq!(answers[1].0, StopReason::EndTurn, "{answers:?}");
    assert!(answers[0].1.ends_with("Answered both."), "{answers:?}");
    // The interjected prompt is answered once the turn that read it ended.
    assert!(answers[1].1.ends_with("Answered both."), "{answers:?}");
    // One turn of two model calls: the second read the words after the
    // call's result, as a user message.
    let received = mock.received();
    assert_eq!(received.len(), 2, "no turn of its own");
    let users = user_texts(&received[1]);
    assert_eq!(users.len(), 2, "{users:?}");
    assert!(users[1].contains("second question"), "{users:?}");
    let messages = received[1].body["messages"].to_string();
    assert!(
        messages.find("\"tool\"").unwrap() < messages.find("second question").unwrap(),
        "{messages}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn words_interjected_while_the_turn_asks_land_in_it_once_answered() {
    let dirs = Dirs::new();
    // The turn writes a file (which asks), then answers.
    let mock = MockServer::start(vec![
        writes("Writing.", "w1", "out.txt", "hi\n"),
        Reply::sse(openai_sse("Wrote it, and read your words.", &[])),
        Reply::sse(openai_sse("A turn of its own.", &[])),
    ])
    .await;
    let config = interjecting(dirs.home(), &mock.url);
    let (child, transport, _) = spawn_with(dirs.home(), &config_args(dirs.home(), &config));
    // The user takes a while to answer: the words come meanwhile.
    let editor = Editor::answering(Answer::Later("allow_once", 1_500));
    let asked = editor.asked.clone();
    let cwd = dirs.cwd();
    let model = &mock;
    let answers = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let first = cx.send_request(prompt_request(&session, "write it"));
            for _ in 0..200 {
                if !asked.lock().unwrap().is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(asked.lock().unwrap().len(), 1, "the turn asks first");
            let second = cx.send_request(prompt_request(&session, "also say hello"));
            // Each answer, with the model calls made by the time it came:
            // the second is answered once the turn it joined has ended
            // (both after the turn's second model call; which of the two
            // answers is read first is up to the join).
            let (a, b) = tokio::join!(
                async {
                    let r = first.block_task().await;
                    (r, model.received().len())
                },
                async {
                    let r = second.block_task().await;
                    (r, model.received().len())
                }
            );
            assert_eq!((a.1, b.1), (2, 2), "answered before the turn ended");
            let (a, b) = (a.0, b.0);
            // The session goes on.
            let third = prompt(&cx, &session, "and then?").await?;
            Ok([a?.stop_reason, b?.stop_reason, third])
        })
        .await;
    drop(child);
    // Never refused: both answered when the turn ended.
    assert_eq!(answers, [StopReason::EndTurn; 3], "{answers:?}");
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("out.txt")).unwrap(),
        "hi\n"
    );
    // The turn went on after the answer with the words read after the
    // call's result, as a user message: two model calls, then the third
    // prompt's.
    let received = mock.received();
    assert_eq!(received.len(), 3, "model calls");
    let users = user_texts(&received[1]);
    assert_eq!(users.len(), 2, "{users:?}");
    assert!(users[1].contains("also say hello"), "{users:?}");
    let messages = received[1].body["messages"].to_string();
    assert!(
        messages.find("\"tool\"").unwrap() < messages.find("also say hello").unwrap(),
        "{messages}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn words_too_late_for_the_turn_start_one_that_is_shown_and_asked_about() {
    let dirs = Dirs::new();
    // The running turn answers without a call, slowly: the words come
    // while it writes, too late for it. The turn they start writes a file
    // (which asks), then answers.
    let mock = slow_first(
        openai_sse(&"A long answer. ".repeat(12), &[]),
        vec![
            writes("Writing.", "w1", "out.txt", "hi\n"),
            Reply::sse(openai_sse("Wrote it.", &[])),
        ],
    )
    .await;
    let config = interjecting(dirs.home(), &mock.url);
    let args = config_args(dirs.home(), &config);
    let (answers, wire) = two_prompts_at_once(&args, dirs.home(), dirs.cwd()).await;
    assert_eq!(answers[0].0, StopReason::EndTurn, "{answers:?}");
    assert_eq!(answers[1].0, StopReason::EndTurn, "{answers:?}");
    // The first prompt showed the turn its words started, to its end.
    assert!(answers[0].1.ends_with("Writing.Wrote it."), "{answers:?}");
    // Its call was asked about (the editor allows), ran and completed.
    let asked: Vec<_> = wire
        .iter()
        .filter(|m| m["method"] == "session/request_permission")
        .collect();
    assert_eq!(asked.len(), 1, "{wire:#?}");
    assert_eq!(asked[0]["params"]["toolCall"]["toolCallId"], "w1");
    assert!(
        wire.iter().any(|m| {
            let update = &m["params"]["update"];
            update["toolCallId"] == "w1" && update["status"] == "completed"
        }),
        "{wire:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(dirs.project().join("out.txt")).unwrap(),
        "hi\n"
    );
    // Two turns: the second began with the words, as a user message.
    let received = mock.received();
    assert_eq!(received.len(), 3, "model calls");
    assert_last_user_words(&received[1], "second question");
}

#[tokio::test(flavor = "multi_thread")]
async fn words_for_a_turn_that_fails_start_one_that_is_shown_after_the_failure() {
    let dirs = Dirs::new();
    // The running turn's model thinks, then refuses the request: the words
    // that came meanwhile start the next turn.
    let mock = MockServer::start(vec![
        Reply::Late {
            after: Duration::from_millis(1_000),
            reply: Box::new(Reply::Status {
                code: 400,
                headers: vec![("content-type".into(), "application/json".into())],
                body: r#"{"error":{"message":"the request is malformed","type":"invalid_request_error"}}"#.into(),
            }),
        },
        Reply::sse(openai_sse("Answered the second.", &[])),
    ])
    .await;
    let config = interjecting(dirs.home(), &mock.url);
    let (child, transport, _) = spawn_with(dirs.home(), &config_args(dirs.home(), &config));
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let model = &mock;
    let answers = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let first = cx.send_request(prompt_request(&session, "first question"));
            while model.received().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let second = cx.send_request(prompt_request(&session, "second question"));
            let (a, b) = tokio::join!(first.block_task(), second.block_task());
            Ok([a?.stop_reason, b?.stop_reason])
        })
        .await;
    drop(child);
    // Both answered when the second turn ended; its words shown after the
    // first one's failure.
    assert_eq!(answers, [StopReason::EndTurn; 2]);
    let said = words(&editor.updates());
    assert!(said.starts_with("The turn failed: "), "{said}");
    assert!(said.contains("the request is malformed"), "{said}");
    assert!(said.ends_with("Answered the second."), "{said}");
    let received = mock.received();
    assert_eq!(received.len(), 2, "model calls");
    assert_last_user_words(&received[1], "second question");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_sent_right_after_a_cancel_runs_on_its_own() {
    let dirs = Dirs::new();
    let mock = slow_first(
        openai_sse(&"A long answer. ".repeat(12), &[]),
        vec![Reply::sse(openai_sse("Answered the second.", &[]))],
    )
    .await;
    let config = interjecting(dirs.home(), &mock.url);
    let (child, transport, _) = spawn_with(dirs.home(), &config_args(dirs.home(), &config));
    let editor = Editor::new();
    let seen = editor.updates.clone();
    let cwd = dirs.cwd();
    let answers = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let session = open_session(&cx, ClientCapabilities::new(), cwd).await?;
            let first = cx.send_request(prompt_request(&session, "first question"));
            first_words(&seen).await;
            // The user stops the turn and asks again at once, while it
            // is still ending.
            cx.send_notification(CancelNotification::new(session.clone()))?;
            let second = cx.send_request(prompt_request(&session, "second question"));
            let (a, b) = tokio::join!(first.block_task(), second.block_task());
            Ok([a?.stop_reason, b?.stop_reason])
        })
        .await;
    drop(child);
    assert_eq!(answers, [StopReason::Cancelled, StopReason::EndTurn]);
    // Its own turn, shown: not words for the cancelled one.
    let said = words(&editor.updates());
    assert!(said.ends_with("Answered the second."), "{said}");
    let received = mock.received();
    assert_eq!(received.len(), 2, "model calls");
    assert_last_user_words(&received[1], "second question");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_editors_other_folders_are_in_reach_and_named_to_the_model() {
    let dirs = Dirs::new();
    let other = tempfile::tempdir().unwrap();
    let other_root = other.path().canonicalize().unwrap();
    let target = other_root.join("lib.txt");
    std::fs::write(&target, "from the other folder\n").unwrap();
    let mock = MockServer::start(vec![
        Reply::sse(openai_sse(
            "Reading.",
            &[Call {
                id: "r1",
                name: "read_file",
                arguments: serde_json::json!({"path": target}),
            }],
        )),
        Reply::sse(openai_sse("Read.", &[])),
    ])
    .await;
    let args = config_args(dirs.home(), &config(dirs.home(), &mock.url));
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let (cwd, roots) = (dirs.cwd(), vec![other_root.clone()]);
    let (offered, bad_root) = editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            let init = initialize(&cx, ClientCapabilities::new()).await?;
            let offered = init
                .agent_capabilities
                .session_capabilities
                .additional_directories
                .is_some();
            let session = cx
                .send_request(NewSessionRequest::new(cwd.clone()).additional_directories(roots))
                .block_task()
                .await?
                .session_id;
            assert_eq!(prompt(&cx, &session, "read it").await?, StopReason::EndTurn);
            let bad_root = cx
                .send_request(
                    NewSessionRequest::new(cwd).additional_directories(vec!["not/absolute".into()]),
                )
                .block_task()
                .await
                .unwrap_err();
            Ok((offered, bad_root))
        })
        .await;
    drop(child);
    assert!(
        offered,
        "initialize offers sessionCapabilities.additionalDirectories"
    );
    assert!(
        results(&editor.updates()).contains("from the other folder"),
        "{:?}",
        editor.updates()
    );
    // Named to the model in the system prompt of each step.
    let received = mock.received();
    let system = received[0].body["messages"][0].to_string();
    assert!(
        system.contains(&other_root.display().to_string()),
        "{system}"
    );
    assert!(says(&bad_root).contains("`not/absolute`"), "{bad_root:?}");
}
