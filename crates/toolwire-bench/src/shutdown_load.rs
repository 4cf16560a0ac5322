//! `shutdown-load`: the real `toolwire serve` stopped with SIGTERM under
//! load and started again on the same SQLite file, while its clients go
//! on.
//!
//! N clients (one agent each) send M messages each, one after the other,
//! over `POST /v1/agents/{id}/messages/stream`, to a scripted model that
//! takes a moment per answer (`--chunk-size` bytes every `--delay-ms`).
//! Once half of all messages have been accepted the server gets SIGTERM;
//! as soon as it has exited it is started again on the same file (a new
//! port). Each client handles every answer as a real one would:
//!
//! * a 200 with an SSE body is *accepted*: the message is the server's.
//!   A stream that ends with `end_turn` is *answered*; one that ends with
//!   an `error_message` of type `interrupted` is *cut*, and the client asks
//!   the agent to go on with a new message (`go on: …`, a message of its
//!   own); a body that breaks off without a final event is counted
//!   (*cut silently*: the shutdown must never do that);
//! * a 503 is *refused*: the client waits (`Retry-After`, at most
//!   `--max-retry-wait-ms`) and sends the same message again;
//! * a connection that cannot be made (the server is down) is retried
//!   every 100 ms.
//!
//! Afterwards every agent's stored history (`GET …/messages`, from the
//! restarted server) is compared with what the clients were told: every
//! accepted message must be stored exactly once (`duplicates` and `lost`
//! are 0), and no refused one at all (`stored although refused` is 0).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::serve_load::{Server, call_json, sse_data, toolwire_binary};

/// What `shutdown-load` is asked to do.
pub struct Options {
    pub toolwire: Option<PathBuf>,
    pub clients: usize,
    pub messages: usize,
    pub chunk_size: usize,
    pub delay_ms: u64,
    pub grace_secs: f64,
    pub max_retry_wait: Duration,
    pub timeout: Duration,
}

/// Each answer: a short text streamed slowly (a turn takes a moment).
fn script(chunk_size: usize, delay_ms: u64) -> String {
    format!(
        "model: scripted-slow\n\
         steps:\n\
         \x20 - text: \"Thinking it over, then answering in a few short words.\"\n\
         \x20   chunk_size: {chunk_size}\n\
         \x20   delay_ms: {delay_ms}\n"
    )
}

/// What the clients saw, counted across all of them.
#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    answered: AtomicU64,
    cut: AtomicU64,
    cut_silently: AtomicU64,
    refused: AtomicU64,
    unreachable: AtomicU64,
    other: AtomicU64,
}

/// How one attempt ended.
enum Attempt {
    Answered,
    Cut,
    CutSilently,
    Refused(Duration),
    Unreachable,
    Other(String),
}

/// The server's current base URL: it changes when it restarts.
type Base = Arc<RwLock<String>>;

fn base_of(base: &Base) -> String {
    base.read().map(|b| b.clone()).unwrap_or_default()
}

/// One message over the stream endpoint, its answer read to its end.
async fn attempt(http: &reqwest::Client, url: &str, text: &str, counts: &Counts) -> Attempt {
    let response = match http
        .post(url)
        .json(&json!({"messages": [{"role": "user", "content": text}]}))
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Attempt::Unreachable,
        // The request may or may not have reached the server: the
        // connection broke before an answer. Counted apart.
        Err(e) => return Attempt::Other(format!("sending: {e}")),
    };
    let status = response.status();
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        let wait = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(Duration::from_secs(1), Duration::from_secs);
        return Attempt::Refused(wait);
    }
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Attempt::Other(format!("HTTP {status}: {body}"));
    }
    counts.accepted.fetch_add(1, Ordering::Relaxed);
    // A stream cut by an error is cut all the same: it never said [DONE].
    let data = match sse_data(response, || {}).await {
        Ok(data) if data.last().map(String::as_str) == Some("[DONE]") => data,
        _ => return Attempt::CutSilently,
    };
    let messages: Vec<Value> = data
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let stop = messages
        .iter()
        .find(|m| m["message_type"] == "stop_reason")
        .and_then(|m| m["stop_reason"].as_str());
    let interrupted = messages
        .iter()
        .any(|m| m["message_type"] == "error_message" && m["error_type"] == "interrupted");
    match stop {
        Some("end_turn") => Attempt::Answered,
        _ if interrupted => Attempt::Cut,
        other => Attempt::Other(format!("stream ended with stop_reason {other:?}")),
    }
}

/// One client: its messages, each until the server has it; returns the
/// texts the server accepted and those it refused.
async fn client(
    http: reqwest::Client,
    base: Base,
    agent: String,
    client: usize,
    messages: usize,
    max_wait: Duration,
    counts: Arc<Counts>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    let mut errors = Vec::new();
    let mut queue: std::collections::VecDeque<String> = (0..messages)
        .map(|i| format!("client {client} message {i}"))
        .collect();
    while let Some(text) = queue.pop_front() {
        let url = format!("{}/v1/agents/{agent}/messages/stream", base_of(&base));
        match attempt(&http, &url, &text, &counts).await {
            Attempt::Answered => {
                counts.answered.fetch_add(1, Ordering::Relaxed);
                accepted.push(text);
            }
            Attempt::Cut => {
                counts.cut.fetch_add(1, Ordering::Relaxed);
                // Stored, its answer cut: ask the agent to go on.
                queue.push_front(format!("go on: {text}"));
                accepted.push(text);
            }
            Attempt::CutSilently => {
                counts.cut_silently.fetch_add(1, Ordering::Relaxed);
                queue.push_front(format!("go on: {text}"));
                accepted.push(text);
            }
            Attempt::Refused(wait) => {
                counts.refused.fetch_add(1, Ordering::Relaxed);
                refused.push(text.clone());
                tokio::time::sleep(wait.min(max_wait)).await;
                queue.push_front(text);
            }
            Attempt::Unreachable => {
                counts.unreachable.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                queue.push_front(text);
            }
            Attempt::Other(e) => {
                counts.other.fetch_add(1, Ordering::Relaxed);
                errors.push(format!("client {client}: {text}: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                // A busy conversation (a cut turn still ending) or a
                // broken connection: once more, as a client would.
                if errors.len() < 20 {
                    queue.push_front(text);
                }
            }
        }
    }
    (accepted, refused, errors)
}

/// The user messages stored for `agent`, by text.
async fn stored_texts(http: &reqwest::Client, base: &str, agent: &str) -> Result<Vec<String>> {
    let list = call_json(http.get(format!(
        "{base}/v1/agents/{agent}/messages?order=asc&limit=100000"
    )))
    .await?;
    let list = list.as_array().context("the history is not a list")?;
    Ok(list
        .iter()
        .filter(|m| m["message_type"] == "user_message")
        .filter_map(|m| match &m["content"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
            ),
            _ => None,
        })
        .collect())
}

pub async fn shutdown_load(options: Options) -> Result<()> {
    let toolwire = toolwire_binary(options.toolwire.clone())?;
    let dir = tempfile::tempdir()?;
    let script = script(options.chunk_size, options.delay_ms);
    let grace = options.grace_secs.to_string();
    let flags = ["--shutdown-grace-secs", grace.as_str()];
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let mut server = Server::start_with(&toolwire, dir.path(), &script, &flags).await?;
    server.wait_ready(&http).await?;
    let base: Base = Arc::new(RwLock::new(server.base.clone()));

    let mut agents = Vec::with_capacity(options.clients);
    for i in 0..options.clients {
        let agent = call_json(
            http.post(server.url("/v1/agents"))
                .json(&json!({"name": format!("restart-{i}")})),
        )
        .await?;
        agents.push(
            agent["id"]
                .as_str()
                .context("an agent without an id")?
                .to_owned(),
        );
    }
    println!(
        "shutdown-load: {} clients x {} messages, answers of {} B chunks every {} ms, grace {} s",
        options.clients, options.messages, options.chunk_size, options.delay_ms, options.grace_secs
    );

    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for (i, agent) in agents.iter().enumerate() {
        clients.spawn(client(
            http.clone(),
            base.clone(),
            agent.clone(),
            i,
            options.messages,
            options.max_retry_wait,
            counts.clone(),
        ));
    }

    // SIGTERM once half the messages are accepted; start again once it
    // has exited.
    let half = (options.clients * options.messages / 2) as u64;
    while counts.accepted.load(Ordering::Relaxed) < half {
        if started.elapsed() > options.timeout {
            bail!("half the messages were not accepted within the timeout");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let complaints_before = server.complaints();
    let accepted_at_signal = counts.accepted.load(Ordering::Relaxed);
    server.terminate()?;
    let signalled = Instant::now();
    let bound = Duration::from_secs_f64(options.grace_secs) + Duration::from_secs(30);
    let status = server.exited(bound).await?;
    let stop_time = signalled.elapsed();
    let mut server = Server::start_with(&toolwire, dir.path(), &script, &flags).await?;
    server.wait_ready(&http).await?;
    let down_time = signalled.elapsed();
    if let Ok(mut b) = base.write() {
        *b = server.base.clone();
    }

    let mut accepted: HashMap<String, usize> = HashMap::new();
    let mut refused: Vec<String> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let deadline = options.timeout.saturating_sub(started.elapsed());
    let joined = tokio::time::timeout(deadline, async {
        while let Some(done) = clients.join_next().await {
            let (a, r, e) = done?;
            for text in a {
                *accepted.entry(text).or_default() += 1;
            }
            refused.extend(r);
            errors.extend(e);
        }
        anyhow::Ok(())
    })
    .await;
    joined.context("the clients did not finish within the timeout")??;
    let wall = started.elapsed();

    // What is stored, read back through the restarted server.
    let mut stored: HashMap<String, usize> = HashMap::new();
    for agent in &agents {
        for text in stored_texts(&http, &server.base, agent).await? {
            *stored.entry(text).or_default() += 1;
        }
    }
    let stored_total: usize = stored.values().sum();
    let duplicates: usize = stored.values().filter(|&&n| n > 1).map(|n| n - 1).sum();
    let lost: Vec<&String> = accepted
        .keys()
        .filter(|t| !stored.contains_key(*t))
        .collect();
    // A refused text sent again and accepted later is stored once; one
    // never accepted must not be stored at all.
    let refused_stored: Vec<&String> = refused
        .iter()
        .filter(|t| !accepted.contains_key(*t) && stored.contains_key(*t))
        .collect();
    let complaints_after = server.complaints();
    server.stop().await?;

    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!("wall time              {:.1} s", wall.as_secs_f64());
    println!("accepted at SIGTERM    {accepted_at_signal}");
    println!(
        "SIGTERM to exit        {:.2} s (exit status {status})",
        stop_time.as_secs_f64()
    );
    println!("SIGTERM to serving     {:.2} s", down_time.as_secs_f64());
    println!("accepted (200 + SSE)   {}", c(&counts.accepted));
    println!("  answered (end_turn)  {}", c(&counts.answered));
    println!("  cut, final event     {}", c(&counts.cut));
    println!("  cut silently         {}", c(&counts.cut_silently));
    println!("refused (503)          {}", c(&counts.refused));
    println!("unreachable (retried)  {}", c(&counts.unreachable));
    println!("other errors           {}", c(&counts.other));
    println!("stored user messages   {stored_total}");
    println!("duplicates             {duplicates}");
    println!("lost                   {}", lost.len());
    println!("stored although refused {}", refused_stored.len());
    println!(
        "server log             {} WARN/ERROR lines before the restart, {} after",
        complaints_before.len(),
        complaints_after.len()
    );
    for e in errors.iter().take(10) {
        println!("  error: {e}");
    }
    for line in complaints_before.iter().take(5) {
        println!("  log: {line}");
    }
    if duplicates > 0 || !lost.is_empty() || !refused_stored.is_empty() {
        bail!(
            "stored {duplicates} duplicates, lost {} accepted messages ({:?}), stored {} refused ones",
            lost.len(),
            lost.iter().take(5).collect::<Vec<_>>(),
            refused_stored.len()
        );
    }
    if !status.success() {
        bail!("the server exited with {status} on SIGTERM");
    }
    let sent_once: usize = accepted.values().filter(|&&n| n > 1).count();
    if sent_once > 0 {
        bail!("{sent_once} texts were accepted more than once by the clients' count");
    }
    Ok(())
}
