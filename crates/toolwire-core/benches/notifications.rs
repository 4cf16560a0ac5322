//! Notifications: draining and formatting 10,000 queued notifications
//! (target: under 5 ms), and a storm of 1,000,000 events a minute (the
//! queue stays capped; the figure is the time to take them all).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use toolwire_core::{FileChange, Incoming, NotificationQueue, NotifyConfig, Priority};

/// 10,000 lines waiting (no coalescing, no rate limit), and a cap that
/// shows them all in one block.
fn ten_thousand() -> NotificationQueue {
    let config = NotifyConfig {
        max_lines: 10_000,
        max_queued: 10_000,
        burst: 1_000_000,
        coalesce_window: Duration::ZERO,
        ..NotifyConfig::default()
    };
    let mut q = NotificationQueue::new(config);
    let t = Instant::now();
    for i in 0..10_000u64 {
        let priority = [Priority::Low, Priority::Normal, Priority::High][(i % 3) as usize];
        q.push(
            Incoming::text(
                format!("task{i}"),
                priority,
                format!("task {i} finished (exit 0)"),
            ),
            t,
        );
    }
    assert_eq!(q.len(), 10_000);
    q
}

fn drain_and_format(c: &mut Criterion) {
    c.bench_function("drain and format 10,000 notifications", |b| {
        b.iter_batched(
            ten_thousand,
            |mut q| {
                let batch = q.drain().unwrap();
                black_box(batch.format())
            },
            BatchSize::LargeInput,
        )
    });
}

fn storm(c: &mut Criterion) {
    let mut group = c.benchmark_group("storm");
    group.sample_size(10);
    group.bench_function("1,000,000 file events in a minute", |b| {
        b.iter(|| {
            let mut q = NotificationQueue::new(NotifyConfig::default());
            let t = Instant::now();
            for i in 0..1_000_000u64 {
                q.push(
                    Incoming::file(
                        format!("s{}", i % 1_000),
                        format!("src/f{i}.rs"),
                        FileChange::Modified,
                    ),
                    t + Duration::from_micros(i * 60),
                );
            }
            assert!(q.len() <= NotifyConfig::default().max_queued);
            black_box(q.drain())
        })
    });
    group.finish();
}

criterion_group!(benches, drain_and_format, storm);
criterion_main!(benches);
