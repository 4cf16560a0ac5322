//! The session history: `session/list` (title, cwd, other roots, update time; paged;
//! by cwd), `session/resume` (no replay), `session/close`,
//! `session/delete` and `session/fork`, across two agent processes on one
//! database; and the errors for what is not there.

use agent_client_protocol::v1::schema::{
    CloseSessionRequest, DeleteSessionRequest, ForkSessionRequest, ListSessionsRequest,
    ResumeSessionRequest, SessionInfo, SetSessionModeRequest,
};

use super::*;

const ANSWER: &str = "steps:\n  - text: \"Noted.\"\n";

/// The JSON-RPC error's data, as text.
fn data(e: &AcpError) -> String {
    e.data.clone().unwrap_or_default().to_string()
}

/// Every page of `session/list` (of `cwd` when given), and the number of
/// pages.
async fn list_all(
    cx: &ConnectionTo<Agent>,
    cwd: Option<PathBuf>,
) -> Result<(Vec<SessionInfo>, usize), AcpError> {
    let mut sessions = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = cx
            .send_request(ListSessionsRequest::new().cwd(cwd.clone()).cursor(cursor))
            .block_task()
            .await?;
        pages += 1;
        sessions.extend(page.sessions);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok((sessions, pages)),
        }
    }
}

fn user_text(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::UserMessageChunk(chunk) => Some(text_of(&chunk.content)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_listed_resumed_closed_and_forked_by_another_process() {
    let dirs = Dirs::new();
    let other = tempfile::tempdir().unwrap();
    let other_cwd = other.path().to_path_buf();
    let script = write_file(dirs.home(), "answer.yaml", ANSWER);
    let args = scripted_args(&script, &dirs.db());

    // Process A: a session in the project, titled by its first prompt,
    // one elsewhere, and enough more for a second page.
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let (cwd, elsewhere) = (dirs.cwd(), other_cwd.clone());
    let (first, second, errors) = editor
        .run_within(120, transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let first = new_session(&cx, cwd.clone()).await?;
            prompt(&cx, &first, "\n  fix the parser\nthen the lexer").await?;
            // Elsewhere, with the project as another root.
            let second = cx
                .send_request(
                    NewSessionRequest::new(elsewhere.clone())
                        .additional_directories(vec![cwd.clone()]),
                )
                .block_task()
                .await?
                .session_id;
            prompt(&cx, &second, "second thread").await?;
            for _ in 0..31 {
                new_session(&cx, elsewhere.clone()).await?;
            }
            // Closing frees it here; a second close names what is wrong.
            cx.send_request(CloseSessionRequest::new(second.clone()))
                .block_task()
                .await?;
            let closed_twice = cx
                .send_request(CloseSessionRequest::new(second.clone()))
                .block_task()
                .await
                .unwrap_err();
            let unknown_mode_session = cx
                .send_request(SetSessionModeRequest::new("no-such-session", "ask"))
                .block_task()
                .await
                .unwrap_err();
            let bad_cursor = cx
                .send_request(ListSessionsRequest::new().cursor("not-a-session".to_owned()))
                .block_task()
                .await
                .unwrap_err();
            let unknown_resume = cx
                .send_request(ResumeSessionRequest::new("no-such-session", cwd.clone()))
                .block_task()
                .await
                .unwrap_err();
            // The session is still usable after all that.
            assert_eq!(
                prompt(&cx, &first, "still there?").await?,
                StopReason::EndTurn
            );
            Ok((
                first,
                second,
                [
                    closed_twice,
                    unknown_mode_session,
                    bad_cursor,
                    unknown_resume,
                ],
            ))
        })
        .await;
    drop(child);
    let [
        closed_twice,
        unknown_mode_session,
        bad_cursor,
        unknown_resume,
    ] = &errors;
    assert!(
        data(closed_twice).contains(&second.0.to_string()),
        "{closed_twice:?}"
    );
    assert!(
        data(unknown_mode_session).contains("`no-such-session`"),
        "{unknown_mode_session:?}"
    );
    assert!(
        data(bad_cursor).contains("`not-a-session`"),
        "{bad_cursor:?}"
    );
    assert!(
        data(unknown_resume).contains("`no-such-session`"),
        "{unknown_resume:?}"
    );

    // Process B, same database: lists them, resumes one without a replay,
    // loads the other with one, forks the first.
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let (cwd, elsewhere) = (dirs.cwd(), other_cwd.clone());
    let (s1, s2) = (first.clone(), second.clone());
    let watching = editor.clone();
    let (all, pages, project_only, after_resume, forked, listed_after_fork) = editor
        .run_within(120, transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let (all, pages) = list_all(&cx, None).await?;
            let (project_only, _) = list_all(&cx, Some(cwd.clone())).await?;
            let resumed = cx
                .send_request(ResumeSessionRequest::new(s1.clone(), cwd.clone()))
                .block_task()
                .await?;
            assert_eq!(
                resumed.modes.map(|m| m.current_mode_id.0.to_string()),
                Some("ask".to_owned())
            );
            round_trip(&cx).await;
            let after_resume = user_text(&watching.updates());
            assert_eq!(prompt(&cx, &s1, "resumed").await?, StopReason::EndTurn);
            load_session(&cx, &s2, elsewhere.clone()).await?;
            let forked = cx
                .send_request(
                    ForkSessionRequest::new(s1.clone(), cwd.clone())
                        .additional_directories(vec![elsewhere.clone()]),
                )
                .block_task()
                .await?;
            assert_eq!(
                prompt(&cx, &forked.session_id, "in the fork").await?,
                StopReason::EndTurn
            );
            let (listed_after_fork, _) = list_all(&cx, Some(cwd.clone())).await?;
            Ok((
                all,
                pages,
                project_only,
                after_resume,
                forked.session_id,
                listed_after_fork,
            ))
        })
        .await;
    drop(child);
    assert_eq!(all.len(), 33, "{all:?}");
    assert_eq!(pages, 2, "32 a page");
    // Newest first: the first session was prompted last.
    assert_eq!(all[0].session_id, first);
    assert_eq!(all[0].title.as_deref(), Some("fix the parser"));
    assert_eq!(all[0].cwd, dirs.cwd());
    assert!(
        all[0]
            .updated_at
            .as_deref()
            .is_some_and(|t| t.ends_with('Z')),
        "{:?}",
        all[0]
    );
    let s2_info = all.iter().find(|s| s.session_id == second).unwrap();
    assert_eq!(s2_info.title.as_deref(), Some("second thread"));
    assert_eq!(s2_info.cwd, other_cwd);
    // Each with the roots it was opened with.
    assert_eq!(s2_info.additional_directories, vec![dirs.cwd()]);
    assert!(all[0].additional_directories.is_empty(), "{:?}", all[0]);
    // By cwd: only the project's.
    assert_eq!(project_only.len(), 1);
    assert_eq!(project_only[0].session_id, first);
    // Resume replays nothing.
    assert_eq!(after_resume, "");
    // Load replays; the fork holds the first session's history and is
    // listed under the project, titled as its source.
    let seen = user_text(&editor.updates());
    assert!(seen.contains("second thread"), "{seen}");
    assert_eq!(listed_after_fork.len(), 2, "{listed_after_fork:?}");
    assert_eq!(listed_after_fork[0].session_id, forked);
    assert_eq!(listed_after_fork[0].additional_directories, vec![other_cwd]);
    assert_eq!(
        listed_after_fork[0].title.as_deref(),
        Some("fix the parser")
    );

    // Process C loads the fork: its history is the source's up to the
    // fork, then its own prompt.
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    editor
        .run(transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            load_session(&cx, &forked, cwd).await?;
            Ok(())
        })
        .await;
    drop(child);
    let replayed = user_text(&editor.updates());
    assert!(
        replayed.contains("fix the parser")
            && replayed.contains("resumed")
            && replayed.ends_with("in the fork"),
        "{replayed}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_session_leaves_the_history_of_every_process() {
    let dirs = Dirs::new();
    let script = write_file(dirs.home(), "answer.yaml", ANSWER);
    let args = scripted_args(&script, &dirs.db());
    let ids = |sessions: &[SessionInfo]| -> Vec<SessionId> {
        sessions.iter().map(|s| s.session_id.clone()).collect()
    };

    // Process A deletes a session it has open; the other stays usable.
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let (kept, deleted, listed, errors) = editor
        .run_within(120, transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let kept = new_session(&cx, cwd.clone()).await?;
            prompt(&cx, &kept, "keep me").await?;
            let deleted = new_session(&cx, cwd.clone()).await?;
            prompt(&cx, &deleted, "delete me").await?;
            cx.send_request(DeleteSessionRequest::new(deleted.clone()))
                .block_task()
                .await?;
            let (listed, _) = list_all(&cx, None).await?;
            let mut errors = Vec::new();
            errors.push(prompt(&cx, &deleted, "still here?").await.unwrap_err());
            errors.push(load_session(&cx, &deleted, cwd.clone()).await.unwrap_err());
            for id in [deleted.clone(), SessionId::new("no-such-session")] {
                errors.push(
                    cx.send_request(DeleteSessionRequest::new(id))
                        .block_task()
                        .await
                        .unwrap_err(),
                );
            }
            assert_eq!(
                prompt(&cx, &kept, "still usable").await?,
                StopReason::EndTurn
            );
            Ok((kept, deleted, listed, errors))
        })
        .await;
    drop(child);
    assert_eq!(ids(&listed), std::slice::from_ref(&kept));
    let gone = format!("`{}` was deleted", deleted.0);
    for e in &errors[..3] {
        assert!(data(e).contains(&gone), "{e:?}");
    }
    assert!(
        data(&errors[3]).contains("`no-such-session`"),
        "{:?}",
        errors[3]
    );

    // Process B, same database: does not list, resume or fork it either,
    // and deletes the other.
    let (child, transport, _) = spawn_with(dirs.home(), &args);
    let editor = Editor::new();
    let cwd = dirs.cwd();
    let (s1, s2) = (kept.clone(), deleted.clone());
    let (before, after, errors) = editor
        .run_within(120, transport, async move |cx: ConnectionTo<Agent>| {
            initialize(&cx, ClientCapabilities::new()).await?;
            let (before, _) = list_all(&cx, None).await?;
            let errors = [
                cx.send_request(ResumeSessionRequest::new(s2.clone(), cwd.clone()))
                    .block_task()
                    .await
                    .unwrap_err(),
                cx.send_request(ForkSessionRequest::new(s2.clone(), cwd.clone()))
                    .block_task()
                    .await
                    .unwrap_err(),
            ];
            cx.send_request(DeleteSessionRequest::new(s1))
                .block_task()
                .await?;
            let (after, _) = list_all(&cx, None).await?;
            Ok((before, after, errors))
        })
        .await;
    drop(child);
    assert_eq!(ids(&before), [kept]);
    for e in &errors {
        assert!(data(e).contains(&gone), "{e:?}");
    }
    assert_eq!(after, []);
}

/// A request and its answer (an unknown session's close), after which the
/// agent's earlier notifications have arrived.
async fn round_trip(cx: &ConnectionTo<Agent>) {
    let closed = cx
        .send_request(CloseSessionRequest::new("round-trip"))
        .block_task()
        .await;
    assert!(closed.is_err());
}
