//! A real `toolwire serve` in the test process: the scripted engine of
//! `toolwire-test-support` on a SQLite file, served over loopback HTTP,
//! and the HTTP and WebSocket clients of the server's tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::oneshot;
use toolwire_engine::EngineConfig;
use toolwire_providers::Models;
use toolwire_server::{AppState, ServerSettings};
use toolwire_tools::ToolRegistry;
use toolwire_tools::confined::Policy;

pub struct Server {
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    pub db: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// A server on the database at `db`, playing `script` (YAML).
    pub async fn start(db: &Path, script: &str, settings: ServerSettings) -> Server {
        Server::start_with(db, script, settings, EngineConfig::default()).await
    }

    /// [`Server::start`] with the engine's configuration.
    pub async fn start_with(
        db: &Path,
        script: &str,
        settings: ServerSettings,
        config: EngineConfig,
    ) -> Server {
        let models = Models::single(toolwire_test_support::script(script));
        Server::start_models(db, models, settings, config).await
    }

    /// A server whose turns are answered by an OpenAI-compatible model
    /// at `url` (the mock's), registered as `mini`.
    pub async fn start_openai(db: &Path, url: &str) -> Server {
        let provider = toolwire_providers::OpenAiProvider::new(
            toolwire_test_support::http(url),
            "gpt-4o-mini",
            true,
        );
        let entry = toolwire_test_support::model_entry("mini", "openai", Arc::new(provider), &[]);
        let models = Models::new(vec![entry], Some("mini")).unwrap();
        Server::start_models(
            db,
            models,
            ServerSettings::default(),
            EngineConfig::default(),
        )
        .await
    }

    /// A server whose turns are answered by `models`.
    pub async fn start_models(
        db: &Path,
        models: Models,
        mut settings: ServerSettings,
        config: EngineConfig,
    ) -> Server {
        // Python tools run through this crate's helper binary, with the
        // database's directory as their workspace.
        if !settings.python_sandbox.sandbox.has_helper() {
            let sandbox = toolwire_test_support::sandbox::through(
                env!("CARGO_BIN_EXE_toolwire-server-sandbox"),
                Policy::default(),
            );
            settings.python_sandbox = toolwire_tools::python::PythonSandbox::new(
                Arc::new(sandbox),
                db.parent().unwrap().canonicalize().unwrap(),
            );
        }
        let engine =
            toolwire_test_support::engine_at(db, models, ToolRegistry::new(), config).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let state = AppState::new(engine, settings);
        let task = tokio::spawn(async move {
            toolwire_server::serve(listener, state, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Server {
            addr,
            http: reqwest::Client::new(),
            db: db.to_owned(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    /// Sends a JSON request; returns the status and the JSON body.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    /// A stream's `data:` payloads, in order (the last is `[DONE]`), and
    /// every other line it carried (there should be none but comments).
    pub async fn stream(&self, path: &str, body: Value) -> (Vec<String>, Vec<String>) {
        let response = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let text = response.text().await.unwrap();
        let mut data = Vec::new();
        let mut other = Vec::new();
        for line in text.lines() {
            if let Some(d) = line.strip_prefix("data: ") {
                data.push(d.to_owned());
            } else if !line.is_empty() && !line.starts_with(':') {
                other.push(line.to_owned());
            }
        }
        (data, other)
    }
}

/// `message_type`s of Letta messages.
pub fn types(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["message_type"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// A WebSocket client of the live view.
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Server {
    /// Opens the live socket at `path` (`/v1/conversations/{id}/ws…`).
    pub async fn socket(&self, path: &str) -> Socket {
        let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{}{}", self.addr, path))
            .await
            .unwrap();
        socket
    }

    /// The HTTP status a refused upgrade at `path` answers with.
    pub async fn refused_socket(&self, path: &str) -> u16 {
        match tokio_tungstenite::connect_async(format!("ws://{}{}", self.addr, path)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                response.status().as_u16()
            }
            Ok(_) => panic!("{path} was upgraded"),
            Err(e) => panic!("{path}: {e}"),
        }
    }
}

/// The next JSON frame of `socket` (10 s at most).
pub async fn frame(socket: &mut Socket) -> Value {
    use futures::StreamExt;
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), socket.next())
            .await
            .expect("a frame within 10 s")
            .expect("the socket is open")
            .unwrap();
        match next {
            tokio_tungstenite::tungstenite::Message::Text(text) => {
                return serde_json::from_str(text.as_str()).unwrap();
            }
            tokio_tungstenite::tungstenite::Message::Close(c) => panic!("socket closed: {c:?}"),
            _ => continue,
        }
    }
}

/// Frames of `socket` up to and including the first that `last` accepts.
pub async fn frames_until(socket: &mut Socket, last: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let f = frame(socket).await;
        let done = last(&f);
        frames.push(f);
        if done {
            return frames;
        }
    }
}

/// Sends a JSON text frame.
pub async fn send_frame(socket: &mut Socket, frame: Value) {
    use futures::SinkExt;
    socket
        .send(tokio_tungstenite::tungstenite::Message::Text(
            frame.to_string().into(),
        ))
        .await
        .unwrap();
}

/// The answer to a request written by hand.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header lines, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (a string if it is not JSON).
    pub body: Value,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Server {
    /// Sends `head` (the request line and headers, each line ending in
    /// CRLF, without the blank line) and `body` over a new connection as
    /// they are, with `Connection: close`; reads the answer to its end.
    /// For what a well-behaved client would never send: a foreign `Host`.
    pub async fn raw(&self, head: &str, body: &str) -> RawResponse {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let request = format!(
            "{head}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            tcp.read_to_end(&mut answer),
        )
        .await
        .expect("an answer within 10 s")
        .unwrap();
        let text = String::from_utf8_lossy(&answer);
        let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("a status line");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
        RawResponse {
            status,
            headers,
            body,
        }
    }
}
