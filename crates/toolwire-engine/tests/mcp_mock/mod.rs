//! For the MCP tests of the engine (`tests/mcp.rs`): a scripted streamable
//! HTTP MCP server, for answers no real server can be asked to give, and a
//! capture of what the engine logs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// A request the mock received (`session()`, `method()`).
pub use crate::support::Request as Received;
use crate::support::read_request;

/// The answer to one `tools/call`: an HTTP status and a JSON body.
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// 200 with the tool's text result.
    pub fn text(request: &Received, text: &str) -> Answer {
        Answer {
            status: 200,
            body: json!({
                "jsonrpc": "2.0",
                "id": request.body["id"],
                "result": {"content": [{"type": "text", "text": text}]}
            }),
        }
    }

    /// `status` with a JSON-RPC error; `id` as given (`None`: no `id`).
    pub fn error(status: u16, id: Option<&Value>, code: i64, message: &str) -> Answer {
        let mut body = json!({"jsonrpc": "2.0", "error": {"code": code, "message": message}});
        if let Some(id) = id {
            body["id"] = id.clone();
        }
        Answer { status, body }
    }
}

type OnCall = Box<dyn Fn(&Received) -> Answer + Send + Sync>;

/// An MCP server on 127.0.0.1 with one tool, `act`, whose `tools/call`s
/// `on_call` answers. Each `initialize` opens a session `s1`, `s2`, …; it
/// offers no event stream (GET: 405), and does not check sessions itself:
/// `on_call` sees each request's.
pub struct McpMock {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
    /// Once set, an `initialize` gets no answer.
    pub stall: Arc<AtomicBool>,
}

impl McpMock {
    pub async fn start(on_call: impl Fn(&Received) -> Answer + Send + Sync + 'static) -> McpMock {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        let on_call: Arc<OnCall> = Arc::new(Box::new(on_call));
        let sessions = Arc::new(Mutex::new(0));
        let stall = Arc::new(AtomicBool::new(false));
        let stalls = Arc::clone(&stall);
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                let on_call = Arc::clone(&on_call);
                let sessions = Arc::clone(&sessions);
                let stall = Arc::clone(&stalls);
                tokio::spawn(async move {
                    let _ = serve(socket, &log, &on_call, &sessions, &stall).await;
                });
            }
        });
        McpMock {
            url,
            received,
            stall,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// The `tools/call` requests received.
    pub fn calls(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.method() == Some("tools/call"))
            .collect()
    }
}

async fn serve(
    mut socket: TcpStream,
    log: &Mutex<Vec<Received>>,
    on_call: &OnCall,
    sessions: &Mutex<u32>,
    stall: &AtomicBool,
) -> std::io::Result<()> {
    let Some(request) = read_request(&mut socket).await? else {
        return Ok(());
    };
    log.lock().unwrap().push(request.clone());
    let mut session = None;
    let (status, body) = match (request.verb.as_str(), request.method()) {
        ("POST", Some("initialize")) if stall.load(Ordering::SeqCst) => {
            return std::future::pending().await;
        }
        ("POST", Some("initialize")) => {
            let mut n = sessions.lock().unwrap();
            *n += 1;
            session = Some(format!("s{n}"));
            let version = request.body["params"]["protocolVersion"].clone();
            let result = json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "mock", "version": "1.0.0"}
            });
            (200, Some(rpc_result(&request, result)))
        }
        // Notifications.
        ("POST", Some(_)) if request.body.get("id").is_none() => (202, None),
        ("POST", Some("tools/list")) => {
            let tool = json!({
                "name": "act",
                "description": "Does something that must happen once",
                "inputSchema": {"type": "object"}
            });
            (200, Some(rpc_result(&request, json!({"tools": [tool]}))))
        }
        ("POST", Some("tools/call")) => {
            let answer = on_call(&request);
            (answer.status, Some(answer.body))
        }
        ("DELETE", _) => (200, None),
        _ => (405, None),
    };
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "HTTP/1.1 {status} Mock\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("content-type: application/json\r\n");
    }
    if let Some(session) = session {
        head.push_str(&format!("mcp-session-id: {session}\r\n"));
    }
    head.push_str("\r\n");
    socket.write_all(head.as_bytes()).await?;
    socket.write_all(body.as_bytes()).await?;
    socket.shutdown().await
}

fn rpc_result(request: &Received, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": request.body["id"], "result": result})
}

/// Everything logged (any level, any target) on this thread while the
/// returned guard lives: a `#[tokio::test]` runs its tasks on its own
/// thread, so this is what the test's code logged.
pub fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let guard = tracing::subscriber::set_default(Capture(logs.clone()));
    (logs, guard)
}

/// The lines a [`capture_logs`] captured.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<String>>>);

impl Logs {
    pub fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

struct Capture(Logs);

/// One event's fields as `name=value` pairs.
struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push_str(&format!(" {}={value}", field.name()));
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut line = Line(format!("span {}", span.metadata().name()));
        span.record(&mut line);
        self.0.0.lock().unwrap().push(line.0);
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut line = Line("span record".to_owned());
        values.record(&mut line);
        self.0.0.lock().unwrap().push(line.0);
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let metadata = event.metadata();
        let mut line = Line(format!("{} {}", metadata.level(), metadata.target()));
        event.record(&mut line);
        self.0.0.lock().unwrap().push(line.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
