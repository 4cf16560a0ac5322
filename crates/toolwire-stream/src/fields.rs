//! Incremental JSON: top-level fields of a tool call's arguments object,
//! reported the moment each value is complete.
//!
//! The parser walks the arguments byte by byte, carrying only its state and
//! the value it is inside of. String values at the top level are decoded as
//! they stream and reported as appended fragments; other values are kept as
//! source text and parsed once, when they end. It is a reporter, not the
//! judge: the call's arguments are validated as a whole when the call
//! closes. On the first byte it cannot accept it stops reporting.

use std::sync::Arc;

use memchr::memchr2;
use serde_json::Value;

/// What the parser learned. `end` in [`ArgumentFieldParser::feed`]'s output
/// is the byte index in the fed text just after the byte that made it
/// certain.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldEvent {
    /// Decoded characters appended to the string value of `key`.
    Delta {
        /// The field's name.
        key: Arc<str>,
        /// Characters to append to its value.
        fragment: String,
    },
    /// The value of `key` is complete.
    Complete {
        /// The field's name.
        key: Arc<str>,
        /// Its whole value.
        value: Value,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the opening `{`.
    Start,
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,`: a key.
    Key,
    InKey,
    Colon,
    Value,
    InString,
    /// Inside an object or array value; `depth` open brackets.
    InNested,
    /// Inside a number or a literal.
    InScalar,
    /// After a value: `,` or `}`.
    AfterValue,
    Done,
    Failed,
}

/// Decoding state of a JSON string, carried across chunks.
#[derive(Debug, Default, Clone, Copy)]
struct Unescape {
    /// After a backslash.
    escape: bool,
    /// Inside `\uXXXX`: digits read and their value.
    hex_digits: u8,
    hex: u32,
    /// A high surrogate waiting for its low half.
    high: Option<u32>,
}

/// Reports top-level fields of a streamed JSON object.
#[derive(Debug)]
pub struct ArgumentFieldParser {
    state: State,
    /// The key being decoded.
    key: String,
    /// The key of the current value, shared by its events.
    field: Arc<str>,
    /// Decoded string value, or the source text of a nested/scalar value.
    value: String,
    /// How much of a string `value` has been reported as deltas.
    reported: usize,
    unescape: Unescape,
    /// Nested value bookkeeping.
    depth: u32,
    nested_in_string: bool,
    nested_escape: bool,
    error: Option<String>,
}

impl Default for ArgumentFieldParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ArgumentFieldParser {
    /// A parser expecting the start of an arguments object.
    pub fn new() -> Self {
        ArgumentFieldParser {
            state: State::Start,
            key: String::new(),
            field: Arc::from(""),
            value: String::new(),
            reported: 0,
            unescape: Unescape::default(),
            depth: 0,
            nested_in_string: false,
            nested_escape: false,
            error: None,
        }
    }

    /// Why the parser stopped reporting, if it did.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Feeds the next piece of the arguments text; pushes `(end, event)`.
    pub fn feed(&mut self, text: &str, out: &mut Vec<(usize, FieldEvent)>) {
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Failed => return,
                State::InString => {
                    i = self.string_run(text, i, out);
                    continue;
                }
                State::InKey => {
                    i = self.key_run(text, i);
                    continue;
                }
                State::InNested => {
                    i = self.nested_run(text, i, out);
                    continue;
                }
                _ => {}
            }
            let b = bytes[i];
            i += 1;
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') && self.state != State::InScalar {
                continue;
            }
            match (self.state, b) {
                (State::Start, b'{') => self.state = State::KeyOrEnd,
                (State::Start, _) => self.fail("arguments are not a JSON object"),
                (State::KeyOrEnd, b'}') | (State::AfterValue, b'}') => self.state = State::Done,
                (State::KeyOrEnd | State::Key, b'"') => {
                    self.key.clear();
                    self.unescape = Unescape::default();
                    self.state = State::InKey;
                }
                (State::Colon, b':') => self.state = State::Value,
                (State::Value, b'"') => {
                    self.value.clear();
                    self.reported = 0;
                    self.unescape = Unescape::default();
                    self.state = State::InString;
                }
                (State::Value, b'{' | b'[') => {
                    self.value.clear();
                    self.value.push(b as char);
                    self.depth = 1;
                    self.nested_in_string = false;
                    self.nested_escape = false;
                    self.state = State::InNested;
                }
                (State::Value, b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
                    self.value.clear();
                    self.value.push(b as char);
                    self.state = State::InScalar;
                }
                (State::InScalar, b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'E') => {
                    self.value.push(b as char);
                }
                (State::InScalar, _) => {
                    // The byte after a scalar ends it (the event fires on
                    // it) and is then read again.
                    self.complete_parsed(i, out);
                    i -= 1;
                }
                (State::AfterValue, b',') => self.state = State::Key,
                (State::Value, _) => {
                    let reason = format!(
                        "the value of `{}` cannot start with {}",
                        self.field,
                        describe_byte(text, i - 1)
                    );
                    self.fail(&reason);
                }
                _ => self.fail(&format!(
                    "unexpected {} in arguments JSON",
                    describe_byte(text, i - 1)
                )),
            }
        }
    }

    fn fail(&mut self, reason: &str) {
        if self.error.is_none() {
            self.error = Some(reason.to_owned());
        }
        self.state = State::Failed;
    }

    fn complete_parsed(&mut self, end: usize, out: &mut Vec<(usize, FieldEvent)>) {
        match serde_json::from_str::<Value>(&self.value) {
            Ok(value) => {
                out.push((
                    end,
                    FieldEvent::Complete {
                        key: self.field.clone(),
                        value,
                    },
                ));
                self.state = State::AfterValue;
            }
            Err(e) => {
                let reason = format!("field `{}` is not valid JSON: {e}", self.field);
                self.fail(&reason);
            }
        }
    }

    /// Reads string bytes from `i`; returns where it stopped.
    fn string_run(&mut self, text: &str, i: usize, out: &mut Vec<(usize, FieldEvent)>) -> usize {
        let mut value = std::mem::take(&mut self.value);
        let (next, closed) = self.unescape_into(text, i, &mut value);
        self.value = value;
        if self.state == State::Failed {
            // What was decoded before the bad byte is reported, as it would
            // have been had the chunk ended just before it.
            self.flush_delta(next, out);
            return text.len();
        }
        if closed {
            self.flush_delta(next, out);
            let value = Value::String(std::mem::take(&mut self.value));
            out.push((
                next,
                FieldEvent::Complete {
                    key: self.field.clone(),
                    value,
                },
            ));
            self.state = State::AfterValue;
        } else {
            self.flush_delta(next, out);
        }
        next
    }

    fn flush_delta(&mut self, end: usize, out: &mut Vec<(usize, FieldEvent)>) {
        if self.value.len() > self.reported {
            out.push((
                end,
                FieldEvent::Delta {
                    key: self.field.clone(),
                    fragment: self.value[self.reported..].to_owned(),
                },
            ));
            self.reported = self.value.len();
        }
    }

    fn key_run(&mut self, text: &str, i: usize) -> usize {
        let mut key = std::mem::take(&mut self.key);
        let (next, closed) = self.unescape_into(text, i, &mut key);
        self.key = key;
        if closed {
            self.field = Arc::from(self.key.as_str());
            self.state = State::Colon;
        }
        next
    }

    /// Decodes JSON string content from `text[i..]` into `dst` until the
    /// closing quote (consumed; returns `closed`) or the end of `text`.
    fn unescape_into(&mut self, text: &str, mut i: usize, dst: &mut String) -> (usize, bool) {
        let bytes = text.as_bytes();
        while i < bytes.len() {
            let u = &mut self.unescape;
            if u.escape {
                u.escape = false;
                let c = match bytes[i] {
                    b'"' => '"',
                    b'\\' => '\\',
                    b'/' => '/',
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    b'n' => '\n',
                    b'r' => '\r',
                    b't' => '\t',
                    b'u' => {
                        // `hex_digits` is 1 + the digits read so far.
                        u.hex_digits = 1;
                        u.hex = 0;
                        i += 1;
                        continue;
                    }
                    _ => {
                        self.fail(&format!(
                            "invalid escape {} in arguments JSON",
                            describe_byte(text, i)
                        ));
                        return (bytes.len(), false);
                    }
                };
                if !self.push_char(c, dst) {
                    return (bytes.len(), false);
                }
                i += 1;
                continue;
            }
            if u.hex_digits > 0 {
                let Some(d) = (bytes[i] as char).to_digit(16) else {
                    self.fail(&format!(
                        "invalid \\u escape: {} is not a hex digit",
                        describe_byte(text, i)
                    ));
                    return (bytes.len(), false);
                };
                u.hex = u.hex * 16 + d;
                u.hex_digits += 1;
                i += 1;
                if u.hex_digits == 5 {
                    u.hex_digits = 0;
                    let cp = u.hex;
                    if !self.push_code_unit(cp, dst) {
                        return (bytes.len(), false);
                    }
                }
                continue;
            }
            if u.high.is_some() && bytes[i] != b'\\' {
                self.fail("unpaired surrogate in arguments JSON");
                return (bytes.len(), false);
            }
            let run_end = memchr2(b'"', b'\\', &bytes[i..]).map_or(bytes.len(), |p| i + p);
            let run = &text[i..run_end];
            if let Some(p) = run.bytes().position(|b| b < 0x20) {
                dst.push_str(&run[..p]);
                self.fail(&format!(
                    "unescaped control character {} in a JSON string",
                    describe_byte(text, i + p)
                ));
                return (bytes.len(), false);
            }
            dst.push_str(run);
            i = run_end;
            if i < bytes.len() {
                i += 1;
                if bytes[i - 1] == b'"' {
                    return (i, true);
                }
                self.unescape.escape = true;
            }
        }
        (i, false)
    }

    fn push_char(&mut self, c: char, dst: &mut String) -> bool {
        if self.unescape.high.is_some() {
            self.fail("unpaired surrogate in arguments JSON");
            return false;
        }
        dst.push(c);
        true
    }

    fn push_code_unit(&mut self, cp: u32, dst: &mut String) -> bool {
        let u = &mut self.unescape;
        let c = match (u.high.take(), cp) {
            (None, 0xD800..=0xDBFF) => {
                u.high = Some(cp);
                return true;
            }
            (Some(hi), 0xDC00..=0xDFFF) => {
                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (cp - 0xDC00))
            }
            (None, _) => char::from_u32(cp),
            (Some(_), _) => None,
        };
        match c {
            Some(c) => {
                dst.push(c);
                true
            }
            None => {
                self.fail("unpaired surrogate in arguments JSON");
                false
            }
        }
    }

    /// Copies the source of an object/array value until its brackets close.
    fn nested_run(
        &mut self,
        text: &str,
        start: usize,
        out: &mut Vec<(usize, FieldEvent)>,
    ) -> usize {
        let bytes = text.as_bytes();
        let mut i = start;
        while i < bytes.len() {
            let b = bytes[i];
            i += 1;
            if self.nested_in_string {
                if self.nested_escape {
                    self.nested_escape = false;
                } else if b == b'\\' {
                    self.nested_escape = true;
                } else if b == b'"' {
                    self.nested_in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.nested_in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.value.push_str(&text[start..i]);
                        self.complete_parsed(i, out);
                        return i;
                    }
                }
                _ => {}
            }
        }
        self.value.push_str(&text[start..]);
        i
    }
}

/// Names the character at byte `i` of `text` for an error message.
fn describe_byte(text: &str, i: usize) -> String {
    let c = text.get(i..).and_then(|s| s.chars().next());
    match c {
        Some(c) if c.is_control() => format!("{:?}", c),
        Some(c) => format!("`{c}`"),
        None => "end of text".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(chunks: &[&str]) -> (Vec<FieldEvent>, Option<String>) {
        let mut p = ArgumentFieldParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        (
            out.into_iter().map(|(_, e)| e).collect(),
            p.error().map(str::to_owned),
        )
    }

    fn completes(events: &[FieldEvent]) -> Vec<(String, Value)> {
        events
            .iter()
            .filter_map(|e| match e {
                FieldEvent::Complete { key, value } => Some((key.to_string(), value.clone())),
                FieldEvent::Delta { .. } => None,
            })
            .collect()
    }

    #[test]
    fn every_kind_of_value_at_any_split() {
        let text = r#" {"s": "a\"b\\c\u00e9\ud83d\ude00 日本", "n": -1.5e3, "t": true, "z": null,
            "o": {"k": [1, "]}", {"x": "\""}]}, "a": [], "e": ""} "#;
        let whole = completes(&run(&[text]).0);
        assert_eq!(
            whole,
            vec![
                ("s".into(), json!("a\"b\\cé😀 日本")),
                ("n".into(), json!(-1500.0)),
                ("t".into(), json!(true)),
                ("z".into(), json!(null)),
                ("o".into(), json!({"k": [1, "]}", {"x": "\""}]})),
                ("a".into(), json!([])),
                ("e".into(), json!("")),
            ]
        );
        for split in 0..=text.len() {
            if !text.is_char_boundary(split) {
                continue;
            }
            let (a, b) = text.split_at(split);
            let (events, err) = run(&[a, b]);
            assert_eq!(err, None, "split at {split}");
            assert_eq!(completes(&events), whole, "split at {split}");
        }
    }

    #[test]
    fn string_deltas_concatenate_to_the_value() {
        let text = r#"{"path": "src/lib.rs", "diff": "line1\nline2\u0021"}"#;
        let chunks: Vec<&str> = (0..text.len()).map(|i| &text[i..i + 1]).collect();
        let (events, _) = run(&chunks);
        let diff: String = events
            .iter()
            .filter_map(|e| match e {
                FieldEvent::Delta { key, fragment } if &**key == "diff" => Some(fragment.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(diff, "line1\nline2!");
        let path_done = events
            .iter()
            .position(|e| matches!(e, FieldEvent::Complete { key, .. } if &**key == "path"));
        let diff_first = events
            .iter()
            .position(|e| matches!(e, FieldEvent::Delta { key, .. } if &**key == "diff"));
        assert!(path_done < diff_first);
    }

    #[test]
    fn scalar_ends_at_the_delimiter() {
        let mut p = ArgumentFieldParser::new();
        let mut out = Vec::new();
        p.feed(r#"{"n": 12"#, &mut out);
        assert!(out.is_empty(), "12 may go on to 123");
        p.feed("}", &mut out);
        assert_eq!(
            out,
            vec![(
                1,
                FieldEvent::Complete {
                    key: "n".into(),
                    value: json!(12)
                }
            )]
        );
    }

    #[test]
    fn bad_input_stops_reporting_with_a_reason() {
        assert_eq!(
            run(&["[1, 2]"]).1.as_deref(),
            Some("arguments are not a JSON object")
        );
        assert_eq!(
            run(&[r#"{"unit": celsius}"#]).1.as_deref(),
            Some("the value of `unit` cannot start with `c`")
        );
        assert!(
            run(&["{\"a\": \"x\ny\"}"])
                .1
                .unwrap_or_default()
                .contains("control")
        );
        assert!(
            run(&[r#"{"a": "\ud800x"}"#])
                .1
                .unwrap_or_default()
                .contains("surrogate")
        );
        assert!(
            run(&[r#"{"a": "\q"}"#])
                .1
                .unwrap_or_default()
                .contains("escape")
        );
        assert!(
            run(&[r#"{"a" 1}"#])
                .1
                .unwrap_or_default()
                .contains("unexpected `1`")
        );
        assert!(
            run(&[r#"{"a": tru}"#])
                .1
                .unwrap_or_default()
                .contains("field `a` is not valid JSON")
        );
    }
}
