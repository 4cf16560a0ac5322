//! Cache reads and writes in usage: each provider's names map onto one
//! meaning (`prompt_tokens` counts every prompt token, cached or not).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use toolwire_stream::{Format, StreamEvent, Usage, decode_chunked};

fn usages(format: Format, input: &str) -> Vec<Usage> {
    decode_chunked(format, input.as_bytes(), Some(5))
        .into_iter()
        .filter_map(|e| match e.event {
            StreamEvent::Usage(u) => Some(u),
            _ => None,
        })
        .collect()
}

fn sse(events: &[Value]) -> String {
    events.iter().map(|v| format!("data: {v}\n\n")).collect()
}

#[test]
fn anthropic_reads_and_writes_are_part_of_the_prompt() {
    let body = sse(&[
        json!({"type": "message_start", "message": {"usage": {"input_tokens": 12, "cache_read_input_tokens": 3000, "cache_creation_input_tokens": 500, "output_tokens": 1}}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 40}}),
        json!({"type": "message_stop"}),
    ]);
    let last = *usages(Format::Anthropic, &body).last().unwrap();
    assert_eq!(
        last,
        Usage {
            prompt_tokens: 3512,
            completion_tokens: 40,
            cached_tokens: 3000,
            cache_write_tokens: 500,
            reasoning_tokens: 0,
        }
    );
}

#[test]
fn anthropic_message_delta_may_restate_the_cache_counts() {
    // Newer streams repeat the prompt counts in `message_delta`; a count
    // stated there replaces the start's, one left out keeps it.
    let body = sse(&[
        json!({"type": "message_start", "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"cache_read_input_tokens": 800, "cache_creation_input_tokens": 90, "output_tokens": 7}}),
        json!({"type": "message_stop"}),
    ]);
    let last = *usages(Format::Anthropic, &body).last().unwrap();
    assert_eq!(
        (
            last.prompt_tokens,
            last.cached_tokens,
            last.cache_write_tokens,
            last.completion_tokens
        ),
        (900, 800, 90, 7)
    );
}

#[test]
fn openai_chat_cached_tokens_are_a_part_of_prompt_tokens() {
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 2000, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1920}}}),
    ]) + "data: [DONE]\n\n";
    let last = *usages(Format::OpenAiChat, &body).last().unwrap();
    assert_eq!(
        (
            last.prompt_tokens,
            last.cached_tokens,
            last.cache_write_tokens
        ),
        (2000, 1920, 0)
    );
}

#[test]
fn openai_responses_input_tokens_details_give_the_cached_tokens() {
    let body = sse(&[
        json!({"type": "response.output_text.delta", "delta": "hi"}),
        json!({"type": "response.completed", "response": {"status": "completed", "usage": {"input_tokens": 4000, "input_tokens_details": {"cached_tokens": 3840}, "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 4}}}}),
    ]);
    let last = *usages(Format::OpenAiResponses, &body).last().unwrap();
    assert_eq!(
        last,
        Usage {
            prompt_tokens: 4000,
            completion_tokens: 9,
            cached_tokens: 3840,
            cache_write_tokens: 0,
            reasoning_tokens: 4,
        }
    );
}
