//! Tool-call updates: bytes on the wire (printed once, before the timings)
//! and the time of change detection per update.
//!
//! Bytes are serde_json lengths of the patch objects, without the front
//! door's envelope. Targets: a status-only update ≤ 80 bytes; a typical
//! lifecycle ≥ 80% fewer bytes as patches than as complete objects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::json;
use toolwire_core::{
    Location, ToolCallContent, ToolCallId, ToolCallPatch, ToolCallState, ToolCallStatus,
    ToolCallTracker, ToolKind, TrackerConfig,
};

/// An Anthropic-style call id, as long as real ones.
const ID: &str = "toolu_01A09q90qw90lq917835lq9";
const PATH: &str = "crates/toolwire-core/src/lib.rs";

fn immediate(complete: bool) -> ToolCallTracker {
    ToolCallTracker::new(TrackerConfig {
        complete_objects: complete,
        ..TrackerConfig::default()
    })
}

/// Hunks in the typical edit: an input of 820 B as JSON.
const HUNKS: u32 = 10;

/// An edit call as a model writes it: a unified diff of `hunks` hunks
/// (about 80 B each as JSON).
fn edit_call(hunks: u32) -> ToolCallState {
    let hunks: String = (0..hunks)
        .map(|i| {
            format!(
                "@@ -{l},3 +{l},3 @@\n fn helper_{i}() {{\n-    old_body_{i}();\n+    new_body_{i}();\n",
                l = 10 * i + 1
            )
        })
        .collect();
    let mut s = ToolCallState::new(ID, format!("Edit {PATH}"), ToolKind::Edit);
    s.raw_input = Some(json!({ "path": PATH, "diff": hunks }));
    s.locations = vec![Location {
        path: PATH.into(),
        line: Some(1),
    }];
    s
}

/// The edit call announced and running: the tracker and the patches sent.
///
/// `early`: announced as the front doors do it, the moment the name has
/// streamed in (no arguments yet), then refined as the argument fields
/// complete: the title and location with `path`, the raw input with
/// `diff`. Otherwise announced whole, arguments and all.
fn running_edit(complete: bool, early: bool, hunks: u32, now: Instant) -> (ToolCallTracker, u64) {
    let mut t = immediate(complete);
    let whole = edit_call(hunks);
    let mut patches = Vec::new();
    if early {
        t.announce(ToolCallState::new(ID, "Edit", ToolKind::Edit))
            .unwrap();
        patches.push(
            ToolCallPatch::new(ID)
                .title(whole.title.clone())
                .locations(whole.locations.clone()),
        );
        patches.push(ToolCallPatch::new(ID).raw_input(whole.raw_input.clone().unwrap()));
    } else {
        t.announce(whole).unwrap();
    }
    patches.push(ToolCallPatch::new(ID).status(ToolCallStatus::InProgress));
    let sent = patches
        .into_iter()
        .map(|p| u64::from(t.update(p, now).unwrap().is_some()))
        .sum();
    (t, sent)
}

/// Bytes of one call's life: (announce, updates) and the patch count.
/// Progress moves the location hunk by hunk; the completion shows the
/// diff made and a raw output.
fn edit_lifecycle(complete: bool, early: bool) -> (u64, u64, u64) {
    let now = Instant::now();
    let (mut t, mut sent) = running_edit(complete, early, HUNKS, now);
    let mut send = |t: &mut ToolCallTracker, p: ToolCallPatch| {
        sent += u64::from(t.update(p, now).unwrap().is_some());
    };
    for i in 0..10u32 {
        send(
            &mut t,
            ToolCallPatch::new(ID)
                .content(vec![ToolCallContent::text(format!(
                    "applying hunk {} of 10",
                    i + 1
                ))])
                .locations(vec![Location {
                    path: PATH.into(),
                    line: Some(10 * i + 1),
                }]),
        );
    }
    send(
        &mut t,
        ToolCallPatch::new(ID)
            .status(ToolCallStatus::Completed)
            .content(vec![edit_diff(HUNKS)])
            .raw_output(json!({ "path": PATH, "hunks_applied": 10, "bytes_written": 18342 })),
    );
    let m = t.metrics();
    (m.announce_bytes, m.patch_bytes, sent)
}

/// The diff an edit of `hunks` hunks made, as `toolwire acp` shows it.
fn edit_diff(hunks: u32) -> ToolCallContent {
    let old: String = (0..hunks)
        .map(|i| format!("fn helper_{i}() {{\n    old_body_{i}();\n}}\n"))
        .collect();
    ToolCallContent::Diff {
        path: PATH.into(),
        new_text: old.replace("old_body", "new_body"),
        old_text: Some(old),
    }
}

/// The call as the front doors show a tool that reports progress:
/// announced at its name, refined by its fields, in_progress, 10 progress
/// lines through [`ToolCallTracker::status_line`] (an MCP server's
/// `notifications/progress`, as ACP editors and the live view get them),
/// completed with its result text, under the diff it made if `diff`
/// (as `toolwire acp` ends an edit).
fn status_line_lifecycle(complete: bool, hunks: u32, diff: bool) -> (u64, u64) {
    let now = Instant::now();
    let (mut t, _) = running_edit(complete, true, hunks, now);
    let id = ToolCallId::from(ID);
    for i in 1..=10u32 {
        let line = format!("{i}/10 ({}%): applying hunk {i}", 10 * i);
        t.status_line(&id, &line, now).unwrap();
    }
    let result = ToolCallContent::text(format!("applied {hunks} hunks to `{PATH}`"));
    let content = if diff {
        vec![edit_diff(hunks), result]
    } else {
        vec![result]
    };
    t.update(
        ToolCallPatch::new(ID)
            .status(ToolCallStatus::Completed)
            .content(content),
        now,
    )
    .unwrap();
    let m = t.metrics();
    (m.announce_bytes, m.patch_bytes)
}

/// A short command: announce, in_progress, 10 chunks of 5 output lines,
/// completed with its exit code.
fn command_lifecycle(complete: bool, appended: bool) -> (u64, u64) {
    let mut t = ToolCallTracker::new(TrackerConfig {
        complete_objects: complete,
        appended_output: appended,
        ..TrackerConfig::default()
    });
    let now = Instant::now();
    let id = ToolCallId::from(ID);
    let mut s = ToolCallState::new(ID, "Run cargo test -p toolwire-core", ToolKind::Execute);
    s.raw_input =
        Some(json!({ "command": "cargo test -p toolwire-core", "cwd": "/home/user/project" }));
    s.locations = vec![Location {
        path: "/home/user/project".into(),
        line: None,
    }];
    t.announce(s).unwrap();
    t.update(
        ToolCallPatch::new(ID).status(ToolCallStatus::InProgress),
        now,
    )
    .unwrap();
    for i in 0..10 {
        let chunk: String = (0..5)
            .map(|j| format!("{:<80}\n", format!("test tests::case_{i}_{j} ... ok")))
            .collect();
        t.append_output(&id, &chunk, now).unwrap();
    }
    t.update(
        ToolCallPatch::new(ID)
            .status(ToolCallStatus::Completed)
            .raw_output(json!({ "exit_code": 0 })),
        now,
    )
    .unwrap();
    let m = t.metrics();
    (m.announce_bytes, m.patch_bytes)
}

/// 35,000 lines of 80 characters, one every `every`, through a
/// coalescing tracker driven like an async front door.
fn long_command(appended: bool, every: Duration, budget: Option<u64>) -> (u64, u64) {
    let mut t = ToolCallTracker::new(TrackerConfig {
        appended_output: appended,
        call_byte_budget: budget,
        ..TrackerConfig::coalescing()
    });
    let id = ToolCallId::from(ID);
    let mut s = ToolCallState::new(ID, "Run make", ToolKind::Execute);
    s.status = ToolCallStatus::InProgress;
    t.announce(s).unwrap();
    let t0 = Instant::now();
    let mut at = t0;
    for i in 0..35_000 {
        t.due(at);
        t.append_output(&id, &format!("{:<80}\n", format!("line {i}")), at)
            .unwrap();
        at += every;
    }
    t.update(ToolCallPatch::new(ID).status(ToolCallStatus::Completed), at)
        .unwrap();
    while let Some(deadline) = t.next_deadline() {
        t.due(deadline);
    }
    (t.metrics().patch_bytes, t.metrics().updates_sent)
}

/// How many percent fewer bytes `partial` is than `complete`.
fn fewer(partial: u64, complete: u64) -> f64 {
    100.0 * (1.0 - partial as f64 / complete as f64)
}

fn report_bytes(_: &mut Criterion) {
    // (a) status only.
    let mut t = immediate(false);
    t.announce(edit_call(HUNKS)).unwrap();
    let patch = t
        .update(
            ToolCallPatch::new(ID).status(ToolCallStatus::InProgress),
            Instant::now(),
        )
        .unwrap()
        .unwrap();
    let json = serde_json::to_string(&patch).unwrap();
    println!(
        "(a) status-only update: {} bytes (target ≤ 80): {json}",
        json.len()
    );

    // (b) typical lifecycle, partial vs complete.
    for early in [true, false] {
        let (announce, partial, n) = edit_lifecycle(false, early);
        let (_, complete, _) = edit_lifecycle(true, early);
        println!(
            "(b) edit lifecycle, {}, in_progress, 10 progress, completed with a diff: \
             {n} updates; updates {partial} B partial vs {complete} B complete = {:.1}% fewer; \
             with the {announce} B announce {} vs {} B = {:.1}% fewer (target ≥ 80%)",
            if early {
                "announced at its name then refined by its fields"
            } else {
                "announced whole"
            },
            fewer(partial, complete),
            announce + partial,
            announce + complete,
            fewer(announce + partial, announce + complete),
        );
    }
    let (announce, partial) = status_line_lifecycle(false, HUNKS, false);
    let (_, complete) = status_line_lifecycle(true, HUNKS, false);
    println!(
        "(b) the same call with 10 progress lines (status_line) and completed with its result \
         text: {} vs {} B = {:.1}% fewer counting the announce",
        announce + partial,
        announce + complete,
        fewer(announce + partial, announce + complete),
    );
    // What complete objects repeat is the input; what every update adds
    // is its own: the ratio follows the input's size.
    let by_size: Vec<String> = [3, HUNKS, 40]
        .into_iter()
        .map(|hunks| {
            let ratio = |diff| {
                let (a, p) = status_line_lifecycle(false, hunks, diff);
                let (_, c) = status_line_lifecycle(true, hunks, diff);
                fewer(a + p, a + c)
            };
            let input = serde_json::to_string(&edit_call(hunks).raw_input).unwrap();
            format!(
                "{} B input: {:.1}% ({:.1}% with the diff shown at the end)",
                input.len(),
                ratio(false),
                ratio(true)
            )
        })
        .collect();
    println!(
        "    status-line lifecycle by input size: {}",
        by_size.join("; ")
    );
    for appended in [false, true] {
        let (announce, partial) = command_lifecycle(false, appended);
        let (_, complete) = command_lifecycle(true, appended);
        println!(
            "    command lifecycle ({} output, 50 lines): updates {partial} B partial vs \
             {complete} B complete = {:.1}% fewer (announce {announce} B)",
            if appended { "appended" } else { "replaced" },
            fewer(partial, complete),
        );
    }

    // (c) 35,000 lines.
    let output = 35_000 * 81;
    for every in [Duration::from_micros(200), Duration::from_millis(1)] {
        // toolwire acp's default budget: 8 MiB per call.
        for (appended, budget) in [(false, None), (false, Some(8 << 20)), (true, None)] {
            let (bytes, n) = long_command(appended, every, budget);
            println!(
                "(c) 35,000 × 80-char lines over {:.0} s, {} output{}: {n} updates, {bytes} B \
                 = {:.2} MB ({:.3}× the {output} B of output)",
                (every * 35_000).as_secs_f64(),
                if appended { "appended" } else { "replaced" },
                if budget.is_some() {
                    " (8 MiB budget)"
                } else {
                    ""
                },
                bytes as f64 / 1e6,
                bytes as f64 / output as f64,
            );
        }
    }
}

fn change_detection(c: &mut Criterion) {
    let before = edit_call(HUNKS);
    let mut after = before.clone();
    after.content = vec![ToolCallContent::text("applying hunk 3 of 10")];
    c.bench_function("diff two states (content changed)", |b| {
        b.iter(|| black_box(black_box(&before).diff(black_box(&after))))
    });

    // One update through the tracker: validate, apply, diff, count bytes.
    // Alternating texts so every update is a real change.
    let texts = [
        vec![ToolCallContent::text("applying hunk 3 of 10")],
        vec![ToolCallContent::text("applying hunk 4 of 10")],
    ];
    let mut t = immediate(false);
    t.announce(edit_call(HUNKS)).unwrap();
    let now = Instant::now();
    let mut i = 0usize;
    c.bench_function("update with one field changed", |b| {
        b.iter(|| {
            i += 1;
            let p = ToolCallPatch::new(ID).content(texts[i % 2].clone());
            black_box(t.update(p, now).unwrap())
        })
    });
    c.bench_function("update with nothing changed", |b| {
        b.iter(|| {
            let p = ToolCallPatch::new(ID).content(texts[i % 2].clone());
            black_box(t.update(p, now).unwrap())
        })
    });

    c.bench_function("two coalesced pushes (buffered, no emission)", |b| {
        b.iter_batched_ref(
            || {
                let mut t = ToolCallTracker::new(TrackerConfig::coalescing());
                t.announce(edit_call(HUNKS)).unwrap();
                t
            },
            |t| {
                for text in &texts {
                    let p = ToolCallPatch::new(ID).content(text.clone());
                    t.push(p, now).unwrap();
                }
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, report_bytes, change_detection);
criterion_main!(benches);
