//! Images through the Letta door and the blob route: a user message's
//! image part is stored once by hash, shown in the history as a mention,
//! served at `/v1/blobs/{sha256}` with its type, `nosniff` and immutable
//! caching; hostile ids and bad images get JSON errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use support::*;
use toolwire_server::ServerSettings;

const ANSWERS: &str = r#"
turns:
  - steps:
      - text: "A small square."
  - steps:
      - text: "Noted."
"#;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR a tiny png";

async fn agent(s: &Server) -> String {
    let (status, agent) = s
        .call(
            "POST",
            "/v1/agents/",
            Some(json!({"name": "eyes", "include_base_tools": false})),
        )
        .await;
    assert_eq!(status, 200, "{agent}");
    agent["id"].as_str().unwrap().to_owned()
}

fn with_image(text: &str, media_type: &str, data: &str) -> Value {
    json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}},
    ]}]})
}

#[tokio::test]
async fn a_users_image_is_stored_once_and_served_by_hash() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("t.db"), ANSWERS, ServerSettings::default()).await;
    let agent = agent(&s).await;
    let messages = format!("/v1/agents/{agent}/messages");
    let sha = toolwire_core::image::sha256_hex(PNG);

    let body = with_image("what is this?", "image/png", &STANDARD.encode(PNG));
    let (status, answer) = s.call("POST", &messages, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["stop_reason"]["stop_reason"], "end_turn");

    // The history names the image where Letta carries text.
    let (status, list) = s.call("GET", &messages, None).await;
    assert_eq!(status, 200);
    let user = list
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["message_type"] == "user_message")
        .unwrap();
    let content = user["content"].as_str().unwrap();
    assert!(
        content.starts_with("what is this?\n[image: image/png, ")
            && content.contains(&format!("sha256 {}", &sha[..12])),
        "{content}"
    );

    // The bytes, once, by hash.
    let response = s
        .http
        .get(s.url(&format!("/v1/blobs/{sha}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "image/png");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(
        headers["cache-control"],
        "private, max-age=31536000, immutable"
    );
    assert_eq!(headers["etag"], format!("\"{sha}\""));
    assert_eq!(response.bytes().await.unwrap().as_ref(), PNG);

    // Sending it again stores nothing new: the same reference.
    let body = with_image("and again", "image/png", &STANDARD.encode(PNG));
    let (status, _) = s.call("POST", &messages, Some(body)).await;
    assert_eq!(status, 200);
    let conn = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM blobs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, 1);
    let rows: i64 = conn
        .query_row(
            "SELECT count(*) FROM messages WHERE content LIKE ?1",
            [format!("%{}%", &STANDARD.encode(PNG)[..16])],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 0, "no message row holds the bytes");
    s.stop().await;
}

#[tokio::test]
async fn bad_images_and_hostile_blob_ids_get_json_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("t.db"), ANSWERS, ServerSettings::default()).await;
    let agent = agent(&s).await;
    let messages = format!("/v1/agents/{agent}/messages");

    let (status, err) = s
        .call(
            "POST",
            &messages,
            Some(with_image("x", "image/png", "not base64!")),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("is not base64"),
        "{err}"
    );

    let svg = STANDARD.encode(b"<svg xmlns='http://www.w3.org/2000/svg'/>");
    let (status, err) = s
        .call(
            "POST",
            &messages,
            Some(with_image("x", "image/svg+xml", &svg)),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("declared as image/svg+xml"),
        "{err}"
    );

    let mut big = PNG.to_vec();
    big.resize(toolwire_core::MAX_IMAGE_BYTES + 1, 0);
    let (status, err) = s
        .call(
            "POST",
            &messages,
            Some(with_image("x", "image/png", &STANDARD.encode(&big))),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("over the limit of 5.0 MB (5242880 bytes)"),
        "{err}"
    );

    let url = json!({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:1/x.png"}},
    ]}]});
    let (status, err) = s.call("POST", &messages, Some(url)).await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("must be"),
        "{err}"
    );

    // Nothing was stored, and no turn ran.
    let (_, list) = s.call("GET", &messages, None).await;
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|m| m["message_type"] != "user_message"),
        "{list}"
    );

    for (id, status) in [
        ("..%2F..%2Fetc%2Fpasswd", 400),
        ("ABCDEF", 400),
        (&"A".repeat(64) as &str, 400),
        (&"0".repeat(64) as &str, 404),
        (&"z".repeat(5000) as &str, 400),
    ] {
        let (got, err) = s.call("GET", &format!("/v1/blobs/{id}"), None).await;
        assert_eq!(got, status, "{id}: {err}");
        assert!(err["message"].is_string(), "{id}: {err}");
        assert!(err["message"].as_str().unwrap().len() < 300, "{err}");
    }
    s.stop().await;
}

#[tokio::test]
async fn blobs_want_the_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ServerSettings {
        api_keys: vec!["secret".into()],
        ..ServerSettings::default()
    };
    let s = Server::start(&dir.path().join("t.db"), ANSWERS, settings).await;
    let (status, err) = s
        .call("GET", &format!("/v1/blobs/{}", "0".repeat(64)), None)
        .await;
    assert_eq!(status, 401, "{err}");
    s.stop().await;
}

#[tokio::test]
async fn the_live_views_send_carries_images_and_names_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("t.db"), ANSWERS, ServerSettings::default()).await;
    let (status, conversation) = s.call("POST", "/v1/conversations", Some(json!({}))).await;
    assert_eq!(status, 201, "{conversation}");
    let messages = format!(
        "/v1/conversations/{}/messages",
        conversation["id"].as_str().unwrap()
    );
    let sha = toolwire_core::image::sha256_hex(PNG);

    // Refused before anything is stored, each naming the image.
    for (image, says) in [
        (
            json!({"data": "not base64!"}),
            "images[0]: the image's data is not base64",
        ),
        (
            json!({"data": STANDARD.encode(b"plain words"), "media_type": "image/png"}),
            "images[0]: ",
        ),
    ] {
        let body = json!({"text": "x", "images": [image]});
        let (status, err) = s.call("POST", &messages, Some(body)).await;
        assert_eq!(status, 400, "{err}");
        assert!(err["message"].as_str().unwrap().starts_with(says), "{err}");
    }

    // An image alone is a message; it is kept as a block naming its hash.
    let body = json!({"images": [{"data": STANDARD.encode(PNG), "media_type": "image/png"}]});
    let (status, sent) = s.call("POST", &messages, Some(body)).await;
    assert_eq!(status, 202, "{sent}");
    let mid = sent["message_id"].as_str().unwrap();
    let (status, message) = s.call("GET", &format!("{messages}/{mid}"), None).await;
    assert_eq!(status, 200, "{message}");
    let content = message["content_blocks"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{message}");
    assert_eq!(content[0]["type"], "image", "{message}");
    assert_eq!(content[0]["sha256"], sha, "{message}");
    assert_eq!(content[0]["media_type"], "image/png", "{message}");
    s.stop().await;
}
