//! Anthropic messages stream.
//!
//! A tool call is a `tool_use` content block: the name comes with
//! `content_block_start`, the input with `input_json_delta` fragments, and
//! the call is closed only by `content_block_stop`. A block whose input
//! never had a fragment (or only `""`) has no arguments: `{}`. A message
//! that stops (say at `max_tokens`) with the block still open fails it.

use serde::Deserialize;
use serde_json::Value;

use crate::calls::{ArgumentKind, CallAssembler, OpenCalls};
use crate::event::{FinishReason, StreamEvent, Usage};
use crate::framing::{FrameHandler, framed_decoder, parse_data};
use crate::sse::SseEvent;

framed_decoder!(
    /// Decodes an Anthropic messages stream.
    AnthropicDecoder(MessageState)
);

#[derive(Debug, Default)]
struct MessageState {
    /// Open tool_use blocks keyed by content block index.
    calls: OpenCalls<u64>,
    usage: Usage,
    /// Anthropic's prompt counts as last reported: `message_start` has
    /// them, and a `message_delta` may repeat or update any of them.
    input: u64,
    cache_read: u64,
    cache_write: u64,
    stop_reason: Option<String>,
    finished: bool,
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    index: Option<u64>,
    message: Option<Message>,
    content_block: Option<Block>,
    delta: Option<Delta>,
    usage: Option<AnthropicUsage>,
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct Message {
    usage: Option<AnthropicUsage>,
    content: Option<Vec<Block>>,
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    id: Option<String>,
    name: Option<String>,
    text: Option<String>,
    thinking: Option<String>,
    input: Option<Value>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    thinking: Option<String>,
    partial_json: Option<String>,
    stop_reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AnthropicUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(rename = "type")]
    kind: Option<String>,
    message: Option<String>,
}

impl FrameHandler for MessageState {
    const PROVIDER: &'static str = "anthropic";

    fn event(&mut self, event: SseEvent, out: &mut Vec<StreamEvent>) {
        if let Some(event) = parse_data::<Event>(Self::PROVIDER, &event.data, out) {
            self.handle(event, out);
        }
    }

    fn body(&mut self, body: Value, out: &mut Vec<StreamEvent>) {
        if body.get("type").and_then(Value::as_str) == Some("error") {
            match serde_json::from_value::<Event>(body) {
                Ok(ev) => self.handle(ev, out),
                Err(e) => out.push(StreamEvent::ParseError {
                    message: format!("anthropic: error body could not be read: {e}"),
                }),
            }
            return;
        }
        // A non-streamed message: its blocks are whole.
        match serde_json::from_value::<Message>(body) {
            Ok(Message {
                usage,
                content: Some(content),
                stop_reason,
            }) => {
                for (index, block) in (0u64..).zip(content) {
                    self.block_start(index, block, out);
                    if let Some(call) = self.calls.remove(&index) {
                        call.close(out);
                    }
                }
                if let Some(usage) = usage {
                    self.add_usage(usage);
                    out.push(StreamEvent::Usage(self.usage));
                }
                self.stop_reason = stop_reason;
                self.stop(out);
            }
            Ok(_) => out.push(StreamEvent::ParseError {
                message: "anthropic: JSON body is neither a message nor an error".to_owned(),
            }),
            Err(e) => out.push(StreamEvent::ParseError {
                message: format!("anthropic: JSON body is not a message: {e}"),
            }),
        }
    }

    fn end(&mut self, out: &mut Vec<StreamEvent>) {
        // A stream cut before `message_stop` has not finished: open calls
        // fail, and `Finished` comes only if the provider gave a reason.
        if self.stop_reason.is_some() || !self.calls.is_empty() {
            self.stop(out);
        }
    }

    fn ended(&self) -> bool {
        self.finished
    }
}

impl MessageState {
    fn handle(&mut self, ev: Event, out: &mut Vec<StreamEvent>) {
        if self.finished {
            return; // nothing is meant to follow `message_stop`
        }
        match ev.kind.as_str() {
            "message_start" => {
                if let Some(usage) = ev.message.and_then(|m| m.usage) {
                    self.add_usage(usage);
                }
            }
            "content_block_start" => {
                if let (Some(index), Some(block)) = (ev.index, ev.content_block) {
                    self.block_start(index, block, out);
                }
            }
            "content_block_delta" => {
                if let (Some(index), Some(delta)) = (ev.index, ev.delta) {
                    self.block_delta(index, delta, out);
                }
            }
            "content_block_stop" => {
                if let Some(call) = ev.index.and_then(|i| self.calls.remove(&i)) {
                    call.close(out);
                }
            }
            "message_delta" => {
                if let Some(reason) = ev.delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = ev.usage {
                    self.add_usage(usage);
                    out.push(StreamEvent::Usage(self.usage));
                }
            }
            "message_stop" => self.stop(out),
            "error" => {
                let (kind, message) = ev.error.map_or((None, None), |e| (e.kind, e.message));
                out.push(StreamEvent::ProviderError {
                    message: match (kind, message) {
                        (Some(k), Some(m)) => format!("{k}: {m}"),
                        (k, m) => m.or(k).unwrap_or_else(|| "unknown error".to_owned()),
                    },
                });
            }
            _ => {} // ping, and event types newer than this decoder
        }
    }

    fn block_start(&mut self, index: u64, block: Block, out: &mut Vec<StreamEvent>) {
        match block.kind.as_str() {
            "text" => {
                if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                    out.push(StreamEvent::TextDelta { text });
                }
            }
            "thinking" => {
                if let Some(text) = block.thinking.filter(|t| !t.is_empty()) {
                    out.push(StreamEvent::ReasoningDelta { text });
                }
            }
            "tool_use" => {
                let id = block.id.unwrap_or_else(|| format!("toolu_block_{index}"));
                let call = self
                    .calls
                    .insert(index, CallAssembler::new(id, ArgumentKind::Json));
                call.name(block.name.as_deref().unwrap_or(""), out);
                // The start carries `input: {}`; a proxy may put it all here.
                if let Some(input) = block
                    .input
                    .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
                {
                    call.arguments(&input.to_string(), out);
                }
            }
            _ => {} // redacted thinking, server tools: not ours to run
        }
    }

    fn block_delta(&mut self, index: u64, delta: Delta, out: &mut Vec<StreamEvent>) {
        match delta.kind.as_deref() {
            Some("text_delta") => {
                if let Some(text) = delta.text.filter(|t| !t.is_empty()) {
                    out.push(StreamEvent::TextDelta { text });
                }
            }
            Some("thinking_delta") => {
                if let Some(text) = delta.thinking.filter(|t| !t.is_empty()) {
                    out.push(StreamEvent::ReasoningDelta { text });
                }
            }
            Some("input_json_delta") => {
                if let (Some(call), Some(json)) = (self.calls.get_mut(&index), delta.partial_json) {
                    call.arguments(&json, out);
                }
            }
            _ => {} // signature and citation deltas
        }
    }

    fn add_usage(&mut self, u: AnthropicUsage) {
        // Each count is cumulative where it appears; one left out keeps
        // its last value.
        self.input = u.input_tokens.unwrap_or(self.input);
        self.cache_read = u.cache_read_input_tokens.unwrap_or(self.cache_read);
        self.cache_write = u.cache_creation_input_tokens.unwrap_or(self.cache_write);
        // Anthropic's `input_tokens` leaves out what was read from or
        // written to the cache; toolwire's prompt count includes both, as
        // OpenAI's does.
        self.usage.prompt_tokens = self.input + self.cache_read + self.cache_write;
        self.usage.cached_tokens = self.cache_read;
        self.usage.cache_write_tokens = self.cache_write;
        if let Some(output) = u.output_tokens {
            self.usage.completion_tokens = output;
        }
    }

    /// The message is over: open calls fail, then `Finished`.
    fn stop(&mut self, out: &mut Vec<StreamEvent>) {
        if !self.calls.is_empty() {
            let reason = match &self.stop_reason {
                Some(r) => format!("the message stopped ({r}) before the tool call was closed"),
                None => "the stream ended before the tool call was closed".to_owned(),
            };
            self.calls.fail_all(&reason, out);
        }
        if !self.finished {
            self.finished = true;
            out.push(StreamEvent::Finished {
                reason: self
                    .stop_reason
                    .as_deref()
                    .map_or(FinishReason::Unspecified, stop_reason),
            });
        }
    }
}

fn stop_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" => FinishReason::EndTurn,
        "tool_use" => FinishReason::ToolUse,
        "max_tokens" => FinishReason::MaxTokens,
        "stop_sequence" => FinishReason::StopSequence,
        other => FinishReason::Other(other.to_owned()),
    }
}
