//! `plain-load`: server CPU per answered message, for plain messages (no
//! tool calls) against one OpenAI-compatible mock model over loopback.
//!
//! Starts the mock model (toolwire-test-support's, real HTTP on
//! 127.0.0.1: a streamed answer when the request asks for a stream, a JSON
//! chat completion when it does not, each after `--model-delay-ms`), then,
//! for each round, every server under test in turn: `toolwire serve`
//! (`--provider openai` at the mock, a fresh SQLite file) and, with
//! `--kelpie`, a Kelpie server pointed at the same mock. On each it creates
//! N agents and sends M messages per agent over the Letta messages route
//! (`POST /v1/agents/{id}/messages`, not streamed), the agents at once,
//! each agent's messages one after the other. The server's CPU time
//! (utime + stime of `/proc/PID/stat`) is read just before the first
//! message and just after the last answer; the figure is that difference
//! over the messages answered. An answer counts when it is a 200 whose
//! `messages` hold an `assistant_message`. Afterwards each toolwire
//! agent's history must hold M user and M assistant messages.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use toolwire_test_support::{MockServer, Reply, Request, openai_sse};

use crate::serve_load::{Server, call_json, cpu_seconds, toolwire_binary};
use crate::{ms, percentile};

/// What `plain-load` is asked to do.
pub struct Options {
    /// toolwire binaries to measure, alternating within each round.
    pub toolwire: Vec<PathBuf>,
    /// A Kelpie server binary to measure beside them.
    pub kelpie: Option<PathBuf>,
    /// Kelpie's `RUST_LOG`.
    pub kelpie_log: String,
    pub agents: usize,
    pub messages: usize,
    pub model_delay: Duration,
    pub rounds: usize,
    /// Where the temporary directories (and toolwire's SQLite file) go.
    pub tmpdir: Option<PathBuf>,
    pub request_timeout: Duration,
}

/// The mock model's answer text.
const ANSWER: &str = "Hello! This is the scripted model's plain answer.";

/// The mock model: SSE for `"stream": true`, a chat completion otherwise.
async fn mock_model(delay: Duration) -> MockServer {
    let stream_body = openai_sse(ANSWER, &[]);
    let completion = json!({
        "id": "chatcmpl-plain",
        "object": "chat.completion",
        "created": 0,
        "model": "plain-load",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": ANSWER},
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112},
    })
    .to_string();
    MockServer::start(vec![Reply::Respond(Arc::new(move |request: &Request| {
        let answer = if request.body["stream"].as_bool() == Some(true) {
            Reply::Sse {
                chunk: stream_body.len(),
                body: stream_body.clone(),
                delay: Duration::ZERO,
            }
        } else {
            Reply::Status {
                code: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                body: completion.clone(),
            }
        };
        if delay.is_zero() {
            answer
        } else {
            Reply::Late {
                after: delay,
                reply: Box::new(answer),
            }
        }
    }))])
    .await
}

/// One server's figures for one run.
struct Figures {
    answered: usize,
    errors: Vec<String>,
    cpu: Option<f64>,
    wall: Duration,
    latencies: Vec<Duration>,
}

impl Figures {
    fn print(&self, name: &str) {
        let n = self.answered.max(1) as f64;
        let cpu = self.cpu.map_or_else(
            || "unreadable".to_owned(),
            |c| format!("{:.3} ms per answered message ({c:.2} s)", c * 1e3 / n),
        );
        println!(
            "{name:<10} answered {:>5}  errors {:>3}  server CPU {cpu}  throughput {:.1} messages/s  p50 {}  p99 {}",
            self.answered,
            self.errors.len(),
            self.answered as f64 / self.wall.as_secs_f64(),
            ms(percentile(&self.latencies, 50.0)),
            ms(percentile(&self.latencies, 99.0)),
        );
        for e in self.errors.iter().take(5) {
            println!("  error: {e}");
        }
    }
}

/// Sends one message; ok when the answer holds an assistant message.
async fn one_message(http: &reqwest::Client, url: &str, text: &str) -> Result<()> {
    let body = json!({"messages": [{"role": "user", "content": text}]});
    let answer = call_json(http.post(url).json(&body)).await?;
    let messages = answer
        .get("messages")
        .and_then(Value::as_array)
        .with_context(|| format!("no messages in the answer: {answer}"))?;
    let assistant = messages
        .iter()
        .any(|m| m.get("message_type").and_then(Value::as_str) == Some("assistant_message"));
    if !assistant {
        bail!("no assistant_message in the answer: {answer}");
    }
    Ok(())
}

/// Creates the agents, then sends every message; `pid`'s CPU around it.
async fn drive(
    http: &reqwest::Client,
    base: &str,
    pid: u32,
    o: &Options,
) -> Result<(Figures, Vec<String>)> {
    let created: Vec<Result<String>> = futures::stream::iter(0..o.agents)
        .map(|i| async move {
            let body = json!({"name": format!("plain-{i}")});
            let agent = call_json(http.post(format!("{base}/v1/agents")).json(&body)).await?;
            agent
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("the agent has no id: {agent}"))
        })
        .buffered(8)
        .collect()
        .await;
    let agents = created.into_iter().collect::<Result<Vec<_>>>()?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let pid_text = pid.to_string();
    let cpu_before = cpu_seconds(&pid_text);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (a, agent) in agents.iter().enumerate() {
        let http = http.clone();
        let url = format!("{base}/v1/agents/{agent}/messages");
        let (messages, timeout) = (o.messages, o.request_timeout);
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(messages);
            let mut errors = Vec::new();
            for i in 0..messages {
                let text = format!("agent {a}, message {i}: hello");
                let sent = Instant::now();
                match tokio::time::timeout(timeout, one_message(&http, &url, &text)).await {
                    Ok(Ok(())) => latencies.push(sent.elapsed()),
                    Ok(Err(e)) => errors.push(format!("agent {a} message {i}: {e:#}")),
                    Err(_) => errors.push(format!(
                        "agent {a} message {i}: no answer within {} s",
                        timeout.as_secs()
                    )),
                }
            }
            (latencies, errors)
        });
    }
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((l, e)) => {
                latencies.extend(l);
                errors.extend(e);
            }
            Err(e) => errors.push(format!("a client task failed: {e}")),
        }
    }
    let wall = start.elapsed();
    let cpu_after = cpu_seconds(&pid_text);
    latencies.sort_unstable();
    let cpu = match (cpu_before, cpu_after) {
        (Ok(b), Ok(a)) => Some(a - b),
        _ => None,
    };
    Ok((
        Figures {
            answered: latencies.len(),
            errors,
            cpu,
            wall,
            latencies,
        },
        agents,
    ))
}

/// Every agent's history holds `messages` user and assistant messages.
async fn check_stored(
    http: &reqwest::Client,
    base: &str,
    agents: &[String],
    messages: usize,
) -> Result<()> {
    let mut wrong = Vec::new();
    for agent in agents {
        let url = format!("{base}/v1/agents/{agent}/messages?order=asc&limit=100000");
        let list = call_json(http.get(url)).await?;
        let list = list.as_array().context("the history is not a list")?;
        let count = |kind: &str| {
            list.iter()
                .filter(|m| m.get("message_type").and_then(Value::as_str) == Some(kind))
                .count()
        };
        let (user, assistant) = (count("user_message"), count("assistant_message"));
        if user != messages || assistant != messages {
            wrong.push(format!(
                "agent {agent}: {user} user and {assistant} assistant messages stored, not {messages} each"
            ));
        }
    }
    if let Some(first) = wrong.first() {
        bail!("{} agents' histories are wrong; {first}", wrong.len());
    }
    Ok(())
}

/// One run against a fresh `toolwire serve`.
async fn toolwire_run(
    http: &reqwest::Client,
    toolwire: &Path,
    model: &MockServer,
    o: &Options,
) -> Result<Figures> {
    let dir = match &o.tmpdir {
        Some(parent) => tempfile::tempdir_in(parent),
        None => tempfile::tempdir(),
    }
    .context("creating a temporary directory")?;
    let provider: Vec<OsString> = [
        "--provider",
        "openai",
        "--model",
        "plain-load",
        "--base-url",
        &format!("{}/v1", model.url),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    let mut server = Server::start_provider(toolwire, dir.path(), &provider, &[]).await?;
    server.wait_ready(http).await?;
    let driven = drive(http, &server.base, server.pid, o).await;
    let checked = match &driven {
        Ok((figures, agents)) if figures.errors.is_empty() => {
            check_stored(http, &server.base, agents, o.messages).await
        }
        _ => Ok(()),
    };
    let complaints = server.complaints();
    server.stop().await?;
    let (figures, _) = driven?;
    checked?;
    if let Some(first) = complaints.first() {
        bail!(
            "the server logged {} warnings or errors; the first: {first}",
            complaints.len()
        );
    }
    Ok(figures)
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The last lines of a log file.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// One run against a fresh Kelpie server (everything in memory).
async fn kelpie_run(
    http: &reqwest::Client,
    kelpie: &Path,
    model: &MockServer,
    o: &Options,
) -> Result<Figures> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let port = free_port()?;
    // Its log, for when it fails to start or answer.
    let log_path = dir.path().join("kelpie.log");
    let log = std::fs::File::create(&log_path).context("creating Kelpie's log file")?;
    let mut command = Command::new(kelpie);
    command
        // In memory, explicitly: without it Kelpie looks for a
        // FoundationDB cluster file in the usual places.
        .args(["--bind", &format!("127.0.0.1:{port}"), "--memory-only"])
        .current_dir(dir.path())
        .env("OPENAI_API_KEY", "plain-load")
        .env("OPENAI_BASE_URL", format!("{}/v1", model.url))
        .env("KELPIE_MODEL", "plain-load")
        .env_remove("ANTHROPIC_API_KEY")
        .env("RUST_LOG", &o.kelpie_log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
    let mut child: Child = command
        .spawn()
        .with_context(|| format!("starting {}", kelpie.display()))?;
    let pid = child.id().context("Kelpie exited at once")?;
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "Kelpie exited ({status}) before it answered; its log ends:\n{}",
                log_tail(&log_path)
            );
        }
        match http.get(format!("{base}/health")).send().await {
            Ok(r) if r.status().is_success() => break,
            _ if Instant::now() > deadline => bail!("Kelpie did not answer within 30 s"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let driven = drive(http, &base, pid, o).await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(driven?.0)
}

pub async fn plain_load(o: Options) -> Result<()> {
    if o.agents == 0 || o.messages == 0 || o.rounds == 0 {
        bail!("--agents, --messages and --rounds must be at least 1");
    }
    let toolwires = if o.toolwire.is_empty() {
        vec![toolwire_binary(None)?]
    } else {
        o.toolwire
            .iter()
            .map(|t| toolwire_binary(Some(t.clone())))
            .collect::<Result<Vec<_>>>()?
    };
    if let Some(k) = &o.kelpie
        && !k.is_file()
    {
        bail!("no Kelpie binary at {} (--kelpie)", k.display());
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(o.agents * 2)
        .build()?;
    let model = mock_model(o.model_delay).await;
    println!(
        "{} agents x {} plain messages (POST /v1/agents/{{id}}/messages), agents at once; mock model at {} (OpenAI chat, {} ms before each answer); {} round(s)",
        o.agents,
        o.messages,
        model.url,
        o.model_delay.as_millis(),
        o.rounds,
    );
    for (i, t) in toolwires.iter().enumerate() {
        println!("toolwire#{i} = {}", t.display());
    }
    if let Some(k) = &o.kelpie {
        println!("kelpie     = {} (RUST_LOG={})", k.display(), o.kelpie_log);
    }
    let mut failed = false;
    for round in 1..=o.rounds {
        println!("round {round}");
        for (i, t) in toolwires.iter().enumerate() {
            let name = format!("toolwire#{i}");
            match toolwire_run(&http, t, &model, &o).await {
                Ok(f) => {
                    failed |= !f.errors.is_empty();
                    f.print(&name);
                }
                Err(e) => {
                    failed = true;
                    println!("{name:<10} failed: {e:#}");
                }
            }
        }
        if let Some(k) = &o.kelpie {
            match kelpie_run(&http, k, &model, &o).await {
                Ok(f) => f.print("kelpie"),
                Err(e) => println!("kelpie     failed: {e:#}"),
            }
        }
    }
    println!("mock model answered {} requests", model.received().len());
    if failed {
        bail!("a toolwire run failed (see above)");
    }
    Ok(())
}
