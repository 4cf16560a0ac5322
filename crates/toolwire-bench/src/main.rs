//! `toolwire-bench`: a load driver for toolwire's engine.
//!
//! * `concurrent`: N conversations, each running one turn at the same time
//!   on one engine (scripted provider without delay, one no-op tool);
//!   prints throughput, step latency percentiles, wall time and errors.
//!   A turn of `--steps S` is S model calls: S − 1 that call the no-op
//!   tool, then a final answer. A step's latency is the time between
//!   consecutive `assistant_message_created` events of a run (the first
//!   step from `turn_started`), i.e. one model call plus the tool run
//!   before it, stored and published.
//! * `idle-memory`: N conversations, each with a short exchange, then
//!   idle; prints the process's resident memory before and after, and per
//!   idle conversation.
//! * `serve-load`: the real `toolwire serve` binary (a child process)
//!   under N concurrent SSE clients, each sending M messages whose turn
//!   calls one built-in tool; prints messages/s, time to first event,
//!   message latency and the server's RSS, and checks that every message
//!   was answered and stored (see `serve_load.rs`).
//! * `ws-fanout`: the real `toolwire serve` with N live-view WebSocket
//!   clients on one conversation; prints the fan-out latency (a client's
//!   arrival of a frame minus the first client's) and checks that every
//!   client got every event once, in order (see `ws_fanout.rs`).
//! * `shutdown-load`: the real `toolwire serve` under N clients x M
//!   messages, stopped with SIGTERM midway and started again on the same
//!   SQLite file while the clients retry what was refused or cut; checks
//!   that every message answered as accepted is stored exactly once (see
//!   `shutdown_load.rs`).
//! * `run-resume`: the real `toolwire serve`: a background run's stream
//!   left by its client halfway and resumed after its last `seq_id`;
//!   checks that nothing was lost or repeated and times full replays
//!   (see `run_resume.rs`).
//! * `cluster-load`: three (or more) real `toolwire serve` processes on
//!   one scratch PostgreSQL database under N clients x M messages, one
//!   instance killed with SIGKILL midway and started again while its
//!   clients turn to the others; checks that every accepted message is
//!   stored exactly once, compares message latency with the same load on
//!   one instance alone, and times frames on a follower instance against
//!   the instance running the turn (see `cluster_load.rs`).
//! * `plain-load`: server CPU per answered message: the real `toolwire
//!   serve` (and, with `--kelpie`, a Kelpie server) against an
//!   OpenAI-compatible mock model over loopback, N agents x M plain
//!   messages through the Letta messages route; prints CPU per message,
//!   throughput and latency (see `plain_load.rs`).
//! * `runs-list`: `GET /v1/runs` on the real `toolwire serve` with
//!   thousands of runs stored, each build alternately on one database
//!   (see `runs_list.rs`).
//! * `slowloris`: N connections sending headers a byte at a time; reports
//!   when the server closed them and whether ordinary requests still get
//!   through (see `slowloris.rs`).
//!
//! The store is an SQLite file in a temporary directory unless `--db`
//! names one (`sqlite://PATH` or `postgres://…`).

mod cluster_load;
mod load_client;
mod plain_load;
mod run_resume;
mod runs_list;
mod scratch_db;
mod serve_load;
mod shutdown_load;
mod slowloris;
mod ws_fanout;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use toolwire_core::{AgentEvent, ConversationId, RunId, StopReason};
use toolwire_engine::{Engine, EngineConfig, Observer};
use toolwire_providers::{Script, ScriptedProvider};
use toolwire_store::{Store, StoredEvent};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

#[derive(Parser)]
#[command(name = "toolwire-bench", about = "Load driver for toolwire's engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs one turn in each of N conversations at the same time.
    Concurrent {
        /// Conversations, each running one turn.
        #[arg(long, default_value_t = 1000)]
        conversations: usize,
        /// Model calls per turn: all but the last call the no-op tool.
        #[arg(long, default_value_t = 5)]
        steps: u32,
        /// Store URL (default: an SQLite file in a temporary directory).
        #[arg(long)]
        db: Option<String>,
        /// Turns running at once (default: all of them).
        #[arg(long)]
        concurrency_limit: Option<usize>,
        /// Seconds before the run is cancelled and reported as is.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Creates N conversations with a short exchange each, then measures
    /// resident memory per idle conversation.
    IdleMemory {
        #[arg(long, default_value_t = 10_000)]
        conversations: usize,
        /// Store URL (default: an SQLite file in a temporary directory).
        #[arg(long)]
        db: Option<String>,
        /// Model calls of each conversation's exchange (all but the last
        /// call the no-op tool).
        #[arg(long, default_value_t = 1)]
        steps: u32,
        /// Turns running at once while the conversations are created.
        #[arg(long, default_value_t = 64)]
        parallel: usize,
        /// Seconds before the run gives up.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Starts `toolwire serve` (scripted provider, fresh SQLite file) and
    /// runs N concurrent SSE clients, each sending M messages in turn.
    ServeLoad {
        /// The toolwire binary (default: `toolwire` next to this one,
        /// i.e. target/release/toolwire).
        #[arg(long)]
        toolwire: Option<std::path::PathBuf>,
        /// Concurrent clients, each with its own agent.
        #[arg(long, default_value_t = 200)]
        clients: usize,
        /// Messages each client sends, one after the other.
        #[arg(long, default_value_t = 20)]
        messages: usize,
        /// Bytes per chunk of the scripted model's streams.
        #[arg(long, default_value_t = 65536)]
        chunk_size: usize,
        /// Agents created at once before the load.
        #[arg(long, default_value_t = 16)]
        create_parallel: usize,
        /// Seconds a message may take before it counts as an error.
        #[arg(long, default_value_t = 120)]
        request_timeout: u64,
        /// Seconds before the whole run gives up.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// Seconds to wait after the load before the last memory reading
        /// (tokio's idle blocking threads exit after 10 s).
        #[arg(long, default_value_t = 12)]
        settle: u64,
    },
    /// Runs N clients x M messages against `toolwire serve`, sends it
    /// SIGTERM once half are accepted, starts it again on the same file,
    /// and checks that every accepted message is stored exactly once.
    ShutdownLoad {
        /// The toolwire binary (default: `toolwire` next to this one).
        #[arg(long)]
        toolwire: Option<std::path::PathBuf>,
        /// Concurrent clients, each with its own agent.
        #[arg(long, default_value_t = 100)]
        clients: usize,
        /// Messages each client sends, one after the other.
        #[arg(long, default_value_t = 10)]
        messages: usize,
        /// Bytes per chunk of each answer's stream.
        #[arg(long, default_value_t = 64)]
        chunk_size: usize,
        /// Milliseconds between chunks (an answer takes a moment).
        #[arg(long, default_value_t = 40)]
        delay_ms: u64,
        /// The server's `--shutdown-grace-secs`.
        #[arg(long, default_value_t = 10.0)]
        grace_secs: f64,
        /// Longest wait a client honours from a 503's Retry-After, in ms.
        #[arg(long, default_value_t = 1000)]
        max_retry_wait_ms: u64,
        /// Seconds before the whole run gives up.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Runs N clients x M messages over several `toolwire serve`
    /// instances on one PostgreSQL database, kills one (SIGKILL) midway and
    /// starts it again; checks that every accepted message is stored
    /// exactly once; compares with one instance alone; times frames on a
    /// follower instance against the instance running the turn.
    ClusterLoad {
        /// The toolwire binary (default: `toolwire` next to this one).
        #[arg(long)]
        toolwire: Option<std::path::PathBuf>,
        /// A PostgreSQL URL whose user may create databases; each run
        /// creates a scratch database there and drops it afterwards
        /// (default: $TOOLWIRE_TEST_POSTGRES_URL).
        #[arg(long)]
        db: Option<String>,
        /// `toolwire serve` processes on the database.
        #[arg(long, default_value_t = 3)]
        instances: usize,
        /// Concurrent clients, each with its own agent, client i on
        /// instance i mod N.
        #[arg(long, default_value_t = 200)]
        clients: usize,
        /// Messages each client sends, one after the other.
        #[arg(long, default_value_t = 20)]
        messages: usize,
        /// Bytes per chunk of each answer's stream (one event each).
        #[arg(long, default_value_t = 16)]
        chunk_size: usize,
        /// Milliseconds between chunks.
        #[arg(long, default_value_t = 10)]
        delay_ms: u64,
        /// The instances' `--failover-secs`.
        #[arg(long, default_value_t = 3)]
        failover_secs: u64,
        /// Agents created at once before the load.
        #[arg(long, default_value_t = 16)]
        create_parallel: usize,
        /// Longest wait a client honours from a 503's Retry-After, in ms.
        #[arg(long, default_value_t = 1000)]
        max_retry_wait_ms: u64,
        /// Turns of each cross-instance latency measurement.
        #[arg(long, default_value_t = 20)]
        latency_turns: usize,
        /// Skip the comparison run on one instance alone.
        #[arg(long)]
        no_alone: bool,
        /// Seconds before a run gives up.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
    },
    /// A background run's stream on `toolwire serve`, left by its client
    /// halfway and resumed after its last seq_id; then full replays timed.
    RunResume {
        /// The toolwire binary (default: `toolwire` next to this one).
        #[arg(long)]
        toolwire: Option<std::path::PathBuf>,
        /// Text events of the run (one streamed message each).
        #[arg(long, default_value_t = 10_000)]
        events: usize,
        /// Milliseconds between chunks of the model's stream.
        #[arg(long, default_value_t = 10)]
        delay_ms: u64,
        /// Full replays of the finished run to time.
        #[arg(long, default_value_t = 20)]
        replays: usize,
    },
    /// `GET /v1/runs` with many runs stored: a page of all, one agent's,
    /// and one agent's of a status, each build alternately.
    RunsList {
        /// toolwire binaries to compare (repeat the flag; default:
        /// `toolwire` next to this one).
        #[arg(long)]
        toolwire: Vec<std::path::PathBuf>,
        /// Runs of the busy agent (one plain message each).
        #[arg(long, default_value_t = 2_000)]
        runs: usize,
        /// Rounds, each binary once per round.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Requests of each list per binary per round.
        #[arg(long, default_value_t = 10)]
        requests: usize,
    },
    /// Server CPU per answered message: `toolwire serve` (and Kelpie) with
    /// an OpenAI-compatible mock model, N agents x M plain messages.
    PlainLoad {
        /// toolwire binaries to measure (repeat the flag to compare builds,
        /// run alternately; default: `toolwire` next to this one).
        #[arg(long)]
        toolwire: Vec<std::path::PathBuf>,
        /// A Kelpie server binary to measure beside toolwire, against the
        /// same mock model.
        #[arg(long)]
        kelpie: Option<std::path::PathBuf>,
        /// Kelpie's log filter (its RUST_LOG): warn, as toolwire logs by
        /// default; Kelpie's own default is "info,tower_http=debug", a few
        /// lines per request.
        #[arg(long, default_value = "warn", value_name = "FILTER")]
        kelpie_log: String,
        /// Agents, all sending at once.
        #[arg(long, default_value_t = 50)]
        agents: usize,
        /// Messages each agent sends, one after the other.
        #[arg(long, default_value_t = 10)]
        messages: usize,
        /// Milliseconds the mock model waits before each answer.
        #[arg(long, default_value_t = 0)]
        model_delay_ms: u64,
        /// Runs of every server, alternating.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Directory for the temporary directories and toolwire's SQLite
        /// file (e.g. a tmpfs, for a database in memory).
        #[arg(long)]
        tmpdir: Option<std::path::PathBuf>,
        /// Seconds a message may take before it counts as an error.
        #[arg(long, default_value_t = 120)]
        request_timeout: u64,
    },
    /// Opens N connections to `toolwire serve` that send their headers one
    /// byte at a time; reports when the server closes them.
    Slowloris {
        /// The toolwire binary (default: `toolwire` next to this one).
        #[arg(long)]
        toolwire: Option<std::path::PathBuf>,
        #[arg(long, default_value_t = 500)]
        connections: usize,
        /// Milliseconds between two bytes of one connection.
        #[arg(long, default_value_t = 1000)]
        byte_every_ms: u64,
        /// Seconds the connections are kept up.
        #[arg(long, default_value_t = 60)]
        duration: u64,
    },
    /// Starts `toolwire serve` (scripted provider, fresh SQLite file),
    /// opens N live-view WebSockets on one conversation and runs T turns;
    /// prints the fan-out latency of their frames.
    WsFanout {
        /// The toolwire binary (default: `toolwire` next to this one).
        #[arg(long)]
        toolwire: Option<std::path::PathBuf>,
        /// WebSocket clients, all on the one conversation.
        #[arg(long, default_value_t = 500)]
        clients: usize,
        /// Turns, one after the other.
        #[arg(long, default_value_t = 5)]
        turns: usize,
        /// Bytes per chunk of each answer's stream (one event each).
        #[arg(long, default_value_t = 16)]
        chunk_size: usize,
        /// Milliseconds between chunks.
        #[arg(long, default_value_t = 5)]
        delay_ms: u64,
        /// Sockets opened at once.
        #[arg(long, default_value_t = 50)]
        connect_parallel: usize,
        /// Seconds before the whole run gives up.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Concurrent {
            conversations,
            steps,
            db,
            concurrency_limit,
            timeout,
        } => {
            let limit = concurrency_limit.unwrap_or(conversations).max(1);
            concurrent(
                conversations,
                steps,
                db,
                limit,
                Duration::from_secs(timeout),
            )
            .await
        }
        Command::IdleMemory {
            conversations,
            db,
            steps,
            parallel,
            timeout,
        } => {
            let run = idle_memory(conversations, steps, db, parallel.max(1));
            tokio::time::timeout(Duration::from_secs(timeout), run)
                .await
                .with_context(|| format!("gave up after {timeout} s (--timeout)"))?
        }
        Command::ServeLoad {
            toolwire,
            clients,
            messages,
            chunk_size,
            create_parallel,
            request_timeout,
            timeout,
            settle,
        } => {
            serve_load::serve_load(serve_load::Options {
                toolwire,
                clients,
                messages,
                chunk_size: chunk_size.max(1),
                create_parallel,
                request_timeout: Duration::from_secs(request_timeout),
                timeout: Duration::from_secs(timeout),
                settle: Duration::from_secs(settle),
            })
            .await
        }
        Command::ClusterLoad {
            toolwire,
            db,
            instances,
            clients,
            messages,
            chunk_size,
            delay_ms,
            failover_secs,
            create_parallel,
            max_retry_wait_ms,
            latency_turns,
            no_alone,
            timeout,
        } => {
            let db = match db {
                Some(db) => db,
                None => std::env::var("TOOLWIRE_TEST_POSTGRES_URL").context(
                    "no database: pass --db postgres://… or set TOOLWIRE_TEST_POSTGRES_URL",
                )?,
            };
            cluster_load::cluster_load(cluster_load::Options {
                toolwire,
                db,
                instances,
                clients,
                messages,
                chunk_size: chunk_size.max(1),
                delay_ms,
                failover_secs: failover_secs.max(1),
                create_parallel,
                max_retry_wait: Duration::from_millis(max_retry_wait_ms),
                latency_turns: latency_turns.max(1),
                no_alone,
                timeout: Duration::from_secs(timeout),
            })
            .await
        }
        Command::ShutdownLoad {
            toolwire,
            clients,
            messages,
            chunk_size,
            delay_ms,
            grace_secs,
            max_retry_wait_ms,
            timeout,
        } => {
            shutdown_load::shutdown_load(shutdown_load::Options {
                toolwire,
                clients,
                messages,
                chunk_size: chunk_size.max(1),
                delay_ms,
                grace_secs,
                max_retry_wait: Duration::from_millis(max_retry_wait_ms),
                timeout: Duration::from_secs(timeout),
            })
            .await
        }
        Command::RunResume {
            toolwire,
            events,
            delay_ms,
            replays,
        } => {
            run_resume::run_resume(run_resume::Options {
                toolwire,
                events,
                delay_ms,
                replays,
            })
            .await
        }
        Command::RunsList {
            toolwire,
            runs,
            rounds,
            requests,
        } => {
            runs_list::runs_list(runs_list::Options {
                toolwire,
                runs,
                rounds,
                requests,
            })
            .await
        }
        Command::PlainLoad {
            toolwire,
            kelpie,
            kelpie_log,
            agents,
            messages,
            model_delay_ms,
            rounds,
            tmpdir,
            request_timeout,
        } => {
            plain_load::plain_load(plain_load::Options {
                toolwire,
                kelpie,
                kelpie_log,
                agents,
                messages,
                model_delay: Duration::from_millis(model_delay_ms),
                rounds,
                tmpdir,
                request_timeout: Duration::from_secs(request_timeout),
            })
            .await
        }
        Command::Slowloris {
            toolwire,
            connections,
            byte_every_ms,
            duration,
        } => {
            slowloris::slowloris(slowloris::Options {
                toolwire,
                connections,
                byte_every: Duration::from_millis(byte_every_ms.max(1)),
                duration: Duration::from_secs(duration),
            })
            .await
        }
        Command::WsFanout {
            toolwire,
            clients,
            turns,
            chunk_size,
            delay_ms,
            connect_parallel,
            timeout,
        } => {
            ws_fanout::ws_fanout(ws_fanout::Options {
                toolwire,
                clients,
                turns,
                chunk_size,
                delay_ms,
                connect_parallel,
                timeout: Duration::from_secs(timeout),
            })
            .await
        }
    }
}

/// A tool that does nothing.
struct Noop {
    spec: Arc<ToolSpec>,
}

#[async_trait]
impl Tool for Noop {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, _arguments: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::ok("ok"))
    }
}

/// A store, and the temporary directory holding it when it is the default
/// SQLite file.
async fn open_store(
    db: Option<String>,
) -> Result<(Arc<dyn Store>, String, Option<tempfile::TempDir>)> {
    let (url, dir) = match db {
        Some(url) => (url, None),
        None => {
            let dir = tempfile::tempdir().context("creating a temporary directory")?;
            let url = format!("sqlite://{}", dir.path().join("bench.db").display());
            (url, Some(dir))
        }
    };
    let store = toolwire_store::open(&url)
        .await
        .with_context(|| format!("opening the store at {url}"))?;
    Ok((store, url, dir))
}

/// An engine playing turns of `steps` model calls (all but the last call
/// the no-op tool), without delay, one chunk per call.
async fn engine(store: Arc<dyn Store>, steps: u32) -> Result<Engine> {
    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    let mut script: Vec<Value> = (1..steps)
        .map(|i| {
            json!({
                "text": "Checking.",
                "tool_calls": [{"name": "noop", "arguments": {"n": i}}],
                "chunk_size": 65536,
                "delay_ms": 0,
            })
        })
        .collect();
    script.push(json!({"text": "All done.", "chunk_size": 65536, "delay_ms": 0}));
    let script = Script::parse(&json!({ "steps": script }).to_string())?;
    let provider = Arc::new(ScriptedProvider::new(script, false));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Noop {
        spec: Arc::new(ToolSpec {
            name: "noop".into(),
            server: None,
            description: "Does nothing.".into(),
            parameters: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            read_only: true,
        }),
    }));
    let config = EngineConfig {
        max_steps: steps.max(1),
        ..EngineConfig::default()
    };
    Ok(Engine::start(store, provider, tools, config).await?)
}

/// `n` new conversations, `parallel` created at once.
async fn create_conversations(
    engine: &Engine,
    n: usize,
    parallel: usize,
) -> Result<Vec<ConversationId>> {
    let created: Vec<_> = futures::stream::iter(0..n)
        .map(|_| async { engine.create_conversation(None).await.map(|c| c.id) })
        .buffer_unordered(parallel)
        .collect()
        .await;
    Ok(created.into_iter().collect::<Result<Vec<_>, _>>()?)
}

/// When the events a step's latency is measured from happened.
#[derive(Default)]
struct Timeline {
    runs: Mutex<HashMap<RunId, RunTimes>>,
}

#[derive(Default)]
struct RunTimes {
    started: Option<Instant>,
    messages: Vec<Instant>,
    stopped: Option<Instant>,
}

impl Observer for Timeline {
    fn on_event(&self, _conversation: ConversationId, event: &StoredEvent) {
        let now = Instant::now();
        let run_id = event.event.run_id();
        let Ok(mut runs) = self.runs.lock() else {
            return;
        };
        let times = runs.entry(run_id).or_default();
        match &event.event {
            AgentEvent::TurnStarted { .. } => times.started = Some(now),
            AgentEvent::AssistantMessageCreated { .. } => times.messages.push(now),
            AgentEvent::Stopped { .. } => times.stopped = Some(now),
            _ => {}
        }
    }
}

impl Timeline {
    /// Step latencies and turn latencies of every run seen.
    fn latencies(&self) -> (Vec<Duration>, Vec<Duration>) {
        let mut steps = Vec::new();
        let mut turns = Vec::new();
        if let Ok(runs) = self.runs.lock() {
            for times in runs.values() {
                let Some(started) = times.started else {
                    continue;
                };
                let mut previous = started;
                for &t in &times.messages {
                    steps.push(t.saturating_duration_since(previous));
                    previous = t;
                }
                if let Some(stopped) = times.stopped {
                    turns.push(stopped.saturating_duration_since(started));
                }
            }
        }
        steps.sort_unstable();
        turns.sort_unstable();
        (steps, turns)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn summary(name: &str, sorted: &[Duration]) {
    println!(
        "{name:<14} n={:<6} p50 {}  p90 {}  p99 {}  max {}",
        sorted.len(),
        ms(percentile(sorted, 50.0)),
        ms(percentile(sorted, 90.0)),
        ms(percentile(sorted, 99.0)),
        ms(sorted.last().copied().unwrap_or_default()),
    );
}

async fn concurrent(
    conversations: usize,
    steps: u32,
    db: Option<String>,
    limit: usize,
    timeout: Duration,
) -> Result<()> {
    let (store, url, _dir) = open_store(db).await?;
    let engine = engine(store, steps).await?;
    let timeline = Arc::new(Timeline::default());
    engine.observe(timeline.clone());

    let setup = Instant::now();
    let ids = create_conversations(&engine, conversations, 32).await?;
    println!(
        "store {url}\n{conversations} conversations created in {}; each runs one turn of {steps} model calls \
         ({} with a no-op tool call), at most {limit} at once",
        ms(setup.elapsed()),
        steps - 1,
    );

    let gate = Arc::new(Semaphore::new(limit));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids.iter().copied() {
        let engine = engine.clone();
        let gate = gate.clone();
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let handle = engine
                .send(id, "go", None)
                .await
                .map_err(|e| e.to_string())?;
            let outcome = handle.wait().await;
            match outcome.reason {
                StopReason::EndTurn => Ok(()),
                other => Err(format!(
                    "{}: {}",
                    other.as_str(),
                    outcome.error.unwrap_or_default()
                )),
            }
        });
    }

    let mut ok = 0usize;
    let mut errors: Vec<String> = Vec::new();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut timed_out = false;
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => ok += 1,
                Some(Ok(Err(e))) => errors.push(e),
                Some(Err(e)) => errors.push(format!("task failed: {e}")),
            },
            _ = &mut deadline => {
                timed_out = true;
                for id in &ids {
                    engine.cancel(*id);
                }
                tasks.abort_all();
                break;
            }
        }
    }
    let wall = start.elapsed();

    let (step_latencies, turn_latencies) = timeline.latencies();
    let steps_done = step_latencies.len();
    println!("wall time      {}", ms(wall));
    println!(
        "turns          {ok} completed, {} errors{}",
        errors.len(),
        if timed_out {
            " (timed out: the rest were cancelled)"
        } else {
            ""
        }
    );
    println!(
        "throughput     {:.0} steps/s, {:.1} turns/s",
        steps_done as f64 / wall.as_secs_f64(),
        ok as f64 / wall.as_secs_f64(),
    );
    summary("step latency", &step_latencies);
    summary("turn latency", &turn_latencies);
    for e in errors.iter().take(5) {
        println!("error: {e}");
    }
    if timed_out {
        bail!("timed out after {} s", timeout.as_secs());
    }
    if !errors.is_empty() {
        bail!("{} turns failed", errors.len());
    }
    Ok(())
}

/// The process's resident set size, from /proc/self/status.
fn rss_bytes() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS in /proc/self/status")?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .context("unreadable VmRSS")?;
    Ok(kib * 1024)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Creates `n` conversations and runs one exchange in each, `parallel` at
/// once.
async fn exchanges(engine: &Engine, n: usize, parallel: usize) -> Result<Vec<ConversationId>> {
    let results: Vec<Result<ConversationId>> = futures::stream::iter(0..n)
        .map(|_| async {
            let c = engine.create_conversation(None).await?;
            let outcome = engine.run(c.id, "hi").await?;
            if outcome.reason != StopReason::EndTurn {
                bail!(
                    "the exchange ended with {}: {}",
                    outcome.reason.as_str(),
                    outcome.error.unwrap_or_default()
                );
            }
            Ok(c.id)
        })
        .buffer_unordered(parallel)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Waits for the engine to go quiet (pools settle), then reads the RSS.
async fn idle_rss() -> Result<u64> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    rss_bytes()
}

async fn idle_memory(
    conversations: usize,
    steps: u32,
    db: Option<String>,
    parallel: usize,
) -> Result<()> {
    let (store, url, dir) = open_store(db).await?;
    let engine = engine(store, steps).await?;
    // Warm up: the store's connections, caches and the allocator's arenas.
    exchanges(&engine, 200.min(conversations), parallel).await?;
    let base = idle_rss().await?;
    println!("store {url}");
    println!("RSS after warm-up (200 conversations)   {}", mib(base));

    let start = Instant::now();
    let mut ids = Vec::with_capacity(conversations);
    let batches = 5;
    let mut previous = (0usize, base);
    for b in 1..=batches {
        let upto = conversations * b / batches;
        ids.extend(exchanges(&engine, upto - ids.len(), parallel).await?);
        let rss = idle_rss().await?;
        let added = upto - previous.0;
        println!(
            "RSS with {upto:>7} idle conversations   {}  (+{:.0} bytes per conversation since the previous line)",
            mib(rss),
            rss.saturating_sub(previous.1) as f64 / added.max(1) as f64,
        );
        previous = (upto, rss);
    }
    let idle = previous.1;
    println!(
        "created {conversations} conversations ({steps} model call(s) each) in {}",
        ms(start.elapsed())
    );
    println!(
        "per idle conversation: {:.0} bytes (RSS +{} for {conversations})",
        idle.saturating_sub(base) as f64 / conversations.max(1) as f64,
        mib(idle.saturating_sub(base)),
    );

    // A connected client holds a subscription: the bus keeps a channel
    // per subscribed conversation.
    let receivers: Vec<_> = ids.iter().map(|id| engine.subscribe(*id)).collect();
    let subscribed = idle_rss().await?;
    println!(
        "per idle conversation with a subscriber: +{:.0} bytes more (RSS {})",
        subscribed.saturating_sub(idle) as f64 / conversations.max(1) as f64,
        mib(subscribed),
    );
    drop(receivers);
    let unsubscribed = idle_rss().await?;
    println!(
        "after the subscribers left: RSS {} ({:.0} bytes per conversation above the idle figure)",
        mib(unsubscribed),
        unsubscribed.saturating_sub(idle) as f64 / conversations.max(1) as f64,
    );
    if let Some(dir) = &dir {
        let mut on_disk = 0;
        for entry in std::fs::read_dir(dir.path())?.flatten() {
            on_disk += entry.metadata().map(|m| m.len()).unwrap_or(0);
        }
        println!(
            "on disk (SQLite file + WAL): {} ({:.0} bytes per conversation)",
            mib(on_disk),
            on_disk as f64 / (conversations + 200.min(conversations)).max(1) as f64,
        );
    }
    Ok(())
}
