//! Images end to end against mock OpenAI and Anthropic servers on
//! loopback: a user's image and one `read_file` returned reach a vision
//! model in its provider's format, stored once by hash; a model without
//! vision reads placeholders.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;
use support::*;
use toolwire_core::{ContentBlock, MAX_IMAGE_BYTES, StopReason};
use toolwire_engine::{Engine, EngineConfig, EngineError, TurnOptions};
use toolwire_providers::{
    AnthropicProvider, Capabilities, ModelEntry, ModelInfo, Models, OpenAiProvider, Provider,
};
use toolwire_tools::ToolRegistry;
use toolwire_tools::builtin::{ReadFile, Workspace};

/// A user's photo and a screenshot in the workspace (PNG and JPEG by
/// their first bytes; the rest need not decode).
const PHOTO: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR a photo";
const SHOT: &[u8] = b"\xff\xd8\xff\xe0\0\x10JFIF a screenshot";

fn entry(name: &str, provider: Arc<dyn Provider>, vision: bool) -> ModelEntry {
    ModelEntry {
        info: ModelInfo {
            name: name.into(),
            model: provider.model().into(),
            capabilities: Capabilities {
                vision,
                ..Capabilities::default()
            },
            ..ModelInfo::default()
        },
        provider,
    }
}

/// An engine whose models `eyes` (vision) and `blind` (none) both ask
/// `provider`, with `read_file` over a workspace holding `shot.jpg`.
async fn setup(provider: Arc<dyn Provider>) -> (Engine, tempfile::TempDir, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("shot.jpg"), SHOT).unwrap();
    let mut tools = ToolRegistry::new();
    let workspace = Arc::new(Workspace::new(root.path()).unwrap());
    tools.register(Arc::new(ReadFile::new(workspace)));
    let models = Models::new(
        vec![
            entry("eyes", provider.clone(), true),
            entry("blind", provider, false),
        ],
        None,
    )
    .unwrap();
    let (store, dir) = sqlite_store().await;
    let engine = Engine::start(store, models, tools, EngineConfig::default())
        .await
        .unwrap();
    (engine, dir, root)
}

/// Sends "what is in it?" with the photo to `model`; returns the stored
/// path.
async fn ask(engine: &Engine, model: &str) -> Vec<toolwire_core::Message> {
    let photo = engine.put_image(PHOTO, Some("image/png")).await.unwrap();
    let conv = engine.create_conversation(None).await.unwrap();
    let content = vec![
        ContentBlock::Text {
            text: "what is in it?".into(),
        },
        ContentBlock::Image(photo),
    ];
    let options = TurnOptions {
        model: Some(model.into()),
        ..TurnOptions::default()
    };
    let outcome = engine
        .send_content_with(conv.id, content, None, options)
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let leaf = engine
        .store()
        .conversation(conv.id)
        .await
        .unwrap()
        .active_leaf;
    engine.store().path_to(leaf).await.unwrap()
}

fn read_shot() -> Call<'static> {
    Call {
        id: "call_1",
        name: "read_file",
        arguments: json!({"path": "shot.jpg"}),
    }
}

fn data_url(media_type: &str, bytes: &[u8]) -> String {
    format!("data:{media_type};base64,{}", STANDARD.encode(bytes))
}

#[tokio::test]
async fn openai_sees_the_users_image_and_the_tools() {
    let server = MockServer::start(vec![
        Reply::sse(openai_sse("", &[read_shot()])),
        Reply::sse(openai_sse("A cat and a screen.", &[])),
    ])
    .await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let (engine, _dir, _root) = setup(provider).await;
    let path = ask(&engine, "eyes").await;

    // Stored: references only; the bytes once each, by hash.
    let result = path
        .iter()
        .find(|m| m.images().count() > 0 && m.role == toolwire_core::Role::Tool)
        .unwrap();
    let shot = result.images().next().unwrap().clone();
    assert_eq!(shot.media_type, "image/jpeg");
    assert_eq!(shot.bytes_len, SHOT.len() as u64);
    let kept = engine.store().blob(&shot.sha256).await.unwrap().unwrap();
    assert_eq!(kept.bytes, SHOT);
    assert!(
        !serde_json::to_string(&path)
            .unwrap()
            .contains(&STANDARD.encode(SHOT))
    );

    let received = server.received();
    assert_eq!(received.len(), 2);
    let photo_part =
        json!({"type": "image_url", "image_url": {"url": data_url("image/png", PHOTO)}});
    assert_eq!(
        received[0].body["messages"][1],
        json!({"role": "user", "content": [
            {"type": "text", "text": "what is in it?"},
            photo_part,
        ]})
    );
    let second = received[1].body["messages"].as_array().unwrap();
    assert_eq!(
        second[1], received[0].body["messages"][1],
        "the photo again"
    );
    assert_eq!(second[3]["role"], "tool");
    assert_eq!(
        second[3]["content"],
        format!("`shot.jpg`: image/jpeg image, {} B", SHOT.len())
    );
    assert_eq!(
        second[4],
        json!({"role": "user", "content": [
            {"type": "text", "text": "The image tool call call_1 returned:"},
            {"type": "image_url", "image_url": {"url": data_url("image/jpeg", SHOT)}},
        ]})
    );
}

/// `value` without Anthropic's `cache_control` marks.
fn without_cache_marks(mut value: serde_json::Value) -> serde_json::Value {
    match &mut value {
        serde_json::Value::Object(map) => {
            map.remove("cache_control");
            for v in map.values_mut() {
                *v = without_cache_marks(v.take());
            }
        }
        serde_json::Value::Array(items) => {
            for v in items.iter_mut() {
                *v = without_cache_marks(v.take());
            }
        }
        _ => {}
    }
    value
}

#[tokio::test]
async fn anthropic_sees_images_also_inside_tool_results() {
    let server = MockServer::start(vec![
        Reply::sse(anthropic_sse("", &[read_shot()])),
        Reply::sse(anthropic_sse("A cat and a screen.", &[])),
    ])
    .await;
    let provider = Arc::new(AnthropicProvider::new(
        http(&server.url),
        "claude-test",
        true,
    ));
    let (engine, _dir, _root) = setup(provider).await;
    ask(&engine, "eyes").await;

    let received = server.received();
    assert_eq!(received.len(), 2);
    // Where the prompt-cache breakpoints sit is tests/prompt_cache.rs's
    // business: here, the blocks as written.
    let messages = &without_cache_marks(received[1].body["messages"].clone());
    assert_eq!(
        messages[0]["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": STANDARD.encode(PHOTO)}})
    );
    assert_eq!(
        messages[2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": "call_1", "is_error": false, "content": [
            {"type": "text", "text": format!("`shot.jpg`: image/jpeg image, {} B", SHOT.len())},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": STANDARD.encode(SHOT)}},
        ]})
    );
}

#[tokio::test]
async fn a_model_without_vision_reads_placeholders() {
    let server = MockServer::start(vec![
        Reply::sse(openai_sse("", &[read_shot()])),
        Reply::sse(openai_sse("I cannot see it.", &[])),
    ])
    .await;
    let provider = Arc::new(OpenAiProvider::new(http(&server.url), "gpt-test", true));
    let (engine, _dir, _root) = setup(provider).await;
    ask(&engine, "blind").await;

    let received = server.received();
    let body = &received[1].body;
    let text = body.to_string();
    assert!(!text.contains("image_url"), "{text}");
    assert!(!text.contains(&STANDARD.encode(PHOTO)), "{text}");
    let photo = &body["messages"][1]["content"][1]["text"];
    assert!(
        photo
            .as_str()
            .unwrap()
            .starts_with(&format!("[image: image/png, {} B, sha256 ", PHOTO.len()))
            && photo
                .as_str()
                .unwrap()
                .ends_with(": this model cannot see images]"),
        "{photo}"
    );
    let result = body["messages"][3]["content"].as_str().unwrap();
    assert!(
        result.starts_with(&format!(
            "`shot.jpg`: image/jpeg image, {n} B\n[image: image/jpeg, {n} B, sha256 ",
            n = SHOT.len()
        )) && result.ends_with("this model cannot see images]"),
        "{result}"
    );
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(4));
}

#[tokio::test]
async fn images_are_stored_once_and_bad_ones_refused() {
    // No model is asked.
    let provider = Arc::new(OpenAiProvider::new(
        http("http://127.0.0.1:9"),
        "gpt-test",
        true,
    ));
    let (engine, _dir, _root) = setup(provider).await;
    let a = engine.put_image(PHOTO, None).await.unwrap();
    let b = engine.put_image(PHOTO, Some("image/jpeg")).await.unwrap();
    assert_eq!(a, b, "the same bytes, the same reference");
    assert_eq!(
        a.media_type, "image/png",
        "told by the bytes, not the claim"
    );

    let mut big = PHOTO.to_vec();
    big.resize(MAX_IMAGE_BYTES + 1, 0);
    let err = engine.put_image(&big, Some("image/png")).await.unwrap_err();
    assert!(matches!(err, EngineError::Image(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "the image is 5.0 MB (5242881 bytes), over the limit of 5.0 MB (5242880 bytes)"
    );
    let err = engine
        .put_image(b"<svg/>", Some("image/svg+xml"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("declared as image/svg+xml"),
        "{err}"
    );
    let sha = toolwire_core::image::sha256_hex(b"<svg/>");
    assert_eq!(
        engine.store().blob(&sha).await.unwrap(),
        None,
        "nothing stored"
    );
}
