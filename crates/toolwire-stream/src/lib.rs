//! # toolwire-stream
//!
//! **Owns** incremental decoding of a model's streamed output: SSE framing
//! ([`sse`]), the provider chunk decoders ([`OpenAiChatDecoder`],
//! [`OpenAiResponsesDecoder`], [`AnthropicDecoder`]), the XML text tool-call
//! parser ([`XmlToolCallParser`]) and the incremental JSON field parser
//! ([`ArgumentFieldParser`]). Bytes in, [`StreamEvent`]s out.
//!
//! **Invariants.** No I/O, no async, no panics on any input. The work done
//! by one `feed` is proportional to the chunk it is given, never to the
//! text seen so far: only an unfinished line, tag or token is carried
//! between chunks. Every event is emitted by the `feed` call that delivers
//! the byte making it certain, so any chunking of the same input gives the
//! same events once adjacent fragments are concatenated.
//!
//! **Entry points.** [`Decoder`] (`feed` / `finish`), [`Format`] and
//! [`decoder_for`] to pick one by name, [`decode_chunked`] to replay a
//! recorded stream with byte offsets.

// Decoders are used by every provider: each public item says what it is for.
#![warn(missing_docs)]

mod anthropic;
mod calls;
mod event;
mod fields;
mod framing;
mod openai_chat;
mod openai_responses;
pub mod sse;
mod xml;

pub use anthropic::AnthropicDecoder;
pub use event::{CallId, FinishReason, StreamEvent, Usage};
pub use fields::{ArgumentFieldParser, FieldEvent};
pub use openai_chat::OpenAiChatDecoder;
pub use openai_responses::OpenAiResponsesDecoder;
pub use xml::{XmlTextDecoder, XmlToolCallParser};

use std::fmt;
use std::str::FromStr;

/// An incremental decoder: feed it chunks split anywhere, then `finish`.
pub trait Decoder {
    /// Decodes one chunk and returns the events it made certain.
    fn feed(&mut self, chunk: &[u8]) -> Vec<StreamEvent>;
    /// Ends the input: flushes held bytes, fails calls still open.
    fn finish(&mut self) -> Vec<StreamEvent>;
    /// Whether the input said it is over (OpenAI's `[DONE]`, Anthropic's
    /// `message_stop`, the Responses API's `response.completed`): every
    /// event is out, and nothing that follows would be read, so the
    /// caller need not wait for the body's end (nor call `finish`).
    fn ended(&self) -> bool {
        false
    }
}

/// The wire formats toolwire can decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI chat completions SSE (`chat.completion.chunk`).
    OpenAiChat,
    /// OpenAI responses API SSE (`response.*` events).
    OpenAiResponses,
    /// Anthropic messages SSE.
    Anthropic,
    /// Plain text holding `<tool_call>` XML.
    Xml,
}

impl Format {
    /// Every format, with the name used on the command line.
    pub const ALL: [(Format, &'static str); 4] = [
        (Format::OpenAiChat, "openai-chat"),
        (Format::OpenAiResponses, "openai-responses"),
        (Format::Anthropic, "anthropic"),
        (Format::Xml, "xml"),
    ];

    /// The command-line name of the format.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("unknown", |(_, n)| n)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A format name that is not one of [`Format::ALL`].
#[derive(Debug, thiserror::Error)]
#[error("unknown stream format `{0}` (expected openai-chat, openai-responses, anthropic or xml)")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(f, _)| *f)
            .ok_or_else(|| UnknownFormat(s.to_owned()))
    }
}

/// A fresh decoder for `format`.
pub fn decoder_for(format: Format) -> Box<dyn Decoder + Send> {
    match format {
        Format::OpenAiChat => Box::new(OpenAiChatDecoder::new()),
        Format::OpenAiResponses => Box::new(OpenAiResponsesDecoder::new()),
        Format::Anthropic => Box::new(AnthropicDecoder::new()),
        Format::Xml => Box::new(XmlTextDecoder::new()),
    }
}

/// An event and the number of input bytes consumed when it was emitted.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetEvent {
    /// Input bytes consumed when the event was emitted.
    pub offset: usize,
    /// The event.
    pub event: StreamEvent,
}

/// Feeds `input` to a decoder for `format` in chunks of `chunk_size` bytes
/// (the whole input at once when `None` or 0) and records, for each event,
/// how many bytes had been fed when it came out.
pub fn decode_chunked(format: Format, input: &[u8], chunk_size: Option<usize>) -> Vec<OffsetEvent> {
    let mut decoder = decoder_for(format);
    let size = chunk_size.filter(|n| *n > 0).unwrap_or(input.len().max(1));
    let mut out = Vec::new();
    let mut offset = 0;
    for chunk in input.chunks(size) {
        offset += chunk.len();
        out.extend(
            decoder
                .feed(chunk)
                .into_iter()
                .map(|event| OffsetEvent { offset, event }),
        );
    }
    out.extend(
        decoder
            .finish()
            .into_iter()
            .map(|event| OffsetEvent { offset, event }),
    );
    out
}
