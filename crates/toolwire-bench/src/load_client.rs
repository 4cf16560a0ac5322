//! A client of `toolwire serve` that keeps sending until the server has
//! its messages, as a real one would, through whichever instance it can
//! reach; shared by `shutdown-load` (one server, stopped and started
//! again) and `cluster-load` (three, one killed and started again).
//!
//! Each message goes over `POST /v1/agents/{id}/messages/stream` and its
//! answer is read to its end:
//!
//! * a 200 with an SSE body is *accepted*: the message is the server's.
//!   A stream that ends with `end_turn` is *answered* (and timed); one
//!   that ends with an `error_message` of type `interrupted` is *cut*,
//!   and the client asks the agent to go on with a new message
//!   (`go on: …`, a message of its own); a body that breaks off without a
//!   final event is *cut silently* (its instance died, or stopped badly)
//!   and is followed by a `go on` too, through the next instance;
//! * a 503 is *refused*: the client waits (`Retry-After`, at most
//!   `max_wait`) and sends the same message again; a 409 (a turn of the
//!   conversation still runs, e.g. one being interrupted) is *busy* and
//!   sent again after 100 ms;
//! * a connection that cannot be made (the instance is down) is
//!   *unreachable*: the client turns to the next instance (as a load
//!   balancer would) and tries again 100 ms later;
//! * a request whose connection broke before any answer may or may not
//!   have reached the server (*unknown*): the client sends its words again
//!   as a new message (`again: …`), so that the first may be stored once
//!   or not at all, never twice under one text.
//!
//! Afterwards [`Verdict::of`] compares what the clients were told with the
//! stored histories.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::serve_load::{call_json, sse_data};

/// What the clients saw, counted across all of them.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) accepted: AtomicU64,
    pub(crate) answered: AtomicU64,
    pub(crate) cut: AtomicU64,
    pub(crate) cut_silently: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) unreachable: AtomicU64,
    pub(crate) unknown: AtomicU64,
    pub(crate) other: AtomicU64,
}

impl Counts {
    /// One line per count, for a report.
    pub(crate) fn print(&self) {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        println!("accepted (200 + SSE)   {}", c(&self.accepted));
        println!("  answered (end_turn)  {}", c(&self.answered));
        println!("  cut, final event     {}", c(&self.cut));
        println!("  cut silently         {}", c(&self.cut_silently));
        println!("refused (503)          {}", c(&self.refused));
        println!("busy (409, retried)    {}", c(&self.busy));
        println!("unreachable (retried)  {}", c(&self.unreachable));
        println!("unknown (sent anew)    {}", c(&self.unknown));
        println!("other errors           {}", c(&self.other));
    }
}

/// How one attempt ended.
enum Attempt {
    Answered,
    Cut,
    CutSilently,
    Refused(Duration),
    Busy,
    Unreachable,
    Unknown(String),
    Other(String),
}

/// The instances' base URLs as a load balancer sees them: `None` while
/// one is down; a restarted one comes back on a new port.
#[derive(Clone, Default)]
pub(crate) struct Router(Arc<RwLock<Vec<Option<String>>>>);

impl Router {
    pub(crate) fn new(bases: impl IntoIterator<Item = String>) -> Router {
        Router(Arc::new(RwLock::new(bases.into_iter().map(Some).collect())))
    }

    /// Sets instance `slot`'s base (`None`: down).
    pub(crate) fn set(&self, slot: usize, base: Option<String>) {
        if let Ok(mut bases) = self.0.write()
            && let Some(b) = bases.get_mut(slot)
        {
            *b = base;
        }
    }

    /// The first instance up from `slot` on (round the list), with its
    /// place; `slot`'s own when all are down (the attempt then fails to
    /// connect and is tried again).
    fn pick(&self, slot: usize) -> (usize, String) {
        let Ok(bases) = self.0.read() else {
            return (slot, String::new());
        };
        let n = bases.len().max(1);
        (0..n)
            .map(|i| (slot + i) % n)
            .find_map(|i| bases.get(i)?.clone().map(|b| (i, b)))
            .unwrap_or((slot, String::new()))
    }

    fn len(&self) -> usize {
        self.0.read().map_or(1, |b| b.len().max(1))
    }
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
        // connection broke before an answer.
        Err(e) => return Attempt::Unknown(format!("sending: {}", causes(&e))),
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
    if status == reqwest::StatusCode::CONFLICT {
        return Attempt::Busy;
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

/// An error with its causes (reqwest's own words omit them: whether the
/// connection was reset or closed is in the last).
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// What one client was told.
#[derive(Default)]
pub(crate) struct Told {
    /// Texts the server accepted (a 200 and a stream).
    pub(crate) accepted: Vec<String>,
    /// Texts refused (503, 409) at least once.
    pub(crate) refused: Vec<String>,
    /// Texts whose request broke before any answer.
    pub(crate) unknown: Vec<String>,
    /// Request to `[DONE]` of each answered message.
    pub(crate) latencies: Vec<Duration>,
    pub(crate) errors: Vec<String>,
}

/// Who a client is and what it sends.
pub(crate) struct Job {
    /// Its number, in its texts.
    pub(crate) client: usize,
    pub(crate) agent: String,
    /// The instance it talks to while that one is up.
    pub(crate) home: usize,
    pub(crate) messages: usize,
    /// Longest wait honoured from a 503's `Retry-After`.
    pub(crate) max_wait: Duration,
}

/// One client: its job's messages, each until the server has it, through
/// its home instance of `router` (or the next one up).
pub(crate) async fn client(
    http: reqwest::Client,
    router: Router,
    job: Job,
    counts: Arc<Counts>,
) -> Told {
    let Job {
        client,
        agent,
        home,
        messages,
        max_wait,
    } = job;
    let mut told = Told::default();
    let mut queue: VecDeque<String> = (0..messages)
        .map(|i| format!("client {client} message {i}"))
        .collect();
    // Where the next attempt goes: home unless it failed there.
    let mut slot = home;
    while let Some(text) = queue.pop_front() {
        let (at, base) = router.pick(slot);
        let url = format!("{base}/v1/agents/{agent}/messages/stream");
        let sent = Instant::now();
        match attempt(&http, &url, &text, &counts).await {
            Attempt::Answered => {
                told.latencies.push(sent.elapsed());
                counts.answered.fetch_add(1, Ordering::Relaxed);
                told.accepted.push(text);
                slot = home;
            }
            Attempt::Cut => {
                counts.cut.fetch_add(1, Ordering::Relaxed);
                // Stored, its answer cut: ask the agent to go on.
                queue.push_front(format!("go on: {text}"));
                told.accepted.push(text);
            }
            Attempt::CutSilently => {
                counts.cut_silently.fetch_add(1, Ordering::Relaxed);
                queue.push_front(format!("go on: {text}"));
                told.accepted.push(text);
                slot = (at + 1) % router.len();
            }
            Attempt::Refused(wait) => {
                counts.refused.fetch_add(1, Ordering::Relaxed);
                told.refused.push(text.clone());
                tokio::time::sleep(wait.min(max_wait)).await;
                queue.push_front(text);
            }
            Attempt::Busy => {
                counts.busy.fetch_add(1, Ordering::Relaxed);
                told.refused.push(text.clone());
                tokio::time::sleep(Duration::from_millis(100)).await;
                queue.push_front(text);
            }
            Attempt::Unreachable => {
                counts.unreachable.fetch_add(1, Ordering::Relaxed);
                slot = (at + 1) % router.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
                queue.push_front(text);
            }
            Attempt::Unknown(e) => {
                counts.unknown.fetch_add(1, Ordering::Relaxed);
                told.errors.push(format!("client {client}: {text}: {e}"));
                told.unknown.push(text.clone());
                slot = (at + 1) % router.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
                queue.push_front(format!("again: {text}"));
            }
            Attempt::Other(e) => {
                counts.other.fetch_add(1, Ordering::Relaxed);
                told.errors.push(format!("client {client}: {text}: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                // A broken connection or the like: once more, as a client
                // would.
                if told.errors.len() < 20 {
                    queue.push_front(text);
                }
            }
        }
    }
    told
}

/// The user messages stored for `agent`, by text.
pub(crate) async fn stored_texts(
    http: &reqwest::Client,
    base: &str,
    agent: &str,
) -> Result<Vec<String>> {
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

/// What is stored against what the clients were told.
pub(crate) struct Verdict {
    pub(crate) stored: usize,
    /// Extra copies of a text stored more than once.
    pub(crate) duplicates: usize,
    /// Accepted texts not stored.
    pub(crate) lost: Vec<String>,
    /// Texts never accepted (refused) yet stored.
    pub(crate) refused_stored: usize,
    /// Texts whose request broke before an answer, stored (once).
    pub(crate) unknown_stored: usize,
    /// Texts the clients counted as accepted more than once.
    pub(crate) accepted_twice: usize,
}

impl Verdict {
    /// Reads every agent's history through `base` and compares.
    pub(crate) async fn of(
        http: &reqwest::Client,
        base: &str,
        agents: &[String],
        told: &[Told],
    ) -> Result<Verdict> {
        let mut accepted: HashMap<&str, usize> = HashMap::new();
        for t in told {
            for text in &t.accepted {
                *accepted.entry(text.as_str()).or_default() += 1;
            }
        }
        let mut stored: HashMap<String, usize> = HashMap::new();
        for agent in agents {
            for text in stored_texts(http, base, agent).await? {
                *stored.entry(text).or_default() += 1;
            }
        }
        let lost = accepted
            .keys()
            .filter(|t| !stored.contains_key(**t))
            .map(|t| (*t).to_owned())
            .collect();
        // A refused text sent again and accepted later is stored once; one
        // never accepted must not be stored at all.
        let refused_stored = told
            .iter()
            .flat_map(|t| &t.refused)
            .filter(|t| !accepted.contains_key(t.as_str()) && stored.contains_key(*t))
            .count();
        let unknown_stored = told
            .iter()
            .flat_map(|t| &t.unknown)
            .filter(|t| !accepted.contains_key(t.as_str()) && stored.contains_key(*t))
            .count();
        Ok(Verdict {
            stored: stored.values().sum(),
            duplicates: stored.values().filter(|&&n| n > 1).map(|n| n - 1).sum(),
            lost,
            refused_stored,
            unknown_stored,
            accepted_twice: accepted.values().filter(|&&n| n > 1).count(),
        })
    }

    pub(crate) fn print(&self) {
        println!("stored user messages   {}", self.stored);
        println!("duplicates             {}", self.duplicates);
        println!("lost                   {}", self.lost.len());
        println!("stored although refused {}", self.refused_stored);
        println!(
            "unknown, stored once   {} (a request cut before any answer: stored once or not at all)",
            self.unknown_stored
        );
    }

    /// An error unless every accepted message is stored exactly once and
    /// no refused one at all.
    pub(crate) fn check(&self) -> Result<()> {
        if self.duplicates > 0 || !self.lost.is_empty() || self.refused_stored > 0 {
            anyhow::bail!(
                "stored {} duplicates, lost {} accepted messages ({:?}), stored {} refused ones",
                self.duplicates,
                self.lost.len(),
                self.lost.iter().take(5).collect::<Vec<_>>(),
                self.refused_stored
            );
        }
        if self.accepted_twice > 0 {
            anyhow::bail!(
                "{} texts were accepted more than once by the clients' count",
                self.accepted_twice
            );
        }
        Ok(())
    }
}
