//! Python-source tools: a function given as source code, run in a fresh `python3` process per call with a timeout and a
//! memory limit. When no JSON schema is given, it is derived from the
//! function's signature and docstring by reading the source with Python's
//! `ast`, without running it.
//!
//! Both jobs go through one embedded script (`python_runner.py`): toolwire
//! writes a JSON request on its stdin, and it answers with one JSON reply on
//! the process's original stdout. The tool's own prints are moved to stderr
//! before its code runs, so they cannot corrupt the reply; they are
//! forwarded as progress and shown to the model when the call fails.
//!
//! Every run goes through the sandbox helper ([`PythonSandbox`]): the
//! policy's file-system and network rules, its limits on processes and
//! file size, CPU seconds up to the timeout, and the memory limit, in the
//! call's private temp dir as working directory; everything the tool
//! started ends with the call.
//!
//! The memory limit is `RLIMIT_AS` (address space, set by the sandbox and
//! by the runner before any user code runs), so it counts reserved as well as used memory:
//! libraries that reserve large arenas (one per thread in glibc, BLAS
//! thread pools) need a higher limit than their real use suggests.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::confined::{Confined, Cwd, Limits, Sandbox, StartError};
use crate::{ProgressHandle, Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// The runner script, passed to the interpreter with `-c` so nothing has
/// to be written to disk.
const RUNNER: &str = include_str!("python_runner.py");

/// The interpreter used unless another is given.
pub const DEFAULT_INTERPRETER: &str = "python3";
/// How long a call may run unless [`PythonLimits`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The address-space limit of a call unless [`PythonLimits`] says otherwise.
pub const DEFAULT_MEMORY_LIMIT: u64 = 512 * MIB;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
/// Schema derivation only parses; a limit this long only catches a hung
/// interpreter.
const SCHEMA_TIMEOUT: Duration = Duration::from_secs(30);
/// The end of the tool's output is kept for the model: that is where an
/// error shows.
const OUTPUT_TAIL: usize = 16 * 1024;
/// A return value larger than this is refused rather than held in memory.
const MAX_REPLY: usize = 16 * 1024 * 1024;
/// How long output may still arrive after the runner exits, from processes
/// the tool started that inherited its stderr.
const DRAIN: Duration = Duration::from_millis(500);

/// How long a call may run and how much memory it may reserve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonLimits {
    /// The process (and everything it started) is killed after this.
    pub timeout: Duration,
    /// `RLIMIT_AS` of the process, in bytes.
    pub memory_bytes: u64,
}

impl Default for PythonLimits {
    fn default() -> Self {
        PythonLimits {
            timeout: DEFAULT_TIMEOUT,
            memory_bytes: DEFAULT_MEMORY_LIMIT,
        }
    }
}

/// Where Python tools run: the sandbox, and the workspace its policy
/// grants (read, and write in `workspace-write`).
#[derive(Debug, Clone)]
pub struct PythonSandbox {
    pub sandbox: Arc<Sandbox>,
    pub workspace: PathBuf,
}

impl PythonSandbox {
    pub fn new(sandbox: Arc<Sandbox>, workspace: impl Into<PathBuf>) -> Self {
        PythonSandbox {
            sandbox,
            workspace: workspace.into(),
        }
    }

    /// The sandbox's limits, with the call's memory limit and its timeout
    /// as CPU seconds.
    fn limits(&self, memory: u64, timeout: Duration) -> Limits {
        let mut limits = self.sandbox.policy().limits.clone();
        limits.memory = Some(memory);
        limits.cpu_seconds = Some(whole_seconds(timeout).max(1));
        limits
    }
}

/// A Python tool as a client defines it: its source and, optionally, its
/// schema.
#[derive(Debug, Clone, PartialEq)]
pub struct PythonToolDef {
    /// The tool's name, which is also the name of the function to call.
    pub name: String,
    /// Shown to the model; when empty, the schema's description is used.
    pub description: String,
    pub source_code: String,
    /// The schema as the client gave it (checked again by
    /// [`ToolSchemaInfo::new`]); derived from the source when absent.
    pub schema: Option<ToolSchemaInfo>,
}

/// A function's schema, as derived from its source or given by a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSchemaInfo {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object (OpenAI function-parameters
    /// style: `type`, `properties`, `required`).
    pub parameters: Value,
}

impl ToolSchemaInfo {
    /// A schema given by a client, checked: `parameters` must describe an
    /// object (`"type": "object"`, which a schema of only `properties`, or
    /// an empty one, is taken to mean).
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
    ) -> Result<ToolSchemaInfo, PythonToolError> {
        let Value::Object(mut parameters) = parameters else {
            return Err(PythonToolError::InvalidSchema(
                "`parameters` must be a JSON object".into(),
            ));
        };
        match parameters.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            // Providers insist on `type: object`; a schema with only
            // `properties` plainly means it.
            None if parameters.contains_key("properties") || parameters.is_empty() => {
                parameters.insert("type".into(), json!("object"));
            }
            Some(other) => {
                return Err(PythonToolError::InvalidSchema(format!(
                    "the arguments must be an object (`\"type\": \"object\"`), not {other}"
                )));
            }
            None => {
                return Err(PythonToolError::InvalidSchema(
                    "expected an arguments schema (`type`, `properties`)".into(),
                ));
            }
        }
        if !parameters.contains_key("properties") {
            parameters.insert("properties".into(), json!({}));
        }
        Ok(ToolSchemaInfo {
            name: name.into(),
            description: description.into(),
            parameters: Value::Object(parameters),
        })
    }

    pub fn into_spec(self) -> ToolSpec {
        ToolSpec {
            name: self.name,
            server: None,
            description: self.description,
            parameters: self.parameters,
            // Arbitrary code: never assume it has no side effects.
            read_only: false,
        }
    }
}

/// Why a Python tool could not be defined (or its schema derived).
#[derive(Debug, thiserror::Error)]
pub enum PythonToolError {
    #[error("{interpreter} not found: install Python 3 or configure the interpreter path")]
    InterpreterNotFound { interpreter: String },
    #[error("could not start {interpreter}: {source}")]
    Spawn {
        interpreter: String,
        #[source]
        source: std::io::Error,
    },
    #[error("syntax error in the tool source{}: {message}{}", at_line(*.line), quoted_line(.text))]
    Syntax {
        line: Option<u64>,
        message: String,
        /// The offending source line.
        text: Option<String>,
    },
    #[error("the tool source defines no function named `{name}`{}", in_parens(.detail))]
    FunctionNotFound {
        name: String,
        /// What the source does define, to spot a typo.
        detail: Option<String>,
    },
    #[error("cannot derive the JSON schema of `{name}`: {message}")]
    Signature { name: String, message: String },
    #[error("invalid json_schema: {0}")]
    InvalidSchema(String),
    #[error("deriving the schema timed out after {0} s")]
    TimedOut(u64),
    #[error("{0}")]
    Failed(String),
}

fn at_line(line: Option<u64>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

fn quoted_line(text: &Option<String>) -> String {
    text.as_ref()
        .map(|t| format!(" (`{t}`)"))
        .unwrap_or_default()
}

fn in_parens(detail: &Option<String>) -> String {
    detail
        .as_ref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default()
}

/// A tool whose body is a Python function, run in a `python3` process per
/// call.
#[derive(Debug, Clone)]
pub struct PythonTool {
    spec: Arc<ToolSpec>,
    source_code: String,
    limits: PythonLimits,
    interpreter: PathBuf,
    sandbox: PythonSandbox,
}

impl PythonTool {
    /// Defines the tool with the default interpreter (`python3`), run
    /// through `sandbox`. Runs it once to derive the schema when
    /// `def.schema` is absent.
    pub async fn new(
        def: PythonToolDef,
        limits: PythonLimits,
        sandbox: PythonSandbox,
    ) -> Result<Self, PythonToolError> {
        Self::with_interpreter(def, limits, sandbox, DEFAULT_INTERPRETER).await
    }

    /// As [`PythonTool::new`], with the interpreter at `interpreter` (a path,
    /// or a name looked up in `PATH`).
    pub async fn with_interpreter(
        def: PythonToolDef,
        limits: PythonLimits,
        sandbox: PythonSandbox,
        interpreter: impl Into<PathBuf>,
    ) -> Result<Self, PythonToolError> {
        let interpreter = interpreter.into();
        let schema = match def.schema {
            Some(given) => ToolSchemaInfo::new(given.name, given.description, given.parameters)?,
            None => derive_schema_with(&interpreter, &def.source_code, &def.name, &sandbox).await?,
        };
        let mut spec = schema.into_spec();
        spec.name = def.name;
        if !def.description.trim().is_empty() {
            spec.description = def.description;
        }
        Ok(PythonTool {
            spec: Arc::new(spec),
            source_code: def.source_code,
            limits,
            interpreter,
            sandbox,
        })
    }

    pub fn source_code(&self) -> &str {
        &self.source_code
    }

    pub fn limits(&self) -> &PythonLimits {
        &self.limits
    }

    pub fn interpreter(&self) -> &Path {
        &self.interpreter
    }
}

#[async_trait]
impl Tool for PythonTool {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let arguments = match arguments {
            // Models send `null` for "no arguments".
            Value::Null => Value::Object(Default::default()),
            Value::Object(map) => Value::Object(map),
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "the arguments must be a JSON object, not {other}"
                )));
            }
        };
        let request = json!({
            "mode": "call",
            "name": self.spec.name,
            "source": self.source_code,
            "arguments": arguments,
            "memory_limit": self.limits.memory_bytes,
        });
        ctx.progress
            .status(format!("Running Python function `{}`", self.spec.name));
        let run = run_runner(
            &self.interpreter,
            &request,
            self.limits.timeout,
            &ctx.cancel,
            Some(&ctx.progress),
            (&self.sandbox, self.limits.memory_bytes),
        )
        .await;
        match run {
            Ok(Finished {
                reply,
                output,
                note,
            }) => {
                let mut result = call_result(reply, &output, &self.limits);
                if let (Ok(result), Some(note)) = (&mut result, note) {
                    result.content.push_str(&format!("\n{note}"));
                }
                result
            }
            // The runner itself ran out of memory before it could reply.
            Err(RunFailure::NoReply { output, .. }) if output.contains("MemoryError") => Ok(
                ToolOutput::error(with_output(memory_message(&self.limits), &output)),
            ),
            Err(failure) => Err(failure.into_tool_error(&self.interpreter, &self.limits)),
        }
    }
}

/// Derives `name`'s schema from `source` with the default interpreter.
pub async fn derive_schema(
    source: &str,
    name: &str,
    sandbox: &PythonSandbox,
) -> Result<ToolSchemaInfo, PythonToolError> {
    derive_schema_with(Path::new(DEFAULT_INTERPRETER), source, name, sandbox).await
}

/// Derives the schema of the function `name` defined in `source`: its
/// parameters' types from their annotations (`str`, `int`, `float`, `bool`,
/// `list`, `dict`, `List[X]`, `Dict[str, X]`, `Tuple[...]`, `Optional[X]`,
/// `X | None`, `Union[...]`, `Literal[...]`, `Annotated[X, ...]`), required
/// when they have no default and are not optional, described by the
/// docstring's `Args:` section or `:param x:` fields; the description is
/// the docstring's first paragraph. `self` and `agent_state` (which Letta
/// fills in itself) are left out. The source is parsed, never run (and
/// the parser runs in `sandbox` all the same).
pub async fn derive_schema_with(
    interpreter: &Path,
    source: &str,
    name: &str,
    sandbox: &PythonSandbox,
) -> Result<ToolSchemaInfo, PythonToolError> {
    let request = json!({
        "mode": "schema",
        "name": name,
        "source": source,
        "memory_limit": DEFAULT_MEMORY_LIMIT,
    });
    // Nothing cancels a derivation but its own timeout.
    let never = CancellationToken::new();
    let run = run_runner(
        interpreter,
        &request,
        SCHEMA_TIMEOUT,
        &never,
        None,
        (sandbox, DEFAULT_MEMORY_LIMIT),
    )
    .await;
    match run {
        Ok(Finished { reply, output, .. }) => schema_result(reply, name, &output),
        Err(RunFailure::NotFound) => Err(PythonToolError::InterpreterNotFound {
            interpreter: interpreter.display().to_string(),
        }),
        Err(RunFailure::Spawn(source)) => Err(PythonToolError::Spawn {
            interpreter: interpreter.display().to_string(),
            source,
        }),
        Err(RunFailure::Refused(message)) => Err(PythonToolError::Failed(message)),
        Err(RunFailure::TimedOut) => Err(PythonToolError::TimedOut(whole_seconds(SCHEMA_TIMEOUT))),
        Err(other) => Err(PythonToolError::Failed(
            other
                .into_tool_error(interpreter, &PythonLimits::default())
                .to_string(),
        )),
    }
}

/// The runner's answer (see `python_runner.py`).
#[derive(Debug, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum Reply {
    Ok {
        result: String,
    },
    Exception {
        phase: Phase,
        #[serde(rename = "type")]
        kind: String,
        message: String,
        traceback: Vec<String>,
    },
    MemoryError {
        traceback: Vec<String>,
    },
    Syntax {
        message: String,
        line: Option<u64>,
        text: Option<String>,
    },
    MissingFunction {
        name: String,
        detail: Option<String>,
    },
    Arguments {
        message: String,
    },
    Signature {
        message: String,
    },
    Setup {
        message: String,
    },
    Schema {
        name: String,
        description: String,
        parameters: Value,
    },
}

/// Where an exception came from: running the module's top level, or the
/// function itself.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Phase {
    Load,
    Call,
}

fn call_result(reply: Reply, output: &str, limits: &PythonLimits) -> Result<ToolOutput, ToolError> {
    match reply {
        Reply::Ok { result } => Ok(ToolOutput::ok(result)),
        Reply::Exception {
            phase,
            kind,
            message,
            traceback,
        } => {
            let mut text = match phase {
                Phase::Load => format!("error while loading the tool source: {kind}"),
                Phase::Call => kind,
            };
            if !message.is_empty() {
                text.push_str(": ");
                text.push_str(&message);
            }
            Ok(ToolOutput::error(with_output(
                with_traceback(text, &traceback),
                output,
            )))
        }
        Reply::MemoryError { traceback } => Ok(ToolOutput::error(with_output(
            with_traceback(memory_message(limits), &traceback),
            output,
        ))),
        Reply::Arguments { message } => Err(ToolError::InvalidArguments(message)),
        Reply::Syntax {
            message,
            line,
            text,
        } => Err(ToolError::Failed(
            PythonToolError::Syntax {
                line,
                message,
                text,
            }
            .to_string(),
        )),
        Reply::MissingFunction { name, detail } => Err(ToolError::Failed(
            PythonToolError::FunctionNotFound { name, detail }.to_string(),
        )),
        Reply::Setup { message } => Err(ToolError::Failed(message)),
        Reply::Signature { .. } | Reply::Schema { .. } => Err(ToolError::Failed(
            "the Python runner answered a call with a schema".into(),
        )),
    }
}

fn schema_result(
    reply: Reply,
    name: &str,
    output: &str,
) -> Result<ToolSchemaInfo, PythonToolError> {
    match reply {
        Reply::Schema {
            name,
            description,
            parameters,
        } => Ok(ToolSchemaInfo {
            name,
            description,
            parameters,
        }),
        Reply::Syntax {
            message,
            line,
            text,
        } => Err(PythonToolError::Syntax {
            line,
            message,
            text,
        }),
        Reply::MissingFunction { name, detail } => {
            Err(PythonToolError::FunctionNotFound { name, detail })
        }
        Reply::Signature { message } => Err(PythonToolError::Signature {
            name: name.to_owned(),
            message,
        }),
        Reply::Setup { message } => Err(PythonToolError::Failed(message)),
        Reply::MemoryError { .. } => Err(PythonToolError::Failed(
            "parsing the tool source ran out of memory".into(),
        )),
        Reply::Ok { .. } | Reply::Exception { .. } | Reply::Arguments { .. } => {
            Err(PythonToolError::Failed(with_output(
                "the Python runner answered a schema request with a call result".into(),
                output,
            )))
        }
    }
}

fn memory_message(limits: &PythonLimits) -> String {
    format!(
        "MemoryError: the tool exceeded the memory limit of {}",
        Bytes(limits.memory_bytes)
    )
}

fn with_traceback(mut text: String, traceback: &[String]) -> String {
    if !traceback.is_empty() {
        text.push_str("\n\n");
        text.push_str(&traceback.join("\n"));
    }
    text
}

fn with_output(mut text: String, output: &str) -> String {
    let output = output.trim_end();
    if !output.is_empty() {
        text.push_str("\n\nOutput:\n");
        text.push_str(output);
    }
    text
}

/// A byte count as people write memory limits.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n >= GIB && n % GIB == 0 => write!(f, "{} GiB", n / GIB),
            n if n >= MIB && n % MIB == 0 => write!(f, "{} MiB", n / MIB),
            n => write!(f, "{n} bytes"),
        }
    }
}

/// Rounded up, so a limit under a second never reads "0 s".
fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A runner that replied, and what the tool printed.
struct Finished {
    reply: Reply,
    output: String,
    /// What the sandbox lacked, when weaker than its mode.
    note: Option<String>,
}

/// A runner that did not reply.
#[derive(Debug)]
enum RunFailure {
    NotFound,
    Spawn(std::io::Error),
    /// The sandbox refused to start it.
    Refused(String),
    TimedOut,
    Cancelled,
    NoReply {
        status: ExitStatus,
        output: String,
    },
    BadReply {
        error: String,
        output: String,
    },
    ReplyTooLarge,
    Io(String),
}

impl RunFailure {
    fn into_tool_error(self, interpreter: &Path, limits: &PythonLimits) -> ToolError {
        let interpreter = interpreter.display();
        match self {
            RunFailure::NotFound => ToolError::Failed(
                PythonToolError::InterpreterNotFound {
                    interpreter: interpreter.to_string(),
                }
                .to_string(),
            ),
            RunFailure::Spawn(e) => {
                ToolError::Failed(format!("could not start {interpreter}: {e}"))
            }
            RunFailure::Refused(message) => ToolError::Refused(message),
            RunFailure::TimedOut => ToolError::TimedOut(whole_seconds(limits.timeout)),
            RunFailure::Cancelled => ToolError::Cancelled,
            RunFailure::NoReply { status, output } => ToolError::Failed(with_output(
                format!(
                    "{interpreter} {} before reporting a result",
                    describe_exit(status)
                ),
                &output,
            )),
            RunFailure::BadReply { error, output } => ToolError::Failed(with_output(
                format!("{interpreter} gave an unreadable result ({error})"),
                &output,
            )),
            RunFailure::ReplyTooLarge => ToolError::Failed(format!(
                "the result is larger than {}",
                Bytes(MAX_REPLY as u64)
            )),
            RunFailure::Io(e) => ToolError::Failed(e),
        }
    }
}

fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "exited".into(),
    }
}

/// Runs the runner script once, confined by `sandbox` (with the memory
/// limit given): `request` on its stdin, its reply from its stdout, the
/// tool's output from its stderr (forwarded to `progress`).
async fn run_runner(
    interpreter: &Path,
    request: &Value,
    timeout: Duration,
    cancel: &CancellationToken,
    progress: Option<&ProgressHandle>,
    (sandbox, memory): (&PythonSandbox, u64),
) -> Result<Finished, RunFailure> {
    let request = serde_json::to_vec(request).map_err(|e| RunFailure::Io(e.to_string()))?;
    let argv: [OsString; 3] = [interpreter.into(), "-c".into(), RUNNER.into()];
    let mut confined = Confined::start(
        &sandbox.sandbox,
        &sandbox.workspace,
        &argv,
        Cwd::Temp,
        true,
        Some(sandbox.limits(memory, timeout)),
    )
    .map_err(|e| match e {
        StartError::Sandbox(e) => RunFailure::Refused(e.to_string()),
        StartError::Spawn(e) => RunFailure::Spawn(e),
    })?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (
        confined.child.stdin.take(),
        confined.child.stdout.take(),
        confined.child.stderr.take(),
    ) else {
        return Err(RunFailure::Io("the runner's pipes were not set up".into()));
    };

    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    let _stderr_reader = ChunkReader::spawn(stderr, tx);
    let mut exchange = Box::pin(async {
        let write = async move {
            // A runner that dies before reading everything closes the pipe;
            // its exit status says why, so the write error adds nothing.
            let _ = stdin.write_all(&request).await;
            drop(stdin);
        };
        let (_, reply, status) = tokio::join!(write, read_reply(stdout), confined.wait());
        (reply, status)
    });
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);

    let mut output = Output::default();
    let ended = loop {
        tokio::select! {
            _ = cancel.cancelled() => break Err(RunFailure::Cancelled),
            _ = &mut deadline => break Err(RunFailure::TimedOut),
            Some(chunk) = rx.recv() => output.push(&chunk, progress),
            done = &mut exchange => break Ok(done),
        }
    };
    drop(exchange);
    let (reply, status) = match ended {
        Ok(done) => done,
        Err(failure) => {
            confined.stop().await;
            return Err(failure);
        }
    };

    let drain_until = tokio::time::Instant::now() + DRAIN;
    while let Ok(Some(chunk)) = tokio::time::timeout_at(drain_until, rx.recv()).await {
        output.push(&chunk, progress);
    }
    let output = output.finish(progress);

    let status = status.map_err(|e| RunFailure::Io(format!("waiting for the runner: {e}")))?;
    let reply = match reply {
        Ok(Some(reply)) => reply,
        Ok(None) => return Err(RunFailure::ReplyTooLarge),
        Err(e) => return Err(RunFailure::Io(format!("reading the runner's reply: {e}"))),
    };
    if reply.is_empty() {
        // The helper could not start the interpreter (`127`, as a shell
        // says it).
        if status.code() == Some(127) && output.contains("toolwire sandbox: could not start") {
            return Err(RunFailure::NotFound);
        }
        return Err(RunFailure::NoReply { status, output });
    }
    match serde_json::from_slice::<Reply>(&reply) {
        Ok(reply) => Ok(Finished {
            reply,
            output,
            note: confined.note.clone(),
        }),
        Err(e) => Err(RunFailure::BadReply {
            error: e.to_string(),
            output,
        }),
    }
}

/// The whole reply, or `None` if it was larger than [`MAX_REPLY`]. Reads to
/// the end either way, so the runner never blocks on a full pipe.
async fn read_reply(mut pipe: impl AsyncRead + Unpin) -> std::io::Result<Option<Vec<u8>>> {
    let mut reply = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut too_large = false;
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        if reply.len() + n > MAX_REPLY {
            too_large = true;
            reply = Vec::new();
        }
        if !too_large {
            reply.extend_from_slice(&buf[..n]);
        }
    }
    Ok((!too_large).then_some(reply))
}

/// What the tool printed: forwarded as progress while it runs (whole
/// characters only), and its last [`OUTPUT_TAIL`] bytes kept.
#[derive(Default)]
struct Output {
    tail: Vec<u8>,
    cut: bool,
    /// The start of a character split across reads.
    pending: Vec<u8>,
}

impl Output {
    fn push(&mut self, chunk: &[u8], progress: Option<&ProgressHandle>) {
        self.tail.extend_from_slice(chunk);
        // Trim in batches so a chatty tool does not copy on every chunk.
        if self.tail.len() > 2 * OUTPUT_TAIL {
            self.tail.drain(..self.tail.len() - OUTPUT_TAIL);
            self.cut = true;
        }
        if let Some(progress) = progress {
            self.pending.extend_from_slice(chunk);
            let complete = complete_utf8_len(&self.pending);
            if complete > 0 {
                progress.output(String::from_utf8_lossy(&self.pending[..complete]).into_owned());
                self.pending.drain(..complete);
            }
        }
    }

    fn finish(mut self, progress: Option<&ProgressHandle>) -> String {
        if let Some(progress) = progress
            && !self.pending.is_empty()
        {
            progress.output(String::from_utf8_lossy(&self.pending).into_owned());
        }
        if self.tail.len() > OUTPUT_TAIL {
            self.tail.drain(..self.tail.len() - OUTPUT_TAIL);
            self.cut = true;
        }
        // The cut may have split a character; drop its remains.
        let start = if self.cut {
            self.tail
                .iter()
                .position(|b| b & 0xC0 != 0x80)
                .unwrap_or(self.tail.len())
        } else {
            0
        };
        let text = String::from_utf8_lossy(&self.tail[start..]);
        if self.cut {
            format!("[earlier output cut]\n{text}")
        } else {
            text.into_owned()
        }
    }
}

/// The length of `bytes` without a multi-byte character cut off at its end.
fn complete_utf8_len(bytes: &[u8]) -> usize {
    bytes.len() - crate::builtin::common::unfinished_char(bytes)
}

/// A pipe reader task, aborted with the call so a pipe held open by a
/// process the tool left behind cannot keep it alive.
struct ChunkReader(JoinHandle<()>);

impl ChunkReader {
    fn spawn(
        mut pipe: impl AsyncRead + Unpin + Send + 'static,
        tx: mpsc::Sender<Vec<u8>>,
    ) -> ChunkReader {
        ChunkReader(tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            loop {
                match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }))
    }
}

impl Drop for ChunkReader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_people_write_them() {
        assert_eq!(Bytes(512 * MIB).to_string(), "512 MiB");
        assert_eq!(Bytes(2 * GIB).to_string(), "2 GiB");
        assert_eq!(Bytes(1500).to_string(), "1500 bytes");
        assert_eq!(whole_seconds(Duration::from_secs(60)), 60);
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(
            ToolError::TimedOut(whole_seconds(PythonLimits::default().timeout)).to_string(),
            "timed out after 60 s"
        );
        assert!(
            memory_message(&PythonLimits::default())
                .contains("exceeded the memory limit of 512 MiB")
        );
    }

    #[test]
    fn a_given_schema_must_describe_an_object() {
        let params =
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let given = ToolSchemaInfo::new("add", "Adds.", params.clone()).unwrap();
        assert_eq!(given.parameters, params);
        assert_eq!(given.description, "Adds.");

        let only_props = ToolSchemaInfo::new("f", "", json!({"properties": {}})).unwrap();
        assert_eq!(
            only_props.parameters,
            json!({"properties": {}, "type": "object"})
        );

        for bad in [
            json!([]),
            json!({"type": "string"}),
            json!(3),
            json!({"foo": 1}),
        ] {
            let err = ToolSchemaInfo::new("f", "", bad.clone()).unwrap_err();
            assert!(
                matches!(err, PythonToolError::InvalidSchema(_)),
                "{bad}: {err}"
            );
        }
    }

    fn reply(value: Value) -> Reply {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn replies_become_results() {
        let limits = PythonLimits::default();
        let ok = call_result(reply(json!({"status": "ok", "result": "5"})), "", &limits).unwrap();
        assert_eq!(ok, ToolOutput::ok("5"));

        let raised = call_result(
            reply(json!({
                "status": "exception", "phase": "call", "type": "ValueError", "message": "bad",
                "traceback": ["Traceback (most recent call last):", "  File \"<tool f>\", line 2, in f", "ValueError: bad"]
            })),
            "printed\n",
            &limits,
        )
        .unwrap();
        assert!(raised.is_error);
        assert!(
            raised.content.starts_with("ValueError: bad\n\nTraceback"),
            "{}",
            raised.content
        );
        assert!(
            raised.content.ends_with("Output:\nprinted"),
            "{}",
            raised.content
        );

        let loading = call_result(
            reply(
                json!({"status": "exception", "phase": "load", "type": "ModuleNotFoundError",
                          "message": "No module named 'nope'", "traceback": []}),
            ),
            "",
            &limits,
        )
        .unwrap();
        assert_eq!(
            loading.content,
            "error while loading the tool source: ModuleNotFoundError: No module named 'nope'"
        );

        let memory = call_result(
            reply(json!({"status": "memory_error", "phase": "call", "traceback": []})),
            "",
            &limits,
        )
        .unwrap();
        assert!(memory.is_error);
        assert_eq!(
            memory.content,
            "MemoryError: the tool exceeded the memory limit of 512 MiB"
        );

        let args = call_result(
            reply(json!({"status": "arguments", "message": "missing a required argument: 'b'"})),
            "",
            &limits,
        );
        assert!(matches!(args, Err(ToolError::InvalidArguments(m)) if m.contains("'b'")));

        let syntax = call_result(
            reply(
                json!({"status": "syntax", "message": "invalid syntax", "line": 3, "text": "def f(:"}),
            ),
            "",
            &limits,
        );
        assert!(
            matches!(&syntax, Err(ToolError::Failed(m)) if m == "syntax error in the tool source at line 3: invalid syntax (`def f(:`)"),
            "{syntax:?}"
        );

        let missing = schema_result(
            reply(json!({"status": "missing_function", "name": "f", "detail": "it defines: g"})),
            "f",
            "",
        )
        .unwrap_err();
        assert_eq!(
            missing.to_string(),
            "the tool source defines no function named `f` (it defines: g)"
        );
    }

    #[test]
    fn output_keeps_whole_characters() {
        assert_eq!(complete_utf8_len(b"abc"), 3);
        let e = "é".as_bytes();
        assert_eq!(complete_utf8_len(&[b'a', e[0]]), 1);
        assert_eq!(complete_utf8_len(&[b'a', e[0], e[1]]), 3);
        let euro = "€".as_bytes();
        assert_eq!(complete_utf8_len(&euro[..2]), 0);

        let mut out = Output::default();
        for i in 0..10_000 {
            out.push(format!("line {i} é\n").as_bytes(), None);
        }
        let text = out.finish(None);
        assert!(text.starts_with("[earlier output cut]\n"));
        assert!(text.ends_with("line 9999 é\n"));
        assert!(!text.contains('\u{fffd}'));
        assert!(text.len() < OUTPUT_TAIL + 64);
    }
}
