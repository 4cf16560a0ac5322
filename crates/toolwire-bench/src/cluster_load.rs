//! `cluster-load`: several real `toolwire serve` processes on one
//! PostgreSQL database under N clients x M messages, one of them killed
//! with `kill -9` midway and started again; the same load on one instance
//! alone for comparison; and how long an event takes to reach a follower
//! on another instance.
//!
//! Each run gets a scratch database on the server named by `--db` (or
//! `TOOLWIRE_TEST_POSTGRES_URL`), dropped afterwards. The instances play
//! one script (a short answer streamed in small chunks, so that a turn
//! takes a moment and is several events). N agents are created (through
//! the first instance: they are in the database, any instance serves
//! them) and client i talks to instance i mod K, as a load balancer with
//! sticky sessions would place it. The clients are `load_client.rs`'s:
//! when their instance is unreachable, or its stream breaks off, they turn
//! to the next instance; a message whose stream broke is followed by a
//! `go on` there.
//!
//! Once half of all messages have been accepted, instance 0 is killed
//! (SIGKILL: no shutdown, its turns die mid-stream) and at once started
//! again on the same database (a new port, which the "load balancer"
//! then routes its clients to again). Afterwards every agent's history,
//! read through another instance, must hold every accepted message
//! exactly once and no refused one; no run may stay unfinished.
//!
//! Cross-instance event latency: a live-view socket on instance 1 (which
//! runs the turns) and one on instance 2 follow one conversation through
//! T turns, sent to instance 1 one after the other; for each frame, its
//! arrival on 2 minus its arrival on 1. The owner's socket gets a frame
//! as soon as its event is committed (the in-process bus publishes after
//! the commit), so this is commit-on-1 to frame-on-2, give or take the
//! owner's own socket writing. Measured while the load runs (before the
//! kill) and again on the idle cluster afterwards.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::json;
use tokio::sync::{Barrier, Semaphore, mpsc};

use crate::load_client::{Counts, Job, Router, Told, Verdict, client};
use crate::scratch_db;
use crate::serve_load::{Server, call_json, toolwire_binary};
use crate::ws_fanout::{self, Received};
use crate::{ms, percentile, summary};
use toolwire_test_support::ScratchDatabase;

/// What `cluster-load` is asked to do.
pub struct Options {
    pub toolwire: Option<PathBuf>,
    /// A PostgreSQL URL whose server may create databases.
    pub db: String,
    pub instances: usize,
    pub clients: usize,
    pub messages: usize,
    pub chunk_size: usize,
    pub delay_ms: u64,
    pub failover_secs: u64,
    pub create_parallel: usize,
    pub max_retry_wait: Duration,
    /// Turns of the cross-instance latency measurement, each time.
    pub latency_turns: usize,
    /// Skip the run on one instance alone.
    pub no_alone: bool,
    pub timeout: Duration,
}

/// Each answer: two short sentences streamed in small chunks.
fn script(chunk_size: usize, delay_ms: u64) -> String {
    format!(
        "model: scripted-cluster\n\
         steps:\n\
         \x20 - text: \"Thinking it over, then answering in a few short words. \
         Every instance on the database can tell you the same.\"\n\
         \x20   chunk_size: {chunk_size}\n\
         \x20   delay_ms: {delay_ms}\n"
    )
}

/// What one run measured.
struct Run {
    instances: usize,
    wall: Duration,
    latencies: Vec<Duration>,
    told_errors: usize,
    counts: Arc<Counts>,
    verdict: Verdict,
    /// Kill to the restarted instance answering.
    down: Option<Duration>,
    unfinished: i64,
    under_load: Option<Lags>,
    idle: Option<Lags>,
}

pub async fn cluster_load(o: Options) -> Result<()> {
    if o.instances < 3 {
        bail!(
            "--instances must be at least 3 (one killed, one running the latency turns, one following them)"
        );
    }
    if o.clients == 0 || o.messages == 0 {
        bail!("--clients and --messages must be at least 1");
    }
    let toolwire = toolwire_binary(o.toolwire.clone())?;
    println!(
        "cluster-load: {} clients x {} messages, answers of {} B chunks every {} ms; {}",
        o.clients,
        o.messages,
        o.chunk_size,
        o.delay_ms,
        toolwire.display()
    );
    let alone = if o.no_alone {
        None
    } else {
        println!("\n== one instance alone");
        let run = tokio::time::timeout(o.timeout, run(&o, &toolwire, 1))
            .await
            .context("gave up (--timeout)")??;
        report(&run);
        Some(run)
    };
    println!(
        "\n== {} instances, instance 0 killed (SIGKILL) and restarted midway",
        o.instances
    );
    let cluster = tokio::time::timeout(o.timeout, run(&o, &toolwire, o.instances))
        .await
        .context("gave up (--timeout)")??;
    report(&cluster);

    if let Some(alone) = &alone {
        println!("\n== message latency, request to [DONE] of the answered messages");
        for r in [alone, &cluster] {
            println!(
                "{} instance(s): p50 {}  p99 {}  ({} answered in {:.1} s, {:.0} messages/s)",
                r.instances,
                ms(percentile(&r.latencies, 50.0)),
                ms(percentile(&r.latencies, 99.0)),
                r.latencies.len(),
                r.wall.as_secs_f64(),
                r.latencies.len() as f64 / r.wall.as_secs_f64(),
            );
        }
    }
    for r in alone.iter().chain([&cluster]) {
        r.verdict.check()?;
        if r.unfinished > 0 {
            bail!("{} runs left unfinished", r.unfinished);
        }
    }
    Ok(())
}

fn report(r: &Run) {
    println!("wall time              {:.1} s", r.wall.as_secs_f64());
    if let Some(down) = r.down {
        println!(
            "kill to serving again  {:.2} s (the restarted instance answers)",
            down.as_secs_f64()
        );
    }
    r.counts.print();
    r.verdict.print();
    println!("runs left unfinished   {}", r.unfinished);
    println!("client-side errors     {}", r.told_errors);
    summary("message", &r.latencies);
    if let Some(l) = &r.under_load {
        l.print("cross-instance frames, under the load");
    }
    if let Some(l) = &r.idle {
        l.print("cross-instance frames, idle cluster");
    }
}

/// One run of the load on `instances` instances (the first killed and
/// restarted midway when there are several).
async fn run(o: &Options, toolwire: &std::path::Path, instances: usize) -> Result<Run> {
    let db = scratch_db::create(&o.db).await?;
    let outcome = run_on(o, toolwire, instances, &db).await;
    scratch_db::drop_it(db).await;
    outcome
}

async fn run_on(
    o: &Options,
    toolwire: &std::path::Path,
    instances: usize,
    db: &ScratchDatabase,
) -> Result<Run> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let script = script(o.chunk_size.max(1), o.delay_ms);
    let failover = o.failover_secs.to_string();
    let flags = ["--failover-secs", failover.as_str()];
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let dirs: Vec<PathBuf> = (0..instances)
        .map(|i| dir.path().join(format!("instance-{i}")))
        .collect();
    let mut servers = Vec::with_capacity(instances);
    // One after another: the first migrates the database.
    for d in &dirs {
        std::fs::create_dir_all(d)?;
        let mut server = Server::start_on(toolwire, d, &script, db.url(), &flags).await?;
        server.wait_ready(&http).await?;
        servers.push(server);
    }
    println!(
        "instances              {} (pids {})",
        servers
            .iter()
            .map(|s| s.base.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        servers
            .iter()
            .map(|s| s.pid.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let router = Router::new(servers.iter().map(|s| s.base.clone()));

    let create = servers[0].url("/v1/agents");
    let created: Vec<Result<String>> = futures::stream::iter(0..o.clients)
        .map(|i| {
            let (http, create) = (&http, &create);
            async move {
                let agent = call_json(
                    http.post(create)
                        .json(&json!({"name": format!("cluster-{i}")})),
                )
                .await?;
                agent["id"]
                    .as_str()
                    .map(str::to_owned)
                    .context("an agent without an id")
            }
        })
        .buffered(o.create_parallel.max(1))
        .collect()
        .await;
    let agents = created.into_iter().collect::<Result<Vec<_>>>()?;

    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for (i, agent) in agents.iter().enumerate() {
        let job = Job {
            client: i,
            agent: agent.clone(),
            home: i % instances,
            messages: o.messages,
            max_wait: o.max_retry_wait,
        };
        clients.spawn(client(http.clone(), router.clone(), job, counts.clone()));
    }

    let mut down = None;
    let mut under_load = None;
    if instances > 1 {
        // Followers timed while the load runs, on instances that live,
        // beside the kill below.
        let (owner, follower) = (servers[1].base.clone(), servers[2].base.clone());
        let (http_l, turns) = (http.clone(), o.latency_turns);
        let timing =
            tokio::spawn(async move { cross_latency(&http_l, &owner, &follower, turns).await });
        // Instance 0 dies once half the messages are accepted.
        let half = (o.clients * o.messages / 2) as u64;
        while counts.accepted.load(Ordering::Relaxed) < half {
            if started.elapsed() > o.timeout {
                bail!("half the messages were not accepted within the timeout");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        router.set(0, None);
        let killed = Instant::now();
        servers[0].kill().await?;
        println!(
            "killed                 instance 0 after {:.1} s, {} messages accepted",
            started.elapsed().as_secs_f64(),
            counts.accepted.load(Ordering::Relaxed)
        );
        let mut again = Server::start_on(toolwire, &dirs[0], &script, db.url(), &flags).await?;
        again.wait_ready(&http).await?;
        down = Some(killed.elapsed());
        router.set(0, Some(again.base.clone()));
        servers[0] = again;
        under_load = Some(
            timing
                .await
                .context("the latency task failed")?
                .context("the cross-instance latency under the load")?,
        );
    }

    let mut told: Vec<Told> = Vec::new();
    let deadline = o.timeout.saturating_sub(started.elapsed());
    tokio::time::timeout(deadline, async {
        while let Some(done) = clients.join_next().await {
            told.push(done?);
        }
        anyhow::Ok(())
    })
    .await
    .context("the clients did not finish within the timeout")??;
    let wall = started.elapsed();

    let idle = if instances > 1 {
        Some(
            cross_latency(&http, &servers[1].base, &servers[2].base, o.latency_turns)
                .await
                .context("the cross-instance latency on the idle cluster")?,
        )
    } else {
        None
    };

    // Every run ends (the killed instance's through a survivor's sweep).
    let unfinished =
        scratch_db::unfinished_runs(db, Duration::from_secs(o.failover_secs * 2 + 5)).await?;
    // What is stored, read through an instance that never died.
    let reader = servers.last().context("no instance")?;
    let verdict = Verdict::of(&http, &reader.base, &agents, &told).await?;
    let mut latencies: Vec<Duration> = told.iter().flat_map(|t| t.latencies.clone()).collect();
    latencies.sort_unstable();
    let told_errors = told.iter().map(|t| t.errors.len()).sum();
    for e in told.iter().flat_map(|t| &t.errors).take(5) {
        println!("  client: {e}");
    }
    for (i, s) in servers.iter().enumerate() {
        let complaints = s.complaints();
        if !complaints.is_empty() {
            println!(
                "instance {i} logged   {} WARN/ERROR lines, e.g. {}",
                complaints.len(),
                complaints[0]
            );
        }
    }
    for s in servers {
        s.stop().await?;
    }
    Ok(Run {
        instances,
        wall,
        latencies,
        told_errors,
        counts,
        verdict,
        down,
        unfinished,
        under_load,
        idle,
    })
}

/// Frames' arrival on a follower instance after the owner's.
struct Lags {
    sorted: Vec<Duration>,
    /// The largest, with the frame (seq, type, its place in its turn).
    worst: Vec<(Duration, u64, String, usize)>,
}

impl Lags {
    fn print(&self, name: &str) {
        println!("{name}:");
        summary("  lag", &self.sorted);
        for (lag, seq, kind, place) in &self.worst {
            println!(
                "    {} seq {seq} {kind} (frame {place} of its turn)",
                ms(*lag)
            );
        }
    }
}

/// Sockets on `owner` and `follower` follow one conversation through
/// `turns` turns sent to `owner`; both must get the same frames.
async fn cross_latency(
    http: &reqwest::Client,
    owner: &str,
    follower: &str,
    turns: usize,
) -> Result<Lags> {
    let created = call_json(
        http.post(format!("{owner}/v1/conversations"))
            .json(&json!({"title": "latency"})),
    )
    .await?;
    let id = created["id"]
        .as_str()
        .context("the conversation has no id")?
        .to_owned();
    let ws = |base: &str| {
        format!(
            "{}/v1/conversations/{id}/ws",
            base.replacen("http://", "ws://", 1)
        )
    };
    let ready = Arc::new(Barrier::new(3));
    let connect = Arc::new(Semaphore::new(2));
    let (stops_tx, mut stops_rx) = mpsc::unbounded_channel();
    let sockets: Vec<_> = [ws(owner), ws(follower)]
        .into_iter()
        .map(|url| {
            tokio::spawn(ws_fanout::client(
                url,
                turns,
                ready.clone(),
                stops_tx.clone(),
                connect.clone(),
            ))
        })
        .collect();
    drop(stops_tx);
    ready.wait().await;
    let mut stops = std::collections::HashMap::<usize, usize>::new();
    for turn in 1..=turns {
        let body = json!({"text": format!("latency turn {turn}")});
        call_json(
            http.post(format!("{owner}/v1/conversations/{id}/messages"))
                .json(&body),
        )
        .await?;
        while stops.get(&turn).copied().unwrap_or(0) < 2 {
            let n = stops_rx
                .recv()
                .await
                .context("a socket ended before the last turn")?;
            *stops.entry(n).or_default() += 1;
        }
    }
    let mut received: Vec<Received> = Vec::new();
    for s in sockets {
        received.push(s.await.context("a socket task failed")??);
    }
    let (on_owner, elsewhere) = (&received[0], &received[1]);
    let frames = |r: &Received| {
        r.iter()
            .map(|(s, k, _)| (*s, k.clone()))
            .collect::<Vec<_>>()
    };
    if frames(on_owner) != frames(elsewhere) {
        bail!(
            "the follower on another instance got {} frames, the owner's socket {}: not the same",
            elsewhere.len(),
            on_owner.len()
        );
    }
    let mut place = 0;
    let mut all: Vec<(Duration, u64, String, usize)> = on_owner
        .iter()
        .zip(elsewhere)
        .map(|((seq, kind, at_owner), (_, _, at_follower))| {
            let this = place;
            place = if kind == "stop" { 0 } else { place + 1 };
            (
                at_follower.saturating_duration_since(*at_owner),
                *seq,
                kind.clone(),
                this,
            )
        })
        .collect();
    let mut sorted: Vec<Duration> = all.iter().map(|(d, ..)| *d).collect();
    sorted.sort_unstable();
    all.sort_by_key(|a| std::cmp::Reverse(a.0));
    all.truncate(5);
    Ok(Lags { sorted, worst: all })
}
