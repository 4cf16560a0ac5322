//! What race-free resolution costs: `read_file` on a small file four
//! directories down, as the tool does it now (the name check, then
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the root's fd,
//! `O_PATH` first and the type checked, reading on the bounded pool),
//! against what it did before (the same name check, then `metadata` and
//! `open` by path on tokio's pool), and the name check alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::runtime::Runtime;
use toolwire_tools::builtin::{ReadFile, Workspace};
use toolwire_tools::{Tool, ToolContext};

const PATH: &str = "src/a/b/c/small.rs";

fn file_open(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src/a/b/c")).unwrap();
    std::fs::write(dir.path().join(PATH), "fn main() {}\n".repeat(20)).unwrap();
    let workspace = Arc::new(Workspace::new(dir.path()).unwrap());
    let tool = ReadFile::new(workspace.clone());

    let mut group = c.benchmark_group("read_file_small_nested");
    group.bench_function("new_beneath_fd", |b| {
        b.iter(|| {
            rt.block_on(async {
                let out = tool
                    .call(json!({"path": PATH}), ToolContext::detached("bench"))
                    .await
                    .unwrap();
                assert!(out.content.len() > 200);
            })
        })
    });
    group.bench_function("old_by_path", |b| {
        b.iter(|| {
            rt.block_on(async {
                let path = workspace.resolve(PATH).unwrap();
                let meta = tokio::fs::metadata(&path).await.unwrap();
                assert!(!meta.is_dir());
                let mut file = tokio::fs::File::open(&path).await.unwrap();
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).await.unwrap();
                let text = String::from_utf8(bytes).unwrap();
                assert!(text.len() > 200);
            })
        })
    });
    group.bench_function("name_check_only", |b| {
        b.iter(|| workspace.resolve(PATH).unwrap())
    });
    group.finish();
}

criterion_group!(benches, file_open);
criterion_main!(benches);
