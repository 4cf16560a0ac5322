//! What every SSE provider decoder shares: SSE framing, the sniffing of a
//! plain JSON body sent where a stream was asked for, and the conversion of
//! framing errors into `ParseError` events (`LimitExceeded` for input
//! over a limit).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::event::StreamEvent;
use crate::sse::{SseDecoder, SseError, SseEvent};

/// A JSON body larger than this is refused rather than buffered.
const MAX_JSON_BODY: usize = 64 * 1024 * 1024;

/// A provider's reading of framed input.
pub(crate) trait FrameHandler {
    /// The provider's name, for error messages.
    const PROVIDER: &'static str;
    /// One SSE event.
    fn event(&mut self, event: SseEvent, out: &mut Vec<StreamEvent>);
    /// A whole JSON body (a non-streamed response or an error object).
    fn body(&mut self, body: Value, out: &mut Vec<StreamEvent>);
    /// The input ended.
    fn end(&mut self, out: &mut Vec<StreamEvent>);
    /// The stream said it is over (see [`crate::Decoder::ended`]).
    fn ended(&self) -> bool;
}

#[derive(Debug)]
enum Mode {
    /// Only whitespace so far.
    Sniffing,
    Sse,
    /// The body began with `{`: it is buffered and parsed at the end.
    Json(Vec<u8>),
    /// The JSON body was too large; the rest is ignored.
    Refused,
}

/// Declares a public provider decoder: [`Framing`] in front of a
/// [`FrameHandler`] state, with `new`, `with_max_line` and [`Decoder`].
///
/// [`Decoder`]: crate::Decoder
macro_rules! framed_decoder {
    ($(#[$doc:meta])* $name:ident($state:ty)) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            framing: $crate::framing::Framing,
            state: $state,
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl $name {
            /// A decoder with the default SSE line limit (4 MiB).
            pub fn new() -> Self {
                Self::with_max_line($crate::sse::DEFAULT_MAX_LINE)
            }

            /// A decoder that rejects SSE lines longer than `max_line` bytes.
            pub fn with_max_line(max_line: usize) -> Self {
                $name {
                    framing: $crate::framing::Framing::with_max_line(max_line),
                    state: <$state>::default(),
                }
            }
        }

        impl $crate::Decoder for $name {
            fn feed(&mut self, chunk: &[u8]) -> Vec<$crate::StreamEvent> {
                self.framing.feed(chunk, &mut self.state)
            }

            fn finish(&mut self) -> Vec<$crate::StreamEvent> {
                self.framing.finish(&mut self.state)
            }

            fn ended(&self) -> bool {
                $crate::framing::FrameHandler::ended(&self.state)
            }
        }
    };
}
pub(crate) use framed_decoder;

/// SSE-or-JSON framing in front of a [`FrameHandler`].
#[derive(Debug)]
pub(crate) struct Framing {
    sse: SseDecoder,
    mode: Mode,
    frames: Vec<Result<SseEvent, crate::sse::SseError>>,
}

impl Framing {
    pub(crate) fn with_max_line(max_line: usize) -> Self {
        Framing {
            sse: SseDecoder::with_max_line(max_line),
            mode: Mode::Sniffing,
            frames: Vec::new(),
        }
    }

    pub(crate) fn feed<H: FrameHandler>(
        &mut self,
        mut chunk: &[u8],
        handler: &mut H,
    ) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if let Mode::Sniffing = self.mode {
            let start = chunk.iter().position(|b| !b.is_ascii_whitespace());
            let Some(start) = start else { return out };
            chunk = &chunk[start..];
            self.mode = if chunk[0] == b'{' {
                Mode::Json(Vec::new())
            } else {
                Mode::Sse
            };
        }
        match &mut self.mode {
            Mode::Sse => {
                self.sse.feed(chunk, &mut self.frames);
                self.deliver(handler, &mut out);
            }
            Mode::Json(body) => {
                if body.len() + chunk.len() > MAX_JSON_BODY {
                    self.mode = Mode::Refused;
                    out.push(StreamEvent::LimitExceeded {
                        message: format!(
                            "{}: JSON body is larger than {MAX_JSON_BODY} bytes; ignored",
                            H::PROVIDER
                        ),
                    });
                } else {
                    body.extend_from_slice(chunk);
                }
            }
            Mode::Sniffing | Mode::Refused => {}
        }
        out
    }

    pub(crate) fn finish<H: FrameHandler>(&mut self, handler: &mut H) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        match std::mem::replace(&mut self.mode, Mode::Refused) {
            Mode::Sse => {
                self.sse.finish(&mut self.frames);
                self.deliver(handler, &mut out);
            }
            Mode::Json(body) => match serde_json::from_slice::<Value>(&body) {
                Ok(value) => handler.body(value, &mut out),
                Err(e) => out.push(StreamEvent::ParseError {
                    message: format!(
                        "{}: body is neither SSE nor valid JSON ({e}): {}",
                        H::PROVIDER,
                        excerpt(&String::from_utf8_lossy(&body))
                    ),
                }),
            },
            Mode::Sniffing | Mode::Refused => {}
        }
        handler.end(&mut out);
        out
    }

    fn deliver<H: FrameHandler>(&mut self, handler: &mut H, out: &mut Vec<StreamEvent>) {
        for frame in self.frames.drain(..) {
            match frame {
                Ok(event) => handler.event(event, out),
                Err(e @ (SseError::LineTooLong { .. } | SseError::EventTooLarge { .. })) => out
                    .push(StreamEvent::LimitExceeded {
                        message: format!("{}: {e}", H::PROVIDER),
                    }),
                Err(e) => out.push(StreamEvent::ParseError {
                    message: format!("{}: {e}", H::PROVIDER),
                }),
            }
        }
    }
}

/// Parses an SSE data payload; if it cannot be, pushes a `ParseError`
/// saying why and returns `None`.
pub(crate) fn parse_data<T: DeserializeOwned>(
    provider: &str,
    data: &str,
    out: &mut Vec<StreamEvent>,
) -> Option<T> {
    match serde_json::from_str(data) {
        Ok(v) => Some(v),
        Err(e) => {
            out.push(StreamEvent::ParseError {
                message: format!(
                    "{provider}: SSE data is not a valid event ({e}): {}",
                    excerpt(data)
                ),
            });
            None
        }
    }
}

/// The start of `text`, short enough for an error message.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 120;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The human part of an OpenAI-style error object.
pub(crate) fn error_message(error: &Value) -> String {
    error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string())
}
