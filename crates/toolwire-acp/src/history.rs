//! The session lifecycle beyond new/load: `session/list`,
//! `session/resume` (load without the replay), `session/close`,
//! `session/delete` (out of the history),
//! `session/fork` (the tree's fork at the session's active leaf) and
//! `session/set_mode`. What they read is stored (`sessions.rs`), so a
//! session made by one agent process is listed, loaded and resumed by
//! another on the same database.

use agent_client_protocol::Client;
use agent_client_protocol::v1::schema::{
    CloseSessionRequest, CloseSessionResponse, ConfigOptionUpdate, CurrentModeUpdate,
    DeleteSessionRequest, DeleteSessionResponse, ForkSessionRequest, ForkSessionResponse,
    ListSessionsRequest, ListSessionsResponse, ResumeSessionRequest, ResumeSessionResponse,
    SessionAdditionalDirectoriesCapabilities, SessionCapabilities, SessionCloseCapabilities,
    SessionDeleteCapabilities, SessionForkCapabilities, SessionId, SessionListCapabilities,
    SessionModeId, SessionNotification, SessionResumeCapabilities, SessionUpdate,
    SetSessionModeRequest, SetSessionModeResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use toolwire_core::TrackerMetrics;
use toolwire_engine::EngineError;

use crate::errors::{AcpResult, internal, invalid_params};
use crate::modes::SessionMode;
use crate::{AcpAgent, config, modes, policy, sessions};

/// What `initialize` offers of the lifecycle.
pub(crate) fn capabilities() -> SessionCapabilities {
    SessionCapabilities::new()
        .list(SessionListCapabilities::new())
        .resume(SessionResumeCapabilities::new())
        .close(SessionCloseCapabilities::new())
        .additional_directories(SessionAdditionalDirectoriesCapabilities::new())
        .delete(SessionDeleteCapabilities::new())
        .fork(SessionForkCapabilities::new())
}

/// Tells the editor the session's mode (after a change it did not make
/// through `session/set_mode`).
pub(crate) fn send_mode(
    cx: &ConnectionTo<Client>,
    id: &SessionId,
    mode: SessionMode,
) -> Result<(), agent_client_protocol::Error> {
    cx.send_notification(SessionNotification::new(
        id.clone(),
        SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(SessionModeId::new(mode.id()))),
    ))
}

impl AcpAgent {
    pub(crate) async fn list_sessions(
        &self,
        request: ListSessionsRequest,
        responder: Responder<ListSessionsResponse>,
    ) -> AcpResult {
        match sessions::list(
            &self.engine,
            request.cwd.as_deref(),
            request.cursor.as_deref(),
        )
        .await
        {
            Ok(page) => responder.respond(page),
            Err(e) => responder.respond_with_error(e),
        }
    }

    /// `session/resume`: the stored session opened as `session/load` opens
    /// it, without replaying its history.
    pub(crate) async fn resume_session(
        &self,
        request: ResumeSessionRequest,
        responder: Responder<ResumeSessionResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        let (id, _branch, mode) = match self
            .open_stored(
                &request.session_id,
                &request.cwd,
                &request.additional_directories,
                &request.mcp_servers,
                &cx,
            )
            .await
        {
            Ok(opened) => opened,
            Err(e) => return responder.respond_with_error(e),
        };
        tracing::info!(session = %id.0, "ACP session/resume");
        responder.respond(
            ResumeSessionResponse::new()
                .modes(modes::state(mode))
                .config_options(self.config_options(&id)),
        )?;
        self.announce_commands(id, cx)
    }

    /// `session/close`: a running prompt is cancelled, and the session's
    /// tools, MCP servers and watcher close. What is stored stays: it can
    /// be loaded or resumed again.
    pub(crate) fn close_session(
        &self,
        request: CloseSessionRequest,
        responder: Responder<CloseSessionResponse>,
    ) -> AcpResult {
        let id = &request.session_id;
        if !self.close(id) {
            return responder.respond_with_error(invalid_params(format!(
                "unknown session `{}`: it is not open in this agent",
                id.0
            )));
        }
        tracing::info!(session = %id.0, "ACP session/close");
        responder.respond(CloseSessionResponse::new())
    }

    /// Closes session `id` if this agent has it open (or parked): its
    /// prompt is cancelled, its tools and options dropped. Says whether
    /// it had.
    fn close(&self, id: &SessionId) -> bool {
        let open = self.sessions.lock().ok().and_then(|mut s| s.remove(&id.0));
        let parked = self.parked.lock().ok().and_then(|mut p| p.remove(&id.0));
        if let Some(session) = &open {
            session
                .cancelled
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.engine.cancel(session.conversation);
            self.engine
                .forget_conversation_options(session.conversation);
        }
        open.is_some() || parked.is_some()
    }

    /// `session/delete`: the session leaves the history (closed first if
    /// open here). It is no longer listed, loaded, resumed or forked, by
    /// this agent or another on the database; its conversation stays
    /// stored, as every conversation does (the HTTP API and the live view
    /// still show it).
    pub(crate) async fn delete_session(
        &self,
        request: DeleteSessionRequest,
        responder: Responder<DeleteSessionResponse>,
    ) -> AcpResult {
        let id = &request.session_id;
        let (conversation, record) = match sessions::stored(&self.engine, id).await {
            Ok((conversation, Some(record))) => (conversation.id, record),
            Ok((_, None)) => {
                return responder.respond_with_error(invalid_params(format!(
                    "unknown session `{}`: no editor session has it in its history",
                    id.0
                )));
            }
            Err(e) => return responder.respond_with_error(e),
        };
        self.close(id);
        sessions::save(
            &self.engine,
            conversation,
            &sessions::SessionRecord {
                deleted: true,
                ..record
            },
        )
        .await;
        tracing::info!(session = %id.0, "ACP session/delete");
        responder.respond(DeleteSessionResponse::new())
    }

    /// `session/fork`: a new session holding the path to the session's
    /// active leaf (the tree's fork there), in `cwd`, with the session's
    /// mode and model.
    pub(crate) async fn fork_session(
        &self,
        request: ForkSessionRequest,
        responder: Responder<ForkSessionResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        match self
            .fork(
                &request.session_id,
                &request.cwd,
                &request.additional_directories,
                &request.mcp_servers,
                &cx,
            )
            .await
        {
            Ok((id, mode)) => {
                responder.respond(
                    ForkSessionResponse::new(id.clone())
                        .modes(modes::state(mode))
                        .config_options(self.config_options(&id)),
                )?;
                self.announce_commands(id, cx)
            }
            Err(e) => responder.respond_with_error(e),
        }
    }

    /// Forks stored session `source` at its active leaf and opens the fork
    /// in `cwd`; returns its id and mode.
    pub(crate) async fn fork(
        &self,
        source: &SessionId,
        cwd: &std::path::Path,
        additional: &[std::path::PathBuf],
        mcp_servers: &[agent_client_protocol::v1::schema::McpServer],
        cx: &ConnectionTo<Client>,
    ) -> Result<(SessionId, SessionMode), agent_client_protocol::Error> {
        self.check_key()?;
        let (from, source) = sessions::stored(&self.engine, source).await?;
        let forked = match self.engine.fork(from.active_leaf).await {
            Ok(c) => c,
            Err(EngineError::TurnInProgress(_)) => {
                return Err(invalid_params(
                    "a prompt is running in this session: fork it once the prompt is answered",
                ));
            }
            Err(e) => return Err(internal(e)),
        };
        let from = from.id;
        let mode = source
            .as_ref()
            .map_or(self.settings.default_mode, |r| r.mode);
        if let Ok(Some(model)) = self.engine.chosen_model(from).await
            && let Err(e) = self.engine.choose_model(forked.id, Some(&model)).await
        {
            tracing::warn!(error = %e, "the fork keeps the default model");
        }
        let id = SessionId::new(forked.id.to_string());
        let tools = self
            .tools_for(cwd, additional, mcp_servers, &id, cx, mode)
            .await?;
        sessions::save(
            &self.engine,
            forked.id,
            &sessions::SessionRecord {
                title: source.as_ref().and_then(|r| r.title.clone()),
                reasoning_effort: source.and_then(|r| r.reasoning_effort),
                ..sessions::SessionRecord::new(cwd, additional, mode)
            },
        )
        .await;
        // Its "always" answers are the source's, stored for it too.
        let permissions = policy::Permissions::load(&self.engine, from).await;
        if permissions != policy::Permissions::default() {
            permissions.save(&self.engine, forked.id).await;
        }
        let id = self
            .insert(
                forked.id,
                tools,
                cwd.to_path_buf(),
                permissions,
                mcp_servers.to_vec().into(),
                TrackerMetrics::default(),
            )
            .await;
        tracing::info!(session = %id.0, from = %from, "ACP session/fork");
        Ok((id, mode))
    }

    /// `session/set_mode`: the session's mode, kept with it; the config
    /// options (which hold the mode too) are sent again.
    pub(crate) async fn set_mode(
        &self,
        request: SetSessionModeRequest,
        responder: Responder<SetSessionModeResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        let mode = match SessionMode::parse(&request.mode_id.0) {
            Ok(mode) => mode,
            Err(e) => return responder.respond_with_error(invalid_params(e)),
        };
        let session = match self.open(&request.session_id, &cx).await {
            Ok(session) => session,
            Err(e) => return responder.respond_with_error(e),
        };
        sessions::apply_mode(&self.engine, &session, mode).await;
        tracing::info!(session = %request.session_id.0, mode = mode.id(), "ACP session/set_mode");
        responder.respond(SetSessionModeResponse::new())?;
        cx.send_notification(SessionNotification::new(
            request.session_id,
            SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(config::options(
                &self.engine,
                &session,
            ))),
        ))
    }
}
