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
//! (The client is `load_client.rs`'s, shared with `cluster-load`.)
//!
//! Afterwards every agent's stored history (`GET …/messages`, from the
//! restarted server) is compared with what the clients were told: every
//! accepted message must be stored exactly once (`duplicates` and `lost`
//! are 0), and no refused one at all (`stored although refused` is 0).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::load_client::{Counts, Job, Router, Verdict, client};
use crate::serve_load::{Server, call_json, toolwire_binary};

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
    let router = Router::new([server.base.clone()]);

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
        let job = Job {
            client: i,
            agent: agent.clone(),
            home: 0,
            messages: options.messages,
            max_wait: options.max_retry_wait,
        };
        clients.spawn(client(http.clone(), router.clone(), job, counts.clone()));
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
    router.set(0, Some(server.base.clone()));

    let mut told = Vec::new();
    let deadline = options.timeout.saturating_sub(started.elapsed());
    let joined = tokio::time::timeout(deadline, async {
        while let Some(done) = clients.join_next().await {
            told.push(done?);
        }
        anyhow::Ok(())
    })
    .await;
    joined.context("the clients did not finish within the timeout")??;
    let wall = started.elapsed();

    // What is stored, read back through the restarted server.
    let verdict = Verdict::of(&http, &server.base, &agents, &told).await?;
    let complaints_after = server.complaints();
    server.stop().await?;

    println!("wall time              {:.1} s", wall.as_secs_f64());
    println!("accepted at SIGTERM    {accepted_at_signal}");
    println!(
        "SIGTERM to exit        {:.2} s (exit status {status})",
        stop_time.as_secs_f64()
    );
    println!("SIGTERM to serving     {:.2} s", down_time.as_secs_f64());
    counts.print();
    verdict.print();
    println!(
        "server log             {} WARN/ERROR lines before the restart, {} after",
        complaints_before.len(),
        complaints_after.len()
    );
    for e in told.iter().flat_map(|t| &t.errors).take(10) {
        println!("  error: {e}");
    }
    for line in complaints_before.iter().take(5) {
        println!("  log: {line}");
    }
    verdict.check()?;
    if !status.success() {
        bail!("the server exited with {status} on SIGTERM");
    }
    Ok(())
}
