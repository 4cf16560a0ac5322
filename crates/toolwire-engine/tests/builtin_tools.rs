#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The built-in tools against real directories.

mod support;

use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::mpsc;
use toolwire_core::{Progress, ToolCallId};
use toolwire_tools::builtin::{self, Workspace};
use toolwire_tools::{ProgressHandle, Tool, ToolContext, ToolError, ToolOutput};

struct Fixture {
    root: TempDir,
    outside: TempDir,
    workspace: Arc<Workspace>,
}

impl Fixture {
    fn new() -> Fixture {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret\n").unwrap();
        let workspace = Arc::new(Workspace::new(root.path()).unwrap());
        Fixture {
            root,
            outside,
            workspace,
        }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.workspace.root().join(rel)
    }

    fn write(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap()
    }

    fn tool(&self, name: &str) -> Arc<dyn Tool> {
        builtin::all(self.workspace.clone(), support::sandbox())
            .into_iter()
            .find(|t| t.spec().name == name)
            .unwrap()
    }

    async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, ToolError> {
        self.tool(name)
            .call(args, ToolContext::detached("call"))
            .await
    }

    async fn ok(&self, name: &str, args: Value) -> String {
        let out = self.call(name, args).await.unwrap();
        assert!(!out.is_error, "{}", out.content);
        out.content
    }

    async fn err(&self, name: &str, args: Value) -> String {
        self.call(name, args).await.unwrap_err().to_string()
    }
}

fn refused(result: Result<std::path::PathBuf, ToolError>) -> String {
    match result {
        Err(ToolError::Refused(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn with_progress() -> (ToolContext, mpsc::Receiver<(ToolCallId, Progress)>) {
    let (tx, rx) = mpsc::channel(1024);
    let mut ctx = ToolContext::detached("call");
    ctx.progress = ProgressHandle::new(ctx.call_id.clone(), tx);
    (ctx, rx)
}

fn drain(rx: &mut mpsc::Receiver<(ToolCallId, Progress)>) -> Vec<Progress> {
    let mut all = Vec::new();
    while let Ok((_, p)) = rx.try_recv() {
        all.push(p);
    }
    all
}

// ---------------------------------------------------------------- sandbox

#[test]
fn sandbox_refuses_paths_that_leave_the_root() {
    let f = Fixture::new();
    let ws = &f.workspace;
    std::fs::create_dir(f.path("a")).unwrap();
    assert_eq!(
        refused(ws.resolve("../x")),
        "`../x` is outside the workspace root"
    );
    assert_eq!(
        refused(ws.resolve("/etc/passwd")),
        "`/etc/passwd` is outside the workspace root"
    );
    assert_eq!(
        refused(ws.resolve("a/../../x")),
        "`a/../../x` is outside the workspace root"
    );
    assert_eq!(refused(ws.resolve("")), "the path is empty");
    assert!(refused(ws.resolve("a\0b")).contains("NUL byte"));
}

#[test]
fn sandbox_refuses_symlinks_that_escape() {
    let f = Fixture::new();
    let ws = &f.workspace;
    let secret = f.outside.path().join("secret.txt");
    symlink(&secret, f.path("to_file")).unwrap();
    symlink(f.outside.path(), f.path("to_dir")).unwrap();
    std::fs::create_dir(f.path("sub")).unwrap();
    symlink(f.outside.path(), f.path("sub/parent")).unwrap();

    let message = refused(ws.resolve("to_file"));
    assert!(
        message.starts_with("`to_file` leads through a symbolic link to `"),
        "{message}"
    );
    assert!(message.ends_with("outside the workspace root"), "{message}");
    assert!(refused(ws.resolve("to_dir")).contains("symbolic link"));
    assert!(refused(ws.resolve("to_dir/secret.txt")).contains("outside the workspace root"));
    // A file that does not exist yet, under a symlinked parent.
    assert!(refused(ws.resolve("sub/parent/new/deeper.txt")).contains("symbolic link"));
    // An absolute path spelled through the symlink is judged by where it leads.
    let absolute = f.path("to_dir/secret.txt");
    assert!(refused(ws.resolve(absolute.to_str().unwrap())).contains("outside"));
}

#[test]
fn sandbox_allows_nested_paths_and_symlinks_inside_the_root() {
    let f = Fixture::new();
    let ws = &f.workspace;
    f.write("a/b/c.txt", "c");
    symlink(f.path("a/b"), f.path("link_b")).unwrap();
    symlink("a/b/c.txt", f.path("link_c")).unwrap();

    assert_eq!(ws.resolve("a/b/c.txt").unwrap(), f.path("a/b/c.txt"));
    assert_eq!(ws.resolve("./a/../a/b/c.txt").unwrap(), f.path("a/b/c.txt"));
    assert_eq!(
        ws.resolve("a/new/dir/file.rs").unwrap(),
        f.path("a/new/dir/file.rs")
    );
    assert_eq!(ws.resolve("link_b/c.txt").unwrap(), f.path("a/b/c.txt"));
    assert_eq!(ws.resolve("link_b/new.txt").unwrap(), f.path("a/b/new.txt"));
    assert_eq!(ws.resolve("link_c").unwrap(), f.path("a/b/c.txt"));
    assert_eq!(ws.resolve(".").unwrap(), ws.root());
    let absolute = f.path("a/b/c.txt");
    assert_eq!(ws.resolve(absolute.to_str().unwrap()).unwrap(), absolute);
    // The root given through a symlink still works.
    let alias_dir = tempfile::tempdir().unwrap();
    let alias = alias_dir.path().join("alias");
    symlink(f.root.path(), &alias).unwrap();
    let via_alias = Workspace::new(&alias).unwrap();
    assert_eq!(via_alias.root(), ws.root());
    let through_alias = alias.join("a/b/c.txt");
    assert_eq!(
        via_alias.resolve(through_alias.to_str().unwrap()).unwrap(),
        f.path("a/b/c.txt")
    );
}

#[tokio::test]
async fn writing_through_an_escaping_symlink_is_refused() {
    let f = Fixture::new();
    let secret = f.outside.path().join("secret.txt");
    symlink(&secret, f.path("to_file")).unwrap();
    symlink(f.outside.path().join("new.txt"), f.path("dangling")).unwrap();
    symlink(f.outside.path(), f.path("to_dir")).unwrap();

    let e = f
        .err("write_file", json!({"path": "to_file", "content": "pwned"}))
        .await;
    assert!(e.contains("outside the workspace root"), "{e}");
    let e = f
        .err(
            "write_file",
            json!({"path": "dangling", "content": "pwned"}),
        )
        .await;
    assert!(e.contains("whose target does not exist"), "{e}");
    let e = f
        .err(
            "write_file",
            json!({"path": "to_dir/x/y.txt", "content": "pwned"}),
        )
        .await;
    assert!(e.contains("symbolic link"), "{e}");
    let e = f
        .err(
            "apply_diff",
            json!({"path": "to_file", "diff": "@@ -1 +1 @@\n-secret\n+pwned\n"}),
        )
        .await;
    assert!(e.contains("outside the workspace root"), "{e}");

    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret\n");
    assert!(!f.outside.path().join("new.txt").exists());
    assert!(!f.outside.path().join("x").exists());
}

// ---------------------------------------------------------------- read_file

#[tokio::test]
async fn read_file_returns_text_and_windows() {
    let f = Fixture::new();
    let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    f.write("src/lib.rs", &text);

    assert_eq!(f.ok("read_file", json!({"path": "src/lib.rs"})).await, text);
    let window = f
        .ok(
            "read_file",
            json!({"path": "src/lib.rs", "offset": 3, "limit": 2}),
        )
        .await;
    assert_eq!(
        window,
        "line 3\nline 4\n[showing lines 3-4 of `src/lib.rs`; more lines follow, call again with offset=5]"
    );
    let end = f
        .ok(
            "read_file",
            json!({"path": "src/lib.rs", "offset": 9, "limit": 5}),
        )
        .await;
    assert_eq!(end, "line 9\nline 10\n");
    let e = f
        .err("read_file", json!({"path": "src/lib.rs", "offset": 11}))
        .await;
    assert!(
        e.contains("past the end of `src/lib.rs`, which has 10 lines"),
        "{e}"
    );
}

#[tokio::test]
async fn read_file_reports_its_location() {
    let f = Fixture::new();
    f.write("a.txt", "a\n");
    let (ctx, mut rx) = with_progress();
    f.tool("read_file")
        .call(json!({"path": "a.txt"}), ctx)
        .await
        .unwrap();
    let progress = drain(&mut rx);
    let Progress::Locations { locations } = &progress[0] else {
        panic!("{progress:?}")
    };
    assert_eq!(locations[0].path, f.path("a.txt").display().to_string());
}

#[tokio::test]
async fn read_file_caps_large_files() {
    let f = Fixture::new();
    let line = "x".repeat(99) + "\n";
    f.write("big.txt", &line.repeat(5000)); // ~500 KB
    let out = f.ok("read_file", json!({"path": "big.txt"})).await;
    assert!(out.len() < 256 * 1024 + 200);
    assert!(out.contains("[truncated: output is capped at 256 KiB and was cut in line 2622; call again with offset=2622"), "{}", &out[out.len() - 200..]);
}

#[tokio::test]
async fn read_file_refuses_binary_directories_and_bad_arguments() {
    let f = Fixture::new();
    std::fs::write(f.path("blob.bin"), [0u8, 159, 146, 150, 1, 2]).unwrap();
    std::fs::write(f.path("latin1.txt"), b"caf\xe9\n").unwrap();
    std::fs::create_dir(f.path("dir")).unwrap();

    let e = f.err("read_file", json!({"path": "blob.bin"})).await;
    assert_eq!(
        e,
        "`blob.bin` is not UTF-8 text (binary file?); read_file only returns text"
    );
    let e = f.err("read_file", json!({"path": "latin1.txt"})).await;
    assert!(e.contains("not UTF-8 text"), "{e}");
    let e = f.err("read_file", json!({"path": "dir"})).await;
    assert!(e.contains("is a directory"), "{e}");
    let e = f.err("read_file", json!({"path": "missing.txt"})).await;
    assert!(e.starts_with("I/O error on missing.txt:"), "{e}");
    match f.call("read_file", json!({"path": "a", "lines": 3})).await {
        Err(ToolError::InvalidArguments(m)) => assert!(m.contains("unknown field `lines`"), "{m}"),
        other => panic!("{other:?}"),
    }
    match f.call("read_file", json!({})).await {
        Err(ToolError::InvalidArguments(m)) => assert!(m.contains("missing field `path`"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn read_file_returns_images_by_their_first_bytes() {
    let f = Fixture::new();
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR rest of a png".to_vec();
    // Named as text: the bytes decide.
    std::fs::write(f.path("shot.txt"), &png).unwrap();
    let out = f
        .call("read_file", json!({"path": "shot.txt"}))
        .await
        .unwrap();
    assert!(!out.is_error);
    assert_eq!(out.content, "`shot.txt`: image/png image, 30 B");
    assert_eq!(out.images.len(), 1);
    assert_eq!(out.images[0].media_type(), "image/png");
    assert_eq!(out.images[0].bytes(), png.as_slice());

    let webp = b"RIFF\x10\0\0\0WEBPVP8 data".to_vec();
    std::fs::write(f.path("a.webp"), &webp).unwrap();
    let out = f
        .call("read_file", json!({"path": "a.webp"}))
        .await
        .unwrap();
    assert_eq!(out.images[0].media_type(), "image/webp");

    // Over the limit: refused, naming the size and the limit.
    let mut big = vec![0xff, 0xd8, 0xff, 0xe0];
    big.resize(toolwire_core::MAX_IMAGE_BYTES + 10, 0);
    std::fs::write(f.path("big.jpg"), &big).unwrap();
    let e = f.err("read_file", json!({"path": "big.jpg"})).await;
    assert!(
        e.contains("`big.jpg`: the image is 5.0 MB (5242890 bytes), over the limit of 5.0 MB"),
        "{e}"
    );
}

// ---------------------------------------------------------------- write_file

#[tokio::test]
async fn write_file_creates_parents_and_replaces_atomically() {
    let f = Fixture::new();
    let out = f
        .ok(
            "write_file",
            json!({"path": "a/b/c.txt", "content": "héllo\n"}),
        )
        .await;
    assert_eq!(out, "created `a/b/c.txt`: wrote 7 bytes");
    assert_eq!(f.read("a/b/c.txt"), "héllo\n");

    let out = f
        .ok("write_file", json!({"path": "a/b/c.txt", "content": "bye"}))
        .await;
    assert_eq!(out, "overwrote `a/b/c.txt`: wrote 3 bytes");
    assert_eq!(f.read("a/b/c.txt"), "bye");
    let names: Vec<_> = std::fs::read_dir(f.path("a/b"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["c.txt"], "no temporary file is left behind");

    let e = f
        .err("write_file", json!({"path": "a", "content": "x"}))
        .await;
    assert_eq!(e, "`a` is a directory");
    let e = f
        .err(
            "write_file",
            json!({"path": "../escape.txt", "content": "x"}),
        )
        .await;
    assert_eq!(e, "`../escape.txt` is outside the workspace root");
}

#[tokio::test]
async fn write_file_keeps_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    f.write("run.sh", "#!/bin/sh\n");
    std::fs::set_permissions(f.path("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    f.ok(
        "write_file",
        json!({"path": "run.sh", "content": "#!/bin/sh\necho hi\n"}),
    )
    .await;
    let mode = std::fs::metadata(f.path("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
}

// ---------------------------------------------------------------- apply_diff

const NUMBERS: &str = "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n";

#[tokio::test]
async fn apply_diff_applies_a_hunk_at_an_offset() {
    let f = Fixture::new();
    f.write("n.txt", NUMBERS);
    // Says line 2, but the context is at line 6.
    let diff = "--- a/n.txt\n+++ b/n.txt\n@@ -2,3 +2,3 @@\n six\n-seven\n+SEVEN\n eight\n";
    let out = f
        .ok("apply_diff", json!({"path": "n.txt", "diff": diff}))
        .await;
    assert_eq!(
        out,
        "applied 1 hunk to `n.txt`; hunk 1 at line 6 (offset +4)"
    );
    assert_eq!(f.read("n.txt"), NUMBERS.replace("seven", "SEVEN"));
}

#[tokio::test]
async fn apply_diff_applies_several_hunks() {
    let f = Fixture::new();
    f.write("n.txt", NUMBERS);
    let diff =
        "@@ -1,2 +1,3 @@\n one\n+one and a half\n two\n@@ -8,3 +9,2 @@\n eight\n-nine\n ten\n";
    let out = f
        .ok("apply_diff", json!({"path": "n.txt", "diff": diff}))
        .await;
    assert_eq!(out, "applied 2 hunks to `n.txt`");
    assert_eq!(
        f.read("n.txt"),
        "one\none and a half\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nten\n"
    );
}

#[tokio::test]
async fn apply_diff_writes_nothing_when_a_hunk_does_not_apply() {
    let f = Fixture::new();
    f.write("n.txt", NUMBERS);
    // The first hunk is fine; the second one's context is wrong.
    let diff = "@@ -1,2 +1,2 @@\n-one\n+ONE\n two\n@@ -5,3 +5,3 @@\n five\n-SIX\n+6\n seven\n";
    let e = f
        .err("apply_diff", json!({"path": "n.txt", "diff": diff}))
        .await;
    assert_eq!(
        e,
        "`n.txt` unchanged: hunk 2 (`@@ -5,3 +5,3 @@`) does not apply: its context and removed \
         lines were not found anywhere in the file; at line 6 expected `SIX` but found `six`"
    );
    assert_eq!(f.read("n.txt"), NUMBERS);
}

#[tokio::test]
async fn apply_diff_creates_a_file_from_dev_null() {
    let f = Fixture::new();
    let diff = "--- /dev/null\n+++ b/src/new.rs\n@@ -0,0 +1,2 @@\n+fn main() {}\n+// end\n";
    f.ok("apply_diff", json!({"path": "src/new.rs", "diff": diff}))
        .await;
    assert_eq!(f.read("src/new.rs"), "fn main() {}\n// end\n");
    let e = f
        .err("apply_diff", json!({"path": "src/new.rs", "diff": diff}))
        .await;
    assert!(e.contains("already exists"), "{e}");
}

#[tokio::test]
async fn apply_diff_rejects_malformed_diffs_and_missing_files() {
    let f = Fixture::new();
    f.write("n.txt", NUMBERS);
    match f
        .call("apply_diff", json!({"path": "n.txt", "diff": "just words"}))
        .await
    {
        Err(ToolError::InvalidArguments(m)) => assert!(m.contains("no hunks"), "{m}"),
        other => panic!("{other:?}"),
    }
    let e = f
        .err(
            "apply_diff",
            json!({"path": "nope.txt", "diff": "@@ -1 +1 @@\n-a\n+b\n"}),
        )
        .await;
    assert!(e.starts_with("I/O error on nope.txt"), "{e}");
}

// ---------------------------------------------------------------- list_dir

#[tokio::test]
async fn list_dir_lists_sorted_entries() {
    let f = Fixture::new();
    f.write("b.txt", "");
    f.write("a/x.rs", "");
    f.write("a/y/z.rs", "");
    f.write("target/debug/huge", "");
    f.write(".git/HEAD", "");
    symlink("a", f.path("link")).unwrap();

    let flat = f.ok("list_dir", json!({})).await;
    assert_eq!(flat, ".git/\na/\nb.txt\nlink@\ntarget/");
    let deep = f.ok("list_dir", json!({"recursive": true})).await;
    assert_eq!(
        deep,
        ".git/\na/\na/x.rs\na/y/\na/y/z.rs\nb.txt\nlink@\ntarget/"
    );
    let sub = f
        .ok("list_dir", json!({"path": "a", "recursive": true}))
        .await;
    assert_eq!(sub, "x.rs\ny/\ny/z.rs");
    let cut = f
        .ok("list_dir", json!({"recursive": true, "max_entries": 3}))
        .await;
    assert_eq!(
        cut,
        ".git/\na/\na/x.rs\n[truncated after 3 entries; list a subdirectory or raise max_entries]"
    );
}

#[tokio::test]
async fn list_dir_errors() {
    let f = Fixture::new();
    f.write("file.txt", "");
    let e = f.err("list_dir", json!({"path": "file.txt"})).await;
    assert!(e.contains("is not a directory"), "{e}");
    let e = f.err("list_dir", json!({"path": ".."})).await;
    assert_eq!(e, "`..` is outside the workspace root");
    let e = f.err("list_dir", json!({"path": "missing"})).await;
    assert!(e.starts_with("I/O error on missing"), "{e}");
}

// ---------------------------------------------------------------- search

#[tokio::test]
async fn search_finds_lines_and_reports_locations() {
    let f = Fixture::new();
    f.write(
        "src/main.rs",
        "fn main() {\n    helper();\n}\nfn helper() {}\n",
    );
    f.write("src/notes.md", "helper docs\n");
    f.write("ignored/gen.rs", "fn helper() {}\n");
    f.write(".gitignore", "ignored/\n");
    std::fs::write(f.path("src/blob.bin"), b"helper\0\x01").unwrap();

    let (ctx, mut rx) = with_progress();
    let out = f
        .tool("search")
        .call(json!({"pattern": r"helper\(\)", "glob": "*.rs"}), ctx)
        .await
        .unwrap();
    assert_eq!(
        out.content,
        "src/main.rs:2:     helper();\nsrc/main.rs:4: fn helper() {}"
    );
    let progress = drain(&mut rx);
    let Some(Progress::Locations { locations }) = progress.last() else {
        panic!("{progress:?}")
    };
    assert_eq!(locations.len(), 2);
    assert_eq!(locations[1].line, Some(4));

    let all = f
        .ok("search", json!({"pattern": "helper", "path": "src"}))
        .await;
    assert_eq!(
        all,
        "src/main.rs:2:     helper();\nsrc/main.rs:4: fn helper() {}\nsrc/notes.md:1: helper docs"
    );
    let none = f.ok("search", json!({"pattern": "nothing here"})).await;
    assert_eq!(none, "no matches for `nothing here`");
}

#[tokio::test]
async fn search_caps_results_and_rejects_bad_patterns() {
    let f = Fixture::new();
    f.write("many.txt", &"hit\n".repeat(50));
    let out = f
        .ok("search", json!({"pattern": "hit", "max_results": 3}))
        .await;
    assert!(
        out.starts_with(
            "many.txt:1: hit\nmany.txt:2: hit\nmany.txt:3: hit\n[stopped after 3 matches"
        ),
        "{out}"
    );
    match f.call("search", json!({"pattern": "(unclosed"})).await {
        Err(ToolError::InvalidArguments(m)) => assert!(m.starts_with("bad pattern:"), "{m}"),
        other => panic!("{other:?}"),
    }
    let e = f
        .err("search", json!({"pattern": "x", "path": "/etc"}))
        .await;
    assert_eq!(e, "`/etc` is outside the workspace root");
}

// ---------------------------------------------------------------- run_command

#[tokio::test]
async fn run_command_reports_exit_codes_and_output() {
    let f = Fixture::new();
    f.write("sub/marker", "");
    let out = f
        .call(
            "run_command",
            json!({"command": "echo hello; ls", "cwd": "sub"}),
        )
        .await
        .unwrap();
    assert!(!out.is_error);
    assert_eq!(out.content, "hello\nmarker\n[exit code: 0]");

    let out = f
        .call("run_command", json!({"command": "echo oops >&2; exit 3"}))
        .await
        .unwrap();
    assert!(
        out.is_error,
        "a non-zero exit is a failed result, not a tool error"
    );
    assert_eq!(out.content, "oops\n[exit code: 3]");

    let e = f
        .err("run_command", json!({"command": "true", "cwd": "../"}))
        .await;
    assert_eq!(e, "`../` is outside the workspace root");
    match f
        .call("run_command", json!({"command": "true", "timeout_secs": 0}))
        .await
    {
        Err(ToolError::InvalidArguments(m)) => assert!(m.contains("between 1 and 3600"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn run_command_streams_output_while_running() {
    let f = Fixture::new();
    let (ctx, mut rx) = with_progress();
    let tool = f.tool("run_command");
    let run = tokio::spawn(async move {
        tool.call(
            json!({"command": "echo first; sleep 0.5; echo second >&2"}),
            ctx,
        )
        .await
    });
    // "first" arrives before the command ends: alone, while the call still
    // runs, and half a second before "second" is printed.
    let mut seen = String::new();
    while !seen.contains("first") {
        let (_, progress) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        if let Progress::Output { text } = progress {
            seen.push_str(&text);
        }
    }
    assert!(!run.is_finished());
    assert_eq!(seen, "first\n", "only what was printed before the sleep");
    let out = run.await.unwrap().unwrap();
    for progress in drain(&mut rx) {
        if let Progress::Output { text } = progress {
            seen.push_str(&text);
        }
    }
    assert_eq!(seen, "first\nsecond\n");
    assert_eq!(out.content, "first\nsecond\n[exit code: 0]");
}

#[tokio::test]
async fn run_command_times_out_and_kills() {
    let f = Fixture::new();
    let marker = support::marker();
    // A hang guard only: the command would take 30 s, the timeout is 1 s.
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        f.call(
            "run_command",
            json!({"command": format!("sleep {marker}; touch late"), "timeout_secs": 1}),
        ),
    )
    .await
    .expect("the call ended at its timeout, not with the command");
    assert!(matches!(result, Err(ToolError::TimedOut(1))), "{result:?}");
    assert!(support::none_with(marker).await, "the command was killed");
    assert!(!f.path("late").exists());
}

#[tokio::test]
async fn cancelling_kills_the_whole_process_group() {
    let f = Fixture::new();
    let (ctx, mut rx) = with_progress();
    let cancel = ctx.cancel.clone();
    let tool = f.tool("run_command");
    let marker = support::marker();
    let run = tokio::spawn(async move {
        tool.call(
            json!({"command": format!("(sleep 1 && touch marker) & sleep {marker} & echo started; wait")}),
            ctx,
        )
        .await
    });
    let mut output = String::new();
    while !output.ends_with('\n') {
        let (_, progress) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        if let Progress::Output { text } = progress {
            output.push_str(&text);
        }
    }
    assert!(support::some_with(marker).await, "the child runs");
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(result, Err(ToolError::Cancelled)), "{result:?}");

    let left = support::running_with(marker);
    assert!(
        left.is_empty(),
        "background child {left:?} survived the cancel"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!f.path("marker").exists(), "the child ran to completion");
}

#[tokio::test]
async fn background_processes_do_not_outlive_the_command() {
    let f = Fixture::new();
    let marker = support::marker();
    // Ended with the shell, not after it: the call does not wait for them
    // (the background `sleep` would never end; the guard only catches that).
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        f.call(
            "run_command",
            json!({"command": format!("sleep {marker} & echo started")}),
        ),
    )
    .await
    .expect("the call ended with its shell")
    .unwrap();
    assert!(out.content.starts_with("started\n"), "{}", out.content);
    let left = support::running_with(marker);
    assert!(left.is_empty(), "{left:?} outlived the command");
}

// ---------------------------------------------------------------- registry

#[test]
fn all_returns_every_tool_with_a_schema() {
    let f = Fixture::new();
    let tools = builtin::all(f.workspace.clone(), support::sandbox());
    let names: Vec<_> = tools
        .iter()
        .map(|t| (t.spec().name.clone(), t.spec().read_only))
        .collect();
    assert_eq!(
        names,
        [
            ("read_file".to_owned(), true),
            ("write_file".to_owned(), false),
            ("apply_diff".to_owned(), false),
            ("list_dir".to_owned(), true),
            ("search".to_owned(), true),
            ("run_command".to_owned(), false),
            ("task_status".to_owned(), true),
            ("update_plan".to_owned(), true),
        ]
    );
    for tool in &tools {
        let spec = tool.spec();
        assert_eq!(spec.parameters["type"], "object", "{}", spec.name);
        assert_eq!(
            spec.parameters["additionalProperties"], false,
            "{}",
            spec.name
        );
        assert!(!spec.description.is_empty());
    }
}

#[test]
fn workspace_root_must_be_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "").unwrap();
    assert!(
        Workspace::new(&file)
            .unwrap_err()
            .to_string()
            .contains("is not a directory")
    );
    assert!(Workspace::new(dir.path().join("missing")).is_err());
}

/// A second root (an editor's other folder of the project): reached by
/// absolute path, read, written, listed and searched beneath its own
/// directory; shown absolute; a symlink out of it and everything outside
/// both roots are still refused.
#[tokio::test]
async fn an_additional_root_is_in_reach_and_nothing_beyond_it() {
    let f = Fixture::new();
    let other = tempfile::tempdir().unwrap();
    let other_root = std::fs::canonicalize(other.path()).unwrap();
    std::fs::write(other_root.join("notes.txt"), "one\ntwo needle\n").unwrap();
    symlink(f.outside.path().join("secret.txt"), other_root.join("leak")).unwrap();
    let workspace = Workspace::new(f.root.path())
        .unwrap()
        .with_additional_roots(&[other.path().to_path_buf(), f.root.path().to_path_buf()])
        .unwrap();
    // The main root again is left out: two roots.
    assert_eq!(workspace.roots().count(), 2);
    let f = Fixture {
        workspace: Arc::new(workspace),
        ..f
    };
    let notes = other_root.join("notes.txt");
    let notes = notes.to_str().unwrap();
    let read = f.ok("read_file", json!({"path": notes})).await;
    assert!(read.contains("two needle"), "{read}");
    let new = other_root.join("sub/new.txt");
    f.ok(
        "write_file",
        json!({"path": new.to_str().unwrap(), "content": "made\n"}),
    )
    .await;
    assert_eq!(std::fs::read_to_string(&new).unwrap(), "made\n");
    let listed = f
        .ok("list_dir", json!({"path": other_root.to_str().unwrap()}))
        .await;
    assert!(listed.contains("notes.txt"), "{listed}");
    let found = f
        .ok(
            "search",
            json!({"pattern": "needle", "path": other_root.to_str().unwrap()}),
        )
        .await;
    // Shown absolute: it is not under the working directory.
    assert!(found.contains(&format!("{notes}:2")), "{found}");
    // Relative paths stay the main root's.
    f.write("here.txt", "main\n");
    assert!(
        f.ok("read_file", json!({"path": "here.txt"}))
            .await
            .contains("main")
    );
    // Out of the second root through a symlink, or outside both: refused.
    let leak = other_root.join("leak");
    let e = f
        .err("read_file", json!({"path": leak.to_str().unwrap()}))
        .await;
    assert!(e.contains("outside the workspace root"), "{e}");
    let secret = f.outside.path().join("secret.txt");
    let e = f
        .err("read_file", json!({"path": secret.to_str().unwrap()}))
        .await;
    assert!(e.contains("outside the workspace root"), "{e}");
    // An additional root that is not an absolute directory is refused.
    let e = Workspace::new(f.root.path())
        .unwrap()
        .with_additional_roots(&["relative/dir".into()])
        .unwrap_err();
    assert!(e.to_string().contains("not an absolute path"), "{e}");
}
