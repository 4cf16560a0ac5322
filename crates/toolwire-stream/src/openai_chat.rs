//! OpenAI chat completions (`chat.completion.chunk`), as spoken by OpenAI,
//! vLLM, llama.cpp, Ollama, DeepSeek, Groq, Mistral and others.
//!
//! Quirks handled: a call's id and name come on its first delta only and a
//! later `"name": ""` must not erase them; `index` may be missing (Mistral:
//! the position in `tool_calls` stands in); usage may be repeated
//! (reported once) or sent in a chunk with no choices; a server may answer
//! with one plain JSON completion instead of a stream.

use serde::Deserialize;
use serde_json::Value;

use crate::calls::{ArgumentKind, CallAssembler, OpenCalls};
use crate::event::{FinishReason, StreamEvent, Usage};
use crate::framing::{FrameHandler, error_message, framed_decoder, parse_data};
use crate::sse::SseEvent;

framed_decoder!(
    /// Decodes an OpenAI chat completions stream.
    OpenAiChatDecoder(ChatState)
);

#[derive(Debug, Default)]
struct ChatState {
    calls: OpenCalls<u64>,
    finished: bool,
    done: bool,
    last_usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Chunk {
    choices: Option<Vec<Choice>>,
    usage: Option<ChatUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u64,
    /// Streamed chunks carry `delta`; a plain completion carries `message`.
    #[serde(alias = "message")]
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ChatUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    prompt_tokens_details: Option<PromptDetails>,
    /// DeepSeek's name for cached prompt tokens.
    prompt_cache_hit_tokens: Option<u64>,
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CompletionDetails {
    reasoning_tokens: Option<u64>,
}

impl From<ChatUsage> for Usage {
    fn from(u: ChatUsage) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_tokens: u
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .or(u.prompt_cache_hit_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: u
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

impl FrameHandler for ChatState {
    const PROVIDER: &'static str = "openai-chat";

    fn event(&mut self, event: SseEvent, out: &mut Vec<StreamEvent>) {
        let data = event.data.trim();
        if self.done {
            return; // nothing is meant to follow `[DONE]`
        }
        if data == "[DONE]" {
            self.calls.close_all(out);
            if !self.finished {
                self.finished = true;
                out.push(StreamEvent::Finished {
                    reason: FinishReason::Unspecified,
                });
            }
            self.done = true;
            return;
        }
        if let Some(chunk) = parse_data::<Chunk>(Self::PROVIDER, data, out) {
            self.chunk(chunk, out);
        }
    }

    fn body(&mut self, body: Value, out: &mut Vec<StreamEvent>) {
        match serde_json::from_value::<Chunk>(body) {
            Ok(chunk) => {
                self.chunk(chunk, out);
                // A whole completion is closed by definition.
                self.calls.close_all(out);
            }
            Err(e) => out.push(StreamEvent::ParseError {
                message: format!("openai-chat: JSON body is not a chat completion: {e}"),
            }),
        }
    }

    fn end(&mut self, out: &mut Vec<StreamEvent>) {
        self.calls
            .fail_all("the stream ended before the tool call was closed", out);
    }

    fn ended(&self) -> bool {
        self.done
    }
}

impl ChatState {
    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<StreamEvent>) {
        if let Some(error) = chunk.error {
            out.push(StreamEvent::ProviderError {
                message: error_message(&error),
            });
        }
        // Agents ask for one choice; others (n > 1) are not mixed in.
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index == 0 {
                self.choice(choice, out);
            }
        }
        if let Some(usage) = chunk.usage.map(Usage::from)
            && self.last_usage != Some(usage)
        {
            self.last_usage = Some(usage);
            out.push(StreamEvent::Usage(usage));
        }
    }

    fn choice(&mut self, choice: Choice, out: &mut Vec<StreamEvent>) {
        if let Some(delta) = choice.delta {
            for text in [delta.reasoning_content, delta.reasoning]
                .into_iter()
                .flatten()
            {
                if !text.is_empty() {
                    out.push(StreamEvent::ReasoningDelta { text });
                }
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                out.push(StreamEvent::TextDelta { text });
            }
            for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                self.tool_call_delta(position as u64, call, out);
            }
        }
        if let Some(reason) = choice.finish_reason {
            let reason = finish_reason(&reason);
            if reason == FinishReason::MaxTokens {
                self.calls.fail_all(
                    "the model hit its output token limit before the tool call was finished",
                    out,
                );
            } else {
                self.calls.close_all(out);
            }
            if !std::mem::replace(&mut self.finished, true) {
                out.push(StreamEvent::Finished { reason });
            }
        }
    }

    fn tool_call_delta(&mut self, position: u64, delta: ToolCallDelta, out: &mut Vec<StreamEvent>) {
        let index = delta.index.unwrap_or(position);
        let id = delta.id.filter(|id| !id.is_empty());
        let (name, arguments) = delta
            .function
            .map_or((None, None), |f| (f.name, f.arguments));
        // Some servers reuse index 0 for every parallel call; a new id on a
        // named call means the previous call is over.
        let replaced = match (self.calls.get_mut(&index), &id) {
            (Some(open), Some(id)) => open.is_named() && open.id() != id,
            _ => false,
        };
        if replaced && let Some(previous) = self.calls.remove(&index) {
            previous.close(out);
        }
        let call = match self.calls.get_mut(&index) {
            Some(call) => call,
            None => {
                let id = id.unwrap_or_else(|| format!("call_{index}"));
                self.calls
                    .insert(index, CallAssembler::new(id, ArgumentKind::Json))
            }
        };
        if let Some(name) = name {
            call.name(&name, out);
        }
        if let Some(arguments) = arguments {
            call.arguments(&arguments, out);
        }
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::EndTurn,
        "tool_calls" | "function_call" => FinishReason::ToolUse,
        "length" => FinishReason::MaxTokens,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}
