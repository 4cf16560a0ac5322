//! `ws-fanout`: many live-view WebSocket clients on one conversation.
//!
//! Starts the real `toolwire serve` (as `serve-load` does: a child
//! process, fresh SQLite file, scripted provider), creates one
//! conversation and opens N sockets on it
//! (`/v1/conversations/{id}/ws`), each reading its snapshot. Then it sends
//! T messages one after the other (each once every client has seen the
//! previous turn's `stop`); every turn streams its answer in small chunks,
//! so each turn is many stored events (`text_delta`s mostly).
//!
//! Every client notes when each frame arrives. For each event (by its
//! seq), the first client to get it sets the mark; a client's fan-out
//! latency for that event is its arrival minus the mark (the spread of one
//! event across the clients: the server's fan-out and the sockets, not the
//! model). Printed as percentiles over every (client, event). Every client
//! must receive every event's frames exactly once and in order, the same
//! as every other client; anything else fails the command.
//!
//! The clients run in this process, on its runtime: on a small machine
//! they compete with the server for CPU, which the figures include.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Barrier, Semaphore, mpsc};
use tokio_tungstenite::tungstenite::Message;

use crate::serve_load::{Server, call_json, toolwire_binary};
use crate::{ms, percentile, summary};

/// What `ws-fanout` is asked to do.
pub struct Options {
    pub toolwire: Option<PathBuf>,
    pub clients: usize,
    pub turns: usize,
    /// Bytes per chunk of the scripted answer (one `text_delta` each).
    pub chunk_size: usize,
    /// Pause between chunks.
    pub delay_ms: u64,
    /// Sockets opened at once.
    pub connect_parallel: usize,
    pub timeout: Duration,
}

/// Each turn's answer: about 1 KiB of text.
fn script(chunk_size: usize, delay_ms: u64) -> String {
    let text = "All the clients should see this sentence at about the same time. ".repeat(16);
    format!(
        "model: scripted-fanout\n\
         steps:\n\
         \x20 - text: \"{text}\"\n\
         \x20   chunk_size: {chunk_size}\n\
         \x20   delay_ms: {delay_ms}\n"
    )
}

/// What one client received: (seq, frame type, arrival) per frame.
pub(crate) type Received = Vec<(u64, String, Instant)>;

/// One client: reads its snapshot, says it is ready, then reads frames
/// until it has seen `turns` stops; reports each `stop` to the driver.
/// (`cluster-load` uses it too, with sockets on several instances.)
pub(crate) async fn client(
    url: String,
    turns: usize,
    ready: Arc<Barrier>,
    stops: mpsc::UnboundedSender<usize>,
    connect: Arc<Semaphore>,
) -> Result<Received> {
    let mut socket = {
        let _permit = connect.acquire().await?;
        let (socket, _) = tokio_tungstenite::connect_async(&url)
            .await
            .with_context(|| format!("connecting {url}"))?;
        socket
    };
    let mut received = Received::new();
    let mut snapshot = false;
    let mut stopped = 0;
    let mut waited = false;
    while stopped < turns {
        if snapshot && !waited {
            ready.wait().await;
            waited = true;
        }
        let message = socket
            .next()
            .await
            .context("the socket closed early")?
            .context("reading the socket")?;
        let at = Instant::now();
        let Message::Text(text) = message else {
            continue;
        };
        let frame: Value = serde_json::from_str(text.as_str()).context("a frame is not JSON")?;
        let kind = frame["type"].as_str().unwrap_or("?").to_owned();
        match kind.as_str() {
            "snapshot" => snapshot = true,
            "error" => bail!("the server sent an error: {frame}"),
            _ => {
                let seq = frame["seq"].as_u64().context("a frame without seq")?;
                if kind == "stop" {
                    stopped += 1;
                    let _ = stops.send(stopped);
                }
                received.push((seq, kind, at));
            }
        }
    }
    let _ = socket.close(None).await;
    Ok(received)
}

pub async fn ws_fanout(o: Options) -> Result<()> {
    if o.clients == 0 || o.turns == 0 {
        bail!("--clients and --turns must be at least 1");
    }
    let toolwire = toolwire_binary(o.toolwire.clone())?;
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let http = reqwest::Client::new();
    let mut server = Server::start(
        &toolwire,
        dir.path(),
        &script(o.chunk_size.max(1), o.delay_ms),
    )
    .await?;
    server.wait_ready(&http).await?;
    println!(
        "server {} (pid {}) at {}; {} clients on one conversation, {} turns (chunk {} B, {} ms apart)",
        toolwire.display(),
        server.pid,
        server.base,
        o.clients,
        o.turns,
        o.chunk_size,
        o.delay_ms,
    );
    let outcome = tokio::time::timeout(o.timeout, drive(&o, &http, &server)).await;
    let stopped = server.stop().await;
    match outcome {
        Ok(result) => result?,
        Err(_) => bail!("gave up after {} s (--timeout)", o.timeout.as_secs()),
    }
    stopped
}

async fn drive(o: &Options, http: &reqwest::Client, server: &Server) -> Result<()> {
    let created = call_json(http.post(server.url("/v1/conversations")).json(&json!({}))).await?;
    let id = created["id"]
        .as_str()
        .context("the conversation has no id")?
        .to_owned();
    let ws_url = format!(
        "{}/v1/conversations/{id}/ws",
        server.base.replacen("http://", "ws://", 1)
    );
    let ready = Arc::new(Barrier::new(o.clients + 1));
    let connect = Arc::new(Semaphore::new(o.connect_parallel.max(1)));
    let (stops_tx, mut stops_rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    let clients: Vec<_> = (0..o.clients)
        .map(|_| {
            tokio::spawn(client(
                ws_url.clone(),
                o.turns,
                ready.clone(),
                stops_tx.clone(),
                connect.clone(),
            ))
        })
        .collect();
    drop(stops_tx);
    ready.wait().await;
    println!(
        "connected      {} sockets in {}",
        o.clients,
        ms(started.elapsed())
    );
    let mut turn_times = Vec::new();
    let mut stops: HashMap<usize, usize> = HashMap::new();
    for turn in 1..=o.turns {
        let sent = Instant::now();
        let body = json!({"text": format!("turn {turn}")});
        let url = server.url(&format!("/v1/conversations/{id}/messages"));
        call_json(http.post(url).json(&body)).await?;
        // The next turn once every client has this one's stop.
        while stops.get(&turn).copied().unwrap_or(0) < o.clients {
            let n = stops_rx
                .recv()
                .await
                .context("a client ended before the last turn")?;
            *stops.entry(n).or_default() += 1;
        }
        turn_times.push(sent.elapsed());
    }
    let mut all = Vec::with_capacity(o.clients);
    for c in clients {
        all.push(c.await.context("a client task failed")??);
    }
    report(&all, &mut turn_times)
}

/// Checks that every client got the same frames, once each, in order,
/// and prints the fan-out latency.
fn report(all: &[Received], turn_times: &mut [Duration]) -> Result<()> {
    let Some(reference) = all.first() else {
        bail!("no client");
    };
    let expected: Vec<(u64, &str)> = reference.iter().map(|(s, k, _)| (*s, k.as_str())).collect();
    if expected.windows(2).any(|w| w[0].0 > w[1].0) {
        bail!("a client's seqs went down");
    }
    for (i, got) in all.iter().enumerate() {
        let frames: Vec<(u64, &str)> = got.iter().map(|(s, k, _)| (*s, k.as_str())).collect();
        if frames != expected {
            bail!(
                "client {i} got {} frames, client 0 got {}: not the same events",
                frames.len(),
                expected.len()
            );
        }
    }
    // The first arrival of each frame (by its place in the stream).
    let mut first: Vec<Instant> = reference.iter().map(|(_, _, t)| *t).collect();
    for got in all {
        for (mark, (_, _, t)) in first.iter_mut().zip(got) {
            *mark = (*mark).min(*t);
        }
    }
    let mut spread: Vec<Duration> = all
        .iter()
        .flat_map(|got| {
            got.iter()
                .zip(&first)
                .map(|((_, _, t), mark)| t.saturating_duration_since(*mark))
        })
        .collect();
    spread.sort_unstable();
    let mut last_client: Vec<Duration> = (0..first.len())
        .map(|i| {
            all.iter()
                .map(|got| got[i].2.saturating_duration_since(first[i]))
                .max()
                .unwrap_or_default()
        })
        .collect();
    last_client.sort_unstable();
    turn_times.sort_unstable();
    let events = expected
        .iter()
        .map(|(s, _)| s)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    println!(
        "checked        every client got the same {} frames ({} events), once each, in order",
        expected.len(),
        events
    );
    summary("fan-out", &spread);
    summary("last client", &last_client);
    summary("turn", turn_times);
    println!(
        "fan-out: a client's arrival minus the first client's, per frame and client; \
         last client: that for the slowest client, per frame (p99 {})",
        ms(percentile(&last_client, 99.0))
    );
    Ok(())
}
