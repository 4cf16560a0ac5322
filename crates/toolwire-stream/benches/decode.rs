//! Decoding benchmarks for the XML text decoder: the issue's acceptance
//! targets.
//!
//! * `xml_throughput/{prose,tool_calls}/chunk_{1,16,4096}`: 1 MiB inputs
//!   (targets: prose ≥ 1 GB/s at 4096-byte chunks; both ≥ 100 MB/s at
//!   16-byte chunks).
//! * `xml_growth/tool_calls_chunk_16/{100KiB,1MiB}`: linear growth (target:
//!   time(1 MiB) / time(100 KiB) between 8 and 12). The ratio is also timed
//!   directly and printed.
//! * `baseline_vs_ours/{regex_rescan,toolwire}/{100KiB,1MiB}`: the common
//!   "accumulate everything and re-run a regex on every chunk" approach
//!   against our decoder, both at [`BASELINE_CHUNK`]-byte chunks (target:
//!   ≥ 100× at 1 MiB). The ratios are also timed directly and printed.
//! * `large_arguments/xml_1.1MB_chunk_16`: one call whose arguments are a
//!   1.1 MB JSON object, fed in 16-byte chunks (target: < 50 ms).
//!
//! Inputs are generated deterministically; nothing is read from disk.
//! The directly timed ratios run only in `--bench` mode and only when the
//! filter (if any) matches one of the group's benchmark ids.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use regex::Regex;
use toolwire_stream::{Format, StreamEvent, decoder_for};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// Chunk size for the regex baseline comparison. The baseline re-scans the
/// whole buffer on every chunk (O(n²)); at 16-byte chunks one 1 MiB
/// iteration takes tens of seconds, so both sides use 256-byte chunks.
const BASELINE_CHUNK: usize = 256;

// ---- deterministic input generation ---------------------------------------

/// A tiny LCG (Knuth's MMIX constants): deterministic, no dependencies.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// Uniform-ish in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const WORDS: &[&str] = &[
    "the",
    "decoder",
    "stream",
    "returns",
    "events",
    "for",
    "each",
    "chunk",
    "and",
    "a",
    "call",
    "is",
    "ready",
    "when",
    "its",
    "arguments",
    "close",
    "we",
    "can",
    "show",
    "the",
    "path",
    "early",
    "while",
    "content",
    "still",
    "arrives",
    "from",
    "model",
    "this",
    "means",
    "that",
    "user",
    "sees",
    "progress",
    "before",
    "whole",
    "response",
    "ends",
    "so",
    "interface",
    "feels",
    "fast",
    "buffer",
    "parser",
    "token",
    "field",
    "value",
    "string",
    "object",
    "with",
    "in",
    "of",
    "to",
    "it",
    "on",
    "not",
    "only",
    "also",
    "every",
    "byte",
    "line",
    "file",
    "function",
    "test",
    "change",
    "diff",
    "patch",
    "résumé",
    "café",
    "naïve",
    "handles",
    "incremental",
    "linear",
    "time",
    "memory",
    "because",
    "after",
    "then",
    "which",
    "they",
];

const PUNCT: &[&str] = &[", ", ". ", "; ", ": ", ", ", ". ", "! ", "? "];

const CODE: &[&str] = &[
    "`Vec<u8>`",
    "`feed()`",
    "`finish`",
    "`a < b`",
    "`x <= y`",
    "`Option<String>`",
    "`&str`",
    "`memchr`",
    "`HashMap<K, V>`",
];

const COMPARISONS: &[&str] = &[
    "a < b",
    "n < 10",
    "i <= len",
    "1 < 2",
    "x<y",
    "size < limit",
];

/// Markdown-like prose of about `n` bytes (ends on a char boundary): words,
/// punctuation, lines of 60–100 characters, paragraphs, inline code and
/// bare `<` comparisons, never `<tool_call>`. Backticks are balanced on
/// every line.
fn prose_into(out: &mut String, rng: &mut Lcg, n: usize) {
    let end = out.len() + n;
    let mut line_len = 0;
    let mut line_target = 60 + rng.below(41);
    let mut sentence_start = true;
    while out.len() < end {
        let r = rng.below(100);
        let piece: &str = if r < 4 {
            rng.pick(CODE)
        } else if r < 6 {
            rng.pick(COMPARISONS)
        } else {
            rng.pick(WORDS)
        };
        if sentence_start && piece.as_bytes()[0].is_ascii_lowercase() {
            let mut cs = piece.chars();
            if let Some(c) = cs.next() {
                out.extend(c.to_uppercase());
                out.push_str(cs.as_str());
            }
        } else {
            out.push_str(piece);
        }
        line_len += piece.len();
        sentence_start = false;
        let sep = if rng.below(9) == 0 {
            let p = rng.pick(PUNCT);
            sentence_start = p.starts_with(['.', '!', '?']);
            p
        } else {
            " "
        };
        if line_len + sep.len() >= line_target {
            out.push_str(sep.trim_end());
            out.push('\n');
            if rng.below(6) == 0 {
                out.push('\n');
                sentence_start = true;
            }
            line_len = 0;
            line_target = 60 + rng.below(41);
        } else {
            out.push_str(sep);
            line_len += sep.len();
        }
    }
    truncate_to(out, end);
}

/// Truncates to at most `len` bytes, backing up to a char boundary.
fn truncate_to(s: &mut String, len: usize) {
    let mut len = len.min(s.len());
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    s.truncate(len);
}

fn prose(n: usize) -> String {
    let mut s = String::with_capacity(n + 128);
    prose_into(&mut s, &mut Lcg(0x5eed_0001), n);
    s
}

/// Source-code-ish text of about `n` bytes with newlines, quotes,
/// backslashes and tabs, so its JSON encoding has plenty of escapes.
fn code_text(rng: &mut Lcg, n: usize, diff: bool) -> String {
    const LINES: &[&str] = &[
        "fn main() {",
        "    let greeting = \"hello, world\";",
        "    println!(\"{greeting} — {}\", 42);",
        "}",
        "    if a < b && b > c { return Err(\"bad \\\"quote\\\"\".into()); }",
        "\tlet path = \"C:\\\\Users\\\\dev\\\\file.txt\";",
        "    // comment with <angle> brackets & ampersands",
        "    let v: Vec<u8> = Vec::with_capacity(1024);",
        "    match x { Some(y) => y, None => 0 }",
        "",
        "impl Decoder for Thing {",
        "    fn feed(&mut self, chunk: &[u8]) -> Vec<Event> { todo!() }",
    ];
    let mut s = String::with_capacity(n + 128);
    if diff {
        s.push_str("--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,40 +1,42 @@\n");
    }
    while s.len() < n {
        if diff {
            s.push_str([" ", "-", "+", " ", " "][rng.below(5)]);
        }
        s.push_str(rng.pick(LINES));
        s.push('\n');
    }
    s
}

/// One `<tool_call>` block whose CDATA arguments are a JSON object with a
/// short `path` and a `content` (or `diff`) string of `body_len` bytes.
fn tool_call_block(out: &mut String, rng: &mut Lcg, idx: usize, body_len: usize) {
    let diff = rng.below(2) == 0;
    let (tool, key) = if diff {
        ("apply_diff", "diff")
    } else {
        ("write_file", "content")
    };
    let path = format!("src/module_{idx}/file_{}.rs", rng.below(1000));
    let body = code_text(rng, body_len, diff);
    let args = format!(
        "{{\"path\": {}, \"{key}\": {}}}",
        serde_json::to_string(&path).unwrap(),
        serde_json::to_string(&body).unwrap()
    );
    assert!(!args.contains("]]>"));
    out.push_str("<tool_call>\n");
    if rng.below(3) != 0 {
        out.push_str("  <server_name>filesystem</server_name>\n");
    }
    out.push_str("  <tool_name>");
    out.push_str(tool);
    out.push_str("</tool_name>\n  <arguments><![CDATA[");
    out.push_str(&args);
    out.push_str("]]></arguments>\n</tool_call>\n");
}

/// About `n` bytes of model output: prose paragraphs interleaved with
/// tool calls of roughly 1–4 KB each; padded with prose to `n` bytes so no
/// call is cut off.
fn tool_traffic(n: usize) -> String {
    let mut rng = Lcg(0x5eed_0002);
    let mut s = String::with_capacity(n + 8 * KIB);
    let mut idx = 0;
    loop {
        let mut piece = String::new();
        let prose_len = 150 + rng.below(450);
        prose_into(&mut piece, &mut rng, prose_len);
        if !piece.ends_with('\n') {
            piece.push('\n');
        }
        let body_len = 900 + rng.below(3000);
        tool_call_block(&mut piece, &mut rng, idx, body_len);
        if s.len() + piece.len() > n {
            break;
        }
        s.push_str(&piece);
        idx += 1;
    }
    let rest = n - s.len();
    prose_into(&mut s, &mut rng, rest);
    s
}

/// One call with a ~1.1 MB JSON arguments object, inside CDATA.
fn large_arguments_input() -> String {
    let mut rng = Lcg(0x5eed_0003);
    let body = code_text(&mut rng, 1_050_000, false);
    let args = format!(
        "{{\"path\": \"src/generated/huge_table.rs\", \"content\": {}}}",
        serde_json::to_string(&body).unwrap()
    );
    assert!(!args.contains("]]>"));
    format!(
        "I'll write the generated table now.\n<tool_call>\n  <server_name>filesystem</server_name>\n  \
         <tool_name>write_file</tool_name>\n  <arguments><![CDATA[{args}]]></arguments>\n</tool_call>\nDone.\n"
    )
}

// ---- the decoders under test ----------------------------------------------

/// Our decoder over `input` in `chunk`-byte pieces: a fresh decoder, every
/// chunk fed, then `finish`. Returns the number of events.
fn run_ours(input: &[u8], chunk: usize) -> usize {
    let mut decoder = decoder_for(Format::Xml);
    let mut n = 0;
    for piece in input.chunks(chunk) {
        n += black_box(decoder.feed(piece)).len();
    }
    n + black_box(decoder.finish()).len()
}

/// Every event, for checks outside the timed loops.
fn collect_ours(input: &[u8], chunk: usize) -> Vec<StreamEvent> {
    let mut decoder = decoder_for(Format::Xml);
    let mut events = Vec::new();
    for piece in input.chunks(chunk) {
        events.extend(decoder.feed(piece));
    }
    events.extend(decoder.finish());
    events
}

fn baseline_regex() -> Regex {
    Regex::new(
        r"(?s)<tool_call>\s*(?:<server_name>(.*?)</server_name>\s*)?<tool_name>(.*?)</tool_name>",
    )
    .unwrap()
}

/// Splits `s` into pieces of at most `size` bytes on char boundaries, as a
/// UI receiving text deltas would see them.
fn str_chunks(s: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::with_capacity(s.len() / size + 1);
    let mut i = 0;
    while i < s.len() {
        let mut j = (i + size).min(s.len());
        while !s.is_char_boundary(j) {
            j += 1;
        }
        out.push(&s[i..j]);
        i = j;
    }
    out
}

/// The common approach: append each delta to a `String` and re-run a regex
/// over the whole buffer to find tool names, counting matches to notice new
/// calls. Returns the number of calls detected.
fn run_baseline(re: &Regex, chunks: &[&str]) -> usize {
    let mut buf = String::new();
    let mut seen = 0;
    for piece in chunks {
        buf.push_str(piece);
        let mut count = 0;
        for caps in re.captures_iter(&buf) {
            count += 1;
            if count > seen {
                // A new call: a UI would show its name now.
                black_box(caps.get(2).map(|m| m.as_str()));
            }
        }
        seen = count;
    }
    seen
}

// ---- direct timing (for ratios printed in one run) ------------------------

/// True when criterion runs in benchmark mode (not `--test`, `--list` or
/// `--profile-time`) and the command-line filter, if any, matches one of
/// `ids`.
fn direct_timing_wanted(ids: &[&str]) -> bool {
    const WITH_VALUE: &[&str] = &[
        "--save-baseline",
        "-s",
        "--baseline",
        "-b",
        "--baseline-lenient",
        "--load-baseline",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--profile-time",
        "--plotting-backend",
        "--output-format",
        "--color",
        "-c",
        "--format",
        "--logfile",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    if !flag("--bench") || flag("--list") || flag("--test") || flag("--profile-time") {
        return false;
    }
    let mut filters = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if WITH_VALUE.contains(&a.as_str()) {
            i += 2;
            continue;
        }
        if !a.starts_with('-') {
            filters.push(a.clone());
        }
        i += 1;
    }
    let Some(filter) = filters.first() else {
        return true;
    };
    if flag("--exact") {
        return ids.iter().any(|id| id == filter);
    }
    match Regex::new(filter) {
        Ok(re) => ids.iter().any(|id| re.is_match(id)),
        Err(_) => ids.iter().any(|id| id.contains(filter.as_str())),
    }
}

/// Median wall time of `runs` calls of `f`, after one warm-up call.
fn median_time(runs: usize, mut f: impl FnMut() -> usize) -> Duration {
    black_box(f());
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            black_box(f());
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Medians of `rounds` timed calls of each of `fs`, run in turns (one call
/// of each per round) after one warm-up round.
fn median_times_interleaved<const N: usize>(
    rounds: usize,
    mut fs: [&mut dyn FnMut() -> usize; N],
) -> [Duration; N] {
    for f in fs.iter_mut() {
        black_box(f());
    }
    let mut times: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::with_capacity(rounds));
    for _ in 0..rounds {
        for (f, t) in fs.iter_mut().zip(times.iter_mut()) {
            let start = Instant::now();
            black_box(f());
            t.push(start.elapsed());
        }
    }
    times.map(|mut t| {
        t.sort();
        t[t.len() / 2]
    })
}

fn mb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e6
}

// ---- benchmark groups -----------------------------------------------------

fn bench_throughput(c: &mut Criterion) {
    let inputs = [("prose", prose(MIB)), ("tool_calls", tool_traffic(MIB))];
    // Sanity, outside timing: prose has no calls, the traffic has many and
    // all of them complete.
    let prose_events = collect_ours(inputs[0].1.as_bytes(), 4096);
    assert!(
        prose_events
            .iter()
            .all(|e| matches!(e, StreamEvent::TextDelta { .. })),
        "prose produced non-text events"
    );
    let traffic_events = collect_ours(inputs[1].1.as_bytes(), 16);
    let ready = traffic_events
        .iter()
        .filter(|e| matches!(e, StreamEvent::ToolCallReady { .. }))
        .count();
    let opened = inputs[1].1.matches("<tool_call>").count();
    assert!(ready > 100, "only {ready} tool calls decoded");
    assert_eq!(ready, opened, "not every tool call became ready");
    assert!(
        !traffic_events.iter().any(|e| matches!(
            e,
            StreamEvent::ToolCallFailed { .. } | StreamEvent::ParseError { .. }
        )),
        "tool-call traffic produced failures"
    );

    let mut group = c.benchmark_group("xml_throughput");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);
    for (name, input) in &inputs {
        let bytes = input.as_bytes();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        for chunk in [1usize, 16, 4096] {
            group.bench_with_input(
                BenchmarkId::new(*name, format!("chunk_{chunk}")),
                &chunk,
                |b, &chunk| b.iter(|| run_ours(black_box(bytes), chunk)),
            );
        }
    }
    group.finish();
}

fn bench_growth(c: &mut Criterion) {
    const CHUNK: usize = 16;
    let sizes = [
        ("100KiB", tool_traffic(100 * KIB)),
        ("1MiB", tool_traffic(MIB)),
    ];

    let mut group = c.benchmark_group("xml_growth");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for (label, input) in &sizes {
        let bytes = input.as_bytes();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("tool_calls_chunk_16", label),
            bytes,
            |b, bytes| b.iter(|| run_ours(black_box(bytes), CHUNK)),
        );
    }
    group.finish();

    if direct_timing_wanted(&[
        "xml_growth/tool_calls_chunk_16/100KiB",
        "xml_growth/tool_calls_chunk_16/1MiB",
    ]) {
        let small = sizes[0].1.as_bytes();
        let large = sizes[1].1.as_bytes();
        // A third, larger point shows whether any excess is a trend.
        let xl_input = tool_traffic(4 * MIB);
        let xl = xl_input.as_bytes();
        // Interleaved rounds, so background load hits every size alike.
        let [t_small, t_large, t_xl] = median_times_interleaved(
            21,
            [
                &mut || run_ours(small, CHUNK),
                &mut || run_ours(large, CHUNK),
                &mut || run_ours(xl, CHUNK),
            ],
        );
        let ratio = t_large.as_secs_f64() / t_small.as_secs_f64();
        let ns_per_byte = |bytes: &[u8], t: Duration| t.as_secs_f64() * 1e9 / bytes.len() as f64;
        eprintln!(
            "\n[direct] growth, tool-call traffic, {CHUNK}-byte chunks (medians of 21 \
             interleaved runs): 100 KiB {t_small:?} ({:.0} MB/s, {:.2} ns/B), \
             1 MiB {t_large:?} ({:.0} MB/s, {:.2} ns/B), 4 MiB {t_xl:?} ({:.0} MB/s, {:.2} ns/B); \
             time ratio 1MiB/100KiB = {ratio:.2} (size ratio {:.2}; target 8..=12: {})\n",
            mb_per_s(small.len(), t_small),
            ns_per_byte(small, t_small),
            mb_per_s(large.len(), t_large),
            ns_per_byte(large, t_large),
            mb_per_s(xl.len(), t_xl),
            ns_per_byte(xl, t_xl),
            large.len() as f64 / small.len() as f64,
            if (8.0..=12.0).contains(&ratio) {
                "MET"
            } else {
                "MISSED"
            },
        );
    }
}

fn bench_baseline(c: &mut Criterion) {
    let re = baseline_regex();
    let sizes = [
        ("100KiB", tool_traffic(100 * KIB)),
        ("1MiB", tool_traffic(MIB)),
    ];
    // Both sides must see the same calls.
    for (_, input) in &sizes {
        let expected = input.matches("<tool_call>").count();
        assert_eq!(
            run_baseline(&re, &str_chunks(input, BASELINE_CHUNK * 64)),
            expected
        );
        let started = collect_ours(input.as_bytes(), BASELINE_CHUNK)
            .iter()
            .filter(|e| matches!(e, StreamEvent::ToolCallStarted { .. }))
            .count();
        assert_eq!(started, expected);
    }

    let mut group = c.benchmark_group("baseline_vs_ours");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(2))
        .sampling_mode(SamplingMode::Flat);
    for (label, input) in &sizes {
        let chunks = str_chunks(input, BASELINE_CHUNK);
        // One baseline iteration at 1 MiB takes seconds: give criterion
        // room for its 10 one-iteration samples instead of warning.
        group.measurement_time(Duration::from_secs(if input.len() > MIB / 2 {
            45
        } else {
            2
        }));
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_with_input(
            BenchmarkId::new(format!("regex_rescan_chunk_{BASELINE_CHUNK}"), label),
            &chunks,
            |b, chunks| b.iter(|| run_baseline(&re, black_box(chunks))),
        );
        group.bench_with_input(
            BenchmarkId::new(format!("toolwire_chunk_{BASELINE_CHUNK}"), label),
            &chunks,
            |b, chunks| {
                b.iter(|| {
                    let mut decoder = decoder_for(Format::Xml);
                    let mut n = 0;
                    for piece in black_box(chunks) {
                        n += black_box(decoder.feed(piece.as_bytes())).len();
                    }
                    n + black_box(decoder.finish()).len()
                })
            },
        );
    }
    group.finish();

    let ids: Vec<String> = sizes
        .iter()
        .flat_map(|(label, _)| {
            [
                format!("baseline_vs_ours/regex_rescan_chunk_{BASELINE_CHUNK}/{label}"),
                format!("baseline_vs_ours/toolwire_chunk_{BASELINE_CHUNK}/{label}"),
            ]
        })
        .collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    if direct_timing_wanted(&id_refs) {
        for (label, input) in &sizes {
            let chunks = str_chunks(input, BASELINE_CHUNK);
            let big = input.len() > MIB / 2;
            let t_base = median_time(if big { 3 } else { 11 }, || run_baseline(&re, &chunks));
            let t_ours = median_time(if big { 11 } else { 51 }, || {
                run_ours(input.as_bytes(), BASELINE_CHUNK)
            });
            let ratio = t_base.as_secs_f64() / t_ours.as_secs_f64();
            eprintln!(
                "\n[direct] baseline vs ours, {label} ({} B) of tool-call traffic, \
                 {BASELINE_CHUNK}-byte chunks: regex re-scan {t_base:?}, toolwire {t_ours:?}; \
                 baseline/ours = {ratio:.0}x{}\n",
                input.len(),
                if big {
                    if ratio >= 100.0 {
                        " (target >= 100x: MET)"
                    } else {
                        " (target >= 100x: MISSED)"
                    }
                } else {
                    ""
                },
            );
        }
    }
}

fn bench_large_arguments(c: &mut Criterion) {
    const CHUNK: usize = 16;
    let input = large_arguments_input();
    let bytes = input.as_bytes();
    // Outside timing: the decoder reports both fields and the call.
    let events = collect_ours(bytes, CHUNK);
    let field = |key: &str| {
        events
            .iter()
            .any(|e| matches!(e, StreamEvent::ArgumentField { key: k, .. } if &**k == key))
    };
    assert!(field("path"), "no ArgumentField for `path`");
    assert!(field("content"), "no ArgumentField for `content`");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, StreamEvent::ToolCallReady { .. })),
        "the large call never became ready"
    );

    let mut group = c.benchmark_group("large_arguments");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function(
        format!("xml_{:.1}MB_chunk_{CHUNK}", bytes.len() as f64 / 1e6),
        |b| b.iter(|| run_ours(black_box(bytes), CHUNK)),
    );
    group.finish();
}

criterion_group!(
    benches,
    bench_throughput,
    bench_growth,
    bench_baseline,
    bench_large_arguments
);
criterion_main!(benches);
