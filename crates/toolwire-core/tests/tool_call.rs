//! The tool-call tracker: diffs (one field, none, deep changes),
//! coalescing, the rate limit, status changes under load, validation,
//! compatibility mode, streamed output, and the invariant that the patches
//! rebuild the sent state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Value, json};
use toolwire_core::{
    Location, ToolCallContent, ToolCallId, ToolCallPatch, ToolCallState, ToolCallStatus,
    ToolCallTracker, ToolKind, TrackerConfig, TrackerError,
};

const ID: &str = "toolu_01A09q90qw90lq917835lq9";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn id() -> ToolCallId {
    ToolCallId::from(ID)
}

fn edit_state() -> ToolCallState {
    let mut s = ToolCallState::new(ID, "Edit src/lib.rs", ToolKind::Edit);
    s.content = vec![ToolCallContent::Diff {
        path: "src/lib.rs".into(),
        old_text: Some("fn a() {}\n".into()),
        new_text: "fn b() {}\n".into(),
    }];
    s.locations = vec![Location {
        path: "src/lib.rs".into(),
        line: Some(1),
    }];
    s.raw_input = Some(json!({"path": "src/lib.rs", "edits": [{"line": 1}]}));
    s.raw_output = Some(json!({"a": {"b": [1, 2]}}));
    s
}

fn tracker_with(config: TrackerConfig) -> ToolCallTracker {
    let mut t = ToolCallTracker::new(config);
    t.announce(edit_state()).unwrap();
    t
}

fn tracker() -> ToolCallTracker {
    tracker_with(TrackerConfig::default())
}

fn keys(patch: &ToolCallPatch) -> BTreeSet<String> {
    match serde_json::to_value(patch).unwrap() {
        Value::Object(map) => map.keys().cloned().collect(),
        other => panic!("a patch serializes as an object, got {other}"),
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn each_field_alone_gives_a_patch_with_only_that_field() {
    let cases: Vec<(&str, ToolCallPatch)> = vec![
        ("title", ToolCallPatch::new(ID).title("Edit src/main.rs")),
        ("kind", ToolCallPatch::new(ID).kind(ToolKind::Move)),
        (
            "status",
            ToolCallPatch::new(ID).status(ToolCallStatus::InProgress),
        ),
        (
            "content",
            ToolCallPatch::new(ID).content(vec![ToolCallContent::text("done")]),
        ),
        (
            "locations",
            ToolCallPatch::new(ID).locations(vec![Location {
                path: "src/main.rs".into(),
                line: None,
            }]),
        ),
        (
            "raw_input",
            ToolCallPatch::new(ID).raw_input(json!({"x": 1})),
        ),
        ("raw_output", ToolCallPatch::new(ID).raw_output(json!("ok"))),
    ];
    for (field, change) in cases {
        let mut t = tracker();
        let patch = t
            .update(change.clone(), Instant::now())
            .unwrap()
            .unwrap_or_else(|| panic!("{field}: a change gives a patch"));
        assert_eq!(keys(&patch), set(&["id", field]), "{field}");
        assert_eq!(patch, change, "{field}: the patch is exactly the change");
    }
}

#[test]
fn no_change_gives_nothing() {
    let mut t = tracker();
    let now = Instant::now();
    let s = edit_state();
    let same = ToolCallPatch::new(ID)
        .title(s.title.clone())
        .kind(s.kind)
        .status(s.status)
        .content(s.content.clone())
        .locations(s.locations.clone())
        .raw_input(s.raw_input.clone().unwrap())
        .raw_output(s.raw_output.clone().unwrap());
    assert_eq!(t.update(same, now).unwrap(), None);
    assert_eq!(t.update(ToolCallPatch::new(ID), now).unwrap(), None);
    assert_eq!(t.metrics().suppressed, 2);
    assert_eq!(t.metrics().updates_sent, 0);
}

#[test]
fn a_change_deep_inside_a_content_item_is_found() {
    let mut t = tracker();
    // Same number of items, same lengths: one character differs.
    let content = vec![ToolCallContent::Diff {
        path: "src/lib.rs".into(),
        old_text: Some("fn a() {}\n".into()),
        new_text: "fn c() {}\n".into(),
    }];
    let patch = t
        .update(
            ToolCallPatch::new(ID).content(content.clone()),
            Instant::now(),
        )
        .unwrap()
        .expect("the changed diff is sent");
    assert_eq!(keys(&patch), set(&["id", "content"]));
    assert_eq!(patch.content, Some(content));
}

#[test]
fn a_change_deep_inside_raw_output_is_found() {
    let mut t = tracker();
    let patch = t
        .update(
            ToolCallPatch::new(ID).raw_output(json!({"a": {"b": [1, 3]}})),
            Instant::now(),
        )
        .unwrap()
        .expect("the nested change is sent");
    assert_eq!(keys(&patch), set(&["id", "raw_output"]));
    // And the same value again is not.
    let again = ToolCallPatch::new(ID).raw_output(json!({"a": {"b": [1, 3]}}));
    assert_eq!(t.update(again, Instant::now()).unwrap(), None);
}

#[test]
fn coalescing_merges_changes_and_later_values_win() {
    let mut t = tracker_with(TrackerConfig::coalescing());
    let t0 = Instant::now();
    assert_eq!(
        t.update(ToolCallPatch::new(ID).title("one"), t0).unwrap(),
        None
    );
    t.push(ToolCallPatch::new(ID).title("two"), t0 + ms(10))
        .unwrap();
    t.push(
        ToolCallPatch::new(ID).raw_output(json!({"n": 1})),
        t0 + ms(20),
    )
    .unwrap();
    t.push(ToolCallPatch::new(ID).title("three"), t0 + ms(30))
        .unwrap();
    assert_eq!(t.next_deadline(), Some(t0 + ms(50)));
    assert!(t.due(t0 + ms(49)).is_empty(), "held for the window");
    let out = t.due(t0 + ms(50));
    assert_eq!(
        out,
        vec![
            ToolCallPatch::new(ID)
                .title("three")
                .raw_output(json!({"n": 1}))
        ]
    );
    assert_eq!(t.metrics().coalesced, 3);
    assert_eq!(t.metrics().updates_sent, 1);
    assert_eq!(t.next_deadline(), None);
}

#[test]
fn a_change_and_its_change_back_inside_the_window_give_nothing() {
    let mut t = tracker_with(TrackerConfig::coalescing());
    let t0 = Instant::now();
    t.push(ToolCallPatch::new(ID).title("other"), t0).unwrap();
    t.push(
        ToolCallPatch::new(ID).raw_output(json!({"a": {"b": [9]}})),
        t0 + ms(5),
    )
    .unwrap();
    t.push(ToolCallPatch::new(ID).title("Edit src/lib.rs"), t0 + ms(10))
        .unwrap();
    t.push(
        ToolCallPatch::new(ID).raw_output(json!({"a": {"b": [1, 2]}})),
        t0 + ms(20),
    )
    .unwrap();
    assert!(t.due(t0 + ms(100)).is_empty());
    assert_eq!(t.metrics().suppressed, 1);
    assert_eq!(t.metrics().updates_sent, 0);
    assert_eq!(t.next_deadline(), None);
}

/// Runs like an async front door: at each event time, first whatever is
/// due; returns the emission times and patches.
fn progress_storm(
    t: &mut ToolCallTracker,
    t0: Instant,
    every: Duration,
    until: Duration,
) -> Vec<(Instant, ToolCallPatch)> {
    let mut sent = Vec::new();
    let mut n = 0u32;
    let mut at = t0;
    while at < t0 + until {
        sent.extend(t.due(at).into_iter().map(|p| (at, p)));
        let text = format!("step {n}");
        if let Some(p) = t
            .update(
                ToolCallPatch::new(ID).content(vec![ToolCallContent::text(text)]),
                at,
            )
            .unwrap()
        {
            sent.push((at, p));
        }
        n += 1;
        at += every;
    }
    sent
}

#[test]
fn the_rate_limit_holds() {
    // A short window, so the rate and not the window is what binds.
    let config = TrackerConfig {
        window: ms(5),
        ..TrackerConfig::coalescing()
    };
    let mut t = tracker_with(config);
    let t0 = Instant::now();
    // A change every millisecond for three simulated seconds.
    let sent = progress_storm(&mut t, t0, ms(1), Duration::from_secs(3));
    let times: Vec<Instant> = sent.iter().map(|(at, _)| *at).collect();
    // In every one-second window (sliding by 1 ms): at most 20.
    let mut most = 0;
    for start in 0..2000 {
        let from = t0 + ms(start);
        let n = times
            .iter()
            .filter(|&&x| x >= from && x < from + Duration::from_secs(1))
            .count();
        most = most.max(n);
    }
    assert_eq!(most, 20, "at most 20 a second, and the budget is used");
    let second = times
        .iter()
        .filter(|&&x| x >= t0 + Duration::from_secs(1) && x < t0 + Duration::from_secs(2))
        .count();
    println!("patches in the second simulated second: {second} (of 1000 changes)");
    assert_eq!(t.metrics().updates_sent as usize, times.len());
    assert!(t.metrics().coalesced > 2900);
}

#[test]
fn a_status_change_is_never_dropped_nor_held_longer_than_the_window() {
    let config = TrackerConfig {
        max_per_second: 2, // a harsh rate, which status changes ignore
        ..TrackerConfig::coalescing()
    };
    let window = config.window;
    let mut t = tracker_with(config);
    let t0 = Instant::now();
    // Progress every millisecond; a status change at 437 ms and the final
    // status (with the final content) at 1203 ms.
    let mut emitted: Vec<(Instant, ToolCallPatch)> = Vec::new();
    let mut step = 0u64;
    loop {
        let at = t0 + ms(step);
        emitted.extend(t.due(at).into_iter().map(|p| (at, p)));
        let patch = match step {
            437 => ToolCallPatch::new(ID).status(ToolCallStatus::InProgress),
            1203 => ToolCallPatch::new(ID)
                .status(ToolCallStatus::Completed)
                .content(vec![ToolCallContent::text("final")]),
            1204.. => break,
            _ => ToolCallPatch::new(ID).content(vec![ToolCallContent::text(format!("p{step}"))]),
        };
        if let Some(p) = t.update(patch, at).unwrap() {
            emitted.push((at, p));
        }
        step += 1;
    }
    // Nothing else happens: the front door sleeps until the deadline.
    while let Some(deadline) = t.next_deadline() {
        emitted.extend(t.due(deadline).into_iter().map(|p| (deadline, p)));
    }
    let in_progress = emitted
        .iter()
        .find(|(_, p)| p.status == Some(ToolCallStatus::InProgress))
        .expect("in_progress is sent");
    assert!(in_progress.0 <= t0 + ms(437) + window);
    let (at, last) = emitted.last().unwrap();
    assert_eq!(last.status, Some(ToolCallStatus::Completed));
    assert_eq!(last.content, Some(vec![ToolCallContent::text("final")]));
    assert!(*at <= t0 + ms(1203) + window, "final status held too long");
    assert_eq!(t.finished(&id()), Some(ToolCallStatus::Completed));
    // The rate still held for the progress-only patches: ≤ 2 per second.
    let progress_only = emitted.iter().filter(|(_, p)| p.status.is_none()).count();
    assert!(progress_only <= 3, "{progress_only} progress patches");
}

#[test]
fn validation_errors() {
    let mut t = tracker();
    let now = Instant::now();
    let unknown = ToolCallId::from("call_nobody");
    assert_eq!(
        t.update(ToolCallPatch::new(unknown.clone()).title("x"), now),
        Err(TrackerError::Unknown(unknown.clone()))
    );
    assert_eq!(
        t.append_output(&unknown, "x", now),
        Err(TrackerError::Unknown(unknown.clone()))
    );
    assert_eq!(
        t.flush(&unknown, now),
        Err(TrackerError::Unknown(unknown.clone()))
    );
    assert_eq!(
        t.announce(edit_state()),
        Err(TrackerError::AlreadyAnnounced(id()))
    );

    t.update(
        ToolCallPatch::new(ID).status(ToolCallStatus::InProgress),
        now,
    )
    .unwrap();
    let back = t.update(ToolCallPatch::new(ID).status(ToolCallStatus::Pending), now);
    assert_eq!(
        back,
        Err(TrackerError::StatusBackwards {
            id: id(),
            from: ToolCallStatus::InProgress,
            to: ToolCallStatus::Pending,
        })
    );
    assert_eq!(
        back.unwrap_err().to_string(),
        format!("tool call `{ID}` cannot go from in_progress back to pending")
    );

    t.update(ToolCallPatch::new(ID).status(ToolCallStatus::Failed), now)
        .unwrap()
        .unwrap();
    let finished = TrackerError::Finished {
        id: id(),
        status: ToolCallStatus::Failed,
    };
    assert_eq!(
        t.update(ToolCallPatch::new(ID).title("late"), now),
        Err(finished.clone())
    );
    assert_eq!(
        t.update(
            ToolCallPatch::new(ID).status(ToolCallStatus::Completed),
            now
        ),
        Err(finished.clone())
    );
    assert_eq!(t.append_output(&id(), "late", now), Err(finished));
    assert_eq!(t.flush(&id(), now), Ok(None));
    assert_eq!(t.last_sent(&id()), None, "a finished call's state is freed");
}

#[test]
fn a_final_status_still_buffered_already_closes_the_call() {
    let mut t = tracker_with(TrackerConfig::coalescing());
    let t0 = Instant::now();
    t.push(ToolCallPatch::new(ID).status(ToolCallStatus::Completed), t0)
        .unwrap();
    assert!(matches!(
        t.push(ToolCallPatch::new(ID).title("late"), t0 + ms(1)),
        Err(TrackerError::Finished { .. })
    ));
    let out = t.flush_all(t0 + ms(2));
    assert_eq!(
        out,
        vec![ToolCallPatch::new(ID).status(ToolCallStatus::Completed)]
    );
}

#[test]
fn terminal_output_is_not_accepted_in_an_update() {
    let mut t = tracker();
    let mut patch = ToolCallPatch::new(ID);
    patch.terminal_output = Some(toolwire_core::TerminalOutput {
        terminal_id: ID.into(),
        data: "x".into(),
    });
    assert_eq!(
        t.update(patch, Instant::now()),
        Err(TrackerError::OutputInPatch(id()))
    );
}

#[test]
fn compatibility_mode_sends_complete_objects() {
    let config = TrackerConfig {
        complete_objects: true,
        ..TrackerConfig::default()
    };
    let mut t = tracker_with(config);
    let now = Instant::now();
    let patch = t
        .update(
            ToolCallPatch::new(ID).status(ToolCallStatus::InProgress),
            now,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        keys(&patch),
        set(&[
            "id",
            "title",
            "kind",
            "status",
            "content",
            "locations",
            "raw_input",
            "raw_output"
        ])
    );
    let mut expected = edit_state();
    expected.status = ToolCallStatus::InProgress;
    assert_eq!(patch, ToolCallPatch::complete(&expected));
    // Still nothing when nothing changed.
    assert_eq!(t.update(ToolCallPatch::new(ID), now).unwrap(), None);
    let m = t.metrics();
    assert_eq!(m.patch_bytes, m.complete_bytes);
}

#[test]
fn partial_patches_save_bytes_and_say_so() {
    let mut t = tracker();
    t.update(
        ToolCallPatch::new(ID).status(ToolCallStatus::InProgress),
        Instant::now(),
    )
    .unwrap();
    let m = *t.metrics();
    assert_eq!(m.announced, 1);
    assert_eq!(
        m.patch_bytes as usize,
        format!(r#"{{"id":"{ID}","status":"in_progress"}}"#).len()
    );
    assert!(m.complete_bytes > 4 * m.patch_bytes);
    assert!(m.saved() > 0.75);
}

const LINES: usize = 35_000;

fn line(i: usize) -> String {
    // 80 characters and a newline.
    format!(
        "{:<80}\n",
        format!("line {i:05} of the command's output, padded to eighty chars")
    )
}

/// 35,000 lines, one every 0.2 ms (7 simulated seconds), driven like an
/// async front door; then the call completes. Returns the emitted patches.
fn run_command(appended: bool) -> (ToolCallTracker, Vec<ToolCallPatch>) {
    let config = TrackerConfig {
        appended_output: appended,
        ..TrackerConfig::coalescing()
    };
    let mut t = ToolCallTracker::new(config);
    let mut state = ToolCallState::new(ID, "cargo test", ToolKind::Execute);
    state.status = ToolCallStatus::InProgress;
    state.raw_input = Some(json!({"command": "cargo test"}));
    t.announce(state).unwrap();
    let t0 = Instant::now();
    let mut out = Vec::new();
    for i in 0..LINES {
        let at = t0 + Duration::from_micros(200 * i as u64);
        out.extend(t.due(at));
        out.extend(t.append_output(&id(), &line(i), at).unwrap());
    }
    let end = t0 + Duration::from_micros(200 * LINES as u64);
    out.extend(
        t.update(
            ToolCallPatch::new(ID)
                .status(ToolCallStatus::Completed)
                .raw_output(json!({"exit_code": 0})),
            end,
        )
        .unwrap(),
    );
    while let Some(deadline) = t.next_deadline() {
        out.extend(t.due(deadline));
    }
    (t, out)
}

#[test]
fn long_output_without_appended_support_stays_bounded() {
    let (t, out) = run_command(false);
    let output_bytes = LINES * 81;
    let m = *t.metrics();
    println!(
        "replaced content: {} patches, {} bytes emitted for {} bytes of output ({:.2} MB)",
        m.updates_sent,
        m.patch_bytes,
        output_bytes,
        m.patch_bytes as f64 / 1e6
    );
    assert!(m.patch_bytes <= 50_000_000, "{} bytes", m.patch_bytes);
    let last = out.last().unwrap();
    assert_eq!(last.status, Some(ToolCallStatus::Completed));
    // The final content: the truncation line, then whole lines up to the
    // very last one, within 64 KiB.
    let Some(content) = &last.content else {
        // The last output may have gone out just before; then the final
        // patch has only the status and raw_output.
        return check_final_tail(&out);
    };
    assert_eq!(content.len(), 1);
    check_final_tail(&out);
}

fn check_final_tail(out: &[ToolCallPatch]) {
    let text = out
        .iter()
        .rev()
        .find_map(|p| match p.content.as_deref() {
            Some([ToolCallContent::Text { text }]) => Some(text.clone()),
            _ => None,
        })
        .expect("some content was sent");
    let (head, tail) = text.split_once('\n').unwrap();
    assert!(tail.len() <= 64 * 1024);
    assert!(
        tail.starts_with("line "),
        "the tail starts with a whole line"
    );
    assert!(tail.ends_with(&line(LINES - 1)));
    let dropped = LINES * 81 - tail.len();
    assert_eq!(head, format!("… {dropped} bytes truncated …"));
}

#[test]
fn long_output_with_appended_support_sends_each_byte_once() {
    let (t, out) = run_command(true);
    let output_bytes = LINES * 81;
    let m = *t.metrics();
    println!(
        "appended output: {} patches, {} bytes emitted for {} bytes of output ({:.3}×)",
        m.updates_sent,
        m.patch_bytes,
        output_bytes,
        m.patch_bytes as f64 / output_bytes as f64
    );
    assert!((m.patch_bytes as f64) <= 1.3 * output_bytes as f64);
    let data: String = out
        .iter()
        .filter_map(|p| p.terminal_output.as_ref())
        .map(|o| o.data.as_str())
        .collect();
    assert_eq!(data.len(), output_bytes);
    assert!(data.starts_with(&line(0)) && data.ends_with(&line(LINES - 1)));
    // The call shows its terminal, named in the first patch.
    assert_eq!(
        out[0].content,
        Some(vec![ToolCallContent::Terminal {
            terminal_id: ID.into()
        }])
    );
    assert!(
        out.iter()
            .filter_map(|p| p.terminal_output.as_ref())
            .all(|o| o.terminal_id == ID)
    );
    assert_eq!(out.last().unwrap().status, Some(ToolCallStatus::Completed));
}

#[test]
fn content_set_by_the_caller_replaces_the_output_item() {
    let mut t = tracker();
    let now = Instant::now();
    let p = t.append_output(&id(), "hello\n", now).unwrap().unwrap();
    let mut expected = edit_state().content;
    expected.push(ToolCallContent::text("hello\n"));
    assert_eq!(p.content, Some(expected));
    let p = t.append_output(&id(), "world\n", now).unwrap().unwrap();
    assert_eq!(
        p.content.unwrap().last(),
        Some(&ToolCallContent::text("hello\nworld\n"))
    );
    let fin = vec![ToolCallContent::text("exit 0")];
    let p = t
        .update(ToolCallPatch::new(ID).content(fin.clone()), now)
        .unwrap()
        .unwrap();
    assert_eq!(p.content, Some(fin.clone()));
    let p = t.append_output(&id(), "more\n", now).unwrap().unwrap();
    assert_eq!(
        p.content,
        Some(vec![
            fin[0].clone(),
            ToolCallContent::text("hello\nworld\nmore\n")
        ])
    );
}

/// A call with nothing to show yet (a command, an MCP tool).
fn bare_tracker(appended: bool) -> ToolCallTracker {
    let mut t = ToolCallTracker::new(TrackerConfig {
        appended_output: appended,
        ..TrackerConfig::default()
    });
    t.announce(ToolCallState::new(ID, "index", ToolKind::Other))
        .unwrap();
    t
}

#[test]
fn a_status_line_shows_until_the_next_one_or_the_output() {
    for appended in [false, true] {
        let mut t = bare_tracker(appended);
        let now = Instant::now();
        let p = t.status_line(&id(), "1/3 (33%): scanning", now).unwrap();
        assert_eq!(
            p.unwrap().content,
            Some(vec![ToolCallContent::text("1/3 (33%): scanning")])
        );
        let p = t.status_line(&id(), "2/3 (67%): indexing", now).unwrap();
        assert_eq!(
            p.unwrap().content,
            Some(vec![ToolCallContent::text("2/3 (67%): indexing")])
        );
        // The same line again changes nothing.
        assert_eq!(
            t.status_line(&id(), "2/3 (67%): indexing", now).unwrap(),
            None
        );
        // Output takes the line's place, and no later line hides it.
        let p = t.append_output(&id(), "done\n", now).unwrap().unwrap();
        let output = if appended {
            ToolCallContent::Terminal {
                terminal_id: ID.into(),
            }
        } else {
            ToolCallContent::text("done\n")
        };
        assert_eq!(p.content, Some(vec![output.clone()]));
        assert_eq!(t.status_line(&id(), "3/3 (100%)", now).unwrap(), None);
        assert_eq!(t.current(&id()).unwrap().content, vec![output]);
    }
}

#[test]
fn a_status_line_never_hides_content_the_caller_set() {
    let now = Instant::now();
    // The edit's diff stays.
    let mut t = tracker();
    assert_eq!(t.status_line(&id(), "applying", now).unwrap(), None);
    assert_eq!(t.current(&id()).unwrap().content, edit_state().content);
    // The final content replaces a line, and a later line is refused.
    let mut t = bare_tracker(false);
    t.status_line(&id(), "working", now).unwrap();
    let result = vec![ToolCallContent::text("42 files indexed")];
    let p = t
        .update(
            ToolCallPatch::new(ID)
                .status(ToolCallStatus::Completed)
                .content(result.clone()),
            now,
        )
        .unwrap()
        .unwrap();
    assert_eq!(p.content, Some(result));
    assert!(matches!(
        t.status_line(&id(), "late", now),
        Err(TrackerError::Finished { .. })
    ));
    // Content set while a line shows replaces it for good.
    let mut t = bare_tracker(false);
    t.status_line(&id(), "working", now).unwrap();
    let terminal = vec![ToolCallContent::Terminal {
        terminal_id: "term-1".into(),
    }];
    t.update(ToolCallPatch::new(ID).content(terminal.clone()), now)
        .unwrap();
    assert_eq!(t.status_line(&id(), "still working", now).unwrap(), None);
    assert_eq!(t.current(&id()).unwrap().content, terminal);
    assert!(matches!(
        t.status_line(&ToolCallId::from("nope"), "x", now),
        Err(TrackerError::Unknown(_))
    ));
}

#[derive(Debug, Clone)]
enum Op {
    Title(u8),
    Text(u8),
    Output(u8),
    Line(u8),
    Raw(Option<u8>),
    Status(u8),
    Wait(u16),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3).prop_map(Op::Title),
        (0u8..3).prop_map(Op::Text),
        (0u8..3).prop_map(Op::Output),
        (0u8..3).prop_map(Op::Line),
        proptest::option::of(0u8..3).prop_map(Op::Raw),
        (0u8..4).prop_map(Op::Status),
        (0u16..120).prop_map(Op::Wait),
        Just(Op::Flush),
    ]
}

proptest! {
    /// Whatever the changes, their timing and the mode: the announced
    /// state plus every emitted patch, applied in order, is what the
    /// tracker ends on; no patch is empty; every accepted final status is
    /// sent.
    #[test]
    fn patches_rebuild_the_sent_state(
        ops in proptest::collection::vec(op(), 0..60),
        coalesce: bool,
        appended: bool,
        complete: bool,
        bare: bool,
    ) {
        let config = TrackerConfig {
            coalesce,
            appended_output: appended,
            complete_objects: complete,
            output_limit: 64,
            ..TrackerConfig::default()
        };
        let mut t = ToolCallTracker::new(config);
        // A bare call lets status lines show; an edit's diff hides them.
        let announced = if bare {
            ToolCallState::new(ID, "index", ToolKind::Other)
        } else {
            edit_state()
        };
        let mut client = t.announce(announced).unwrap();
        let mut now = Instant::now();
        let mut patches = Vec::new();
        let mut last_status = client.status;
        for op in ops {
            let patch = ToolCallPatch::new(ID);
            let result = match op {
                Op::Title(n) => t.update(patch.title(format!("t{n}")), now),
                Op::Text(n) => t.update(patch.content(vec![ToolCallContent::text(format!("c{n}"))]), now),
                Op::Output(n) => t.append_output(&id(), &format!("out {n}\n").repeat(usize::from(n) * 5), now),
                Op::Line(n) => t.status_line(&id(), &format!("line {n}"), now),
                Op::Raw(n) => t.update(patch.raw_output(n.map_or(Value::Null, |n| json!({"n": n}))), now),
                Op::Status(n) => {
                    let s = [ToolCallStatus::Pending, ToolCallStatus::InProgress, ToolCallStatus::Completed, ToolCallStatus::Failed][usize::from(n)];
                    let r = t.update(patch.status(s), now);
                    if r.is_ok() { last_status = s; }
                    r
                }
                Op::Wait(d) => { now += ms(u64::from(d)); Ok(None) }
                Op::Flush => Ok(t.flush(&id(), now).unwrap()),
            };
            match result {
                Ok(p) => patches.extend(p),
                Err(TrackerError::StatusBackwards { .. } | TrackerError::Finished { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
            patches.extend(t.due(now));
        }
        patches.extend(t.flush_all(now));
        for p in &patches {
            prop_assert!(!p.is_empty());
            p.apply_to(&mut client);
        }
        match t.last_sent(&id()) {
            Some(sent) => prop_assert_eq!(&client, sent),
            None => prop_assert_eq!(t.finished(&id()), Some(client.status)),
        }
        prop_assert_eq!(client.status, last_status);
        prop_assert!(!t.has_pending());
    }
}
