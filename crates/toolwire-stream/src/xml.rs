//! Tool calls written as XML in plain text, for models without native tool
//! calling:
//!
//! ```text
//! <tool_call>
//!   <server_name>filesystem</server_name>
//!   <tool_name>apply_diff</tool_name>
//!   <arguments><![CDATA[{"path": "src/lib.rs"}]]></arguments>
//! </tool_call>
//! ```
//!
//! Prose outside calls streams out as text. `<tool_call>` inside a markdown
//! code fence or inline code is text. Prose is scanned with `memchr` for
//! the few bytes that matter (`<`, and the backtick and tilde that open
//! code); only a partial tag, entity or `]]>` is held between chunks.

use memchr::{memchr, memchr2, memchr3, memrchr};

use crate::Decoder;
use crate::calls::{ArgumentKind, CallAssembler};
use crate::event::{CallId, StreamEvent};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const CDATA_OPEN: &str = "<![CDATA[";
const ARGS_CLOSE: &str = "</arguments>";
/// Longest tag accepted inside a call.
const MAX_TAG: usize = 64;
/// Longest tool or server name accepted.
const MAX_NAME: usize = 256;
/// Longest entity reference (`&#x10FFFF;`).
const MAX_ENTITY: usize = 10;

/// How a held `<…` compares with the tags expected in its place.
enum TagMatch {
    /// The last byte completed a tag (already acted on).
    Complete,
    /// The last byte broke the match; it must be read again.
    Broken,
    /// Still a prefix of some tag.
    Prefix,
}

/// Where the parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Prose, outside any call.
    Text,
    /// Inside `<tool_call>`, between elements. `seen_element` is false until
    /// the first child tag: text before it means this was prose after all.
    Between { seen_element: bool },
    /// Text of `<server_name>` or `<tool_name>`.
    Name(NameKind),
    /// `<arguments>` text outside CDATA: entities are decoded.
    ArgsText,
    /// Inside `<![CDATA[ … ]]>`: taken verbatim.
    CData,
    /// After a failed call: skipped up to `</tool_call>`.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameKind {
    Server,
    Tool,
}

impl NameKind {
    fn close_tag(self) -> &'static str {
        match self {
            NameKind::Server => "</server_name>",
            NameKind::Tool => "</tool_name>",
        }
    }
}

/// Markdown code spans, tracked so that their `<tool_call>` stays text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    Prose,
    /// Inside inline code opened by this many backticks.
    Inline(usize),
    /// On the line of a backtick fence opener: a fence if the line ends
    /// without another backtick (an info string may not hold one), else
    /// inline code, as in "```ls```".
    FenceInfo(usize),
    /// Inside a fenced block opened by this many of this byte.
    Fence(u8, usize),
    /// After a closing-fence run: it closes only if the rest of its line
    /// is blank ("``` x" is content).
    FenceCloseTail(u8, usize),
}

#[derive(Debug)]
struct Markdown {
    code: Code,
    /// `Some(n)`: the current line so far is `n` (≤ 3) spaces, so a fence
    /// may start here.
    indent: Option<usize>,
    /// A run of backticks or tildes not yet ended: byte, length, and
    /// whether it began a line.
    run: Option<(u8, usize, bool)>,
}

impl Markdown {
    fn new() -> Self {
        Markdown {
            code: Code::Prose,
            indent: Some(0),
            run: None,
        }
    }

    /// Accounts for plain text (no run bytes) passed over.
    fn pass(&mut self, text: &[u8]) {
        let (tail, base) = match memrchr(b'\n', text) {
            Some(nl) => (&text[nl + 1..], Some(0)),
            None => (text, self.indent),
        };
        self.indent = base.and_then(|n| {
            let n = n + tail.len();
            (n <= 3 && tail.iter().all(|&b| b == b' ')).then_some(n)
        });
    }

    /// A run of `count` × `byte` ended.
    fn end_run(&mut self, byte: u8, count: usize, line_start: bool) {
        self.code = match self.code {
            Code::Prose if line_start && count >= 3 && byte == b'`' => Code::FenceInfo(count),
            Code::Prose if line_start && count >= 3 => Code::Fence(byte, count),
            Code::Prose if byte == b'`' => Code::Inline(count),
            Code::Inline(n) if byte == b'`' && count == n => Code::Prose,
            Code::FenceInfo(n) if byte == b'`' => {
                if count == n {
                    Code::Prose
                } else {
                    Code::Inline(n)
                }
            }
            Code::Fence(b, n) if byte == b && line_start && count >= n => {
                Code::FenceCloseTail(b, n)
            }
            same => same,
        };
        self.indent = None;
    }
}

/// Parses tool calls out of streamed text.
#[derive(Debug)]
pub struct XmlToolCallParser {
    mode: Mode,
    md: Markdown,
    /// A partial tag, entity or `]]>` carried to the next chunk.
    held: String,
    /// Prose not yet emitted.
    text: String,
    call: Option<CallAssembler>,
    name: String,
    /// Decoded argument text not yet given to the call.
    args: String,
    /// `<tool_call>` and the whitespace after it, given back as text if
    /// what follows shows it was prose.
    raw_open: String,
    calls_opened: u64,
}

impl Default for XmlToolCallParser {
    fn default() -> Self {
        Self::new()
    }
}

impl XmlToolCallParser {
    /// A parser at the start of the text, outside any tag.
    pub fn new() -> Self {
        XmlToolCallParser {
            mode: Mode::Text,
            md: Markdown::new(),
            held: String::new(),
            text: String::new(),
            call: None,
            name: String::new(),
            args: String::new(),
            raw_open: String::new(),
            calls_opened: 0,
        }
    }

    /// Parses the next piece of text.
    pub fn feed(&mut self, text: &str) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.feed_into(text, &mut out);
        out
    }

    /// Ends the text: held bytes become prose, an open call fails.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        out
    }

    pub(crate) fn feed_into(&mut self, s: &str, out: &mut Vec<StreamEvent>) {
        let mut i = 0;
        while i < s.len() {
            i = if !self.held.is_empty() {
                self.token(s, i, out)
            } else {
                match self.mode {
                    Mode::Text => self.prose(s, i, out),
                    Mode::Between { seen_element } => self.between(s, i, seen_element, out),
                    Mode::Name(_) => self.name_text(s, i, out),
                    Mode::ArgsText => self.args_text(s, i),
                    Mode::CData => self.cdata(s, i),
                    Mode::Skip => match memchr(b'<', &s.as_bytes()[i..]) {
                        Some(p) => self.start_token(i + p),
                        None => s.len(),
                    },
                }
            };
        }
        self.flush_args(out);
        self.flush_text(out);
    }

    pub(crate) fn finish_into(&mut self, out: &mut Vec<StreamEvent>) {
        let held = std::mem::take(&mut self.held);
        match self.mode {
            Mode::Text => self.text.push_str(&held),
            Mode::Skip => {}
            _ => {
                if self.mode == Mode::ArgsText && held.starts_with('&') {
                    self.args.push_str(&held);
                }
                self.malformed(
                    "the text ended inside <tool_call> (no </tool_call>)",
                    &held,
                    out,
                );
            }
        }
        self.mode = Mode::Text;
        self.flush_args(out);
        self.flush_text(out);
    }

    fn flush_text(&mut self, out: &mut Vec<StreamEvent>) {
        if !self.text.is_empty() {
            out.push(StreamEvent::TextDelta {
                text: std::mem::take(&mut self.text),
            });
        }
    }

    fn flush_args(&mut self, out: &mut Vec<StreamEvent>) {
        if self.args.is_empty() {
            return;
        }
        if let Some(call) = &mut self.call {
            call.arguments(&self.args, out);
        }
        self.args.clear();
    }

    /// Holds the `<` at `p` as the start of a tag; returns where to go on.
    fn start_token(&mut self, p: usize) -> usize {
        self.held.push('<');
        p + 1
    }

    // ---- prose -------------------------------------------------------

    fn prose(&mut self, s: &str, mut i: usize, out: &mut Vec<StreamEvent>) -> usize {
        let b = s.as_bytes();
        if let Some((byte, count, line_start)) = self.md.run {
            let n = b[i..].iter().take_while(|&&c| c == byte).count();
            self.text.push_str(&s[i..i + n]);
            i += n;
            if i == b.len() {
                self.md.run = Some((byte, count + n, line_start));
                return i;
            }
            self.md.run = None;
            self.md.end_run(byte, count + n, line_start);
        }
        if let Code::FenceCloseTail(byte, n) = self.md.code {
            return self.fence_close_tail(s, i, byte, n);
        }
        let rest = &b[i..];
        let found = match self.md.code {
            Code::Prose => memchr3(b'<', b'`', b'~', rest),
            Code::Inline(_) | Code::FenceInfo(_) => memchr2(b'`', b'\n', rest),
            Code::Fence(byte, _) | Code::FenceCloseTail(byte, _) => memchr(byte, rest),
        };
        let Some(off) = found else {
            self.text.push_str(&s[i..]);
            self.md.pass(rest);
            return b.len();
        };
        let p = i + off;
        self.text.push_str(&s[i..p]);
        self.md.pass(&b[i..p]);
        match b[p] {
            b'<' => self.tag_in_prose(s, p, out),
            b'\n' => {
                // Inline code does not run past its line: an unmatched
                // backtick would otherwise hide every later call.
                self.text.push('\n');
                self.md.code = match self.md.code {
                    Code::FenceInfo(n) => Code::Fence(b'`', n),
                    _ => Code::Prose,
                };
                self.md.indent = Some(0);
                p + 1
            }
            byte => {
                self.md.run = Some((byte, 0, self.md.indent.is_some()));
                p
            }
        }
    }

    /// Reads what follows a closing-fence run: blanks then a line end close
    /// the fence; anything else keeps it open.
    fn fence_close_tail(&mut self, s: &str, i: usize, byte: u8, n: usize) -> usize {
        let b = s.as_bytes();
        let blanks = b[i..]
            .iter()
            .take_while(|c| matches!(c, b' ' | b'\t' | b'\r'))
            .count();
        let j = i + blanks;
        self.text.push_str(&s[i..j]);
        match b.get(j) {
            None => j,
            Some(b'\n') => {
                self.text.push('\n');
                self.md.code = Code::Prose;
                self.md.indent = Some(0);
                j + 1
            }
            Some(_) => {
                self.md.code = Code::Fence(byte, n);
                self.md.indent = None;
                j
            }
        }
    }

    /// `s[p]` is `<` in prose.
    fn tag_in_prose(&mut self, s: &str, p: usize, out: &mut Vec<StreamEvent>) -> usize {
        let avail = &s[p..];
        let n = avail.len().min(OPEN.len());
        if avail.as_bytes()[..n] != OPEN.as_bytes()[..n] {
            self.text.push('<');
            self.md.indent = None;
            return p + 1;
        }
        if n < OPEN.len() {
            self.held.push_str(avail);
            return s.len();
        }
        self.open_call(out);
        p + OPEN.len()
    }

    fn open_call(&mut self, out: &mut Vec<StreamEvent>) {
        self.flush_text(out);
        self.calls_opened += 1;
        let id: CallId = format!("xml_call_{}", self.calls_opened).into();
        out.push(StreamEvent::ToolCallOpened {
            call_id: id.clone(),
        });
        self.call = Some(CallAssembler::new(id, ArgumentKind::Json));
        self.mode = Mode::Between {
            seen_element: false,
        };
        self.raw_open.clear();
        self.raw_open.push_str(OPEN);
        self.md.indent = None;
    }

    // ---- inside a call -----------------------------------------------

    fn between(&mut self, s: &str, i: usize, seen: bool, out: &mut Vec<StreamEvent>) -> usize {
        let b = s.as_bytes();
        let ws = b[i..]
            .iter()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
        let j = i + ws;
        if !seen {
            self.raw_open.push_str(&s[i..j]);
        }
        if j == b.len() {
            return j;
        }
        if b[j] == b'<' {
            return self.start_token(j);
        }
        let reason = if seen {
            format!("unexpected text {} inside <tool_call>", quote_char(&s[j..]))
        } else {
            "`<tool_call>` was followed by text, not a tool call".to_owned()
        };
        // The offending byte is read again, as prose if it is.
        self.malformed(&reason, "", out);
        j
    }

    /// The open call is malformed. Before its first element it was prose
    /// all along (`<tool_call>` named in a sentence): its bytes and `tail`
    /// come back as text. Later, the rest of the call is skipped.
    fn malformed(&mut self, reason: &str, tail: &str, out: &mut Vec<StreamEvent>) {
        let prose = self.mode
            == Mode::Between {
                seen_element: false,
            };
        self.fail_call(reason, out);
        if prose {
            let mut raw = std::mem::take(&mut self.raw_open);
            raw.push_str(tail);
            self.md.pass(raw.as_bytes());
            self.text.push_str(&raw);
            self.mode = Mode::Text;
        } else {
            self.mode = Mode::Skip;
        }
    }

    fn name_text(&mut self, s: &str, i: usize, out: &mut Vec<StreamEvent>) -> usize {
        let rest = &s.as_bytes()[i..];
        let end = memchr(b'<', rest).map_or(s.len(), |p| i + p);
        self.name.push_str(&s[i..end]);
        if self.name.len() > MAX_NAME {
            self.fail_call(&format!("tool name longer than {MAX_NAME} bytes"), out);
            self.mode = Mode::Skip;
            return end;
        }
        if end < s.len() {
            return self.start_token(end);
        }
        end
    }

    fn args_text(&mut self, s: &str, i: usize) -> usize {
        let rest = &s.as_bytes()[i..];
        match memchr2(b'<', b'&', rest) {
            Some(p) => {
                self.args.push_str(&s[i..i + p]);
                self.held.push(rest[p] as char);
                i + p + 1
            }
            None => {
                self.args.push_str(&s[i..]);
                s.len()
            }
        }
    }

    fn cdata(&mut self, s: &str, i: usize) -> usize {
        let rest = &s.as_bytes()[i..];
        match memchr(b']', rest) {
            Some(p) => {
                self.args.push_str(&s[i..i + p]);
                self.held.push(']');
                i + p + 1
            }
            None => {
                self.args.push_str(&s[i..]);
                s.len()
            }
        }
    }

    /// Continues the held token with the bytes at `s[i..]`, one at a time
    /// (tokens are short); returns where reading should go on.
    fn token(&mut self, s: &str, mut i: usize, out: &mut Vec<StreamEvent>) -> usize {
        let b = s.as_bytes();
        while i < b.len() {
            let c = b[i];
            let first = self.held.as_bytes()[0];
            match (self.mode, first) {
                (Mode::Text, _) => return self.held_open_tag(s, i, out),
                (Mode::ArgsText, b'&') => {
                    if c == b';' {
                        let entity = std::mem::take(&mut self.held);
                        match decode_entity(&entity[1..]) {
                            Some(ch) => self.args.push(ch),
                            None => {
                                self.args.push_str(&entity);
                                self.args.push(';');
                            }
                        }
                        return i + 1;
                    }
                    if !(c.is_ascii_alphanumeric() || c == b'#') || self.held.len() > MAX_ENTITY {
                        // Not an entity: a literal `&`, as models write.
                        let literal = std::mem::take(&mut self.held);
                        self.args.push_str(&literal);
                        return i;
                    }
                    self.held.push(c as char);
                }
                (Mode::CData, _) => {
                    match (self.held.len(), c) {
                        (1, b']') => self.held.push(']'),
                        (2, b'>') => {
                            self.held.clear();
                            self.mode = Mode::ArgsText;
                            return i + 1;
                        }
                        // `]]]`: the first `]` is content.
                        (2, b']') => self.args.push(']'),
                        _ => {
                            let literal = std::mem::take(&mut self.held);
                            self.args.push_str(&literal);
                            return i;
                        }
                    }
                }
                (Mode::ArgsText | Mode::Skip, _) => {
                    self.held.push(c as char);
                    match self.known_tag_prefix(out) {
                        TagMatch::Complete => return i + 1,
                        TagMatch::Broken => return i,
                        TagMatch::Prefix => {}
                    }
                }
                (Mode::Between { .. } | Mode::Name(_), _) => {
                    // Tags may hold any character; `i` stays on boundaries.
                    let Some(ch) = s.get(i..).and_then(|rest| rest.chars().next()) else {
                        return b.len();
                    };
                    self.held.push(ch);
                    i += ch.len_utf8();
                    if c == b'>' {
                        let tag = std::mem::take(&mut self.held);
                        self.element_tag(&tag, out);
                        return i;
                    }
                    if self.held.len() > MAX_TAG {
                        let tag = std::mem::take(&mut self.held);
                        let reason =
                            format!("malformed tag {} inside <tool_call>", quote_str(&tag));
                        self.malformed(&reason, &tag, out);
                        return i;
                    }
                    continue;
                }
            }
            i += 1;
        }
        i
    }

    /// A `<` was held in prose at a chunk end; go on matching `<tool_call>`.
    fn held_open_tag(&mut self, s: &str, i: usize, out: &mut Vec<StreamEvent>) -> usize {
        let need = OPEN.len() - self.held.len();
        let avail = &s.as_bytes()[i..];
        let n = need.min(avail.len());
        let want = &OPEN.as_bytes()[self.held.len()..self.held.len() + n];
        match avail[..n].iter().zip(want).position(|(a, b)| a != b) {
            Some(bad) => {
                // Not a tag: the held bytes and the matching ones are prose.
                let held = std::mem::take(&mut self.held);
                self.text.push_str(&held);
                self.text.push_str(&s[i..i + bad]);
                self.md.indent = None;
                i + bad
            }
            None if n < need => {
                self.held.push_str(&s[i..i + n]);
                i + n
            }
            None => {
                self.held.clear();
                self.open_call(out);
                i + n
            }
        }
    }

    /// Inside arguments text or while skipping, `<` may begin one of a
    /// few known tags; anything else is content. `</tool_call>` also ends
    /// arguments whose `</arguments>` the model forgot.
    fn known_tag_prefix(&mut self, out: &mut Vec<StreamEvent>) -> TagMatch {
        let candidates: &[&str] = if self.mode == Mode::Skip {
            &[CLOSE, OPEN]
        } else {
            &[CDATA_OPEN, ARGS_CLOSE, OPEN, CLOSE]
        };
        let held = self.held.as_str();
        if let Some(&tag) = candidates.iter().find(|t| **t == held) {
            self.held.clear();
            match tag {
                CDATA_OPEN => self.mode = Mode::CData,
                ARGS_CLOSE => self.mode = Mode::Between { seen_element: true },
                CLOSE if self.mode == Mode::Skip => self.mode = Mode::Text,
                CLOSE => self.close_call(out),
                _ => self.nested_open(out),
            }
            return TagMatch::Complete;
        }
        if candidates.iter().any(|t| t.starts_with(held)) {
            return TagMatch::Prefix;
        }
        // Give back all but the last byte, which is read again.
        let mut held = std::mem::take(&mut self.held);
        held.pop();
        if self.mode == Mode::ArgsText {
            self.args.push_str(&held);
        }
        TagMatch::Broken
    }

    /// `</tool_call>`: the call is complete.
    fn close_call(&mut self, out: &mut Vec<StreamEvent>) {
        self.flush_args(out);
        if let Some(call) = self.call.take() {
            call.close(out);
        }
        self.mode = Mode::Text;
    }

    /// A complete tag between elements or after a name.
    fn element_tag(&mut self, tag: &str, out: &mut Vec<StreamEvent>) {
        if let Mode::Name(kind) = self.mode {
            if tag == kind.close_tag() {
                self.end_name(kind, out);
            } else if tag == OPEN {
                self.nested_open(out);
            } else {
                self.fail_call(
                    &format!("expected {}, found {}", kind.close_tag(), quote_str(tag)),
                    out,
                );
                self.mode = Mode::Skip;
            }
            return;
        }
        let named = self.call.as_ref().is_some_and(CallAssembler::is_named);
        match tag {
            "<server_name>" => self.begin_name(NameKind::Server),
            "<tool_name>" => self.begin_name(NameKind::Tool),
            "<arguments>" if named => self.mode = Mode::ArgsText,
            "<arguments>" => self.malformed("<arguments> came before <tool_name>", tag, out),
            "<arguments/>" => self.mode = Mode::Between { seen_element: true },
            CLOSE => self.close_call(out),
            OPEN => self.nested_open(out),
            other => {
                let reason = format!("unknown element {} inside <tool_call>", quote_str(other));
                self.malformed(&reason, other, out);
            }
        }
    }

    fn begin_name(&mut self, kind: NameKind) {
        self.name.clear();
        self.mode = Mode::Name(kind);
    }

    fn end_name(&mut self, kind: NameKind, out: &mut Vec<StreamEvent>) {
        let name = decode_entities(self.name.trim());
        self.mode = Mode::Between { seen_element: true };
        let Some(call) = &mut self.call else { return };
        match kind {
            NameKind::Server => call.set_server(name),
            NameKind::Tool if name.is_empty() => {
                self.fail_call("<tool_name> is empty", out);
                self.mode = Mode::Skip;
            }
            NameKind::Tool if call.is_named() => {
                self.fail_call("a second <tool_name> in one <tool_call>", out);
                self.mode = Mode::Skip;
            }
            NameKind::Tool => call.name(&name, out),
        }
    }

    /// `<tool_call>` inside a call: the open one fails, a new one begins.
    fn nested_open(&mut self, out: &mut Vec<StreamEvent>) {
        if self.call.is_some() {
            self.fail_call("a nested <tool_call> began before </tool_call>", out);
        }
        self.open_call(out);
    }

    fn fail_call(&mut self, reason: &str, out: &mut Vec<StreamEvent>) {
        self.flush_args(out);
        if let Some(call) = self.call.take() {
            call.fail(reason, out);
        }
    }
}

/// Decodes raw bytes of plain model text (`--format xml`): UTF-8 sequences
/// split across chunks are joined; invalid bytes are reported and kept as
/// U+FFFD so no prose is lost.
#[derive(Debug, Default)]
pub struct XmlTextDecoder {
    parser: XmlToolCallParser,
    /// The start of a UTF-8 sequence cut by the chunk end (≤ 3 bytes).
    carry: Vec<u8>,
    /// Bytes fed so far, for error positions.
    consumed: usize,
}

impl XmlTextDecoder {
    /// A decoder at the start of the model's text.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Decoder for XmlTextDecoder {
    fn feed(&mut self, chunk: &[u8]) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let mut base = self.consumed - self.carry.len();
        self.consumed += chunk.len();
        let joined;
        let mut data: &[u8] = if self.carry.is_empty() {
            chunk
        } else {
            let mut j = std::mem::take(&mut self.carry);
            j.extend_from_slice(chunk);
            joined = j;
            &joined
        };
        loop {
            match std::str::from_utf8(data) {
                Ok(text) => {
                    self.parser.feed_into(text, &mut out);
                    return out;
                }
                Err(e) => {
                    let (valid, rest) = data.split_at(e.valid_up_to());
                    if let Ok(text) = std::str::from_utf8(valid) {
                        self.parser.feed_into(text, &mut out);
                    }
                    let Some(bad) = e.error_len() else {
                        self.carry = rest.to_vec();
                        return out;
                    };
                    out.push(StreamEvent::ParseError {
                        message: format!(
                            "xml: invalid UTF-8 at input byte {}; replaced with U+FFFD",
                            base + valid.len()
                        ),
                    });
                    self.parser.feed_into("\u{fffd}", &mut out);
                    base += valid.len() + bad;
                    data = &rest[bad..];
                }
            }
        }
    }

    fn finish(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if !self.carry.is_empty() {
            out.push(StreamEvent::ParseError {
                message: format!(
                    "xml: input ended inside a UTF-8 sequence at byte {}; replaced with U+FFFD",
                    self.consumed - self.carry.len()
                ),
            });
            self.carry.clear();
            self.parser.feed_into("\u{fffd}", &mut out);
        }
        self.parser.finish_into(&mut out);
        out
    }
}

/// Decodes the XML entity named `name` (without `&` and `;`).
fn decode_entity(name: &str) -> Option<char> {
    match name {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        _ => {
            let num = name.strip_prefix('#')?;
            let code = match num.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                None => num.parse().ok()?,
            };
            char::from_u32(code)
        }
    }
}

/// Decodes every entity in a short text; unknown ones stay as written.
fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        match after
            .find(';')
            .and_then(|semi| Some((semi, decode_entity(&after[..semi])?)))
        {
            Some((semi, ch)) => {
                out.push(ch);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn quote_char(s: &str) -> String {
    s.chars()
        .next()
        .map_or_else(|| "end of text".into(), |c| format!("{c:?}"))
}

fn quote_str(s: &str) -> String {
    format!("`{}`", s.escape_debug())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(input: &str) -> Vec<StreamEvent> {
        let mut p = XmlToolCallParser::new();
        let mut out = p.feed(input);
        out.extend(p.finish());
        out
    }

    fn text_of(events: &[StreamEvent]) -> String {
        events.iter().filter_map(StreamEvent::text).collect()
    }

    #[test]
    fn prose_with_angle_brackets_is_text() {
        let input = "a < b, x<y, <div>, <tool, <tool_calls> and a <";
        let out = events(input);
        assert_eq!(text_of(&out), input);
        assert!(
            out.iter()
                .all(|e| matches!(e, StreamEvent::TextDelta { .. }))
        );
    }

    #[test]
    fn entities_decode() {
        assert_eq!(
            decode_entities("a&amp;b&lt;&#x263A;&#39;&bogus;&"),
            "a&b<☺'&bogus;&"
        );
    }

    #[test]
    fn fences_and_inline_code_hide_calls() {
        let call = "<tool_call><tool_name>t</tool_name></tool_call>";
        for input in [
            format!("```\n{call}\n```\n"),
            format!("  ~~~~ xml\n{call}\n~~~~\n"),
            format!("see `{call}` here"),
            format!("see ``a ` {call}`` here"),
        ] {
            let out = events(&input);
            assert_eq!(text_of(&out), input, "{input}");
        }
        // After the fence closes, calls count again.
        let out = events(&format!("```\nx\n```\n{call}"));
        assert!(
            out.iter()
                .any(|e| matches!(e, StreamEvent::ToolCallReady { .. }))
        );
        // An unmatched backtick does not hide the next line's call.
        let out = events(&format!("don't ` do this\n{call}"));
        assert!(
            out.iter()
                .any(|e| matches!(e, StreamEvent::ToolCallReady { .. }))
        );
    }

    fn kinds(events: &[StreamEvent]) -> Vec<&'static str> {
        events.iter().map(StreamEvent::kind).collect()
    }

    #[test]
    fn backticks_after_an_opening_run_make_inline_code_not_a_fence() {
        let call = "<tool_call><tool_name>t</tool_name></tool_call>";
        for prefix in ["```ls```\n", "```x`y\n"] {
            let out = events(&format!("{prefix}{call}"));
            assert!(
                kinds(&out).contains(&"tool_call_ready"),
                "{prefix:?}: {out:?}"
            );
            assert_eq!(text_of(&out), prefix);
        }
    }

    #[test]
    fn a_closing_fence_with_trailing_text_does_not_close() {
        let input = "```\na\n``` x\n<tool_call><tool_name>t</tool_name></tool_call>";
        let out = events(input);
        assert_eq!(text_of(&out), input);
        let input = "```\na\n```  \n<tool_call><tool_name>t</tool_name></tool_call>";
        assert!(kinds(&events(input)).contains(&"tool_call_ready"));
    }

    #[test]
    fn a_failure_before_the_first_element_gives_the_prose_back() {
        let input = "Use <tool_call> <em>bold</em> text. More prose.";
        let out = events(input);
        assert_eq!(text_of(&out), input);
        assert_eq!(
            kinds(&out)
                .iter()
                .filter(|k| **k == "tool_call_failed")
                .count(),
            1
        );
        let out = events("hi <tool_call>");
        assert_eq!(text_of(&out), "hi <tool_call>");
    }

    #[test]
    fn a_missing_arguments_close_is_forgiven() {
        let input = "<tool_call><tool_name>t</tool_name><arguments>{\"a\":1}</tool_call> after";
        let out = events(input);
        assert!(out.iter().any(
            |e| matches!(e, StreamEvent::ToolCallReady { arguments, .. } if arguments["a"] == 1)
        ));
        assert_eq!(text_of(&out), " after");
    }

    #[test]
    fn tool_call_word_in_prose_is_given_back() {
        let input = "wrap it in a <tool_call> element, like this";
        let out = events(input);
        assert_eq!(text_of(&out), input);
        assert!(matches!(out[1], StreamEvent::ToolCallOpened { .. }));
        assert!(matches!(out[2], StreamEvent::ToolCallFailed { .. }));
    }
}
