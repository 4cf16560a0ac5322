//! One tool call's life, shared by every decoder: name, argument
//! fragments, field events, and the verdict when the call closes.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::event::{CallId, StreamEvent};
use crate::fields::{ArgumentFieldParser, FieldEvent};

/// How a call's arguments are to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgumentKind {
    /// A JSON object, reported field by field.
    Json,
    /// Free-form text (OpenAI custom tools); delivered as a JSON string.
    Text,
}

/// Assembles one tool call from a decoder's observations.
#[derive(Debug)]
pub(crate) struct CallAssembler {
    id: CallId,
    name: Option<String>,
    server: Option<String>,
    kind: ArgumentKind,
    /// All argument text so far.
    arguments: String,
    /// Argument text received before the name (held back so that
    /// `ToolCallStarted` always comes first).
    before_name: usize,
    fields: ArgumentFieldParser,
    scratch: Vec<(usize, FieldEvent)>,
}

impl CallAssembler {
    pub(crate) fn new(id: impl Into<Arc<str>>, kind: ArgumentKind) -> Self {
        CallAssembler {
            id: id.into(),
            name: None,
            server: None,
            kind,
            arguments: String::new(),
            before_name: 0,
            fields: ArgumentFieldParser::new(),
            scratch: Vec::new(),
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn has_arguments(&self) -> bool {
        !self.arguments.is_empty()
    }

    pub(crate) fn is_named(&self) -> bool {
        self.name.is_some()
    }

    pub(crate) fn set_server(&mut self, server: String) {
        self.server = Some(server);
    }

    /// Records the name; the first non-empty name wins (some servers repeat
    /// the call with `"name": ""` on later deltas). Emits `ToolCallStarted`
    /// and any argument text that came before it.
    pub(crate) fn name(&mut self, name: &str, out: &mut Vec<StreamEvent>) {
        if self.name.is_some() || name.is_empty() {
            return;
        }
        self.name = Some(name.to_owned());
        out.push(StreamEvent::ToolCallStarted {
            call_id: self.id.clone(),
            name: name.to_owned(),
            server: self.server.clone(),
        });
        if self.before_name > 0 {
            self.before_name = 0;
            let held = std::mem::take(&mut self.arguments);
            self.report_arguments(&held, out);
            self.arguments = held;
        }
    }

    /// Appends argument text.
    pub(crate) fn arguments(&mut self, fragment: &str, out: &mut Vec<StreamEvent>) {
        if fragment.is_empty() {
            return;
        }
        self.arguments.push_str(fragment);
        if self.name.is_none() {
            self.before_name += fragment.len();
            return;
        }
        self.report_arguments(fragment, out);
    }

    /// Emits `ArgumentsDelta`, cut where field events fire so that events
    /// stay in byte order whatever the chunking.
    fn report_arguments(&mut self, fragment: &str, out: &mut Vec<StreamEvent>) {
        if self.kind == ArgumentKind::Text {
            self.push_delta(fragment, out);
            return;
        }
        self.scratch.clear();
        self.fields.feed(fragment, &mut self.scratch);
        let mut cut = 0;
        for (end, event) in self.scratch.drain(..) {
            if end > cut {
                out.push(StreamEvent::ArgumentsDelta {
                    call_id: self.id.clone(),
                    fragment: fragment[cut..end].to_owned(),
                });
                cut = end;
            }
            out.push(match event {
                FieldEvent::Delta { key, fragment } => StreamEvent::ArgumentFieldDelta {
                    call_id: self.id.clone(),
                    key,
                    fragment,
                },
                FieldEvent::Complete { key, value } => StreamEvent::ArgumentField {
                    call_id: self.id.clone(),
                    key,
                    value,
                },
            });
        }
        self.push_delta(&fragment[cut..], out);
    }

    fn push_delta(&self, fragment: &str, out: &mut Vec<StreamEvent>) {
        if !fragment.is_empty() {
            out.push(StreamEvent::ArgumentsDelta {
                call_id: self.id.clone(),
                fragment: fragment.to_owned(),
            });
        }
    }

    /// The provider closed the call: `ToolCallReady` if it has a name and
    /// its arguments are valid, else `ToolCallFailed` saying why.
    pub(crate) fn close(self, out: &mut Vec<StreamEvent>) {
        let Some(name) = self.name else {
            return fail(self.id, "the tool call was closed without a name", out);
        };
        let arguments = match self.kind {
            ArgumentKind::Text => Value::String(self.arguments),
            ArgumentKind::Json => match parse_arguments(&self.arguments) {
                Ok(v) => v,
                Err(reason) => return fail(self.id, &reason, out),
            },
        };
        out.push(StreamEvent::ToolCallReady {
            call_id: self.id,
            name,
            server: self.server,
            arguments,
        });
    }

    /// The call can never be closed properly.
    pub(crate) fn fail(self, reason: &str, out: &mut Vec<StreamEvent>) {
        fail(self.id, reason, out);
    }
}

fn fail(call_id: CallId, reason: &str, out: &mut Vec<StreamEvent>) {
    out.push(StreamEvent::ToolCallFailed {
        call_id,
        reason: reason.to_owned(),
    });
}

/// Arguments as a JSON object; empty text means no arguments (`{}`).
pub(crate) fn parse_arguments(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(format!(
            "arguments must be a JSON object, got {}",
            json_kind(&other)
        )),
        Err(e) => Err(format!("arguments are not valid JSON: {e}")),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Open calls of one message, in the order they started, looked up by the
/// provider's key (OpenAI's `index`, Anthropic's block index, a responses
/// item id). Few calls are open at once, so a vector beats a map.
#[derive(Debug, Default)]
pub(crate) struct OpenCalls<K> {
    calls: Vec<(K, CallAssembler)>,
}

impl<K: PartialEq> OpenCalls<K> {
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut CallAssembler> {
        self.calls
            .iter_mut()
            .find(|(k, _)| k == key)
            .map(|(_, c)| c)
    }

    pub(crate) fn insert(&mut self, key: K, call: CallAssembler) -> &mut CallAssembler {
        self.calls.retain(|(k, _)| k != &key);
        self.calls.push((key, call));
        let last = self.calls.len() - 1;
        &mut self.calls[last].1
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<CallAssembler> {
        let pos = self.calls.iter().position(|(k, _)| k == key)?;
        Some(self.calls.remove(pos).1)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Closes every open call, in start order.
    pub(crate) fn close_all(&mut self, out: &mut Vec<StreamEvent>) {
        for (_, call) in self.calls.drain(..) {
            call.close(out);
        }
    }

    /// Fails every open call with `reason`.
    pub(crate) fn fail_all(&mut self, reason: &str, out: &mut Vec<StreamEvent>) {
        for (_, call) in self.calls.drain(..) {
            call.fail(reason, out);
        }
    }
}
