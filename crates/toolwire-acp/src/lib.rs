//! # toolwire-acp
//!
//! **Owns** toolwire's Agent Client Protocol (v1) front door: JSON-RPC over
//! a byte stream (stdio for `toolwire acp`), built with the
//! `agent-client-protocol` crate. An ACP session is one conversation of the
//! engine (the session id is the conversation id); the session's `cwd` is
//! the root of its built-in tools. The engine's events become
//! `session/update` notifications, tool calls through a
//! [`toolwire_core::ToolCallTracker`] so that every `tool_call_update`
//! carries only what changed.
//!
//! **Invariants.** ACP names and JSON live here and nowhere below; the
//! engine is used only through its public API. Nothing but the protocol is
//! written to the output stream (logs go through `tracing`). Every
//! `session/prompt` is answered exactly once, with `cancelled` after a
//! `session/cancel`.
//!
//! **Entry points.** [`serve`] (any reader/writer pair), [`serve_stdio`],
//! [`AcpError`].

mod convert;
mod session;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, InitializeRequest, InitializeResponse,
    LoadSessionRequest, LoadSessionResponse, McpCapabilities, McpServer, NewSessionRequest,
    NewSessionResponse, PromptCapabilities, PromptRequest, SessionId, SessionNotification,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, ByteStreams, Client};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use toolwire_core::ConversationId;
use toolwire_engine::Engine;
use toolwire_engine::tools::ToolRegistry;
use toolwire_engine::tools::builtin::{self, Workspace};
use toolwire_engine::tools::mcp::{self, McpServerConfig};

pub use convert::kind_of;

/// Why the ACP connection ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error("ACP connection: {0}")]
    Protocol(agent_client_protocol::Error),
}

/// Serves ACP on the process's stdin and stdout until stdin closes.
pub async fn serve_stdio(engine: Engine) -> Result<(), AcpError> {
    serve(engine, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Serves ACP, reading the client's messages from `input` and writing to
/// `output`, until `input` closes.
pub async fn serve(
    engine: Engine,
    input: impl AsyncRead + Send + Unpin + 'static,
    output: impl AsyncWrite + Send + Unpin + 'static,
) -> Result<(), AcpError> {
    let agent = AcpAgent {
        engine,
        sessions: Arc::new(Mutex::new(HashMap::new())),
    };
    let (a1, a2, a3, a4, a5) = (
        agent.clone(),
        agent.clone(),
        agent.clone(),
        agent.clone(),
        agent,
    );
    Agent
        .v1()
        .name("toolwire")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                a1.initialize(request, responder)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                a2.new_session(request, responder).await
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                a3.load_session(request, responder, cx).await
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| a4.prompt(request, responder, cx),
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                a5.cancel(&notification.session_id);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(ByteStreams::new(output.compat_write(), input.compat()))
        .await
        .map_err(AcpError::Protocol)
}

/// One ACP session: its conversation and its tools.
#[derive(Clone)]
struct Session {
    conversation: ConversationId,
    tools: ToolRegistry,
    /// The root of the built-in tools.
    cwd: PathBuf,
    /// The session's "always" answers (stored, so a loaded session keeps
    /// them).
    permissions: Arc<Mutex<session::Permissions>>,
    /// Set by `session/cancel`; the running prompt answers `cancelled`.
    cancelled: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Clone)]
struct AcpAgent {
    engine: Engine,
    sessions: Arc<Mutex<HashMap<Arc<str>, Session>>>,
}

type AcpResult = Result<(), agent_client_protocol::Error>;

fn invalid_params(message: impl Into<String>) -> agent_client_protocol::Error {
    let message: String = message.into();
    agent_client_protocol::Error::invalid_params().data(serde_json::Value::String(message))
}

fn internal(message: impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::internal_error()
        .data(serde_json::Value::String(message.to_string()))
}

impl AcpAgent {
    fn initialize(
        &self,
        request: InitializeRequest,
        responder: Responder<InitializeResponse>,
    ) -> AcpResult {
        tracing::info!(client = ?request.client_info, "ACP initialize");
        let capabilities = AgentCapabilities::new()
            .load_session(true)
            .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
            .mcp_capabilities(McpCapabilities::new());
        responder.respond(
            InitializeResponse::new(agent_client_protocol::schema::ProtocolVersion::V1)
                .agent_capabilities(capabilities)
                .agent_info(agent_client_protocol::v1::schema::Implementation::new(
                    "toolwire",
                    env!("CARGO_PKG_VERSION"),
                )),
        )
    }

    /// The engine's tools with the built-in ones rooted at `cwd`, and the
    /// tools of the client's stdio MCP servers (a server that fails to
    /// start is logged and left out; other transports are not offered).
    async fn tools_for(
        &self,
        cwd: &Path,
        mcp_servers: &[McpServer],
    ) -> Result<ToolRegistry, agent_client_protocol::Error> {
        let workspace = Workspace::new(cwd)
            .map_err(|e| invalid_params(format!("cwd {}: {e}", cwd.display())))?;
        let mut tools = self.engine.tools().clone();
        for tool in builtin::all(Arc::new(workspace)) {
            tools.register(tool);
        }
        let configs = mcp_servers.iter().filter_map(|server| match server {
            McpServer::Stdio(stdio) => Some(McpServerConfig {
                name: stdio.name.clone(),
                command: stdio.command.display().to_string(),
                args: stdio.args.clone(),
                env: stdio
                    .env
                    .iter()
                    .map(|v| (v.name.clone(), v.value.clone()))
                    .collect(),
                timeout_secs: None,
            }),
            other => {
                tracing::warn!(server = ?other, "only stdio MCP servers are supported");
                None
            }
        });
        // connect_all logs each server that failed.
        let (servers, _warnings) = mcp::connect_all(configs).await;
        for server in servers {
            tools.register_source(server);
        }
        Ok(tools)
    }

    fn insert(
        &self,
        conversation: ConversationId,
        tools: ToolRegistry,
        cwd: PathBuf,
        permissions: session::Permissions,
    ) -> SessionId {
        let id: Arc<str> = conversation.to_string().into();
        let session = Session {
            conversation,
            tools,
            cwd,
            permissions: Arc::new(Mutex::new(permissions)),
            cancelled: Arc::default(),
        };
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(id.clone(), session);
        }
        SessionId::new(id)
    }

    fn session(&self, id: &SessionId) -> Option<Session> {
        self.sessions.lock().ok()?.get(&id.0).cloned()
    }

    async fn new_session(
        &self,
        request: NewSessionRequest,
        responder: Responder<NewSessionResponse>,
    ) -> AcpResult {
        let tools = match self.tools_for(&request.cwd, &request.mcp_servers).await {
            Ok(tools) => tools,
            Err(e) => return responder.respond_with_error(e),
        };
        let conversation = match self.engine.create_conversation(None).await {
            Ok(c) => c.id,
            Err(e) => return responder.respond_with_error(internal(e)),
        };
        let id = self.insert(
            conversation,
            tools,
            request.cwd.clone(),
            session::Permissions::default(),
        );
        tracing::info!(session = %id.0, cwd = %request.cwd.display(), "ACP session/new");
        responder.respond(NewSessionResponse::new(id))
    }

    async fn load_session(
        &self,
        request: LoadSessionRequest,
        responder: Responder<LoadSessionResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        let Ok(conversation) = request.session_id.0.parse::<ConversationId>() else {
            return responder.respond_with_error(invalid_params("unknown session"));
        };
        let store = self.engine.store();
        let branch = match store.conversation(conversation).await {
            Ok(c) => store.path_to(c.active_leaf).await,
            Err(e) => return responder.respond_with_error(invalid_params(format!("session: {e}"))),
        };
        let branch = match branch {
            Ok(branch) => branch,
            Err(e) => return responder.respond_with_error(internal(e)),
        };
        let tools = match self.tools_for(&request.cwd, &request.mcp_servers).await {
            Ok(tools) => tools,
            Err(e) => return responder.respond_with_error(e),
        };
        let permissions = session::Permissions::load(&self.engine, conversation).await;
        let id = self.insert(conversation, tools, request.cwd.clone(), permissions);
        tracing::info!(session = %id.0, "ACP session/load");
        // The history first, then the answer (as the protocol asks).
        for update in session::replay(&branch) {
            cx.send_notification(SessionNotification::new(id.clone(), update))?;
        }
        responder.respond(LoadSessionResponse::new())
    }

    /// Starts the turn outside the dispatch loop (so that `session/cancel`
    /// gets through while it runs); the turn answers the prompt.
    fn prompt(
        &self,
        request: PromptRequest,
        responder: Responder<agent_client_protocol::v1::schema::PromptResponse>,
        cx: ConnectionTo<Client>,
    ) -> AcpResult {
        let Some(session) = self.session(&request.session_id) else {
            return responder.respond_with_error(invalid_params("unknown session"));
        };
        session
            .cancelled
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let engine = self.engine.clone();
        let text = convert::prompt_text(&request.prompt);
        let session_id = request.session_id;
        cx.clone().spawn(async move {
            let answer = session::run_prompt(&engine, &session, session_id, &text, &cx).await;
            match answer {
                Ok(response) => responder.respond(response),
                Err(e) => responder.respond_with_error(e),
            }
        })
    }

    fn cancel(&self, id: &SessionId) {
        if let Some(session) = self.session(id) {
            session
                .cancelled
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let was_running = self.engine.cancel(session.conversation);
            tracing::info!(session = %id.0, was_running, "ACP session/cancel");
        }
    }
}
