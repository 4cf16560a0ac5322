//! The cost of images: storing and replaying a path of 100 user messages
//! that each carry a 64 KiB image, against the same 100 messages with
//! text alone. The parts are the ones a turn uses, on an SQLite file in a
//! temporary directory:
//!
//! * `images/store_100/{text,images}`: 100 messages appended in a fresh
//!   conversation; with images, each image first checked and stored once
//!   by hash (`check_image` + `Store::put_blob`, what `Engine::put_image`
//!   does), the message holding the reference.
//! * `images/replay_100/{text,images}_{openai,anthropic}`: what a model
//!   step does before it sends: the path read (`Store::path_to`), each
//!   image's bytes read from the store (the turn's first step; later steps
//!   keep them), and the provider's request body written (base64 for the
//!   images). `…_read_only`: the path and the bytes alone, no body.
//!
//! Before the timed runs, the size of each body is printed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use toolwire_core::{ContentBlock, Message, MessageId, Role};
use toolwire_providers::{
    AnthropicProvider, HttpSettings, ModelRequest, OpenAiProvider, RequestImages, RetryPolicy,
    StreamLimits,
};
use toolwire_store::Store;

const MESSAGES: usize = 100;
const IMAGE_BYTES: usize = 64 * 1024;

/// Image `i`: a PNG signature, then bytes of its own (each hash distinct).
fn image(i: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while bytes.len() < IMAGE_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(IMAGE_BYTES);
    bytes
}

fn text(i: usize) -> ContentBlock {
    ContentBlock::Text {
        text: format!("Here is screenshot {i}: what changed since the last one?"),
    }
}

struct Db {
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

async fn db() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    Db {
        store: toolwire_store::open(&url).await.unwrap(),
        _dir: dir,
    }
}

/// Appends the 100 messages (with an image each when `images`) to a new
/// conversation of `store`; returns the leaf.
async fn store_path(store: &dyn Store, images: Option<&[Vec<u8>]>) -> MessageId {
    let c = store
        .create_conversation("You look at screenshots.", None)
        .await
        .unwrap();
    let mut parent = c.root_id;
    for i in 0..MESSAGES {
        let mut content = vec![text(i)];
        if let Some(images) = images {
            let bytes = &images[i];
            let media_type = toolwire_core::image::check_image(bytes, None).unwrap();
            content.push(ContentBlock::Image(
                store.put_blob(media_type, bytes).await.unwrap(),
            ));
        }
        let m = Message::new(c.id, Some(parent), Role::User, content);
        store.append(&m).await.unwrap();
        parent = m.id;
    }
    parent
}

/// What a model step does before it sends: the path, the images' bytes,
/// the request.
async fn request(store: &dyn Store, leaf: MessageId) -> ModelRequest {
    let path = store.path_to(leaf).await.unwrap();
    let mut bytes: HashMap<String, Arc<[u8]>> = HashMap::new();
    for image in path.iter().flat_map(Message::images) {
        if !bytes.contains_key(&image.sha256) {
            let blob = store.blob(&image.sha256).await.unwrap().unwrap();
            bytes.insert(image.sha256.clone(), blob.bytes.into());
        }
    }
    ModelRequest {
        system: path[0].text(),
        messages: path[1..].to_vec(),
        tools: Vec::new(),
        turn: 0,
        iteration: 1,
        reasoning_effort: None,
        images: RequestImages {
            vision: true,
            bytes,
        },
        response_format: None,
    }
}

fn settings() -> HttpSettings {
    HttpSettings {
        base_url: "http://127.0.0.1:9".into(),
        api_key: None,
        retry: RetryPolicy::default(),
        headers: Vec::new(),
        limits: StreamLimits::default(),
        max_tokens: 1024,
    }
}

fn bench(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let images: Vec<Vec<u8>> = (0..MESSAGES).map(image).collect();
    let openai = OpenAiProvider::new(settings(), "gpt-bench", true);
    let anthropic = AnthropicProvider::new(settings(), "claude-bench", true);

    let mut group = c.benchmark_group("images");
    group.sample_size(10);

    for (name, with) in [("text", None), ("images", Some(images.as_slice()))] {
        group.bench_function(format!("store_100/{name}"), |b| {
            b.iter_batched(
                || rt.block_on(db()),
                |db| {
                    rt.block_on(store_path(db.store.as_ref(), with));
                    db
                },
                BatchSize::PerIteration,
            )
        });
    }

    for (name, with) in [("text", None), ("images", Some(images.as_slice()))] {
        let db = rt.block_on(db());
        let leaf = rt.block_on(store_path(db.store.as_ref(), with));
        let sample = rt.block_on(request(db.store.as_ref(), leaf));
        println!(
            "images/{name}: OpenAI body {} bytes, Anthropic body {} bytes",
            openai.body(&sample).map_or(0, |b| b.len()),
            anthropic.body(&sample).map_or(0, |b| b.len())
        );
        group.bench_function(format!("replay_100/{name}_read_only"), |b| {
            b.iter(|| black_box(rt.block_on(request(db.store.as_ref(), leaf)).messages.len()))
        });
        group.bench_function(format!("replay_100/{name}_openai"), |b| {
            b.iter(|| {
                let request = rt.block_on(request(db.store.as_ref(), leaf));
                black_box(openai.body(&request).map_or(0, |b| b.len()))
            })
        });
        group.bench_function(format!("replay_100/{name}_anthropic"), |b| {
            b.iter(|| {
                let request = rt.block_on(request(db.store.as_ref(), leaf));
                black_box(anthropic.body(&request).map_or(0, |b| b.len()))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
