//! MCP servers on streamable HTTP on loopback (server-everything, or a
//! server a test writes), for the MCP tests of the engine and of
//! `toolwire acp`; and a loopback URL where nothing listens.
//!
//! The test binds the server's socket itself, on 127.0.0.1, and hands it to
//! the server as its stdin: the server cannot listen anywhere else, and no
//! other test can take its port, even while a test has killed the server to
//! start it again where it was.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpSocket;
use tokio::process::{Child, Command};

/// What a server writes to stderr once it listens, then its port.
const LISTENING: &str = "TOOLWIRE_TEST_LISTENING ";

/// Runs server-everything's streamable HTTP transport on the socket passed
/// as stdin (`{ fd: 0 }`) instead of the port it picks (`PORT`, on every
/// interface). Should the patch not take, `PORT` is `65536`, which Node
/// refuses (`-1` it would take for the path of a Unix socket), so the
/// server exits instead of listening anywhere.
const WRAPPER: &str = r#"
import http from 'node:http';
import { pathToFileURL } from 'node:url';
const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function (...args) {
  const callback = args.find((arg) => typeof arg === 'function');
  this.once('listening', () => {
    process.stderr.write(`TOOLWIRE_TEST_LISTENING ${this.address().port}\n`);
  });
  return callback ? listen.call(this, { fd: 0 }, callback) : listen.call(this, { fd: 0 });
};
await import(pathToFileURL(process.env.EVERYTHING_HTTP).href);
"#;

/// `TOOLWIRE_TEST_MCP_DIR`, where `scripts/test` installs
/// `@modelcontextprotocol/server-everything`; `None` (test skipped) when it
/// is not set outside CI. In CI a missing server is a failure.
pub fn mcp_dir() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("TOOLWIRE_TEST_MCP_DIR") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "TOOLWIRE_TEST_MCP_DIR is not set but CI is: run the tests through \
             scripts/test, which installs @modelcontextprotocol/server-everything"
        );
        eprintln!(
            "note: TOOLWIRE_TEST_MCP_DIR is not set; skipping the MCP test \
             (scripts/test installs the npm server and sets it)"
        );
        return None;
    };
    Some(PathBuf::from(dir))
}

type MakeCommand = Box<dyn Fn() -> Command + Send + Sync>;

/// A server on a loopback port of its own; killed when dropped.
pub struct HttpServer {
    make: MakeCommand,
    child: Option<Child>,
    /// The port, bound but not listening, while the server is killed:
    /// connections are refused as by a dead server, and the port stays
    /// ours.
    held: Option<TcpSocket>,
    pub port: u16,
    /// The MCP endpoint: `http://127.0.0.1:PORT/mcp`.
    pub url: String,
}

impl HttpServer {
    /// server-everything, installed in `mcp_dir` (an npm prefix holding
    /// `@modelcontextprotocol/server-everything`).
    pub async fn everything(mcp_dir: &Path) -> HttpServer {
        let entry = mcp_dir.join(
            "node_modules/@modelcontextprotocol/server-everything/dist/transports/streamableHttp.js",
        );
        assert!(entry.is_file(), "{} is missing", entry.display());
        HttpServer::start(move || {
            let mut command = Command::new("node");
            command
                .args(["--input-type=module", "-e", WRAPPER])
                .env("EVERYTHING_HTTP", &entry)
                .env("PORT", "65536");
            command
        })
        .await
    }

    /// Runs `make()`'s command, a server that listens on the socket it gets
    /// as stdin (Node: `listen({ fd: 0 })`) and writes
    /// `TOOLWIRE_TEST_LISTENING PORT` to stderr once it does.
    pub async fn start(make: impl Fn() -> Command + Send + Sync + 'static) -> HttpServer {
        let held = hold(0);
        let port = held.local_addr().unwrap().port();
        let mut server = HttpServer {
            make: Box::new(make),
            child: None,
            held: Some(held),
            port,
            url: format!("http://127.0.0.1:{port}/mcp"),
        };
        server.restart().await;
        server
    }

    /// Kills the server and waits until it is gone; its port stays held.
    pub async fn kill(&mut self) {
        let mut child = self.child.take().expect("the server runs");
        child.kill().await.unwrap();
        self.held = Some(hold(self.port));
    }

    /// Starts the killed server again on its port.
    pub async fn restart(&mut self) {
        let held = self.held.take().expect("the server was killed");
        let listener = held.listen(64).unwrap().into_std().unwrap();
        let mut command = (self.make)();
        command.stdin(Stdio::from(OwnedFd::from(listener)));
        let (child, port) = listening(command).await;
        assert_eq!(port, self.port, "the server listens on the socket it got");
        self.child = Some(child);
    }
}

/// A socket bound to `port` (0: one the kernel picks) on 127.0.0.1, not
/// listening.
fn hold(port: u16) -> TcpSocket {
    let socket = TcpSocket::new_v4().unwrap();
    // The connections of a killed server linger in TIME_WAIT on its port.
    socket.set_reuseaddr(true).unwrap();
    socket
        .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:{port}: {e}"));
    socket
}

/// Spawns `command`, a server that writes `TOOLWIRE_TEST_LISTENING PORT` to
/// stderr once it listens; returns it (killed when dropped) and the port.
/// Fails at once should the server say it listens before that line: it
/// would not be listening on the socket it was given.
async fn listening(mut command: Command) -> (Child, u16) {
    let mut child = command
        // server-everything logs every request there.
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    // Its copy of the socket, so that the server's death closes it.
    drop(command);
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    let port = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(port) = line.strip_prefix(LISTENING) {
                return Some(port.trim().parse::<u16>().unwrap());
            }
            assert!(
                !line.to_ascii_lowercase().contains("listening on port"),
                "the MCP server listens, but not on the socket it was given: {line:?} \
                 (after {said:?})"
            );
            said.push(line);
        }
        None
    })
    .await
    .unwrap_or_else(|_| panic!("the MCP server did not listen within 30 s: {said:?}"))
    .unwrap_or_else(|| panic!("the MCP server exited before it listened: {said:?}"));
    // Drained so that the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port)
}

/// A loopback URL where nothing listens: its port is bound (so no other
/// test gets it) but not listening, so connections are refused. Keep it
/// while the URL is used.
pub struct NothingListens {
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    /// The port nothing listens on.
    pub port: u16,
    _held: TcpSocket,
}

/// A [`NothingListens`] on a port of its own.
pub fn nothing_listens() -> NothingListens {
    let held = hold(0);
    let port = held.local_addr().unwrap().port();
    NothingListens {
        url: format!("http://127.0.0.1:{port}/mcp"),
        port,
        _held: held,
    }
}
