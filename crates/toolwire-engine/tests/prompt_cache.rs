//! Anthropic prompt caching through the whole loop: the breakpoints each
//! request carries, and the cache reads and writes a mock that keeps
//! Anthropic's cache (from those breakpoints) reports, as the engine
//! counts and prices them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use toolwire_core::{Price, PriceTable, StopReason};
use toolwire_engine::EngineConfig;
use toolwire_providers::AnthropicProvider;

/// A mock Anthropic that calls `fast` for `calls` steps, then answers,
/// reporting usage from `cache`.
async fn cached_anthropic(cache: Arc<PromptCache>, calls: usize) -> MockServer {
    let step = AtomicUsize::new(0);
    MockServer::start(vec![Reply::Respond(Arc::new(move |request| {
        let usage = cache.usage(&request.body).json();
        let n = step.fetch_add(1, Ordering::SeqCst);
        let id = format!("toolu_{n}");
        let body = if n < calls {
            anthropic_sse_with_usage(
                "",
                &[Call {
                    id: &id,
                    name: "fast",
                    arguments: json!({"step": n, "note": "x".repeat(400)}),
                }],
                usage,
            )
        } else {
            anthropic_sse_with_usage("Done.", &[], usage)
        };
        Reply::sse(body)
    }))])
    .await
}

/// JSON pointers of the objects carrying `cache_control`.
fn breakpoints(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if o.contains_key("cache_control") {
                assert_eq!(o["cache_control"], json!({"type": "ephemeral"}));
                out.push(at.to_owned());
            }
            for (k, v) in o {
                breakpoints(v, &format!("{at}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                breakpoints(v, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Sorted: whether object keys keep their order depends on serde_json's
/// features.
fn marked(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    breakpoints(body, "", &mut out);
    out.sort();
    out
}

fn last_block(body: &Value, message: usize) -> String {
    let blocks = body["messages"][message]["content"].as_array().unwrap();
    format!("/messages/{message}/content/{}", blocks.len() - 1)
}

#[tokio::test]
async fn breakpoints_move_forward_and_the_prefix_is_read_back() {
    // No minimum length: the default system prompt is short.
    let cache = Arc::new(PromptCache::new(0));
    let server = cached_anthropic(cache, 3).await;
    let provider = Arc::new(AnthropicProvider::new(
        http(&server.url),
        "claude-test",
        true,
    ));
    let mut prices = PriceTable::default();
    prices.0.insert(
        "claude-test".into(),
        Price {
            input: 3.0,
            output: 15.0,
            cached_input: Some(0.3),
            cache_write: None,
        },
    );
    let config = EngineConfig {
        prices,
        ..EngineConfig::default()
    };
    let (engine, _dir) = engine(
        provider,
        echo_tools(&["fast", "other"], Duration::ZERO),
        config,
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "go").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);

    let received = server.received();
    assert_eq!(received.len(), 4);
    let tools = received[0].body["tools"].as_array().unwrap().len();
    for (step, request) in received.iter().enumerate() {
        let body = &request.body;
        let n = body["messages"].as_array().unwrap().len();
        assert_eq!(n, 1 + 2 * step);
        let mut expected = vec![last_block(body, n - 1)];
        if step > 0 {
            // The previous request's last message keeps its breakpoint.
            expected.insert(0, last_block(body, n - 3));
        }
        expected.push("/system/0".into());
        expected.push(format!("/tools/{}", tools - 1));
        expected.sort();
        assert_eq!(marked(body), expected, "request {step}");
        assert!(marked(body).len() <= 4);
    }

    // What the mock's cache reported, as the engine counted it: from the
    // second step on, everything up to the previous step's end is read.
    let cache = PromptCache::new(0);
    let reported: Vec<_> = received.iter().map(|r| cache.usage(&r.body)).collect();
    assert_eq!(reported[0].cache_read_input_tokens, 0);
    for step in 1..reported.len() {
        assert_eq!(
            reported[step].cache_read_input_tokens,
            reported[step - 1].total(),
            "step {step} reads all the previous request"
        );
        assert_eq!(reported[step].input_tokens, 0);
    }
    let sum = |f: fn(&_) -> u64| reported.iter().map(f).sum::<u64>();
    assert_eq!(outcome.usage.prompt_tokens, sum(|u| u.total()));
    assert_eq!(
        outcome.usage.cached_tokens,
        sum(|u| u.cache_read_input_tokens)
    );
    assert_eq!(
        outcome.usage.cache_write_tokens,
        sum(|u| u.cache_creation_input_tokens)
    );
    assert_eq!(outcome.usage.completion_tokens, 4 * 20);

    // Priced with reads at cached_input and writes at 1.25 × input.
    let per_million = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
    let expected = per_million(sum(|u| u.cache_read_input_tokens), 0.3)
        + per_million(sum(|u| u.cache_creation_input_tokens), 3.75)
        + per_million(outcome.usage.completion_tokens, 15.0);
    let cost = outcome.cost.unwrap();
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
}

#[tokio::test]
async fn with_caching_off_no_request_carries_a_breakpoint() {
    let cache = Arc::new(PromptCache::new(0));
    let server = cached_anthropic(cache, 1).await;
    let provider = Arc::new(
        AnthropicProvider::new(http(&server.url), "claude-test", true).with_prompt_caching(false),
    );
    let (engine, _dir) = engine(
        provider,
        echo_tools(&["fast"], Duration::ZERO),
        EngineConfig::default(),
    )
    .await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "go").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let received = server.received();
    assert_eq!(received.len(), 2);
    for request in &received {
        assert_eq!(marked(&request.body), Vec::<String>::new());
        assert!(request.body["system"].is_string());
    }
    assert_eq!(outcome.usage.cached_tokens, 0);
    assert_eq!(outcome.usage.cache_write_tokens, 0);
}
