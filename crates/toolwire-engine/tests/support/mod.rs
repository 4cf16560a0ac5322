//! Shared by the engine's integration tests: a mock model server on
//! loopback that speaks real HTTP/1.1 and SSE, SSE builders for OpenAI and
//! Anthropic, and an engine over a real SQLite file.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolwire_core::{AgentEvent, ConversationId};
use toolwire_engine::{Engine, EngineConfig};
use toolwire_providers::{HttpSettings, Provider, RetryPolicy, StreamLimits};
use toolwire_store::Store;
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

/// What the mock answers to one request.
#[derive(Clone)]
pub enum Reply {
    /// 200 with an SSE body sent in `chunk`-byte pieces.
    Sse {
        body: String,
        chunk: usize,
        delay: Duration,
    },
    /// A status with headers and a body, then close.
    Status {
        code: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// 200, the first `cut_at` bytes of an SSE body, then the connection
    /// drops mid-stream.
    Cut { body: String, cut_at: usize },
    /// 200 SSE: `start` once, then `repeat` again and again until the
    /// client goes away (a model that never stops).
    Endless { start: String, repeat: String },
    /// Nothing more after `sent` for `for_`: with `head`, the SSE headers
    /// and `sent` go out first; without, not even the headers.
    Stall {
        head: bool,
        sent: String,
        for_: Duration,
    },
}

impl Reply {
    pub fn sse(body: String) -> Reply {
        Reply::Sse {
            body,
            chunk: 64,
            delay: Duration::ZERO,
        }
    }
}

/// A request the mock received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A model server on 127.0.0.1 that answers with `replies` in order (the
/// last one repeats).
pub struct MockServer {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl MockServer {
    pub async fn start(replies: Vec<Reply>) -> MockServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        tokio::spawn(async move {
            let mut n = 0;
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let reply = replies[n.min(replies.len() - 1)].clone();
                n += 1;
                let log = log.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, reply, log).await;
                });
            }
        });
        MockServer { url, received }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 request as a mock server reads it.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `POST`, `DELETE`.
    pub verb: String,
    /// The request target: path and query.
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`null` if it is not JSON).
    pub body: Value,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request (head, then a `content-length` body) from `socket`;
/// `None` if the client closed it first.
pub async fn read_request(socket: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut start = lines.next().unwrap_or("").split(' ');
    let verb = start.next().unwrap_or("").to_owned();
    let target = start.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
    Ok(Some(Request {
        verb,
        target,
        headers,
        body,
    }))
}

async fn serve(
    mut socket: TcpStream,
    reply: Reply,
    log: Arc<Mutex<Vec<Received>>>,
) -> std::io::Result<()> {
    let Some(request) = read_request(&mut socket).await? else {
        return Ok(());
    };
    log.lock().unwrap().push(Received {
        path: request.target,
        headers: request.headers,
        body: request.body,
    });

    match reply {
        Reply::Status {
            code,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {code} Status\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
        }
        Reply::Sse { body, chunk, delay } => {
            socket.write_all(sse_head().as_bytes()).await?;
            for piece in body.as_bytes().chunks(chunk.max(1)) {
                socket
                    .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await?;
                socket.write_all(piece).await?;
                socket.write_all(b"\r\n").await?;
                socket.flush().await?;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
            }
            socket.write_all(b"0\r\n\r\n").await?;
        }
        Reply::Endless { start, repeat } => {
            socket.write_all(sse_head().as_bytes()).await?;
            let mut piece = start;
            loop {
                // An empty chunk would end the body. Fails once the client
                // has gone: the loop ends there.
                if !piece.is_empty() {
                    socket
                        .write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
                        .await?;
                }
                piece.clone_from(&repeat);
            }
        }
        Reply::Stall { head, sent, for_ } => {
            if head {
                socket.write_all(sse_head().as_bytes()).await?;
                if !sent.is_empty() {
                    socket
                        .write_all(format!("{:x}\r\n{sent}\r\n", sent.len()).as_bytes())
                        .await?;
                }
                socket.flush().await?;
            }
            tokio::time::sleep(for_).await;
            return Ok(());
        }
        Reply::Cut { body, cut_at } => {
            socket.write_all(sse_head().as_bytes()).await?;
            let piece = &body.as_bytes()[..cut_at.min(body.len())];
            socket
                .write_all(format!("{:x}\r\n", body.len()).as_bytes())
                .await?;
            socket.write_all(piece).await?;
            socket.flush().await?;
            // Dropping the socket mid-chunk breaks the stream.
        }
    }
    socket.shutdown().await
}

fn sse_head() -> String {
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".into()
}

/// A tool call for the SSE builders.
pub struct Call<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub arguments: Value,
}

/// An OpenAI chat completions SSE body: text, then calls (argument text in
/// 7-byte fragments), finish, usage, `[DONE]`.
pub fn openai_sse(text: &str, calls: &[Call<'_>]) -> String {
    let mut out = String::new();
    let mut data = |v: Value| out.push_str(&format!("data: {v}\n\n"));
    data(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}));
    if !text.is_empty() {
        data(json!({"choices": [{"index": 0, "delta": {"content": text}}]}));
    }
    for (i, c) in calls.iter().enumerate() {
        data(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]}}]}),
        );
        let args = c.arguments.to_string();
        let bytes: Vec<char> = args.chars().collect();
        for piece in bytes.chunks(7) {
            let piece: String = piece.iter().collect();
            data(
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}}]}),
            );
        }
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}));
    data(
        json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 40}}}),
    );
    out.push_str("data: [DONE]\n\n");
    out
}

/// An Anthropic messages SSE body: a text block, then tool_use blocks.
pub fn anthropic_sse(text: &str, calls: &[Call<'_>]) -> String {
    let mut out = String::new();
    let mut event = |name: &str, v: Value| out.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": {"input_tokens": 90, "cache_read_input_tokens": 10, "output_tokens": 1}}}),
    );
    let mut index = 0;
    if !text.is_empty() {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        );
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        );
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        );
        index = 1;
    }
    for c in calls {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
        );
        let args = c.arguments.to_string();
        let (a, b) = args.split_at(args.len() / 2);
        for piece in [a, b] {
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}),
            );
        }
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    let stop = if calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 20}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out
}

/// A tool that answers with its arguments, after `delay`, noticing
/// cancellation.
pub struct EchoTool {
    spec: ToolSpec,
    delay: Duration,
}

/// An [`EchoTool`] named `name`.
pub fn echo_tool(name: &str, delay: Duration) -> Arc<dyn Tool> {
    Arc::new(EchoTool {
        spec: ToolSpec {
            name: name.into(),
            server: None,
            description: format!("{name}: echoes its arguments"),
            parameters: json!({"type": "object"}),
            read_only: true,
        },
        delay,
    })
}

#[async_trait]
impl Tool for EchoTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        ctx.progress.status(format!("{} working", self.spec.name));
        tokio::select! {
            _ = tokio::time::sleep(self.delay) => Ok(ToolOutput::ok(format!("{} got {arguments}", self.spec.name))),
            _ = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
        }
    }
}

/// A registry of echo tools named `names` (each with `delay`).
pub fn echo_tools(names: &[&str], delay: Duration) -> ToolRegistry {
    let mut r = ToolRegistry::new();
    for n in names {
        r.register(echo_tool(n, delay));
    }
    r
}

/// A SQLite store in a temporary directory (kept alive by the returned
/// guard).
pub async fn sqlite_store() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("test.db").display());
    (toolwire_store::open(&url).await.unwrap(), dir)
}

pub fn http(url: &str) -> HttpSettings {
    HttpSettings {
        base_url: url.to_owned(),
        api_key: Some("test-key".into()),
        retry: RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(2),
            max_retry_after: Duration::from_secs(2),
        },
        headers: Vec::new(),
        limits: StreamLimits::default(),
        max_tokens: 1024,
    }
}

pub async fn engine(
    provider: Arc<dyn Provider>,
    tools: ToolRegistry,
    config: EngineConfig,
) -> (Engine, tempfile::TempDir) {
    let (store, dir) = sqlite_store().await;
    (
        Engine::start(store, provider, tools, config).await.unwrap(),
        dir,
    )
}

/// Every stored event of a conversation, by type name.
pub async fn event_types(engine: &Engine, conversation: ConversationId) -> Vec<String> {
    engine
        .events_since(conversation, 0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| type_of(&e.event))
        .collect()
}

pub fn type_of(event: &AgentEvent) -> String {
    serde_json::to_value(event).unwrap()["type"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Whether process `pid` has exited, or lingers as a zombie waiting to be
/// reaped (gone for our purposes); waits up to 5 s.
pub async fn gone(pid: u32) -> bool {
    for _ in 0..50 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    false
}

/// A sandbox in `mode` through this crate's helper binary (network off,
/// the default limits), protecting `protected`.
pub fn sandbox_protecting(
    mode: toolwire_tools::confined::Mode,
    network: bool,
    protected: &[std::path::PathBuf],
) -> toolwire_tools::confined::Sandbox {
    use toolwire_tools::confined::{Helper, Policy, Sandbox};
    Sandbox::new(
        Helper {
            // option_env: other crates' tests include this module too.
            exe: match option_env!("CARGO_BIN_EXE_toolwire-sandbox") {
                Some(exe) => exe.into(),
                None => panic!("the engine's toolwire-sandbox binary (engine tests only)"),
            },
            args: Vec::new(),
        },
        Policy {
            mode,
            network,
            protected: toolwire_sandbox::canonical(protected.iter().cloned()),
            ..Policy::default()
        },
    )
}

/// The default sandbox (`workspace-write`, no network).
pub fn sandbox() -> Arc<toolwire_tools::confined::Sandbox> {
    Arc::new(sandbox_protecting(
        toolwire_tools::confined::Mode::WorkspaceWrite,
        false,
        &[],
    ))
}

/// A number no other test uses: `sleep MARKER` is then a process only
/// this test started (pids inside a command's PID namespace mean nothing
/// outside it, so tests find their processes by this instead).
pub fn marker() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    900_000_000 + u64::from(std::process::id()) * 1000 + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The processes whose command line holds `marker` as a word (zombies
/// left out: they are gone for our purposes).
pub fn running_with(marker: u64) -> Vec<u32> {
    let marker = marker.to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'))
            });
            !zombie
                && cmdline
                    .split(|b| *b == 0)
                    .any(|word| word == marker.as_bytes())
        })
        .collect()
}

/// Whether no process holds `marker` (see [`running_with`]); waits up to
/// 5 s.
pub async fn none_with(marker: u64) -> bool {
    for _ in 0..50 {
        if running_with(marker).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Whether a process holds `marker`; waits up to 5 s, as a shell may
/// report a background job (`$!`, an echo after `&`) before the job has
/// exec'd the command that carries the marker.
pub async fn some_with(marker: u64) -> bool {
    for _ in 0..50 {
        if !running_with(marker).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
