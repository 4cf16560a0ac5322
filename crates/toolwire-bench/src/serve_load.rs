//! `serve-load`: the real `toolwire serve` binary under concurrent SSE
//! clients.
//!
//! Starts `toolwire serve` as a child process on 127.0.0.1 (a free port)
//! with a fresh SQLite file, the scripted provider and a small temporary
//! workspace. Every turn of the script is two model calls: the first calls
//! the built-in `list_dir` on the workspace, the second answers with short
//! text; no delays. Then N agents are created (one per client) and N
//! clients each send M messages one after the other over
//! `POST /v1/agents/{id}/messages/stream`, reading the SSE body as it
//! arrives. A message's time to first event runs from the request being
//! sent to the first `data:` line; its latency to the end of the body.
//! Every stream must end with `stop_reason: end_turn` then `[DONE]`, with
//! one successful tool return listing the workspace. Afterwards each
//! agent's history (`GET …/messages?order=asc`) must hold M user
//! messages, M tool calls, M tool returns and 2M assistant texts. Any
//! error, missing message or server log line at WARN or ERROR makes the
//! command fail.
//!
//! Without `stream_tokens` a turn's first event is the first step's
//! assistant message, sent once that step is stored.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::{mib, ms, summary};

/// What `serve-load` is asked to do.
pub struct Options {
    pub toolwire: Option<PathBuf>,
    pub clients: usize,
    pub messages: usize,
    pub chunk_size: usize,
    pub create_parallel: usize,
    pub request_timeout: Duration,
    pub timeout: Duration,
    pub settle: Duration,
}

/// The files of the temporary workspace `list_dir` lists.
const WORKSPACE_FILES: &[(&str, &str)] = &[
    ("README.md", "# load test workspace\n"),
    ("notes.txt", "nothing to see here\n"),
    ("src/main.rs", "fn main() {}\n"),
];

/// The script every turn plays: `list_dir` on the workspace, then text.
fn script(chunk_size: usize) -> String {
    format!(
        "model: scripted-load\n\
         steps:\n\
         \x20 - text: \"Looking at the workspace.\"\n\
         \x20   tool_calls:\n\
         \x20     - name: list_dir\n\
         \x20       arguments: {{path: \".\"}}\n\
         \x20   chunk_size: {chunk_size}\n\
         \x20   delay_ms: 0\n\
         \x20 - text: \"The workspace holds README.md, notes.txt and src.\"\n\
         \x20   chunk_size: {chunk_size}\n\
         \x20   delay_ms: 0\n"
    )
}

/// `target/release/toolwire` next to this executable (which lives in
/// `target/release/` too).
fn default_toolwire() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let dir = exe
        .parent()
        .context("this executable has no directory")?
        .to_path_buf();
    Ok(dir.join("toolwire"))
}

/// The `toolwire` binary to run: `given`, else the one beside this
/// executable; an error that says how to build it when it is missing.
pub(crate) fn toolwire_binary(given: Option<PathBuf>) -> Result<PathBuf> {
    let toolwire = match given {
        Some(p) => p,
        None => default_toolwire()?,
    };
    if !toolwire.is_file() {
        bail!(
            "no toolwire binary at {} (build it: cargo build --release -p toolwire-cli, or pass --toolwire)",
            toolwire.display()
        );
    }
    Ok(toolwire)
}

/// The number on line `key` of `/proc/<pid>/FILE` (e.g. `Threads` of
/// `status`).
fn proc_value(pid: u32, file: &str, key: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/{file}");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .with_context(|| format!("no {key} in {path}"))?;
    value
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("unreadable {key} in {path}"))
}

fn proc_status_value(pid: u32, key: &str) -> Result<u64> {
    proc_value(pid, "status", key)
}

/// A size line of `/proc/<pid>/status` (e.g. `VmRSS`, in kB), in bytes.
fn proc_status_bytes(pid: u32, key: &str) -> Result<u64> {
    Ok(proc_status_value(pid, key)? * 1024)
}

/// User + system CPU seconds of process `pid` (`self` for this one), from
/// `/proc/<pid>/stat` (in clock ticks of 1/100 s, Linux's `USER_HZ`).
pub(crate) fn cpu_seconds(pid: &str) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The fields after the command name, which may hold spaces: state is
    // the first, utime the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .map(|t| t as f64 / 100.0)
            .with_context(|| format!("unreadable CPU times in {path}"))
    };
    Ok(ticks(11)? + ticks(12)?)
}

/// Bytes of the database in `dir`: `load.db` and its WAL.
fn disk_usage(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("load.db"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// `line` without its terminal colour codes (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The server process, its address and what it wrote to stderr.
pub(crate) struct Server {
    child: Child,
    pub(crate) pid: u32,
    pub(crate) base: String,
    /// Log lines at WARN or ERROR.
    complaints: Arc<Mutex<Vec<String>>>,
    /// The last lines of stderr, for a failure report.
    tail: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `toolwire` in `dir`, playing `script` (YAML).
    pub(crate) async fn start(toolwire: &Path, dir: &Path, script: &str) -> Result<Server> {
        Self::start_with(toolwire, dir, script, &[]).await
    }

    /// [`Server::start`] with more flags for `serve`; on the same `dir`
    /// again, it serves the same database.
    pub(crate) async fn start_with(
        toolwire: &Path,
        dir: &Path,
        script: &str,
        extra: &[&str],
    ) -> Result<Server> {
        let db = format!("sqlite://{}", dir.join("load.db").display());
        Self::start_on(toolwire, dir, script, &db, extra).await
    }

    /// [`Server::start_with`] on the database at `db` (any `--db` URL;
    /// several servers may share a PostgreSQL one).
    pub(crate) async fn start_on(
        toolwire: &Path,
        dir: &Path,
        script: &str,
        db: &str,
        extra: &[&str],
    ) -> Result<Server> {
        let script_path = dir.join("script.yaml");
        std::fs::write(&script_path, script)?;
        let provider = [
            OsString::from("--provider"),
            "scripted".into(),
            "--script".into(),
            script_path.into(),
        ];
        Self::start_provider_on(toolwire, dir, &provider, db, extra).await
    }

    /// `toolwire serve` in `dir` (a fresh `load.db` there, a small
    /// workspace) with `provider`'s flags (`--provider …` and what it
    /// needs) and `extra`.
    pub(crate) async fn start_provider(
        toolwire: &Path,
        dir: &Path,
        provider: &[OsString],
        extra: &[&str],
    ) -> Result<Server> {
        let db = format!("sqlite://{}", dir.join("load.db").display());
        Self::start_provider_on(toolwire, dir, provider, &db, extra).await
    }

    /// [`Server::start_provider`] on the database at `db`.
    async fn start_provider_on(
        toolwire: &Path,
        dir: &Path,
        provider: &[OsString],
        db: &str,
        extra: &[&str],
    ) -> Result<Server> {
        let workspace = dir.join("workspace");
        for (name, text) in WORKSPACE_FILES {
            let path = workspace.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, text)?;
        }

        let mut command = Command::new(toolwire);
        command
            .arg("serve")
            .args(["--addr", "127.0.0.1:0"])
            .args(provider)
            .arg("--db")
            .arg(db)
            .arg("--workspace")
            .arg(&workspace)
            .args(extra)
            .env("NO_COLOR", "1")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Only the flags above configure it.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TOOLWIRE_") {
                command.env_remove(&key);
            }
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", toolwire.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let stderr = child.stderr.take().context("no stderr pipe")?;

        let complaints = Arc::new(Mutex::new(Vec::new()));
        let tail = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, addr_rx) = oneshot::channel();
        {
            let complaints = complaints.clone();
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut addr_tx = Some(addr_tx);
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(rest) = line.strip_prefix("toolwire: serving on http://")
                        && let Some(tx) = addr_tx.take()
                    {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                        let _ = tx.send(addr);
                    }
                    let line = strip_ansi(&line);
                    if (line.contains(" WARN ") || line.contains(" ERROR "))
                        && let Ok(mut c) = complaints.lock()
                    {
                        c.push(line.clone());
                    }
                    if let Ok(mut t) = tail.lock() {
                        if t.len() >= 40 {
                            t.remove(0);
                        }
                        t.push(line);
                    }
                }
            });
        }
        let mut server = Server {
            child,
            pid,
            base: String::new(),
            complaints,
            tail,
        };
        let addr = match tokio::time::timeout(Duration::from_secs(60), addr_rx).await {
            Ok(Ok(addr)) => addr,
            _ => {
                let _ = server.child.start_kill();
                bail!(
                    "the server did not say where it listens within 60 s; its stderr:\n{}",
                    server.tail()
                );
            }
        };
        server.base = format!("http://{addr}");
        Ok(server)
    }

    fn tail(&self) -> String {
        self.tail.lock().map(|t| t.join("\n")).unwrap_or_default()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Polls until the API answers.
    pub(crate) async fn wait_ready(&mut self, http: &reqwest::Client) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the server exited ({status}); its stderr:\n{}", self.tail());
            }
            match http.get(self.url("/v1/agents?limit=1")).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                _ if Instant::now() > deadline => {
                    bail!(
                        "the server did not answer within 30 s; its stderr:\n{}",
                        self.tail()
                    )
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Sends SIGTERM and returns at once.
    pub(crate) fn terminate(&self) -> Result<()> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = i32::try_from(self.pid).context("pid out of range")?;
        kill(Pid::from_raw(pid), Signal::SIGTERM).context("signalling the server")
    }

    /// `kill -9`: the process dies at once, with no chance to tidy up;
    /// returns once it is gone.
    pub(crate) async fn kill(&mut self) -> Result<()> {
        self.child.start_kill().context("killing the server")?;
        self.child
            .wait()
            .await
            .context("waiting for the killed server")?;
        Ok(())
    }

    /// Waits up to `bound` for the process to exit (then kills it); its
    /// status, or an error with its last log lines.
    pub(crate) async fn exited(&mut self, bound: Duration) -> Result<std::process::ExitStatus> {
        match tokio::time::timeout(bound, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = self.child.start_kill();
                bail!(
                    "the server did not exit within {} s; its stderr:\n{}",
                    bound.as_secs(),
                    self.tail()
                )
            }
        }
    }

    /// Log lines at WARN or ERROR so far.
    pub(crate) fn complaints(&self) -> Vec<String> {
        self.complaints
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// SIGTERM, then waits for a clean exit (SIGKILL after 10 s).
    pub(crate) async fn stop(mut self) -> Result<()> {
        self.terminate()?;
        let status = self.exited(Duration::from_secs(10)).await?;
        if !status.success() {
            bail!(
                "the server exited with {status}; its stderr:\n{}",
                self.tail()
            );
        }
        Ok(())
    }
}

/// Sends a request; the JSON body of its 2xx answer.
pub(crate) async fn call_json(req: reqwest::RequestBuilder) -> Result<Value> {
    let response = req.send().await?;
    let status = response.status();
    let text = response.text().await?;
    if !status.is_success() {
        bail!("HTTP {status}: {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("not JSON: {text}"))
}

/// One message's timings.
struct Timing {
    first_event: Duration,
    total: Duration,
}

/// Sends one message over the stream endpoint and reads the SSE body as it
/// arrives.
async fn one_message(
    http: &reqwest::Client,
    url: &str,
    text: &str,
    timeout: Duration,
) -> Result<Timing> {
    let sent = Instant::now();
    let run = async {
        let response = http
            .post(url)
            .json(&json!({"messages": [{"role": "user", "content": text}]}))
            .send()
            .await
            .context("sending")?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("HTTP {status}: {body}");
        }
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if !content_type.starts_with("text/event-stream") {
            bail!("content-type {content_type:?}, not text/event-stream");
        }
        let mut first_event = None;
        let data = sse_data(response, || {
            first_event.get_or_insert_with(|| sent.elapsed());
        })
        .await
        .context("reading the stream")?;
        let total = sent.elapsed();
        let first_event = first_event.context("the stream carried no data event")?;
        check_stream(&data)?;
        Ok(Timing { first_event, total })
    };
    tokio::time::timeout(timeout, run)
        .await
        .unwrap_or_else(|_| bail!("no complete answer within {} s", timeout.as_secs()))
}

/// A turn's stream: one successful tool return, `end_turn`, then `[DONE]`
/// last.
/// The `data:` payloads of an SSE response, in order; `first` is called
/// as each arrives (for timing the first).
pub(crate) async fn sse_data(
    response: reqwest::Response,
    mut first: impl FnMut(),
) -> Result<Vec<String>, reqwest::Error> {
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut data: Vec<String> = Vec::new();
    while let Some(chunk) = body.next().await {
        buffer.extend_from_slice(&chunk?);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(payload) = line.strip_prefix("data:") {
                first();
                data.push(payload.strip_prefix(' ').unwrap_or(payload).to_owned());
            }
        }
    }
    Ok(data)
}

fn check_stream(data: &[String]) -> Result<()> {
    match data.last().map(String::as_str) {
        Some("[DONE]") => {}
        other => bail!("the stream did not end with [DONE] (last data: {other:?})"),
    }
    let mut stop = None;
    let mut returns = 0;
    for d in &data[..data.len() - 1] {
        let m: Value =
            serde_json::from_str(d).with_context(|| format!("a data event is not JSON: {d}"))?;
        match m.get("message_type").and_then(Value::as_str) {
            Some("stop_reason") => {
                stop = m
                    .get("stop_reason")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }
            Some("error_message") => bail!("error_message: {m}"),
            Some("tool_return_message") => {
                if m.get("status").and_then(Value::as_str) != Some("success") {
                    bail!("the tool failed: {m}");
                }
                let listing = m.get("tool_return").and_then(Value::as_str).unwrap_or("");
                if !listing.contains("README.md") {
                    bail!("list_dir did not list the workspace: {m}");
                }
                returns += 1;
            }
            _ => {}
        }
    }
    if stop.as_deref() != Some("end_turn") {
        bail!("stop_reason {stop:?}, not end_turn");
    }
    if returns != 1 {
        bail!("{returns} tool returns in the stream, not 1");
    }
    Ok(())
}

/// One client: `messages` messages to its agent, one after the other.
async fn client(
    http: reqwest::Client,
    url: String,
    client: usize,
    messages: usize,
    timeout: Duration,
    done: Arc<AtomicU64>,
) -> (Vec<Timing>, Vec<String>) {
    let mut timings = Vec::with_capacity(messages);
    let mut errors = Vec::new();
    for i in 0..messages {
        let text = format!("client {client}, message {i}: what is in the workspace?");
        match one_message(&http, &url, &text, timeout).await {
            Ok(t) => timings.push(t),
            Err(e) => errors.push(format!("client {client} message {i}: {e:#}")),
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    (timings, errors)
}

/// What an agent's stored history holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Stored {
    user: usize,
    tool_calls: usize,
    tool_returns: usize,
    assistant: usize,
}

async fn stored(http: &reqwest::Client, server: &Server, agent: &str) -> Result<Stored> {
    let url = server.url(&format!(
        "/v1/agents/{agent}/messages?order=asc&limit=100000"
    ));
    let list = call_json(http.get(url)).await?;
    let list = list.as_array().context("the history is not a list")?;
    let mut s = Stored::default();
    for m in list {
        match m.get("message_type").and_then(Value::as_str) {
            Some("user_message") => s.user += 1,
            Some("tool_call_message") => s.tool_calls += 1,
            Some("tool_return_message") => s.tool_returns += 1,
            Some("assistant_message") => s.assistant += 1,
            _ => {}
        }
    }
    Ok(s)
}

pub async fn serve_load(o: Options) -> Result<()> {
    if o.clients == 0 || o.messages == 0 {
        bail!("--clients and --messages must be at least 1");
    }
    let toolwire = toolwire_binary(o.toolwire.clone())?;
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(o.clients.max(1) * 2)
        .build()?;

    let mut server = Server::start(&toolwire, dir.path(), &script(o.chunk_size)).await?;
    server.wait_ready(&http).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "server {} (pid {}) at {}",
        toolwire.display(),
        server.pid,
        server.base
    );
    println!(
        "store sqlite file in {}; scripted provider, each turn: list_dir, then a short answer (chunk size {}, no delay)",
        dir.path().display(),
        o.chunk_size,
    );

    let outcome = tokio::time::timeout(o.timeout, drive(&o, &http, &server)).await;
    let result = match outcome {
        Ok(r) => r,
        Err(_) => Err(anyhow::anyhow!(
            "gave up after {} s (--timeout)",
            o.timeout.as_secs()
        )),
    };
    let complaints = server
        .complaints
        .lock()
        .map(|c| c.clone())
        .unwrap_or_default();
    if let Ok(report) = &result {
        println!(
            "server memory  (RSS: anonymous pages, mostly heap, + file-backed pages, counted once per mapping; PSS counts a page once)"
        );
        println!("  at start                 {}", report.start);
        println!("  after the agents         {}", report.agents);
        println!(
            "  peak during the load     RSS {} (VmHWM), {} threads (sampled every 100 ms)",
            mib(report.hwm),
            report.peak_threads
        );
        println!("  1 s after the load       {}", report.after);
        if o.settle > Duration::ZERO {
            tokio::time::sleep(o.settle).await;
            match Memory::of(server.pid) {
                Ok(m) => println!(
                    "  {:<24} {m}",
                    format!("{} s after the load", o.settle.as_secs() + 1)
                ),
                Err(e) => println!("  later: unreadable ({e:#})"),
            }
        }
        println!(
            "  database on disk         {} (SQLite file and WAL; each idle reader connection maps the file)",
            mib(disk_usage(dir.path()))
        );
    }
    println!("server log     {} WARN/ERROR lines", complaints.len());
    for line in complaints.iter().take(10) {
        println!("  {line}");
    }
    let stopped = server.stop().await;
    let report = result?;
    stopped?;
    if report.failed {
        bail!("the load run failed (see above)");
    }
    if !complaints.is_empty() {
        bail!("the server logged {} warnings or errors", complaints.len());
    }
    Ok(())
}

struct Report {
    start: Memory,
    agents: Memory,
    hwm: u64,
    peak_threads: u64,
    after: Memory,
    failed: bool,
}

/// The server's memory at one moment, from `/proc/<pid>/status`.
struct Memory {
    rss: u64,
    anon: u64,
    file: u64,
    /// The proportional set size: a page mapped N times counts 1/N each
    /// time, so the SQLite file mapped by several readers counts once.
    pss: Option<u64>,
    threads: u64,
}

impl Memory {
    fn of(pid: u32) -> Result<Memory> {
        Ok(Memory {
            rss: proc_status_bytes(pid, "VmRSS")?,
            anon: proc_status_bytes(pid, "RssAnon")?,
            file: proc_status_bytes(pid, "RssFile")?,
            pss: proc_value(pid, "smaps_rollup", "Pss")
                .ok()
                .map(|kib| kib * 1024),
            threads: proc_status_value(pid, "Threads")?,
        })
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {} (anonymous {}, file-backed {}), PSS {}, {} threads",
            mib(self.rss),
            mib(self.anon),
            mib(self.file),
            self.pss.map_or_else(|| "?".to_owned(), mib),
            self.threads
        )
    }
}

async fn drive(o: &Options, http: &reqwest::Client, server: &Server) -> Result<Report> {
    let start_memory = Memory::of(server.pid)?;
    // Agents, one per client.
    let setup = Instant::now();
    let created: Vec<Result<String>> = futures::stream::iter(0..o.clients)
        .map(|i| async move {
            let body = json!({"name": format!("load-{i}"), "include_base_tools": true});
            let agent = call_json(http.post(server.url("/v1/agents")).json(&body)).await?;
            agent
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .context("the agent has no id")
        })
        .buffered(o.create_parallel.max(1))
        .collect()
        .await;
    let agents = created.into_iter().collect::<Result<Vec<_>>>()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let agents_memory = Memory::of(server.pid)?;
    println!(
        "{} agents created in {} ({} at once)",
        agents.len(),
        ms(setup.elapsed()),
        o.create_parallel
    );
    println!(
        "{} clients x {} messages each, sequential per client, all clients at once",
        o.clients, o.messages
    );

    // Threads sampled through the run (VmHWM gives the RSS peak).
    let peak_threads = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (pid, peak) = (server.pid, peak_threads.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(threads) = proc_status_value(pid, "Threads") {
                    peak.fetch_max(threads, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let done = Arc::new(AtomicU64::new(0));
    let progress = {
        let done = done.clone();
        let total = (o.clients * o.messages) as u64;
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                eprintln!(
                    "  … {}/{total} messages after {:.0} s",
                    done.load(Ordering::Relaxed),
                    start.elapsed().as_secs_f64()
                );
            }
        })
    };

    let cpu_before = (cpu_seconds("self"), cpu_seconds(&server.pid.to_string()));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, agent) in agents.iter().enumerate() {
        tasks.spawn(client(
            http.clone(),
            server.url(&format!("/v1/agents/{agent}/messages/stream")),
            i,
            o.messages,
            o.request_timeout,
            done.clone(),
        ));
    }
    let mut timings = Vec::new();
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((t, e)) => {
                timings.extend(t);
                errors.extend(e);
            }
            Err(e) => errors.push(format!("a client task failed: {e}")),
        }
    }
    let wall = start.elapsed();
    let cpu_after = (cpu_seconds("self"), cpu_seconds(&server.pid.to_string()));
    progress.abort();
    sampler.abort();

    let mut first: Vec<Duration> = timings.iter().map(|t| t.first_event).collect();
    let mut total: Vec<Duration> = timings.iter().map(|t| t.total).collect();
    first.sort_unstable();
    total.sort_unstable();
    let sent = o.clients * o.messages;
    println!("wall time      {}", ms(wall));
    if let ((Ok(b0), Ok(s0)), (Ok(b1), Ok(s1))) = (cpu_before, cpu_after) {
        let (server_cpu, bench_cpu) = (s1 - s0, b1 - b0);
        println!(
            "CPU time       server {server_cpu:.2} s ({:.0} µs per message), this client {bench_cpu:.2} s, over {:.1} s of wall time on {} cores",
            server_cpu * 1e6 / timings.len().max(1) as f64,
            wall.as_secs_f64(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
    }
    println!(
        "messages       {} sent, {} answered in full, {} errors",
        sent,
        timings.len(),
        errors.len()
    );
    println!(
        "throughput     {:.1} messages/s ({:.1} model steps/s)",
        timings.len() as f64 / wall.as_secs_f64(),
        2.0 * timings.len() as f64 / wall.as_secs_f64(),
    );
    summary("first event", &first);
    summary("message", &total);
    for e in errors.iter().take(10) {
        println!("error: {e}");
    }

    // Every message stored.
    let checked: Vec<(String, Result<Stored>)> = futures::stream::iter(agents.iter())
        .map(|agent| async move { (agent.clone(), stored(http, server, agent).await) })
        .buffered(16)
        .collect()
        .await;
    let want = Stored {
        user: o.messages,
        tool_calls: o.messages,
        tool_returns: o.messages,
        assistant: 2 * o.messages,
    };
    let mut missing = Vec::new();
    let mut totals = Stored::default();
    for (agent, s) in checked {
        match s {
            Ok(s) => {
                totals.user += s.user;
                totals.tool_calls += s.tool_calls;
                totals.tool_returns += s.tool_returns;
                totals.assistant += s.assistant;
                if s != want {
                    missing.push(format!("agent {agent}: stored {s:?}, expected {want:?}"));
                }
            }
            Err(e) => missing.push(format!("agent {agent}: history unreadable: {e:#}")),
        }
    }
    println!(
        "stored         {} user messages, {} tool calls, {} tool returns, {} assistant texts over {} agents ({})",
        totals.user,
        totals.tool_calls,
        totals.tool_returns,
        totals.assistant,
        agents.len(),
        if missing.is_empty() {
            "all present".to_owned()
        } else {
            format!("{} agents differ", missing.len())
        }
    );
    for m in missing.iter().take(10) {
        println!("missing: {m}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(Report {
        start: start_memory,
        agents: agents_memory,
        hwm: proc_status_bytes(server.pid, "VmHWM")?,
        peak_threads: peak_threads.load(Ordering::Relaxed),
        after: Memory::of(server.pid)?,
        failed: !errors.is_empty() || !missing.is_empty(),
    })
}
