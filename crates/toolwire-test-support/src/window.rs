//! A model with a context window: the mock counts each request's tokens
//! (its own way, not the engine's: every string the request sends the
//! model, BPE-counted with `o200k_base`, plus 4 per message), records the
//! count, answers a request over its window with the provider's real
//! error body ([`crate::faults`]), and reports the count as the prompt's
//! usage otherwise, as a real API does.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::faults::{anthropic_prompt_too_long, openai_context_exceeded};
use crate::mock_model::{Reply, Request};
use crate::sse::{Call, anthropic_sse_with_usage, openai_sse_with_usage};

/// The wire format a windowed mock speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    OpenAi,
    Anthropic,
}

/// What the model answers to a request that fits.
pub enum Answer {
    Text(String),
    /// Tool calls: (id, name, arguments).
    Calls(Vec<(String, String, Value)>),
    /// Any reply (a fault, a stall).
    Reply(Reply),
}

/// A model of `window` tokens on the mock server.
#[derive(Clone)]
pub struct Windowed {
    wire: Wire,
    window: u64,
    sizes: Arc<Mutex<Vec<u64>>>,
}

impl Windowed {
    pub fn new(wire: Wire, window: u64) -> Windowed {
        Windowed {
            wire,
            window,
            sizes: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The size of every request so far, in order (those refused
    /// included).
    pub fn sizes(&self) -> Vec<u64> {
        self.sizes.lock().unwrap().clone()
    }

    /// The mock's reply: `answer` for a request within the window, the
    /// provider's error over it.
    pub fn reply(&self, answer: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Reply {
        let this = self.clone();
        Reply::Respond(Arc::new(move |request: &Request| {
            let tokens = request_tokens(&request.body);
            this.sizes.lock().unwrap().push(tokens);
            if tokens > this.window {
                return match this.wire {
                    Wire::OpenAi => openai_context_exceeded(this.window, tokens),
                    Wire::Anthropic => anthropic_prompt_too_long(this.window, tokens),
                };
            }
            let (text, calls) = match answer(request) {
                Answer::Text(t) => (t, Vec::new()),
                Answer::Calls(c) => (String::new(), c),
                Answer::Reply(reply) => return reply,
            };
            let calls: Vec<Call<'_>> = calls
                .iter()
                .map(|(id, name, arguments)| Call {
                    id,
                    name,
                    arguments: arguments.clone(),
                })
                .collect();
            let completion = 20;
            Reply::sse(match this.wire {
                Wire::OpenAi => openai_sse_with_usage(
                    &text,
                    &calls,
                    json!({"prompt_tokens": tokens, "completion_tokens": completion}),
                ),
                Wire::Anthropic => anthropic_sse_with_usage(
                    &text,
                    &calls,
                    json!({"input_tokens": tokens, "output_tokens": completion}),
                ),
            })
        }))
    }
}

/// Tokens of a request body as the mock counts them.
pub fn request_tokens(body: &Value) -> u64 {
    let bpe = tiktoken_rs::o200k_base_singleton();
    let mut text = String::new();
    let mut messages = 0u64;
    for key in ["system", "instructions", "messages", "input", "tools"] {
        if let Some(v) = body.get(key) {
            if let Some(list) = v.as_array()
                && key != "tools"
            {
                messages += list.len() as u64;
            }
            strings(v, &mut text);
        }
    }
    bpe.encode_ordinary(&text).len() as u64 + 4 * messages
}

/// Every string under `v` that the model reads (not roles, types, ids).
fn strings(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(map) => {
            for (k, v) in map {
                if matches!(
                    k.as_str(),
                    "role"
                        | "type"
                        | "id"
                        | "tool_call_id"
                        | "tool_use_id"
                        | "call_id"
                        | "cache_control"
                ) {
                    continue;
                }
                strings(v, out);
            }
        }
        _ => {}
    }
}

/// Whether `request` asks for a compaction summary (the engine's
/// summarising system prompt).
pub fn is_summary_request(request: &Request) -> bool {
    let system = match &request.body["system"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<String>(),
        _ => request.body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    };
    system.starts_with("You are compacting")
}
