//! Long tool loops keep working within the model's context window: the
//! mock model counts every request and refuses one over its window with
//! OpenAI's real error; the engine compacts the older part of the path
//! into a node of the tree (the originals stay stored, a fork from before
//! the node sends them), cuts oversized tool results, survives a failed
//! or interrupted compaction with nothing lost, and stops at budgets.
//! Real HTTP over loopback, a real SQLite file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use support::*;
use toolwire_core::{ContentBlock, ConversationId, Message, Price, Role, StopReason};
use toolwire_engine::context::{Budgets, Limit, SUMMARY_INTRO, Spent};
use toolwire_engine::{Engine, EngineConfig, TurnOptions};
use toolwire_providers::{Models, OpenAiProvider};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec};

const WINDOW: u64 = 8_000;

/// A tool whose result is a chunk of about 400 tokens (`{"n": N}`), or
/// `{"n": N, "lines": L}` lines.
struct Chunks {
    spec: Arc<ToolSpec>,
}

fn chunk(n: u64, lines: u64) -> String {
    (0..lines)
        .map(|j| {
            format!(
                "chunk {n} line {j}: the quick brown fox jumps over the lazy dog {}\n",
                n * 1000 + j
            )
        })
        .collect()
}

#[async_trait]
impl Tool for Chunks {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let n = arguments["n"].as_u64().unwrap_or(0);
        let lines = arguments["lines"].as_u64().unwrap_or(20);
        Ok(ToolOutput::ok(chunk(n, lines)))
    }
}

fn tools() -> ToolRegistry {
    let mut r = ToolRegistry::new();
    r.register(Arc::new(Chunks {
        spec: Arc::new(ToolSpec {
            name: "read_chunk".into(),
            server: None,
            description: "Reads chunk n.".into(),
            parameters: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            read_only: true,
        }),
    }));
    r
}

fn models(url: &str, window: Option<u64>, price: Option<Price>) -> Models {
    let provider = Arc::new(OpenAiProvider::new(http(url), "gpt-4o", true));
    let mut entry = model_entry("gpt", "openai", provider, &[]);
    entry.info.context_window = window;
    entry.info.price = price;
    Models::new(vec![entry], None).unwrap()
}

fn config() -> EngineConfig {
    EngineConfig {
        max_steps: 400,
        ..EngineConfig::default()
    }
}

/// The model of the long loop: calls `read_chunk` with n = 0, 1, … for
/// `steps` requests (summary requests aside), then answers "done";
/// summaries are answered by `summary` (their number given).
struct Script {
    steps: u64,
    step: AtomicUsize,
    summaries: AtomicUsize,
}

impl Script {
    fn new(steps: u64) -> Arc<Script> {
        Arc::new(Script {
            steps,
            step: AtomicUsize::new(0),
            summaries: AtomicUsize::new(0),
        })
    }

    fn answer(&self, request: &Request, summary: impl Fn(usize) -> Answer) -> Answer {
        if is_summary_request(request) {
            return summary(self.summaries.fetch_add(1, Ordering::SeqCst));
        }
        let n = self.step.fetch_add(1, Ordering::SeqCst) as u64;
        if n < self.steps {
            Answer::Calls(vec![(
                format!("call_{n}"),
                "read_chunk".into(),
                json!({"n": n}),
            )])
        } else {
            Answer::Text("done".into())
        }
    }
}

fn summary_text(k: usize) -> Answer {
    Answer::Text(format!(
        "Summary {k}: the user asked to read every chunk; the chunks read so far hold \
         numbered lines about a fox and a dog. Go on with the next chunk."
    ))
}

/// Every request's tool calls are answered right after them, by results
/// with the same ids, and no result comes without its call.
fn calls_and_results_together(body: &Value) {
    let messages = body["messages"].as_array().unwrap();
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        assert_ne!(m["role"], "tool", "a result without its call at {i}");
        i += 1;
        if let Some(calls) = m["tool_calls"].as_array() {
            for call in calls {
                let r = &messages[i];
                assert_eq!(
                    r["role"], "tool",
                    "call {} is not followed by its result",
                    call["id"]
                );
                assert_eq!(r["tool_call_id"], call["id"]);
                i += 1;
            }
        }
    }
}

fn nodes(messages: &[Message]) -> Vec<&Message> {
    messages
        .iter()
        .filter(|m| m.compaction().is_some())
        .collect()
}

async fn stored(engine: &Engine, conversation: ConversationId) -> Vec<Message> {
    engine.store().messages(conversation).await.unwrap()
}

#[tokio::test]
async fn a_200_step_loop_ten_times_the_window_stays_under_it() {
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let script = Script::new(200);
    let s = script.clone();
    let server = MockServer::start(vec![window.reply(move |r| s.answer(r, summary_text))]).await;
    let (engine, _dir) = engine(models(&server.url, Some(WINDOW), None), tools(), config()).await;
    let conv = engine.create_conversation(None).await.unwrap();

    let outcome = engine.run(conv.id, "Read every chunk.").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(outcome.final_message.unwrap().text(), "done");

    // The results together are ten times the window.
    let results: u64 = (0..200)
        .map(|n| request_tokens(&json!({"messages": [chunk(n, 20)]})))
        .sum();
    assert!(results >= 10 * WINDOW, "results hold {results} tokens");

    // Every request stayed under the window: none was refused.
    let sizes = window.sizes();
    let max = *sizes.iter().max().unwrap();
    assert!(max <= WINDOW, "a request of {max} tokens");
    assert_eq!(sizes.len(), 201 + script.summaries.load(Ordering::SeqCst));
    for r in server.received() {
        if !is_summary_request(&r) {
            calls_and_results_together(&r.body);
        }
    }

    // Compaction nodes in the tree; every original message stays stored.
    let messages = stored(&engine, conv.id).await;
    let found = nodes(&messages);
    assert!(found.len() >= 5, "{} compaction nodes", found.len());
    assert_eq!(found.len(), script.summaries.load(Ordering::SeqCst));
    let results_stored = messages.iter().filter(|m| m.role == Role::Tool).count();
    assert_eq!(results_stored, 200);
    for node in &found {
        let Some(ContentBlock::Compaction {
            covered,
            tokens_before,
            tokens_after,
            ..
        }) = node.content.first()
        else {
            panic!("not a compaction block")
        };
        assert!(*covered > 0);
        assert!(tokens_after < tokens_before);
        assert_eq!(node.role, Role::System);
        // It covers the path from the root's child through `through`,
        // earlier nodes aside.
        let path = engine.store().path_to(node.id).await.unwrap();
        let through = node.compaction().unwrap().1;
        let end = path.iter().position(|m| m.id == through).unwrap();
        let count = path[1..=end]
            .iter()
            .filter(|m| m.compaction().is_none())
            .count();
        assert_eq!(*covered as usize, count);
    }

    // A fork from before the first compaction sends the originals.
    let first = found
        .iter()
        .min_by_key(|m| m.created_at)
        .unwrap()
        .compaction()
        .unwrap()
        .1;
    let fork = engine.fork(first).await.unwrap();
    let before = server.received().len();
    let outcome = engine.run(fork.id, "What did chunk 0 say?").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let sent = server.received()[before..].to_vec();
    assert_eq!(sent.len(), 1, "no compaction on the fork");
    let body = sent[0].body.to_string();
    assert!(
        body.contains("chunk 0 line 0:"),
        "the original first result"
    );
    assert!(
        !body.contains("compacted to stay"),
        "no summary on the fork"
    );
    // The compacted branch, by contrast, sends a summary.
    let last = server.received();
    let compacted = last
        .iter()
        .rev()
        .find(|r| !is_summary_request(r) && r.body.to_string().contains("compacted to stay"))
        .expect("a request with a summary");
    assert!(!compacted.body.to_string().contains("chunk 0 line 0:"));
    assert!(SUMMARY_INTRO.contains("compacted to stay"));
}

#[tokio::test]
async fn without_compaction_the_loop_meets_the_providers_error() {
    // What users met before: the same loop with compaction out of reach
    // (the engine knows gpt-4o's 128k window, the mock's is 8,000) fails
    // on the provider's real 400.
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let script = Script::new(200);
    let s = script.clone();
    let server = MockServer::start(vec![window.reply(move |r| s.answer(r, summary_text))]).await;
    let (engine, _dir) = engine(models(&server.url, None, None), tools(), config()).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "Read every chunk.").await.unwrap();
    assert_eq!(outcome.reason, StopReason::LlmApiError);
    let error = outcome.error.unwrap();
    assert!(error.contains("context_length_exceeded"), "{error}");
    assert!(
        error.contains("maximum context length is 8000 tokens"),
        "{error}"
    );
    assert!(*window.sizes().last().unwrap() > WINDOW);
}

#[tokio::test]
async fn a_failed_compaction_leaves_the_conversation_as_it_was() {
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let script = Script::new(200);
    let failing = Arc::new(AtomicBool::new(true));
    let (s, f) = (script.clone(), failing.clone());
    let server = MockServer::start(vec![window.reply(move |r| {
        s.answer(r, |k| {
            if f.load(Ordering::SeqCst) {
                Answer::Reply(Reply::Status {
                    code: 400,
                    headers: Vec::new(),
                    body: r#"{"error":{"message":"Invalid request.","type":"invalid_request_error","param":null,"code":null}}"#.into(),
                })
            } else {
                summary_text(k)
            }
        })
    })])
    .await;
    let (engine, _dir) = engine(models(&server.url, Some(WINDOW), None), tools(), config()).await;
    let conv = engine.create_conversation(None).await.unwrap();

    let outcome = engine.run(conv.id, "Read every chunk.").await.unwrap();
    assert_eq!(outcome.reason, StopReason::LlmApiError);
    let error = outcome.error.unwrap();
    assert!(error.contains("compaction failed"), "{error}");
    assert!(error.contains("nothing was removed"), "{error}");
    assert!(error.contains("Invalid request."), "{error}");
    let messages = stored(&engine, conv.id).await;
    assert!(nodes(&messages).is_empty());
    // Every step before it is stored: each call has its result.
    let calls = messages
        .iter()
        .filter(|m| m.tool_uses().count() > 0)
        .count();
    let results = messages.iter().filter(|m| m.role == Role::Tool).count();
    assert_eq!(calls, results);
    assert!(results > 5);
    // Nothing over the window was sent.
    assert!(window.sizes().iter().all(|s| *s <= WINDOW));

    // Once the summariser works again, the conversation goes on.
    failing.store(false, Ordering::SeqCst);
    let outcome = engine.run(conv.id, "Go on.").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let after = stored(&engine, conv.id).await;
    assert!(!nodes(&after).is_empty());
    for m in &messages {
        assert!(after.iter().any(|a| a.id == m.id), "message {} kept", m.id);
    }
}

#[tokio::test]
async fn a_restart_mid_compaction_leaves_no_half_node() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("test.db");
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let script = Script::new(200);
    let s = script.clone();
    // The summarising call never answers: the engine stops meanwhile.
    let server = MockServer::start(vec![window.reply(move |r| {
        s.answer(r, |_| {
            Answer::Reply(Reply::Stall {
                head: false,
                sent: String::new(),
                for_: Duration::from_secs(60),
            })
        })
    })])
    .await;
    let first = engine_at(
        &db,
        models(&server.url, Some(WINDOW), None),
        tools(),
        config(),
    )
    .await;
    let conv = first.create_conversation(None).await.unwrap();
    let _turn = first
        .send(conv.id, "Read every chunk.", None)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while script.summaries.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the summarising call was made");
    let before = stored(&first, conv.id).await;
    first.shutdown(Duration::from_millis(50)).await;
    drop(first);

    // A new engine on the same file: no node, nothing lost, and the
    // conversation goes on (compacting now).
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let script = Script::new(3);
    let s = script.clone();
    let server = MockServer::start(vec![window.reply(move |r| s.answer(r, summary_text))]).await;
    let second = engine_at(
        &db,
        models(&server.url, Some(WINDOW), None),
        tools(),
        config(),
    )
    .await;
    let after = stored(&second, conv.id).await;
    assert!(nodes(&after).is_empty(), "no half node");
    assert_eq!(after.len(), before.len());
    let outcome = second.run(conv.id, "Go on.").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(nodes(&stored(&second, conv.id).await).len(), 1);
    assert!(window.sizes().iter().all(|s| *s <= WINDOW));
}

#[tokio::test]
async fn an_oversized_result_is_cut_for_the_model_and_kept_whole() {
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let server = MockServer::start(vec![window.reply(move |_| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            // About 6,000 tokens: three quarters of the window.
            Answer::Calls(vec![(
                "big".into(),
                "read_chunk".into(),
                json!({"n": 7, "lines": 300}),
            )])
        } else {
            Answer::Text("read it".into())
        }
    })])
    .await;
    let (engine, _dir) = engine(models(&server.url, Some(WINDOW), None), tools(), config()).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "Read chunk 7.").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let sent = server.received();
    let result = sent[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(result.contains("the whole result is stored"), "{result}");
    assert!(result.contains("read_file with offset and limit"));
    assert!(result.starts_with("chunk 7 line 0:"));
    assert!(result.contains("line 299:"), "the tail is kept");
    assert!(request_tokens(&json!({"messages": [result]})) <= WINDOW / 4 + 150);
    // The store keeps it whole.
    let messages = stored(&engine, conv.id).await;
    let whole = messages.iter().find(|m| m.role == Role::Tool).unwrap();
    let Some(ContentBlock::ToolResult { content, .. }) = whole.content.first() else {
        panic!()
    };
    assert_eq!(content, &chunk(7, 300));
}

/// A model step that calls `echo`, reporting 100 prompt and 20
/// completion tokens.
fn call() -> Reply {
    Reply::sse(openai_sse(
        "",
        &[Call {
            id: "c1",
            name: "echo",
            arguments: json!({}),
        }],
    ))
}

/// A final answer (the same usage).
fn answer() -> Reply {
    Reply::sse(openai_sse("finished", &[]))
}

/// The mock answering `replies` in order, the last one repeating.
async fn looping(replies: Vec<Reply>) -> MockServer {
    MockServer::start(replies).await
}

/// $0.01 a step: 100 prompt tokens at $50/M, 20 completion at $250/M.
fn price() -> Price {
    Price {
        input: 50.0,
        output: 250.0,
        cached_input: None,
        cache_write: None,
    }
}

async fn budget_engine(server: &MockServer, budgets: Budgets) -> (Engine, tempfile::TempDir) {
    let config = EngineConfig {
        budgets,
        ..config()
    };
    engine(
        models(&server.url, None, Some(price())),
        echo_tools(&["echo"], Duration::ZERO),
        config,
    )
    .await
}

fn tokens(n: u64) -> Limit {
    Limit {
        max_tokens: Some(n),
        max_cost: None,
    }
}

#[tokio::test]
async fn a_turn_token_budget_stops_the_loop_at_its_step_with_a_warning() {
    let server = looping(vec![call()]).await;
    let budgets = Budgets {
        turn: tokens(500),
        ..Budgets::default()
    };
    let (engine, _dir) = budget_engine(&server, budgets).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "loop").await.unwrap();
    assert_eq!(outcome.reason, StopReason::BudgetExceeded);
    let error = outcome.error.unwrap();
    assert!(
        error.contains("the turn's token budget (500 tokens)"),
        "{error}"
    );
    // 120 tokens a step: 480 after four, 600 after five: no sixth call.
    assert_eq!(server.received().len(), 5);
    assert_eq!(outcome.usage.total(), 600);
    let types = event_types(&engine, conv.id).await;
    let warning = types.iter().position(|t| t == "budget_warning").unwrap();
    assert!(warning < types.iter().position(|t| t == "stopped").unwrap());
    assert_eq!(types.iter().filter(|t| *t == "budget_warning").count(), 1);
}

#[tokio::test]
async fn a_turn_cost_budget_stops_the_loop_at_its_step() {
    let server = looping(vec![call()]).await;
    let budgets = Budgets {
        turn: Limit {
            max_tokens: None,
            max_cost: Some(0.035),
        },
        ..Budgets::default()
    };
    let (engine, _dir) = budget_engine(&server, budgets).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "loop").await.unwrap();
    assert_eq!(outcome.reason, StopReason::BudgetExceeded);
    assert!(outcome.error.unwrap().contains("the turn's cost budget"));
    assert_eq!(server.received().len(), 4);
}

#[tokio::test]
async fn a_conversation_budget_counts_the_earlier_turns() {
    // Three calls and an answer (480 tokens), then calls forever.
    let server = looping(vec![call(), call(), call(), answer(), call()]).await;
    let budgets = Budgets {
        conversation: tokens(1_000),
        ..Budgets::default()
    };
    let (engine, _dir) = budget_engine(&server, budgets).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let first = engine.run(conv.id, "three").await.unwrap();
    assert_eq!(first.reason, StopReason::EndTurn, "{:?}", first.error);
    assert_eq!(server.received().len(), 4);
    let second = engine.run(conv.id, "more").await.unwrap();
    assert_eq!(second.reason, StopReason::BudgetExceeded);
    assert!(
        second
            .error
            .unwrap()
            .contains("the conversation's token budget")
    );
    // 480 + 120 × 5 = 1,080: the fifth call of the second turn is the last.
    assert_eq!(server.received().len(), 9);
}

#[tokio::test]
async fn an_agent_budget_counts_what_the_agent_spent_elsewhere() {
    let server = looping(vec![call()]).await;
    let budgets = Budgets {
        agent: tokens(1_200),
        ..Budgets::default()
    };
    let (engine, _dir) = budget_engine(&server, budgets).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let options = TurnOptions {
        agent_spent: Some(Spent {
            tokens: 900,
            cost: 0.0,
        }),
        ..TurnOptions::default()
    };
    let outcome = engine
        .send_with(conv.id, "loop", None, options)
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::BudgetExceeded);
    assert!(outcome.error.unwrap().contains("the agent's token budget"));
    // 900 + 240 < 1,200 ≤ 900 + 360.
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn budgets_above_the_loop_never_stop_it() {
    let server = looping(vec![call(), call(), call(), answer()]).await;
    let generous = Limit {
        max_tokens: Some(10_000),
        max_cost: Some(10.0),
    };
    let budgets = Budgets {
        turn: generous,
        conversation: generous,
        agent: generous,
        warn_at: 0.8,
    };
    let (engine, _dir) = budget_engine(&server, budgets).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let options = TurnOptions {
        agent_spent: Some(Spent::default()),
        ..TurnOptions::default()
    };
    let outcome = engine
        .send_with(conv.id, "three", None, options)
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    assert_eq!(server.received().len(), 4);
    assert!(
        !event_types(&engine, conv.id)
            .await
            .contains(&"budget_warning".to_owned())
    );
}

#[tokio::test]
async fn compaction_on_demand_makes_a_node_and_later_turns_send_its_summary() {
    let window = Windowed::new(Wire::OpenAi, WINDOW);
    let script = Script::new(10);
    let s = script.clone();
    let server = MockServer::start(vec![window.reply(move |r| s.answer(r, summary_text))]).await;
    let (engine, _dir) = engine(models(&server.url, Some(WINDOW), None), tools(), config()).await;
    let conv = engine.create_conversation(None).await.unwrap();
    let outcome = engine.run(conv.id, "Read ten chunks.").await.unwrap();
    assert_eq!(outcome.reason, StopReason::EndTurn);
    assert_eq!(script.summaries.load(Ordering::SeqCst), 0, "no need so far");

    let outcome = engine
        .compact(conv.id, TurnOptions::default())
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome.reason, StopReason::EndTurn, "{:?}", outcome.error);
    let node = outcome.final_message.unwrap();
    assert!(node.compaction().unwrap().0.starts_with("Summary 0"));
    let leaf = engine
        .store()
        .conversation(conv.id)
        .await
        .unwrap()
        .active_leaf;
    assert_eq!(leaf, node.id, "the node is the active leaf");
    let types = event_types(&engine, conv.id).await;
    assert!(types.contains(&"context_compacted".to_owned()));

    let before = server.received().len();
    engine.run(conv.id, "And now?").await.unwrap();
    let body = server.received()[before].body.to_string();
    assert!(body.contains("Summary 0"));
    assert!(!body.contains("chunk 0 line 0:"));
}
