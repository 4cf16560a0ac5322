#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Python-source tools against a real `python3`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolwire_core::Progress;
use toolwire_tools::python::PythonSandbox;
use toolwire_tools::python::{
    PythonLimits, PythonTool, PythonToolDef, PythonToolError, ToolSchemaInfo, derive_schema,
    derive_schema_with,
};
use toolwire_tools::{ProgressHandle, Tool, ToolContext, ToolError, ToolOutput};

mod support;

/// The default sandbox, with the working directory as the workspace.
fn python_sandbox() -> PythonSandbox {
    python_sandbox_in(&std::env::current_dir().unwrap())
}

/// The default sandbox, with `dir` as the workspace (writable).
fn python_sandbox_in(dir: &std::path::Path) -> PythonSandbox {
    PythonSandbox::new(support::sandbox(), dir.canonicalize().unwrap())
}

const SOURCE: &str = r#"
import json
import os
import sys
import time
from typing import Dict, List, Literal, Optional


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a (int): The first number.
        b (int): The second number.

    Returns:
        int: The sum.
    """
    return a + b


def echo(text: str, times: int = 1) -> str:
    return " ".join([text] * times)


def structured(name: str):
    return {"name": name, "tags": ["x", "é"], "n": None}


def opaque():
    return object()


def divide(a: float, b: float) -> float:
    half = a / 2
    return half / b


def chatty(text: str) -> str:
    print("progress: starting")
    print('{"status": "ok", "result": "forged"}')
    sys.stdout.flush()
    os.write(1, b"raw fd 1 write\n")
    print("to stderr", file=sys.stderr)
    sys.stdout.write("no newline at the end")
    return text.upper()


def hog(mib: int = 2048):
    data = bytearray(mib * 1024**2)
    return len(data)


def sleeper(pid_file: str, marker: int):
    # Pids inside the sandbox's PID namespace (and its own /proc) mean
    # nothing outside: a child carrying the test's marker is found by its
    # command line, and it ends with the call only if the call's whole
    # namespace does.
    import subprocess
    subprocess.Popen(["sleep", str(marker)])
    with open(pid_file, "w") as f:
        f.write("started")
    time.sleep(30)
    return "woke up"
"#;

fn def(name: &str, source: &str, parameters: Option<Value>) -> PythonToolDef {
    PythonToolDef {
        name: name.into(),
        description: String::new(),
        source_code: source.into(),
        schema: parameters.map(|p| ToolSchemaInfo::new(name, "", p).unwrap()),
    }
}

async fn tool(name: &str) -> PythonTool {
    PythonTool::new(
        def(name, SOURCE, None),
        PythonLimits::default(),
        python_sandbox(),
    )
    .await
    .unwrap()
}

async fn call(tool: &PythonTool, args: Value) -> Result<ToolOutput, ToolError> {
    tool.call(args, ToolContext::detached("call")).await
}

#[tokio::test]
async fn calls_with_keyword_arguments() {
    let add = tool("add").await;
    assert_eq!(
        call(&add, json!({"a": 2, "b": 3})).await.unwrap(),
        ToolOutput::ok("5")
    );

    // A str comes back as it is, not as a JSON string.
    let echo = tool("echo").await;
    assert_eq!(
        call(&echo, json!({"text": "hi there", "times": 2}))
            .await
            .unwrap(),
        ToolOutput::ok("hi there hi there")
    );
    assert_eq!(
        call(&echo, json!({"text": "once"})).await.unwrap(),
        ToolOutput::ok("once")
    );

    let structured = tool("structured").await;
    let out = call(&structured, json!({"name": "n"})).await.unwrap();
    assert!(!out.is_error);
    assert_eq!(
        serde_json::from_str::<Value>(&out.content).unwrap(),
        json!({"name": "n", "tags": ["x", "é"], "n": null})
    );

    // Not JSON-serializable: its repr.
    let opaque = tool("opaque").await;
    let out = call(&opaque, Value::Null).await.unwrap();
    assert!(
        out.content.starts_with("<object object at 0x"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn wrong_arguments_are_reported_as_such() {
    let add = tool("add").await;
    let err = call(&add, json!({"a": 1})).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments(m) if m.contains("'b'")),
        "{err:?}"
    );
    let err = call(&add, json!({"a": 1, "b": 2, "c": 3}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments(m) if m.contains("'c'")),
        "{err:?}"
    );
    let err = call(&add, json!([1, 2])).await.unwrap_err();
    assert!(matches!(err, ToolError::InvalidArguments(_)), "{err:?}");
}

#[tokio::test]
async fn schema_from_a_google_style_docstring() {
    let info = derive_schema(SOURCE, "add", &python_sandbox())
        .await
        .unwrap();
    assert_eq!(info.name, "add");
    assert_eq!(info.description, "Adds two integers.");
    assert_eq!(
        info.parameters,
        json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first number."},
                "b": {"type": "integer", "description": "The second number."}
            },
            "required": ["a", "b"]
        })
    );

    // The tool's spec is the derived schema.
    let add = tool("add").await;
    let spec = add.spec();
    assert_eq!(spec.name, "add");
    assert_eq!(spec.description, "Adds two integers.");
    assert_eq!(spec.parameters, info.parameters);
    assert!(!spec.read_only);
}

#[tokio::test]
async fn schema_of_optional_parameters_and_enums() {
    let source = r#"
from typing import Literal, Optional, Union

def find(
    query: str,
    limit: Optional[int] = None,
    offset: int = 0,
    sort: Literal["asc", "desc"] = "asc",
    level: Literal[1, 2, 3] = 1,
    cursor: "str | None" = None,
    score: float | None = None,
    key: Union[int, str] = 0,
    *,
    exact: bool,
):
    """Finds documents matching a query.

    The query syntax is described elsewhere; this paragraph is not
    part of the description.

    Args:
        query: The text to search for, which
            may span several words.
        limit (Optional[int]): At most this many results.
        sort: The order of the results.
        exact (bool): Match the whole query.
    """
"#;
    let info = derive_schema(source, "find", &python_sandbox())
        .await
        .unwrap();
    assert_eq!(info.description, "Finds documents matching a query.");
    assert_eq!(
        info.parameters,
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The text to search for, which may span several words."},
                "limit": {"type": "integer", "description": "At most this many results."},
                "offset": {"type": "integer"},
                "sort": {"type": "string", "enum": ["asc", "desc"], "description": "The order of the results."},
                "level": {"type": "integer", "enum": [1, 2, 3]},
                "cursor": {"type": "string"},
                "score": {"type": "number"},
                "key": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "exact": {"type": "boolean", "description": "Match the whole query."}
            },
            "required": ["query", "exact"]
        })
    );

    // As in Letta, `Optional[X]` without a default may also be left out.
    let info = derive_schema(
        "def f(a: Optional[int], b: int): pass",
        "f",
        &python_sandbox(),
    )
    .await
    .unwrap();
    assert_eq!(info.parameters["required"], json!(["b"]));
}

#[tokio::test]
async fn schema_of_list_and_dict_types() {
    let source = r#"
import typing
from typing import Dict, List, Optional, Tuple

def collect(
    names: List[str],
    counts: list[int],
    anything: list,
    nested: typing.List[List[float]],
    maybe: List[Optional[str]],
    options: dict,
    weights: Dict[str, float],
    point: Tuple[int, int],
    many: tuple[str, ...],
    self_described,
    agent_state=None,
):
    """Collects things.

    :param names: The names.
    :param List[int] counts: How many of each,
        in order.
    :returns: nothing
    """
"#;
    let info = derive_schema(source, "collect", &python_sandbox())
        .await
        .unwrap();
    assert_eq!(info.description, "Collects things.");
    assert_eq!(
        info.parameters,
        json!({
            "type": "object",
            "properties": {
                "names": {"type": "array", "items": {"type": "string"}, "description": "The names."},
                "counts": {"type": "array", "items": {"type": "integer"}, "description": "How many of each, in order."},
                "anything": {"type": "array", "items": {"type": "string"}},
                "nested": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "maybe": {"type": "array", "items": {"type": ["string", "null"]}},
                "options": {"type": "object"},
                "weights": {"type": "object", "additionalProperties": {"type": "number"}},
                "point": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}], "minItems": 2, "maxItems": 2},
                "many": {"type": "array", "items": {"type": "string"}},
                "self_described": {}
            },
            "required": ["names", "counts", "anything", "nested", "maybe", "options", "weights", "point", "many", "self_described"]
        })
    );

    // A list argument reaches the function as a list.
    let source = "from typing import List\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n";
    let tool = PythonTool::new(
        def("total", source, None),
        PythonLimits::default(),
        python_sandbox(),
    )
    .await
    .unwrap();
    assert_eq!(
        call(&tool, json!({"xs": [1, 2, 3]})).await.unwrap(),
        ToolOutput::ok("6")
    );
}

#[tokio::test]
async fn schema_derivation_never_runs_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let source = format!(
        "open({:?}, 'w').write('ran')\nraise SystemExit(3)\n\ndef f(x: int):\n    \"\"\"Does f.\"\"\"\n",
        marker.display().to_string()
    );
    let info = derive_schema(&source, "f", &python_sandbox())
        .await
        .unwrap();
    assert_eq!(info.description, "Does f.");
    assert!(!marker.exists());
}

#[tokio::test]
async fn schema_errors_are_clear() {
    let err = derive_schema("def f(x: int):\n    return x +\n", "f", &python_sandbox())
        .await
        .unwrap_err();
    assert!(
        matches!(err, PythonToolError::Syntax { line: Some(2), .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("syntax error in the tool source at line 2:"),
        "{err}"
    );

    let err = derive_schema(SOURCE, "subtract", &python_sandbox())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PythonToolError::FunctionNotFound { name, .. } if name == "subtract"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with("the tool source defines no function named `subtract`"),
        "{message}"
    );
    assert!(message.contains("add, chatty"), "{message}");

    let err = derive_schema("def f(data: bytes): pass", "f", &python_sandbox())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PythonToolError::Signature { message, .. } if message.contains("`data`") && message.contains("bytes")),
        "{err:?}"
    );

    let err = derive_schema_with(
        std::path::Path::new("python3-not-installed-here"),
        SOURCE,
        "add",
        &python_sandbox(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, PythonToolError::InterpreterNotFound { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("python3-not-installed-here not found"),
        "{err}"
    );
}

#[tokio::test]
async fn a_given_schema_is_used_without_running_python() {
    let parameters = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]
    });
    let mut given = def("add", SOURCE, None);
    given.schema =
        Some(ToolSchemaInfo::new("add", "From the schema.", parameters.clone()).unwrap());
    // A missing interpreter is only noticed when the tool runs.
    let tool = PythonTool::with_interpreter(
        given,
        PythonLimits::default(),
        python_sandbox(),
        "python3-not-installed-here",
    )
    .await
    .unwrap();
    assert_eq!(tool.spec().description, "From the schema.");
    assert_eq!(tool.spec().parameters, parameters);
    let err = call(&tool, json!({"a": 1, "b": 2})).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::Failed(m) if m.starts_with("python3-not-installed-here not found")),
        "{err:?}"
    );

    // The definition's own description wins over the schema's.
    let mut with_description = def("add", SOURCE, Some(parameters.clone()));
    with_description.description = "Mine.".into();
    let tool = PythonTool::new(with_description, PythonLimits::default(), python_sandbox())
        .await
        .unwrap();
    assert_eq!(tool.spec().description, "Mine.");
    assert_eq!(
        call(&tool, json!({"a": 1, "b": 2})).await.unwrap(),
        ToolOutput::ok("3")
    );

    // Source problems then show when it is called.
    let broken = PythonTool::new(
        def(
            "add",
            "def add(a, b):\n    return a +\n",
            Some(parameters.clone()),
        ),
        PythonLimits::default(),
        python_sandbox(),
    )
    .await
    .unwrap();
    let err = call(&broken, json!({"a": 1, "b": 2})).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::Failed(m) if m.starts_with("syntax error in the tool source at line 2")),
        "{err:?}"
    );
    let misnamed = PythonTool::new(
        def(
            "add",
            "def plus(a, b):\n    return a + b\n",
            Some(parameters),
        ),
        PythonLimits::default(),
        python_sandbox(),
    )
    .await
    .unwrap();
    let err = call(&misnamed, json!({"a": 1, "b": 2})).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::Failed(m) if m == "the tool source defines no function named `add` (it defines: plus)"),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_exception_is_an_error_result_with_its_traceback() {
    let divide = tool("divide").await;
    let out = call(&divide, json!({"a": 1, "b": 0})).await.unwrap();
    assert!(out.is_error);
    let text = &out.content;
    assert!(
        text.starts_with("ZeroDivisionError: float division by zero\n"),
        "{text}"
    );
    assert!(text.contains("line 36, in divide"), "{text}");
    assert!(text.contains("return half / b"), "{text}");
    // The runner's own frames are not shown.
    assert!(!text.contains("run_call"), "{text}");

    let failing_import = PythonTool::new(
        def(
            "f",
            "import no_such_module_here\ndef f():\n    pass\n",
            Some(json!({"type": "object", "properties": {}})),
        ),
        PythonLimits::default(),
        python_sandbox(),
    )
    .await
    .unwrap();
    let out = call(&failing_import, json!({})).await.unwrap();
    assert!(out.is_error);
    assert!(
        out.content.starts_with(
            "error while loading the tool source: ModuleNotFoundError: No module named 'no_such_module_here'"
        ),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn prints_do_not_corrupt_the_result() {
    let chatty = tool("chatty").await;
    let (tx, mut rx) = mpsc::channel(64);
    let mut ctx = ToolContext::detached("call");
    ctx.progress = ProgressHandle::new(ctx.call_id.clone(), tx);
    let out = chatty.call(json!({"text": "done"}), ctx).await.unwrap();
    assert_eq!(out, ToolOutput::ok("DONE"));

    let mut printed = String::new();
    while let Ok(update) = rx.try_recv() {
        if let (_, Progress::Output { text }) = update {
            printed.push_str(&text);
        }
    }
    for line in [
        "progress: starting",
        "forged",
        "raw fd 1 write",
        "to stderr",
        "no newline at the end",
    ] {
        assert!(printed.contains(line), "{line:?} not in {printed:?}");
    }
}

#[tokio::test]
async fn a_memory_hog_hits_the_memory_limit() {
    let hog = tool("hog").await;
    let out = call(&hog, json!({})).await.unwrap();
    assert!(out.is_error, "{}", out.content);
    assert!(
        out.content.contains("exceeded the memory limit of 512 MiB"),
        "{}",
        out.content
    );

    // Under the limit, the same function succeeds.
    let out = call(&hog, json!({"mib": 64})).await.unwrap();
    assert_eq!(out, ToolOutput::ok((64 * 1024 * 1024).to_string()));
}

#[tokio::test]
async fn a_long_call_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let sleeper = PythonTool::new(
        def("sleeper", SOURCE, None),
        PythonLimits {
            timeout: Duration::from_secs(1),
            ..PythonLimits::default()
        },
        python_sandbox_in(dir.path()),
    )
    .await
    .unwrap();
    let marker = support::marker();
    // The function sleeps 30 s: the guard only catches a call that waits.
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        call(&sleeper, json!({"pid_file": pid_file, "marker": marker})),
    )
    .await
    .expect("the call ended at its 1 s timeout")
    .unwrap_err();
    assert!(matches!(err, ToolError::TimedOut(1)), "{err:?}");
    assert_eq!(err.to_string(), "timed out after 1 s");
    assert!(
        support::none_with(marker).await,
        "the call's processes outlived it"
    );
}

#[tokio::test]
async fn cancelling_kills_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let sleeper = PythonTool::new(
        def("sleeper", SOURCE, None),
        PythonLimits::default(),
        python_sandbox_in(dir.path()),
    )
    .await
    .unwrap();
    let ctx = ToolContext::detached("call");
    let cancel = ctx.cancel.clone();
    let started = Instant::now();
    let marker = support::marker();
    let running = tokio::spawn(async move {
        sleeper
            .call(json!({"pid_file": pid_file.clone(), "marker": marker}), ctx)
            .await
    });
    // Cancel once the function is running, not while Python starts.
    let pid_file = dir.path().join("pid");
    while std::fs::read_to_string(&pid_file).map_or(true, |s| s.is_empty()) {
        assert!(started.elapsed() < Duration::from_secs(20), "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    // The function sleeps 30 s: the guard only catches a call that waits.
    let err = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the call ended at the cancel")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, ToolError::Cancelled), "{err:?}");
    assert!(
        support::none_with(marker).await,
        "the call's processes outlived it"
    );
}
