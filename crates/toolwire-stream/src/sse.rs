//! Server-sent events framing, after the WHATWG event-stream grammar.
//!
//! Only the unfinished line is carried between chunks, so a chunk costs
//! time proportional to its length. Lines end at LF, CR or CRLF, and a CRLF
//! split across two chunks is one line end.

use memchr::memchr2;

/// Lines longer than this are rejected unless configured otherwise.
pub const DEFAULT_MAX_LINE: usize = 4 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if the event had one.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last event id seen so far, if any.
    pub id: Option<String>,
}

/// Input that is not a valid event stream. Decoding goes on after it: the
/// offending line is dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line that is not UTF-8.
    #[error("SSE line {line} is not valid UTF-8 (first bad byte at column {column})")]
    InvalidUtf8 {
        /// The line, counted from 1.
        line: u64,
        /// The byte column of the first bad byte.
        column: usize,
    },
    /// A line longer than the decoder takes.
    #[error("SSE line {line} is longer than the {limit}-byte limit; line dropped")]
    LineTooLong {
        /// The line, counted from 1.
        line: u64,
        /// The limit in bytes.
        limit: usize,
    },
    /// An event whose data lines add up to more than the decoder takes.
    #[error("SSE event ending at line {line} has more than {limit} bytes of data; event dropped")]
    EventTooLarge {
        /// The line the event ended at, counted from 1.
        line: u64,
        /// The limit in bytes.
        limit: usize,
    },
}

/// Incremental SSE decoder.
#[derive(Debug)]
pub struct SseDecoder {
    max_line: usize,
    /// Bytes of the line not yet ended.
    partial: Vec<u8>,
    /// The previous chunk ended with CR: a leading LF belongs to it.
    after_cr: bool,
    /// The current line went over the limit; skip to its end.
    discarding: bool,
    /// 1-based number of the line being read.
    line_no: u64,
    at_stream_start: bool,
    event_type: Option<String>,
    data: String,
    has_data: bool,
    /// The event's data went over the limit; it is dropped at dispatch.
    oversized: bool,
    last_id: Option<String>,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl SseDecoder {
    /// A decoder with the default line limit.
    pub fn new() -> Self {
        Self::with_max_line(DEFAULT_MAX_LINE)
    }

    /// A decoder that rejects lines longer than `max_line` bytes.
    pub fn with_max_line(max_line: usize) -> Self {
        SseDecoder {
            max_line,
            partial: Vec::new(),
            after_cr: false,
            discarding: false,
            line_no: 1,
            at_stream_start: true,
            event_type: None,
            data: String::new(),
            has_data: false,
            oversized: false,
            last_id: None,
        }
    }

    /// Decodes a chunk, pushing every event it completes onto `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<Result<SseEvent, SseError>>) {
        if chunk.is_empty() {
            return; // an empty chunk must not end a pending CR's line
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while let Some(pos) = memchr2(b'\n', b'\r', chunk) {
            let (line, rest) = chunk.split_at(pos);
            let line_end = rest[0];
            let mut rest = &rest[1..];
            if line_end == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            self.end_line(line, out);
            chunk = rest;
        }
        self.carry(chunk, out);
    }

    /// Ends the stream. A last line or event left without its terminator
    /// is still delivered: servers often omit the final blank line, and
    /// dropping what they sent would lose data.
    pub fn finish(&mut self, out: &mut Vec<Result<SseEvent, SseError>>) {
        if !self.partial.is_empty() || self.discarding {
            self.end_line(&[], out);
        }
        self.dispatch(out);
    }

    fn carry(&mut self, bytes: &[u8], out: &mut Vec<Result<SseEvent, SseError>>) {
        if self.discarding || bytes.is_empty() {
            return;
        }
        if self.partial.len() + bytes.len() > self.max_line {
            self.partial.clear();
            self.discarding = true;
            out.push(Err(SseError::LineTooLong {
                line: self.line_no,
                limit: self.max_line,
            }));
            return;
        }
        self.partial.extend_from_slice(bytes);
    }

    fn end_line(&mut self, tail: &[u8], out: &mut Vec<Result<SseEvent, SseError>>) {
        let line_no = self.line_no;
        self.line_no += 1;
        if std::mem::take(&mut self.discarding) {
            return;
        }
        if self.partial.len() + tail.len() > self.max_line {
            self.partial.clear();
            out.push(Err(SseError::LineTooLong {
                line: line_no,
                limit: self.max_line,
            }));
            return;
        }
        let joined;
        let bytes: &[u8] = if self.partial.is_empty() {
            tail
        } else {
            self.partial.extend_from_slice(tail);
            joined = std::mem::take(&mut self.partial);
            &joined
        };
        match std::str::from_utf8(bytes) {
            Ok(line) => {
                let line = if std::mem::take(&mut self.at_stream_start) {
                    line.strip_prefix('\u{feff}').unwrap_or(line)
                } else {
                    line
                };
                self.process_line(line, out);
            }
            Err(e) => out.push(Err(SseError::InvalidUtf8 {
                line: line_no,
                column: e.valid_up_to() + 1,
            })),
        }
    }

    fn process_line(&mut self, line: &str, out: &mut Vec<Result<SseEvent, SseError>>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return; // comment, e.g. a keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event_type = Some(value.to_owned()),
            "data" => {
                if self.oversized {
                    return;
                }
                let separator = usize::from(self.has_data);
                if self.data.len() + separator + value.len() > self.max_line {
                    // The line limit also bounds an event made of many lines.
                    self.oversized = true;
                    self.has_data = true;
                    self.data.clear();
                    return;
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            _ => {} // `retry` and unknown fields are ignored, as the spec says
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Result<SseEvent, SseError>>) {
        let event = self.event_type.take();
        if !std::mem::take(&mut self.has_data) {
            return;
        }
        if std::mem::take(&mut self.oversized) {
            out.push(Err(SseError::EventTooLarge {
                line: self.line_no.saturating_sub(1),
                limit: self.max_line,
            }));
            return;
        }
        out.push(Ok(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]]) -> Vec<Result<SseEvent, SseError>> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for c in chunks {
            d.feed(c, &mut out);
        }
        d.finish(&mut out);
        out
    }

    fn ev(event: Option<&str>, data: &str, id: Option<&str>) -> Result<SseEvent, SseError> {
        Ok(SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
            id: id.map(str::to_owned),
        })
    }

    #[test]
    fn fields_comments_and_multiline_data() {
        let input = b": hello\nevent: a\ndata: one\ndata:two\nid: 7\n\ndata: x\n\n";
        assert_eq!(
            decode(&[input]),
            vec![
                ev(Some("a"), "one\ntwo", Some("7")),
                ev(None, "x", Some("7"))
            ]
        );
    }

    #[test]
    fn crlf_split_between_chunks_is_one_line_end() {
        let whole = decode(&[b"data: a\r\n\r\ndata: b\r\n\r\n"]);
        let split = decode(&[b"data: a\r", b"\n\r", b"\ndata: b\r", b"\n", b"\r\n"]);
        assert_eq!(whole, split);
        assert_eq!(whole, vec![ev(None, "a", None), ev(None, "b", None)]);
    }

    #[test]
    fn lone_cr_ends_lines() {
        assert_eq!(decode(&[b"data: a\r\rdata: b\r\r"]).len(), 2);
    }

    #[test]
    fn utf8_split_inside_a_sequence() {
        let input = "data: café 日本\n\n".as_bytes();
        let chunks: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(decode(&chunks), vec![ev(None, "café 日本", None)]);
    }

    #[test]
    fn invalid_utf8_is_an_error_and_decoding_goes_on() {
        let out = decode(&[b"data: \xff\xfe\n\ndata: ok\n\n"]);
        assert_eq!(
            out,
            vec![
                Err(SseError::InvalidUtf8 { line: 1, column: 7 }),
                ev(None, "ok", None)
            ]
        );
    }

    #[test]
    fn overlong_line_is_an_error_and_dropped() {
        let mut d = SseDecoder::with_max_line(16);
        let mut out = Vec::new();
        d.feed(b"data: 0123456789", &mut out);
        d.feed(b"abcdef\n\ndata: ok\n\n", &mut out);
        d.finish(&mut out);
        assert_eq!(
            out,
            vec![
                Err(SseError::LineTooLong { line: 1, limit: 16 }),
                ev(None, "ok", None)
            ]
        );
    }

    #[test]
    fn many_data_lines_are_bounded_like_one_line() {
        let mut d = SseDecoder::with_max_line(16);
        let mut out = Vec::new();
        d.feed(
            b"data: 0123456789\ndata: 0123456789\n\ndata: ok\n\n",
            &mut out,
        );
        assert_eq!(
            out,
            vec![
                Err(SseError::EventTooLarge { line: 3, limit: 16 }),
                ev(None, "ok", None)
            ]
        );
    }

    #[test]
    fn empty_chunk_between_cr_and_lf_changes_nothing() {
        let split = decode(&[b"data: a\r", b"", b"\ndata: b\r\n\r\n"]);
        assert_eq!(split, vec![ev(None, "a\nb", None)]);
    }

    #[test]
    fn unterminated_last_event_is_delivered_at_finish() {
        assert_eq!(decode(&[b"data: [DONE]"]), vec![ev(None, "[DONE]", None)]);
    }

    #[test]
    fn bom_is_skipped() {
        assert_eq!(
            decode(&["\u{feff}data: a\n\n".as_bytes()]),
            vec![ev(None, "a", None)]
        );
    }
}
