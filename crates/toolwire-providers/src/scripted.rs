//! The scripted provider: plays a script (JSON or YAML) so that tests and
//! demos are deterministic. Each step is rendered as a real OpenAI chat
//! completions SSE stream (or XML text, with the XML tool format) and fed
//! through the real decoder in `chunk_size` pieces, so a script exercises
//! the same early-detection path as a live model.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use toolwire_core::Role;
use toolwire_stream::{Decoder, OpenAiChatDecoder};

use crate::{EventStream, ModelRequest, Provider, ProviderError};

/// A script: the steps of each turn. `steps` alone is one turn that every
/// user message replays; `turns` gives each turn its own steps (the last
/// one repeats).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub turns: Vec<Turn>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub steps: Vec<Step>,
}

/// One model call.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// Bytes of the rendered stream per chunk (default 32).
    #[serde(default)]
    pub chunk_size: Option<usize>,
    /// Pause between chunks.
    #[serde(default)]
    pub delay_ms: u64,
    /// Fail the call with this message instead.
    #[serde(default)]
    pub error: Option<String>,
    /// Token counts to report (estimated from the text when absent).
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
}

fn empty_object() -> Value {
    json!({})
}

/// The script the README's run command plays when no model is configured.
pub const DEMO_SCRIPT: &str = include_str!("demo_script.yaml");

impl Script {
    /// Reads a script from JSON or YAML text.
    pub fn parse(text: &str) -> Result<Script, ProviderError> {
        let script: Script = if text.trim_start().starts_with('{') {
            serde_json::from_str(text)
                .map_err(|e| ProviderError::Script(format!("invalid JSON script: {e}")))?
        } else {
            serde_yaml_ng::from_str(text)
                .map_err(|e| ProviderError::Script(format!("invalid YAML script: {e}")))?
        };
        if script.steps.is_empty() && script.turns.iter().all(|t| t.steps.is_empty()) {
            return Err(ProviderError::Script("the script has no steps".into()));
        }
        Ok(script)
    }

    /// The step for the `iteration`-th call (1-based) of turn `turn`
    /// (0-based). Past the last step the turn ends with a short answer.
    fn step(&self, turn: usize, iteration: u32) -> Step {
        let steps = match self.turns.len() {
            0 => &self.steps,
            n => &self.turns[turn.min(n - 1)].steps,
        };
        let index = iteration.saturating_sub(1) as usize;
        steps.get(index).cloned().unwrap_or_else(|| Step {
            text: "(the script has no more steps)".into(),
            ..Step::default()
        })
    }
}

/// Plays a [`Script`].
#[derive(Debug, Clone)]
pub struct ScriptedProvider {
    script: Script,
    model: String,
    xml: bool,
}

impl ScriptedProvider {
    /// `xml`: write tool calls as XML text (the XML tool format) rather
    /// than native tool-call deltas.
    pub fn new(script: Script, xml: bool) -> Self {
        let model = script.model.clone().unwrap_or_else(|| "scripted".into());
        ScriptedProvider { script, model, xml }
    }
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let step = self.script.step(request.turn, request.iteration);
        if let Some(error) = step.error {
            return Err(ProviderError::Reported(error));
        }
        let prompt_chars: usize = request
            .messages
            .iter()
            .filter(|m| m.role != Role::System)
            .map(|m| m.text().len())
            .sum::<usize>()
            + request.system.len();
        let bytes = render_sse(&step, self.xml, prompt_chars);
        let size = step.chunk_size.unwrap_or(32).max(1);
        let delay = Duration::from_millis(step.delay_ms);
        let chunks: Vec<Vec<u8>> = bytes.chunks(size).map(<[u8]>::to_vec).collect();
        let stream = futures::stream::unfold(
            (chunks.into_iter(), OpenAiChatDecoder::new(), false),
            move |(mut chunks, mut decoder, done)| async move {
                if done {
                    return None;
                }
                match chunks.next() {
                    Some(chunk) => {
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        let events = decoder.feed(&chunk);
                        Some((events, (chunks, decoder, false)))
                    }
                    None => {
                        let events = decoder.finish();
                        Some((events, (chunks, decoder, true)))
                    }
                }
            },
        )
        .flat_map(|events| futures::stream::iter(events.into_iter().map(Ok)));
        Ok(stream.boxed())
    }
}

/// The step as an OpenAI chat completions SSE body.
fn render_sse(step: &Step, xml: bool, prompt_chars: usize) -> Vec<u8> {
    let mut out = String::new();
    let mut chunk = |delta: Value, finish: Option<&str>| {
        let body = json!({
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        out.push_str(&format!("data: {body}\n\n"));
    };
    chunk(json!({"role": "assistant"}), None);
    if let Some(reasoning) = &step.reasoning {
        for piece in pieces(reasoning, 12) {
            chunk(json!({"reasoning_content": piece}), None);
        }
    }
    let mut text = step.text.clone();
    if xml {
        for call in &step.tool_calls {
            text.push_str(&format!(
                "\n<tool_call>\n  <tool_name>{}</tool_name>\n  <arguments><![CDATA[{}]]></arguments>\n</tool_call>",
                call.name, call.arguments
            ));
        }
    }
    for piece in pieces(&text, 12) {
        chunk(json!({"content": piece}), None);
    }
    if !xml {
        for (index, call) in step.tool_calls.iter().enumerate() {
            let id = call
                .id
                .clone()
                .unwrap_or_else(|| format!("call_script_{index}"));
            chunk(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}]}),
                None,
            );
            for piece in pieces(&call.arguments.to_string(), 10) {
                chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                    None,
                );
            }
        }
    }
    let finish = if !xml && !step.tool_calls.is_empty() {
        "tool_calls"
    } else {
        "stop"
    };
    chunk(json!({}), Some(finish));
    let usage = step.usage.unwrap_or(ScriptedUsage {
        prompt_tokens: (prompt_chars / 4).max(1) as u64,
        completion_tokens: (text.len() / 4).max(1) as u64,
        cached_tokens: 0,
    });
    out.push_str(&format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"object": "chat.completion.chunk", "choices": [], "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        }})
    ));
    out.into_bytes()
}

/// `text` in pieces of about `n` characters (never inside a character).
fn pieces(text: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut count = 0;
    for (i, _) in text.char_indices() {
        if count == n {
            out.push(&text[start..i]);
            start = i;
            count = 0;
        }
        count += 1;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwire_stream::StreamEvent;

    #[test]
    fn rendered_steps_decode_to_the_scripted_calls() {
        let step = Step {
            text: "Looking — café.".into(),
            tool_calls: vec![ScriptedCall {
                name: "read_file".into(),
                id: Some("c1".into()),
                arguments: json!({"path": "README.md"}),
            }],
            ..Step::default()
        };
        for xml in [false, true] {
            let bytes = render_sse(&step, xml, 40);
            let mut d = OpenAiChatDecoder::new();
            let mut events = d.feed(&bytes);
            events.extend(d.finish());
            let text: String = events.iter().filter_map(StreamEvent::text).collect();
            assert!(text.starts_with("Looking — café."));
            if !xml {
                assert!(events.iter().any(|e| matches!(e,
                    StreamEvent::ToolCallReady { name, arguments, .. }
                        if name == "read_file" && arguments["path"] == "README.md")));
            } else {
                assert!(text.contains("<tool_name>read_file</tool_name>"));
            }
        }
    }

    #[test]
    fn demo_script_parses() {
        let script = Script::parse(DEMO_SCRIPT).unwrap();
        assert!(!script.steps.is_empty() || !script.turns.is_empty());
        assert!(Script::parse("steps: []").is_err());
        assert!(Script::parse("{\"stepz\": []}").is_err());
    }
}
