//! `runs-list`: `GET /v1/runs` on the real `toolwire serve` with many
//! runs stored. One agent gets `--runs` plain messages (a run each),
//! another five; then the list is timed as Letta's clients ask for it: a
//! page of all runs, the few agent's runs, and the busy agent's runs of
//! one status (a filter on the stored run). Each `--toolwire` binary
//! serves the same database in turn, `--rounds` times alternately, so
//! builds compare on one machine state.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::serve_load::{Server, toolwire_binary};
use crate::summary;

/// What `runs-list` is asked to do.
pub struct Options {
    pub toolwire: Vec<PathBuf>,
    pub runs: usize,
    pub rounds: usize,
    pub requests: usize,
}

/// Every message gets this answer at once.
const SCRIPT: &str = "steps:\n  - text: \"Noted.\"\n";

async fn create_agent(http: &reqwest::Client, server: &Server, name: &str) -> Result<String> {
    let agent: Value = http
        .post(server.url("/v1/agents"))
        .json(&json!({"name": name, "include_base_tools": false}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(agent["id"].as_str().context("no agent id")?.to_owned())
}

async fn send(http: &reqwest::Client, server: &Server, agent: &str, n: usize) -> Result<()> {
    for i in 0..n {
        http.post(server.url(&format!("/v1/agents/{agent}/messages")))
            .json(&json!({"input": format!("message {i}")}))
            .send()
            .await?
            .error_for_status()?;
    }
    Ok(())
}

pub async fn runs_list(options: Options) -> Result<()> {
    let binaries = if options.toolwire.is_empty() {
        vec![toolwire_binary(None)?]
    } else {
        options.toolwire.clone()
    };
    let dir = tempfile::tempdir()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;

    // The runs, stored once by the first binary.
    let mut server = Server::start(&binaries[0], dir.path(), SCRIPT).await?;
    server.wait_ready(&http).await?;
    let busy = create_agent(&http, &server, "busy").await?;
    let few = create_agent(&http, &server, "few").await?;
    let started = Instant::now();
    send(&http, &server, &busy, options.runs).await?;
    send(&http, &server, &few, 5).await?;
    println!(
        "runs-list: {} runs stored in {} ms ({} for one agent, 5 for another)",
        options.runs + 5,
        started.elapsed().as_millis(),
        options.runs
    );
    server.stop().await?;

    let queries = [
        ("a page of all", "/v1/runs?limit=10".to_owned(), 10),
        (
            "the few agent's",
            format!("/v1/runs?agent_id={few}&limit=10"),
            5,
        ),
        (
            "busy, completed",
            format!("/v1/runs?agent_id={busy}&statuses=completed&limit=10"),
            10,
        ),
    ];
    let mut times = vec![vec![Vec::new(); queries.len()]; binaries.len()];
    for _ in 0..options.rounds {
        for (b, binary) in binaries.iter().enumerate() {
            let mut server = Server::start(binary, dir.path(), SCRIPT).await?;
            server.wait_ready(&http).await?;
            for (q, (name, path, want)) in queries.iter().enumerate() {
                for _ in 0..options.requests {
                    let sent = Instant::now();
                    let page: Vec<Value> = http
                        .get(server.url(path))
                        .send()
                        .await?
                        .error_for_status()?
                        .json()
                        .await?;
                    times[b][q].push(sent.elapsed());
                    if page.len() != *want {
                        bail!("{name}: {} runs listed, not {want}", page.len());
                    }
                }
            }
            server.stop().await?;
        }
    }
    for (b, binary) in binaries.iter().enumerate() {
        println!("{}", binary.display());
        for (q, (name, _, _)) in queries.iter().enumerate() {
            let sorted = &mut times[b][q];
            sorted.sort();
            summary(name, sorted);
        }
    }
    Ok(())
}
