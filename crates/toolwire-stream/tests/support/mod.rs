//! Shared by the integration tests: the fixtures, feeding in chunks, and
//! the canonical form that makes different chunkings comparable.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use toolwire_stream::{Format, StreamEvent, decoder_for};

/// A recorded stream and its format.
pub struct Fixture {
    pub name: String,
    pub format: Format,
    pub bytes: Vec<u8>,
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every fixture, sorted by name.
pub fn all_fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    for (dir, format) in [
        ("openai-chat", Format::OpenAiChat),
        ("openai-responses", Format::OpenAiResponses),
        ("anthropic", Format::Anthropic),
        ("xml", Format::Xml),
    ] {
        let mut entries: Vec<_> = std::fs::read_dir(fixtures_dir().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("sse" | "txt")))
            .collect();
        entries.sort();
        for path in entries {
            out.push(Fixture {
                name: format!("{dir}/{}", path.file_name().unwrap().to_string_lossy()),
                format,
                bytes: std::fs::read(&path).unwrap(),
            });
        }
    }
    out
}

pub fn fixture(name: &str) -> Fixture {
    all_fixtures()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

/// Feeds `input` split at the given chunk sizes (cycled), then finishes.
/// A size of 0 feeds an empty chunk first, then one byte. Each event comes
/// with the number of bytes fed when it was emitted.
pub fn feed_sizes(format: Format, input: &[u8], sizes: &[usize]) -> Vec<(usize, StreamEvent)> {
    let mut decoder = decoder_for(format);
    let mut out = Vec::new();
    let mut pos = 0;
    let mut k = 0;
    while pos < input.len() {
        let size = sizes[k % sizes.len()];
        if size == 0 {
            out.extend(decoder.feed(&[]).into_iter().map(|e| (pos, e)));
        }
        let n = size.max(1).min(input.len() - pos);
        k += 1;
        pos += n;
        out.extend(
            decoder
                .feed(&input[pos - n..pos])
                .into_iter()
                .map(|e| (pos, e)),
        );
    }
    out.extend(decoder.finish().into_iter().map(|e| (pos, e)));
    out
}

/// Feeds `input` cut at `cuts` (sorted byte positions).
pub fn feed_cuts(format: Format, input: &[u8], cuts: &[usize]) -> Vec<(usize, StreamEvent)> {
    let mut sizes = Vec::new();
    let mut prev = 0;
    for &c in cuts.iter().chain(std::iter::once(&input.len())) {
        if c > prev {
            sizes.push(c - prev);
            prev = c;
        }
    }
    if sizes.is_empty() {
        sizes.push(1);
    }
    feed_sizes(format, input, &sizes)
}

pub fn whole(format: Format, input: &[u8]) -> Vec<StreamEvent> {
    let mut d = decoder_for(format);
    let mut out = d.feed(input);
    out.extend(d.finish());
    out
}

/// The canonical form of an event sequence: adjacent text joined, and in
/// each run of argument fragments of one call, the raw text first, then
/// each field's fragments joined, in order of first appearance. Offsets
/// are kept for the last event merged into each.
pub fn canonical(events: &[(usize, StreamEvent)]) -> Vec<(usize, StreamEvent)> {
    let mut out: Vec<(usize, StreamEvent)> = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let (off, ev) = &events[i];
        match ev {
            StreamEvent::ArgumentsDelta { call_id, .. }
            | StreamEvent::ArgumentFieldDelta { call_id, .. } => {
                let mut j = i;
                let mut raw = String::new();
                let mut fields: Vec<(std::sync::Arc<str>, String)> = Vec::new();
                let mut last = *off;
                while j < events.len() {
                    match &events[j].1 {
                        StreamEvent::ArgumentsDelta {
                            call_id: c,
                            fragment,
                        } if c == call_id => {
                            raw.push_str(fragment);
                        }
                        StreamEvent::ArgumentFieldDelta {
                            call_id: c,
                            key,
                            fragment,
                        } if c == call_id => match fields.iter_mut().find(|(k, _)| k == key) {
                            Some((_, f)) => f.push_str(fragment),
                            None => fields.push((key.clone(), fragment.clone())),
                        },
                        _ => break,
                    }
                    last = events[j].0;
                    j += 1;
                }
                if !raw.is_empty() {
                    out.push((
                        last,
                        StreamEvent::ArgumentsDelta {
                            call_id: call_id.clone(),
                            fragment: raw,
                        },
                    ));
                }
                for (key, fragment) in fields {
                    out.push((
                        last,
                        StreamEvent::ArgumentFieldDelta {
                            call_id: call_id.clone(),
                            key,
                            fragment,
                        },
                    ));
                }
                i = j;
            }
            StreamEvent::TextDelta { text } => {
                if let Some((o, StreamEvent::TextDelta { text: prev })) = out.last_mut() {
                    prev.push_str(text);
                    *o = *off;
                } else {
                    out.push((*off, ev.clone()));
                }
                i += 1;
            }
            StreamEvent::ReasoningDelta { text } => {
                if let Some((o, StreamEvent::ReasoningDelta { text: prev })) = out.last_mut() {
                    prev.push_str(text);
                    *o = *off;
                } else {
                    out.push((*off, ev.clone()));
                }
                i += 1;
            }
            _ => {
                out.push((*off, ev.clone()));
                i += 1;
            }
        }
    }
    out
}

pub fn without_offsets(events: &[(usize, StreamEvent)]) -> Vec<StreamEvent> {
    events.iter().map(|(_, e)| e.clone()).collect()
}

/// JSON lines, one event per line with its offset, as `toolwire stream
/// decode` prints them.
pub fn json_lines(events: &[(usize, StreamEvent)]) -> String {
    let mut s = String::new();
    for (offset, event) in events {
        let mut v = serde_json::to_value(event).unwrap();
        v.as_object_mut()
            .unwrap()
            .insert("offset".into(), (*offset).into());
        s.push_str(&serde_json::to_string(&v).unwrap());
        s.push('\n');
    }
    s
}

/// Where each tool call's name ends in `input`, found without the decoder:
/// for SSE, the end of the blank line that dispatches the first event
/// carrying `"name": "<name>"` after the previous call's (for the responses
/// API, after the first `output_item.added`); for a plain JSON
/// body, the end of input; for XML, any `</tool_name>` end (the decoder
/// must pick one of them; fences decide which).
pub fn expected_name_ends(format: Format, input: &[u8], names: &[String]) -> Vec<Vec<usize>> {
    if format == Format::Xml {
        let ends: Vec<usize> = find_all(input, b"</tool_name>")
            .into_iter()
            .map(|p| p + b"</tool_name>".len())
            .collect();
        return names.iter().map(|_| ends.clone()).collect();
    }
    let first = input.iter().position(|b| !b.is_ascii_whitespace());
    if first.map(|p| input[p]) == Some(b'{') {
        return names.iter().map(|_| vec![input.len()]).collect();
    }
    // The responses API repeats tool definitions (with names) in
    // `response.created`; calls begin at their `output_item.added`.
    let mut cursor = match format {
        Format::OpenAiResponses => find_from(input, b"response.output_item.added", 0).unwrap_or(0),
        _ => 0,
    };
    let mut out = Vec::new();
    for name in names {
        let candidates = [
            format!("\"name\":\"{name}\""),
            format!("\"name\": \"{name}\""),
        ];
        let pos = candidates
            .iter()
            .filter_map(|c| find_from(input, c.as_bytes(), cursor))
            .min()
            .unwrap_or_else(|| panic!("name {name} not in input after {cursor}"));
        cursor = pos + 1;
        out.push(vec![blank_line_end(input, pos)]);
    }
    out
}

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = find_from(hay, needle, from) {
        out.push(p);
        from = p + 1;
    }
    out
}

fn find_from(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// The position just after the terminator of the first empty line at or
/// after the line holding `pos` (an event is dispatched there), or the end
/// of input.
fn blank_line_end(input: &[u8], pos: usize) -> usize {
    let mut line_start = input[..pos]
        .iter()
        .rposition(|&b| b == b'\n' || b == b'\r')
        .map_or(0, |p| p + 1);
    let mut i = line_start;
    while i < input.len() {
        let b = input[i];
        if b == b'\n' || b == b'\r' {
            if i == line_start && i > pos {
                return i + 1; // the empty line ends at this terminator
            }
            i += if b == b'\r' && input.get(i + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            line_start = i;
        } else {
            i += 1;
        }
    }
    input.len()
}

/// The first position in `bounds` (chunk ends, ascending) at or after `e`.
pub fn ceil_to_boundary(bounds: &[usize], e: usize) -> usize {
    bounds.iter().copied().find(|&b| b >= e).unwrap_or(e)
}

/// Names of `ToolCallStarted` events, in order.
pub fn started(events: &[(usize, StreamEvent)]) -> Vec<(usize, String)> {
    events
        .iter()
        .filter_map(|(o, e)| match e {
            StreamEvent::ToolCallStarted { name, .. } => Some((*o, name.clone())),
            _ => None,
        })
        .collect()
}
