//! `slowloris`: N connections to the real `toolwire serve`, each sending
//! a request's headers one byte at a time (one byte every `--byte-every-ms`
//! per connection) and never finishing them. Measures what the server does
//! about it, whatever that is: when each connection was closed by the
//! server (read returned end of stream or an error) counted from its
//! first byte, how many were still open at the end, and whether an
//! ordinary request still gets through meanwhile (one a second, each on a
//! new connection, with its latency).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::serve_load::{Server, toolwire_binary};
use crate::summary;

/// What `slowloris` is asked to do.
pub struct Options {
    pub toolwire: Option<PathBuf>,
    pub connections: usize,
    pub byte_every: Duration,
    pub duration: Duration,
}

/// How one slow connection ended.
enum Fate {
    /// Closed by the server this long after its first byte.
    Closed(Duration),
    /// Never connected.
    Refused,
    /// Still open when the run ended.
    Open,
}

/// Headers that never end: a request line, then one header whose value
/// grows a byte at a time.
async fn slow_connection(addr: String, byte_every: Duration, until: Instant) -> Fate {
    let Ok(mut stream) = TcpStream::connect(&addr).await else {
        return Fate::Refused;
    };
    let start = Instant::now();
    let head = b"GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".to_vec();
    let bytes = head.into_iter().chain(std::iter::repeat(b'a'));
    let mut probe = [0u8; 256];
    for byte in bytes {
        if Instant::now() >= until {
            return Fate::Open;
        }
        if stream.write_all(&[byte]).await.is_err() {
            return Fate::Closed(start.elapsed());
        }
        // Whatever the server sends back (a 408, or nothing) and whether
        // it closes, within one byte's interval.
        match tokio::time::timeout(byte_every, stream.read(&mut probe)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Fate::Closed(start.elapsed()),
            Ok(Ok(_)) => {
                // An answer before the headers ended (an error status):
                // the close follows.
                tokio::time::sleep(byte_every).await;
            }
            Err(_) => {}
        }
    }
    Fate::Open
}

pub async fn slowloris(options: Options) -> Result<()> {
    let toolwire = toolwire_binary(options.toolwire.clone())?;
    let dir = tempfile::tempdir()?;
    let script = "steps:\n  - text: ok\n";
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut server = Server::start(&toolwire, dir.path(), script).await?;
    server.wait_ready(&http).await?;
    let addr = server.base.trim_start_matches("http://").to_owned();
    println!(
        "slowloris: {} connections, one header byte every {} ms each, for {} s",
        options.connections,
        options.byte_every.as_millis(),
        options.duration.as_secs()
    );
    let started = Instant::now();
    let until = started + options.duration;
    let mut slow = tokio::task::JoinSet::new();
    for _ in 0..options.connections {
        slow.spawn(slow_connection(addr.clone(), options.byte_every, until));
    }
    // Ordinary requests meanwhile, one a second.
    let mut ordinary_ok = Vec::new();
    let mut ordinary_failed = 0usize;
    while Instant::now() < until {
        let sent = Instant::now();
        match http.get(server.url("/v1/agents?limit=1")).send().await {
            Ok(r) if r.status().is_success() => ordinary_ok.push(sent.elapsed()),
            _ => ordinary_failed += 1,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut closed = Vec::new();
    let (mut refused, mut open) = (0usize, 0usize);
    while let Some(fate) = slow.join_next().await {
        match fate? {
            Fate::Closed(after) => closed.push(after),
            Fate::Refused => refused += 1,
            Fate::Open => open += 1,
        }
    }
    closed.sort();
    ordinary_ok.sort();
    server.stop().await?;
    println!("closed by the server   {}", closed.len());
    println!("still open at the end  {open}");
    println!("never connected        {refused}");
    if !closed.is_empty() {
        summary("time to close", &closed);
    }
    println!(
        "ordinary requests      {} answered, {} failed",
        ordinary_ok.len(),
        ordinary_failed
    );
    if !ordinary_ok.is_empty() {
        summary("ordinary", &ordinary_ok);
    }
    Ok(())
}
