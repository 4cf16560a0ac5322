//! The mock model server: a loopback HTTP/1.1 server that answers each
//! request with the next scripted [`Reply`] (the last one repeats) and
//! records what it was sent, for the tests of the providers, the engine and
//! the front doors. It speaks the real wire format (chunked SSE, statuses,
//! headers) so that the code under test meets what a real API sends, and
//! keeps a connection open for the next request after a whole answer, as
//! the real APIs do (HTTP/1.1 keep-alive): a client's pool is used as in
//! production. Replies that break or abandon a stream close it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the mock answers to one request.
#[derive(Clone)]
pub enum Reply {
    /// The reply `answer` makes of the request: for a mock whose answer
    /// depends on what it was sent (a prompt cache, say).
    Respond(Arc<dyn Fn(&Request) -> Reply + Send + Sync>),
    /// 200 with an SSE body sent in `chunk`-byte pieces.
    Sse {
        body: String,
        chunk: usize,
        delay: Duration,
    },
    /// A status with headers and a body (the connection kept).
    Status {
        code: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// 200, the first `cut_at` bytes of an SSE body, then the connection
    /// drops mid-stream.
    Cut { body: String, cut_at: usize },
    /// 200 SSE: `start` once, then `repeat` again and again until the
    /// client goes away (a model that never stops).
    Endless { start: String, repeat: String },
    /// Nothing more after `sent` for `for_`: with `head`, the SSE headers
    /// and `sent` go out first; without, not even the headers.
    Stall {
        head: bool,
        sent: String,
        for_: Duration,
    },
    /// `reply`, once `after` has passed: a model that thinks before its
    /// first byte (a load bench's model delay).
    Late { after: Duration, reply: Box<Reply> },
}

impl Reply {
    /// 200 with `body` in 64-byte chunks, no delay.
    pub fn sse(body: String) -> Reply {
        Reply::Sse {
            body,
            chunk: 64,
            delay: Duration::ZERO,
        }
    }
}

/// A request the mock received.
pub type Received = Request;

/// A model server on 127.0.0.1 that answers with `replies` in order (the
/// last one repeats), one per request, whichever connection it comes on.
pub struct MockServer {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl MockServer {
    pub async fn start(replies: Vec<Reply>) -> MockServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let replies = Arc::new(replies);
        let next = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                // As the real APIs' servers do: on a kept connection, an
                // answer's last small write (the body's end) would
                // otherwise wait for the client's delayed ACK (Nagle).
                let _ = socket.set_nodelay(true);
                let (replies, next, log) = (replies.clone(), next.clone(), log.clone());
                tokio::spawn(async move {
                    let _ = serve(socket, &replies, &next, &log).await;
                });
            }
        });
        MockServer { url, received }
    }

    /// The requests so far, in the order they arrived.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 request as a mock server reads it.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `POST`, `DELETE`.
    pub verb: String,
    /// The request target: path and query.
    pub path: String,
    /// Header lines as sent.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`null` if it is not JSON).
    pub body: Value,
    /// When its head arrived: the gaps between requests show the client's
    /// backoff without timing the whole test.
    pub at: Instant,
}

impl Request {
    /// The value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `Mcp-Session-Id` it carried (for a mock MCP server).
    pub fn session(&self) -> Option<&str> {
        self.header("mcp-session-id")
    }

    /// The JSON-RPC method it carried.
    pub fn method(&self) -> Option<&str> {
        self.body["method"].as_str()
    }
}

/// Reads one request (head, then a `content-length` body) from `socket`;
/// `None` if the client closed it first.
pub async fn read_request(socket: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut buf = Vec::new();
    let mut at = None;
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        at.get_or_insert_with(Instant::now);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut start = lines.next().unwrap_or("").split(' ');
    let verb = start.next().unwrap_or("").to_owned();
    let path = start.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
    Ok(Some(Request {
        verb,
        path,
        headers,
        body,
        at: at.unwrap_or_else(Instant::now),
    }))
}

/// Answers the requests of one connection, each with the next reply,
/// until the client closes it or a reply ends it.
async fn serve(
    mut socket: TcpStream,
    replies: &[Reply],
    next: &AtomicUsize,
    log: &Mutex<Vec<Received>>,
) -> std::io::Result<()> {
    while let Some(request) = read_request(&mut socket).await? {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let reply = replies[n.min(replies.len() - 1)].clone();
        if !answer(&mut socket, request, reply, log).await? {
            return Ok(());
        }
    }
    Ok(())
}

/// Sends `reply` to `request`; says whether the connection can carry the
/// next request (a whole answer was sent).
async fn answer(
    socket: &mut TcpStream,
    request: Request,
    reply: Reply,
    log: &Mutex<Vec<Received>>,
) -> std::io::Result<bool> {
    let mut reply = match reply {
        Reply::Respond(answer) => answer(&request),
        other => other,
    };
    log.lock().unwrap().push(request);
    while let Reply::Late {
        after,
        reply: later,
    } = reply
    {
        tokio::time::sleep(after).await;
        reply = *later;
    }

    match reply {
        // Waited for above.
        Reply::Late { .. } => {}
        // Answered above; an answer that is itself `Respond` gets a 500.
        Reply::Respond(_) => {
            let body = "the mock's Respond answer returned another Respond";
            let head = format!(
                "HTTP/1.1 500 Status\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
        }
        Reply::Status {
            code,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {code} Status\r\ncontent-length: {}\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            head.push_str(&body);
            socket.write_all(head.as_bytes()).await?;
            return Ok(true);
        }
        Reply::Sse { body, chunk, delay } => {
            socket.write_all(sse_head(true).as_bytes()).await?;
            let pieces: Vec<&[u8]> = body.as_bytes().chunks(chunk.max(1)).collect();
            for (i, piece) in pieces.iter().enumerate() {
                let mut out = format!("{:x}\r\n", piece.len()).into_bytes();
                out.extend_from_slice(piece);
                out.extend_from_slice(b"\r\n");
                // Without pauses, the body's end goes with its last piece,
                // as a server writing a whole answer at once sends it.
                if delay.is_zero() && i + 1 == pieces.len() {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                socket.write_all(&out).await?;
                socket.flush().await?;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
            }
            if !delay.is_zero() || pieces.is_empty() {
                socket.write_all(b"0\r\n\r\n").await?;
            }
            return Ok(true);
        }
        Reply::Endless { start, repeat } => {
            socket.write_all(sse_head(false).as_bytes()).await?;
            let mut piece = start;
            loop {
                // An empty chunk would end the body. Fails once the client
                // has gone: the loop ends there.
                if !piece.is_empty() {
                    socket
                        .write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
                        .await?;
                }
                piece.clone_from(&repeat);
            }
        }
        Reply::Stall { head, sent, for_ } => {
            if head {
                socket.write_all(sse_head(false).as_bytes()).await?;
                if !sent.is_empty() {
                    socket
                        .write_all(format!("{:x}\r\n{sent}\r\n", sent.len()).as_bytes())
                        .await?;
                }
                socket.flush().await?;
            }
            tokio::time::sleep(for_).await;
            return Ok(false);
        }
        Reply::Cut { body, cut_at } => {
            socket.write_all(sse_head(false).as_bytes()).await?;
            let piece = &body.as_bytes()[..cut_at.min(body.len())];
            socket
                .write_all(format!("{:x}\r\n", body.len()).as_bytes())
                .await?;
            socket.write_all(piece).await?;
            socket.flush().await?;
            // Dropping the socket mid-chunk breaks the stream.
            return Ok(false);
        }
    }
    socket.shutdown().await?;
    Ok(false)
}

/// The head of a 200 SSE answer; `keep`: the connection stays open after
/// the body's end.
fn sse_head(keep: bool) -> String {
    let connection = if keep { "" } else { "connection: close\r\n" };
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n{connection}\r\n"
    )
}
