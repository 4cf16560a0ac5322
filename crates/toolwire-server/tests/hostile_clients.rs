//! Hostile clients over real HTTP on loopback: what a web page can do
//! through DNS rebinding (a foreign `Host`) or a cross-site request (a
//! foreign `Origin`, JSON as `text/plain`), on every door (REST, the
//! WebSocket, the page); and connections that hold the server (slowloris,
//! idle ones, more than the cap). Each refused case is checked for its
//! status, its message and that nothing changed; each allowed case for
//! still working.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{RawResponse, Server, frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use toolwire_server::ServerSettings;

const SCRIPT: &str = r#"
turns:
  - steps:
      - text: "Hello."
"#;

/// A generous bound for what the server should do "soon".
const SOON: Duration = Duration::from_secs(15);

async fn server_with(dir: &tempfile::TempDir, settings: ServerSettings) -> Server {
    Server::start(&dir.path().join("t.db"), SCRIPT, settings).await
}

/// A refusal: its status, code, what it names and the config key.
fn refused(r: &RawResponse, status: u16, code: &str, names: &str, key: Option<&str>) {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.body["code"], code, "{r:?}");
    let message = r.body["message"].as_str().unwrap();
    assert!(message.contains(names), "{message:?} should name {names:?}");
    if let Some(key) = key {
        assert!(message.contains(key), "{message:?} should name {key}");
        assert_eq!(r.body["config_key"], key);
    }
    assert_eq!(r.body["detail"], r.body["message"]);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
}

async fn agent_names(s: &Server) -> Vec<String> {
    let (status, agents) = s.call("GET", "/v1/agents", None).await;
    assert_eq!(status, 200);
    agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The head of a WebSocket upgrade of `path`.
fn upgrade_head(path: &str, host: &str, origin: Option<&str>) -> String {
    let mut head = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    );
    if let Some(origin) = origin {
        head.push_str(&format!("Origin: {origin}\r\n"));
    }
    head
}

#[tokio::test]
async fn a_foreign_host_is_refused_on_every_door() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(&dir, ServerSettings::default()).await;
    let (_, conversation) = s.call("POST", "/v1/conversations", None).await;
    let ws = format!(
        "/v1/conversations/{}/ws",
        conversation["id"].as_str().unwrap()
    );
    let port = s.addr.port();
    // A plain foreign name, and DNS rebinding: the attacker's name, now
    // resolving to 127.0.0.1, with the server's port.
    let rebound = format!("attacker.example:{port}");
    for host in [
        "attacker.example",
        rebound.as_str(),
        "localhost.attacker.example",
    ] {
        for (method, path) in [
            ("GET", "/"),
            ("GET", "/assets/app.js"),
            ("GET", "/openapi.json"),
            ("GET", "/v1/agents"),
            ("GET", "/v1/conversations"),
            ("GET", "/v2/nothing"),
        ] {
            let r = s
                .raw(&format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n"), "")
                .await;
            refused(&r, 403, "HOST_NOT_ALLOWED", host, Some("allowed_hosts"));
        }
        let r = s
            .raw(
                &format!(
                    "POST /v1/agents HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                ),
                r#"{"name": "planted"}"#,
            )
            .await;
        refused(&r, 403, "HOST_NOT_ALLOWED", host, Some("allowed_hosts"));
        let r = s.raw(&upgrade_head(&ws, host, None), "").await;
        refused(&r, 403, "HOST_NOT_ALLOWED", host, Some("allowed_hosts"));
    }
    assert!(agent_names(&s).await.is_empty());
    s.stop().await;
}

#[tokio::test]
async fn a_foreign_origin_cannot_change_anything() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(&dir, ServerSettings::default()).await;
    let (status, agent) = s
        .call("POST", "/v1/agents", Some(json!({"name": "mine"})))
        .await;
    assert_eq!(status, 200, "{agent}");
    let id = agent["id"].as_str().unwrap().to_owned();
    let host = format!("127.0.0.1:{}", s.addr.port());
    // Another site; a sandboxed frame or a file (`null`); another server
    // on this machine (same host, another port).
    let other_local = "http://127.0.0.1:1";
    for origin in ["http://attacker.example", "null", other_local] {
        for (method, path, body) in [
            ("POST", "/v1/agents".to_owned(), r#"{"name": "planted"}"#),
            (
                "PATCH",
                format!("/v1/agents/{id}"),
                r#"{"name": "renamed"}"#,
            ),
            ("DELETE", format!("/v1/agents/{id}"), ""),
            ("POST", "/v1/conversations".to_owned(), "{}"),
            (
                "POST",
                format!("/v1/agents/{id}/messages"),
                r#"{"messages": [{"role": "user", "content": "run rm -rf"}]}"#,
            ),
        ] {
            let r = s
                .raw(
                    &format!(
                        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\n\
                         Content-Type: application/json\r\n"
                    ),
                    body,
                )
                .await;
            refused(
                &r,
                403,
                "ORIGIN_NOT_ALLOWED",
                origin,
                Some("allowed_origins"),
            );
        }
    }
    assert_eq!(agent_names(&s).await, ["mine"]);
    let (_, messages) = s
        .call("GET", &format!("/v1/agents/{id}/messages"), None)
        .await;
    assert!(
        !messages.to_string().contains("rm -rf"),
        "a refused message was stored: {messages}"
    );
    // Reads are left to the browser: without CORS headers it keeps the
    // answer from the foreign page.
    let r = s
        .raw(
            &format!(
                "GET /v1/agents HTTP/1.1\r\nHost: {host}\r\nOrigin: http://attacker.example\r\n"
            ),
            "",
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.header("access-control-allow-origin").is_none());
    s.stop().await;
}

#[tokio::test]
async fn a_websocket_from_a_foreign_origin_gets_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(&dir, ServerSettings::default()).await;
    let (_, conversation) = s.call("POST", "/v1/conversations", None).await;
    let path = format!(
        "/v1/conversations/{}/ws",
        conversation["id"].as_str().unwrap()
    );
    let mut request = format!("ws://{}{path}", s.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("origin", "http://attacker.example".parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 403);
            let body: Value = serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["code"], "ORIGIN_NOT_ALLOWED", "{body}");
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains("may not open a WebSocket")
            );
        }
        Ok(_) => panic!("a foreign page's socket was upgraded"),
        Err(e) => panic!("{e}"),
    }
    s.stop().await;
}

#[tokio::test]
async fn json_only_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(&dir, ServerSettings::default()).await;
    let host = format!("127.0.0.1:{}", s.addr.port());
    for content_type in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
        None,
    ] {
        let header = content_type.map_or(String::new(), |t| format!("Content-Type: {t}\r\n"));
        let r = s
            .raw(
                &format!("POST /v1/agents HTTP/1.1\r\nHost: {host}\r\n{header}"),
                r#"{"name": "planted"}"#,
            )
            .await;
        let names = content_type.unwrap_or("no Content-Type");
        refused(&r, 415, "UNSUPPORTED_MEDIA_TYPE", names, None);
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .contains("application/json")
        );
    }
    assert!(agent_names(&s).await.is_empty());
    for (i, content_type) in [
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/merge-patch+json",
    ]
    .into_iter()
    .enumerate()
    {
        let r = s
            .raw(
                &format!(
                    "POST /v1/agents HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
                ),
                &format!(r#"{{"name": "agent {i}"}}"#),
            )
            .await;
        assert_eq!(r.status, 200, "{content_type}: {r:?}");
    }
    // No body needs no type (the SDKs send some POSTs without one).
    let r = s
        .raw(
            &format!(
                "POST /v1/conversations HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n"
            ),
            "",
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(agent_names(&s).await.len(), 3);
    s.stop().await;
}

#[tokio::test]
async fn the_page_sdks_and_configured_names_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(
        &dir,
        ServerSettings {
            allowed_hosts: vec!["toolwire.example.com".into()],
            allowed_origins: vec!["https://ui.example.com".into()],
            ..ServerSettings::default()
        },
    )
    .await;
    let port = s.addr.port();
    let create = |host: String, origin: Option<String>, name: &str| {
        let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        (
            format!(
                "POST /v1/agents HTTP/1.1\r\nHost: {host}\r\n{origin}Content-Type: application/json\r\n"
            ),
            format!(r#"{{"name": "{name}"}}"#),
        )
    };
    let allowed = [
        // An SDK or curl: no Origin.
        create(format!("127.0.0.1:{port}"), None, "sdk"),
        // The page, as served at each loopback name.
        create(
            format!("127.0.0.1:{port}"),
            Some(format!("http://127.0.0.1:{port}")),
            "page on 127.0.0.1",
        ),
        create(
            format!("localhost:{port}"),
            Some(format!("http://localhost:{port}")),
            "page on localhost",
        ),
        create(
            format!("[::1]:{port}"),
            Some(format!("http://[::1]:{port}")),
            "page on [::1]",
        ),
        // Behind a reverse proxy with TLS: the configured name, and the
        // page as served there.
        create("toolwire.example.com".into(), None, "proxied sdk"),
        create(
            "toolwire.example.com".into(),
            Some("https://toolwire.example.com".into()),
            "proxied page",
        ),
        // A configured page elsewhere.
        create(
            format!("127.0.0.1:{port}"),
            Some("https://ui.example.com".into()),
            "configured page",
        ),
    ];
    for (head, body) in &allowed {
        let r = s.raw(head, body).await;
        assert_eq!(r.status, 200, "{head}: {r:?}");
    }
    assert_eq!(agent_names(&s).await.len(), allowed.len());
    // The page itself.
    let r = s
        .raw(&format!("GET / HTTP/1.1\r\nHost: localhost:{port}\r\n"), "")
        .await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    // A configured name with another page is still refused.
    let (head, body) = create(
        "toolwire.example.com".into(),
        Some("https://attacker.example".into()),
        "planted",
    );
    refused(
        &s.raw(&head, &body).await,
        403,
        "ORIGIN_NOT_ALLOWED",
        "https://attacker.example",
        Some("allowed_origins"),
    );
    // The page's socket, with its own origin: upgraded, snapshot first.
    let (_, conversation) = s.call("POST", "/v1/conversations", None).await;
    let path = format!(
        "/v1/conversations/{}/ws",
        conversation["id"].as_str().unwrap()
    );
    let mut request = format!("ws://{}{path}", s.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("origin", format!("http://{}", s.addr).parse().unwrap());
    let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(response.status().as_u16(), 101);
    assert_eq!(frame(&mut socket).await["type"], "snapshot");
    s.stop().await;
}

/// Reads from `tcp` until the server closes it (end of file or a reset);
/// `None` if it is still open after `bound`.
async fn closed_within(tcp: &mut tokio::net::TcpStream, bound: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(bound, read).await.ok().map(|()| got)
}

#[tokio::test]
async fn a_slowloris_connection_is_closed_by_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(
        &dir,
        ServerSettings {
            header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(600),
            ..ServerSettings::default()
        },
    )
    .await;
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (mut reader, mut writer) = tcp.into_split();
    // A head that never ends, one byte every 50 ms: each byte is progress,
    // and the whole head still has its deadline.
    let trickle = tokio::spawn(async move {
        let head = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ";
        let bytes = head.bytes().chain(std::iter::repeat(b'a'));
        let mut sent = 0usize;
        for byte in bytes {
            if writer.write_all(&[byte]).await.is_err() {
                break;
            }
            sent += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        sent
    });
    let mut got = Vec::new();
    let closed = tokio::time::timeout(SOON, reader.read_to_end(&mut got)).await;
    assert!(
        closed.is_ok(),
        "the slow head was still open after {SOON:?}"
    );
    // The writer notices the close at its next byte or the one after.
    let sent = tokio::time::timeout(SOON, trickle).await.unwrap().unwrap();
    assert!(sent > 0);
    // Nothing was answered: the head never came whole.
    assert!(
        !String::from_utf8_lossy(&got).contains("200 OK"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    // A connection that sends nothing at all is closed too.
    let mut silent = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    assert!(
        closed_within(&mut silent, SOON).await.is_some(),
        "a silent connection was still open after {SOON:?}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_body_trickling_in_is_answered_408_at_the_body_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(
        &dir,
        ServerSettings {
            header_timeout: Duration::from_secs(600),
            body_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(600),
            ..ServerSettings::default()
        },
    )
    .await;
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (mut reader, mut writer) = tcp.into_split();
    let body = br#"{"name": "slow-agent-with-a-long-name-that-takes-a-while"}"#;
    let head = format!(
        "POST /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    writer.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    // The body, one byte a second: each byte is progress, and the whole
    // body still has its deadline.
    let trickle = tokio::spawn(async move {
        for byte in body {
            if writer.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let mut got = Vec::new();
    let closed = tokio::time::timeout(SOON, reader.read_to_end(&mut got)).await;
    let waited = started.elapsed();
    trickle.abort();
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(closed.is_ok(), "still open after {SOON:?}: {got}");
    assert!(
        got.starts_with("HTTP/1.1 408"),
        "not a 408 after {waited:?}: {got}"
    );
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(6),
        "answered after {waited:?}"
    );
    let json: Value = serde_json::from_str(got.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(json["code"], "BODY_TIMEOUT", "{json}");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("body_timeout_secs"),
        "{json}"
    );
    // Nothing of the request was acted on.
    assert!(
        !agent_names(&s)
            .await
            .iter()
            .any(|n| n.starts_with("slow-agent"))
    );
    // A body that arrives in time is read as usual.
    let (status, agent) = s
        .call("POST", "/v1/agents", Some(json!({"name": "quick-agent"})))
        .await;
    assert_eq!(status, 200, "{agent}");
    s.stop().await;
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_but_a_socket_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(
        &dir,
        ServerSettings {
            header_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(1),
            ..ServerSettings::default()
        },
    )
    .await;
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    // The answer comes, then the connection waits for another request:
    // the idle timeout (not the header timeout, ten minutes) ends it.
    let got = closed_within(&mut tcp, SOON)
        .await
        .expect("the idle connection was closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200 OK"));

    // A WebSocket is quiet for longer than the idle timeout and stays.
    let (_, conversation) = s.call("POST", "/v1/conversations", None).await;
    let mut socket = s
        .socket(&format!(
            "/v1/conversations/{}/ws",
            conversation["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(frame(&mut socket).await["type"], "snapshot");
    tokio::time::sleep(Duration::from_secs(3)).await;
    support::send_frame(&mut socket, json!({"type": "nonsense"})).await;
    assert_eq!(frame(&mut socket).await["type"], "error");
    s.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_place() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(
        &dir,
        ServerSettings {
            max_connections: 2,
            ..ServerSettings::default()
        },
    )
    .await;
    // Two connections that send nothing hold both places.
    let first = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let _second = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let client = reqwest::Client::new();
    let request = tokio::spawn({
        let url = s.url("/openapi.json");
        async move { client.get(url).send().await.map(|r| r.status().as_u16()) }
    });
    // The third is connected by the kernel but not taken: no answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !request.is_finished(),
        "a request beyond the cap was answered"
    );
    // A place frees: it is taken and answered.
    drop(first);
    let status = tokio::time::timeout(SOON, request)
        .await
        .expect("answered once a place was free")
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    s.stop().await;
}
