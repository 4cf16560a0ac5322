//! `run-resume`: a background run's stream on the real `toolwire serve`,
//! left by its client halfway and resumed after the last `seq_id` the
//! client saw (`POST /v1/runs/{id}/stream` with `starting_after`).
//! Checks that the two parts together are the whole stream, each
//! message once and in order (events lost 0, repeated 0), against a full
//! replay from `starting_after: 0` once the run ended; then times full
//! replays of the finished run (`--replays` of them) and reports the time
//! per replay and per event.
//!
//! The scripted model streams one answer of `--events` text pieces (12
//! characters each, one event each), `--delay-ms` between chunks of the
//! rendered stream, so that the client leaves while the run goes on.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::serve_load::{Server, toolwire_binary};
use crate::summary;

/// What `run-resume` is asked to do.
pub struct Options {
    pub toolwire: Option<PathBuf>,
    pub events: usize,
    pub delay_ms: u64,
    pub replays: usize,
}

/// Reads an SSE response: each `data:` JSON object, until `[DONE]` or
/// until `stop_after` objects were read (then the connection is dropped).
async fn read_sse(
    response: reqwest::Response,
    stop_after: Option<usize>,
) -> Result<(Vec<Value>, bool)> {
    let mut body = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        buffer.extend_from_slice(&chunk?);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for line in text.lines() {
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    return Ok((out, true));
                }
                out.push(serde_json::from_str(data).context("an SSE event is not JSON")?);
                if stop_after.is_some_and(|n| out.len() >= n) {
                    return Ok((out, false));
                }
            }
        }
    }
    Ok((out, false))
}

fn seq_ids(messages: &[Value]) -> Vec<u64> {
    messages
        .iter()
        .filter_map(|m| m.get("seq_id").and_then(Value::as_u64))
        .collect()
}

pub async fn run_resume(options: Options) -> Result<()> {
    let toolwire = toolwire_binary(options.toolwire.clone())?;
    let dir = tempfile::tempdir()?;
    // Pieces of 12 characters: one text event each.
    let text = "abcdefghijk ".repeat(options.events);
    let script = format!(
        "steps:\n  - text: \"{text}\"\n    chunk_size: 4096\n    delay_ms: {}\n",
        options.delay_ms
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let mut server = Server::start(&toolwire, dir.path(), &script).await?;
    server.wait_ready(&http).await?;
    let agent: Value = http
        .post(server.url("/v1/agents"))
        .json(&json!({"name": "resume", "include_base_tools": false}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let agent_id = agent["id"].as_str().context("no agent id")?.to_owned();

    // The client reads a third of the stream, then leaves.
    let started = Instant::now();
    let response = http
        .post(server.url(&format!("/v1/agents/{agent_id}/messages/stream")))
        .json(&json!({"input": "Go.", "stream_tokens": true, "background": true}))
        .send()
        .await?
        .error_for_status()?;
    let (first, done) = read_sse(response, Some(options.events / 3)).await?;
    if done {
        bail!("the run ended before the client left: raise --delay-ms");
    }
    let left_at = started.elapsed();
    let run_id = first
        .first()
        .and_then(|m| m["run_id"].as_str())
        .context("no run id in the stream")?
        .to_owned();
    let last_seen = seq_ids(&first).last().copied().unwrap_or(0);
    let status: Value = http
        .get(server.url(&format!("/v1/runs/{run_id}")))
        .send()
        .await?
        .json()
        .await?;
    let running_when_left = status["status"] == "running";

    // Resumed after the last seq_id seen, while the run goes on.
    let response = http
        .post(server.url(&format!("/v1/runs/{run_id}/stream")))
        .json(&json!({"starting_after": last_seen}))
        .send()
        .await?
        .error_for_status()?;
    let (rest, rest_done) = read_sse(response, None).await?;
    let run_took = started.elapsed();

    // The whole stream, from the finished run.
    let response = http
        .post(server.url(&format!("/v1/runs/{run_id}/stream")))
        .json(&json!({"starting_after": 0}))
        .send()
        .await?
        .error_for_status()?;
    let (whole, whole_done) = read_sse(response, None).await?;
    let expected = seq_ids(&whole);
    let mut got = seq_ids(&first);
    got.extend(seq_ids(&rest));
    let lost = expected.iter().filter(|s| !got.contains(s)).count();
    let repeated = got.len() - got.iter().collect::<std::collections::HashSet<_>>().len();
    let in_order = got.windows(2).all(|w| w[0] < w[1]) && got == expected;
    let same_messages = first
        .iter()
        .chain(rest.iter())
        .zip(whole.iter())
        .all(|(a, b)| {
            a["seq_id"] == b["seq_id"]
                && a["message_type"] == b["message_type"]
                && a["content"] == b["content"]
        });

    let mut replays = Vec::with_capacity(options.replays);
    for _ in 0..options.replays {
        let sent = Instant::now();
        let response = http
            .post(server.url(&format!("/v1/runs/{run_id}/stream")))
            .json(&json!({"starting_after": 0}))
            .send()
            .await?
            .error_for_status()?;
        let (all, ended) = read_sse(response, None).await?;
        if !ended || all.len() != whole.len() {
            bail!("a replay gave {} messages, not {}", all.len(), whole.len());
        }
        replays.push(sent.elapsed());
    }
    replays.sort();
    server.stop().await?;

    println!(
        "run-resume: one background run of {} text events (stream_tokens), client left after {} messages ({} ms, run {})",
        options.events,
        first.len(),
        left_at.as_millis(),
        if running_when_left {
            "still running"
        } else {
            "already ended"
        }
    );
    println!(
        "stream messages        {} (seq_id 1..{})",
        whole.len(),
        expected.last().copied().unwrap_or(0)
    );
    println!(
        "first part + resumed   {} + {} (resumed after seq_id {last_seen}; ended with [DONE]: {rest_done})",
        first.len(),
        rest.len()
    );
    println!("events lost            {lost}");
    println!("events repeated        {repeated}");
    println!(
        "in order, as replayed  {}",
        in_order && same_messages && whole_done
    );
    println!("run wall time          {} ms", run_took.as_millis());
    summary("full replay", &replays);
    if let Some(p50) = replays.get(replays.len() / 2) {
        println!(
            "per event (p50)        {:.2} µs",
            p50.as_secs_f64() * 1e6 / whole.len().max(1) as f64
        );
    }
    if lost != 0 || repeated != 0 || !in_order {
        bail!("the resumed stream is not the run's stream");
    }
    Ok(())
}
