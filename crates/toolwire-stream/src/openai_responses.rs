//! OpenAI responses API (`response.*` events).
//!
//! A function call is an output item: its name comes with
//! `response.output_item.added`, its arguments with
//! `response.function_call_arguments.delta`, and it is closed by
//! `.done` or `response.output_item.done`. Custom (free-form) tools work the
//! same way with `response.custom_tool_call_input.*`; their input is text.

use serde::Deserialize;
use serde_json::Value;

use crate::calls::{ArgumentKind, CallAssembler, OpenCalls};
use crate::event::{FinishReason, StreamEvent, Usage};
use crate::framing::{FrameHandler, error_message, framed_decoder, parse_data};
use crate::sse::SseEvent;

framed_decoder!(
    /// Decodes an OpenAI responses API stream.
    OpenAiResponsesDecoder(ResponsesState)
);

#[derive(Debug, Default)]
struct ResponsesState {
    /// Open calls keyed by output item id.
    calls: OpenCalls<String>,
    saw_call: bool,
    /// The response's last event came (nothing follows it).
    ended: bool,
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    item: Option<Item>,
    item_id: Option<String>,
    delta: Option<Value>,
    arguments: Option<String>,
    input: Option<String>,
    response: Option<Response>,
    message: Option<String>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(rename = "type")]
    kind: String,
    id: Option<String>,
    call_id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
    input: Option<String>,
    content: Option<Vec<ContentPart>>,
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Response {
    status: Option<String>,
    usage: Option<ResponseUsage>,
    incomplete_details: Option<IncompleteDetails>,
    error: Option<Value>,
    output: Option<Vec<Item>>,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ResponseUsage {
    input_tokens: u64,
    output_tokens: u64,
    input_tokens_details: Option<InputDetails>,
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct InputDetails {
    cached_tokens: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct OutputDetails {
    reasoning_tokens: u64,
}

impl From<ResponseUsage> for Usage {
    fn from(u: ResponseUsage) -> Self {
        Usage {
            prompt_tokens: u.input_tokens,
            completion_tokens: u.output_tokens,
            cached_tokens: u.input_tokens_details.map_or(0, |d| d.cached_tokens),
            cache_write_tokens: 0,
            reasoning_tokens: u.output_tokens_details.map_or(0, |d| d.reasoning_tokens),
        }
    }
}

impl FrameHandler for ResponsesState {
    const PROVIDER: &'static str = "openai-responses";

    fn event(&mut self, event: SseEvent, out: &mut Vec<StreamEvent>) {
        if let Some(event) = parse_data::<Event>(Self::PROVIDER, &event.data, out) {
            self.handle(event, out);
        }
    }

    fn body(&mut self, body: Value, out: &mut Vec<StreamEvent>) {
        if let Some(error) = body.get("error").filter(|e| !e.is_null()) {
            out.push(StreamEvent::ProviderError {
                message: error_message(error),
            });
            return;
        }
        match serde_json::from_value::<Response>(body) {
            Ok(response) => {
                for item in response.output.iter().flatten() {
                    self.whole_item(item, out);
                }
                self.response_end(response, out);
            }
            Err(e) => out.push(StreamEvent::ParseError {
                message: format!("openai-responses: JSON body is not a response: {e}"),
            }),
        }
    }

    fn end(&mut self, out: &mut Vec<StreamEvent>) {
        self.calls
            .fail_all("the stream ended before the tool call was closed", out);
    }

    fn ended(&self) -> bool {
        self.ended
    }
}

impl ResponsesState {
    fn handle(&mut self, ev: Event, out: &mut Vec<StreamEvent>) {
        let delta = ev.delta.as_ref().and_then(Value::as_str).unwrap_or("");
        match ev.kind.as_str() {
            "response.output_item.added" => {
                if let Some(item) = &ev.item {
                    self.item_added(item, out);
                }
            }
            "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
                if let Some(call) = ev.item_id.as_ref().and_then(|id| self.calls.get_mut(id)) {
                    call.arguments(delta, out);
                }
            }
            "response.function_call_arguments.done" | "response.custom_tool_call_input.done" => {
                let whole = ev.arguments.as_deref().or(ev.input.as_deref());
                if let Some(id) = &ev.item_id {
                    self.close(id, whole, out);
                }
            }
            "response.output_item.done" => {
                if let Some(item) = &ev.item
                    && let Some(id) = item.id.as_ref().or(item.call_id.as_ref())
                {
                    let whole = item.arguments.as_deref().or(item.input.as_deref());
                    self.close(id, whole, out);
                }
            }
            "response.output_text.delta" | "response.refusal.delta" if !delta.is_empty() => {
                out.push(StreamEvent::TextDelta {
                    text: delta.to_owned(),
                });
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta"
                if !delta.is_empty() =>
            {
                out.push(StreamEvent::ReasoningDelta {
                    text: delta.to_owned(),
                });
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.ended = true;
                if let Some(response) = ev.response {
                    self.response_end(response, out);
                }
            }
            "error" => out.push(StreamEvent::ProviderError {
                message: ev
                    .message
                    .or_else(|| ev.error.as_ref().map(error_message))
                    .unwrap_or_else(|| "unknown error".to_owned()),
            }),
            _ => {} // lifecycle and content-part events carry nothing new
        }
    }

    /// Opens a call if `item` is a tool call; says whether it was.
    fn item_added(&mut self, item: &Item, out: &mut Vec<StreamEvent>) -> bool {
        let kind = match item.kind.as_str() {
            "function_call" => ArgumentKind::Json,
            "custom_tool_call" => ArgumentKind::Text,
            _ => return false,
        };
        let Some(key) = item.id.clone().or_else(|| item.call_id.clone()) else {
            return false;
        };
        let call_id = item.call_id.clone().unwrap_or_else(|| key.clone());
        self.saw_call = true;
        let call = self.calls.insert(key, CallAssembler::new(call_id, kind));
        if let Some(name) = &item.name {
            call.name(name, out);
        }
        let initial = item.arguments.as_deref().or(item.input.as_deref());
        if let Some(initial) = initial {
            call.arguments(initial, out);
        }
        true
    }

    /// Closes the call of item `id`. `whole` is the final text the server
    /// sends along; it stands in for deltas that never came.
    fn close(&mut self, id: &str, whole: Option<&str>, out: &mut Vec<StreamEvent>) {
        let Some(mut call) = self.calls.remove(&id.to_owned()) else {
            return;
        };
        if let Some(whole) = whole
            && !call.has_arguments()
        {
            call.arguments(whole, out);
        }
        call.close(out);
    }

    /// A whole output item from a non-streamed response.
    fn whole_item(&mut self, item: &Item, out: &mut Vec<StreamEvent>) {
        if item.kind == "message" {
            for part in item.content.iter().flatten() {
                if matches!(part.kind.as_str(), "output_text" | "refusal")
                    && let Some(text) = part.text.clone().filter(|t| !t.is_empty())
                {
                    out.push(StreamEvent::TextDelta { text });
                }
            }
        } else if self.item_added(item, out)
            && let Some(id) = item.id.as_ref().or(item.call_id.as_ref())
        {
            self.close(id, None, out);
        }
    }

    fn response_end(&mut self, response: Response, out: &mut Vec<StreamEvent>) {
        if let Some(error) = response.error.as_ref().filter(|e| !e.is_null()) {
            out.push(StreamEvent::ProviderError {
                message: error_message(error),
            });
        }
        let reason = match response.status.as_deref() {
            Some("incomplete") => {
                match response
                    .incomplete_details
                    .and_then(|d| d.reason)
                    .as_deref()
                {
                    Some("content_filter") => FinishReason::ContentFilter,
                    _ => FinishReason::MaxTokens,
                }
            }
            Some("failed") => FinishReason::Other("failed".to_owned()),
            _ if self.saw_call => FinishReason::ToolUse,
            _ => FinishReason::EndTurn,
        };
        if reason == FinishReason::ToolUse || reason == FinishReason::EndTurn {
            self.calls.close_all(out);
        } else {
            self.calls
                .fail_all("the response ended before the tool call was finished", out);
        }
        if let Some(usage) = response.usage {
            out.push(StreamEvent::Usage(usage.into()));
        }
        out.push(StreamEvent::Finished { reason });
    }
}
