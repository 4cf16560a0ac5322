//! Settings shared by `serve`, `acp`, `exec` and `chat`: each comes from its
//! flag, else its `TOOLWIRE_*` environment variable, else the config file
//! (same keys, TOML), else a default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::Deserialize;
use toolwire_core::PriceTable;
use toolwire_engine::notify::{Activation, InjectionMode, NotificationSettings};
use toolwire_engine::watch::{self, WatchHandle, WatchSettings};
use toolwire_engine::{Engine, EngineConfig, InterjectionMode};
use toolwire_providers::{DEFAULT_MAX_TOKENS, RetryPolicy, StreamLimits, ToolFormat};
use toolwire_tools::ToolRegistry;
use toolwire_tools::builtin::{self, Workspace};
use toolwire_tools::confined::{Limits, Mode, Policy, Sandbox};
use toolwire_tools::mcp::{self, McpServerConfig};
use toolwire_tools::python::{PythonLimits, PythonSandbox};

mod context;
mod models;

use models::ModelFile;
pub use models::ModelSettings;

/// The database a working directory kept from before the default moved.
const OLD_DEFAULT_DB: &str = "toolwire.db";

/// The hidden subcommand that runs the sandbox helper (`toolwire
/// SANDBOX_SUBCOMMAND --policy JSON -- argv`): dispatched in `main` before
/// anything else starts, never listed by `--help`.
pub const SANDBOX_SUBCOMMAND: &str = "__sandbox";

/// The default database: `$XDG_DATA_HOME/toolwire/toolwire.db`, else
/// `~/.local/share/toolwire/toolwire.db` (the directory made on first
/// use), outside every workspace, so that commands never meet it. A
/// `toolwire.db` left in the working directory by earlier versions is
/// still used, with a warning saying how to move it.
pub fn default_db() -> Result<String> {
    if Path::new(OLD_DEFAULT_DB).is_file() {
        let target = data_dir().map(|d| d.join("toolwire.db"));
        tracing::warn!(
            "using ./{OLD_DEFAULT_DB} from the working directory (the default database moved to \
             the per-user data directory, out of reach of commands): move it with `mv \
             toolwire.db* {}` or keep it with --db sqlite://toolwire.db",
            target
                .as_ref()
                .map_or("$XDG_DATA_HOME/toolwire/".to_owned(), |t| format!(
                    "{}/",
                    t.parent().unwrap_or(Path::new(".")).display()
                ))
        );
        return Ok(format!("sqlite://{OLD_DEFAULT_DB}"));
    }
    let dir = data_dir()
        .context("no place for the default database: set XDG_DATA_HOME or HOME, or give --db")?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("making the data directory {}", dir.display()))?;
    Ok(format!("sqlite://{}", dir.join("toolwire.db").display()))
}

/// `$XDG_DATA_HOME/toolwire`, else `$HOME/.local/share/toolwire`.
fn data_dir() -> Option<PathBuf> {
    let nonempty = |key: &str| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    nonempty("XDG_DATA_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| nonempty("HOME").map(|home| home.join(".local/share")))
        .map(|base| base.join("toolwire"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions (OpenAI, vLLM, llama.cpp, Ollama…).
    Openai,
    /// OpenAI's Responses API (`/responses`), which reasoning models such
    /// as the o-series and codex models need.
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
    /// Anthropic messages.
    Anthropic,
    /// Plays a script file (or the built-in demo): deterministic, offline.
    Scripted,
}

impl ProviderKind {
    const ALL: [ProviderKind; 4] = [
        ProviderKind::Openai,
        ProviderKind::OpenaiResponses,
        ProviderKind::Anthropic,
        ProviderKind::Scripted,
    ];

    /// The name the flag, the config file and Letta's handles use.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::OpenaiResponses => "openai-responses",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Scripted => "scripted",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolFormatArg {
    /// The API's own tool calling.
    Native,
    /// Tools described in the prompt; calls written as XML in the text.
    Xml,
}

/// Flags every command that runs the engine accepts.
#[derive(Debug, Clone, Args, Default)]
pub struct EngineArgs {
    /// Database URL: sqlite://PATH or postgres://… [default:
    /// $XDG_DATA_HOME/toolwire/toolwire.db, else
    /// ~/.local/share/toolwire/toolwire.db; ./toolwire.db if it exists]
    #[arg(long, env = "TOOLWIRE_DB", value_name = "URL")]
    pub db: Option<String>,
    /// TOML config file with the same keys as these flags, and prices,
    /// model bounds (max_tokens, first_byte_timeout_secs,
    /// stream_idle_timeout_secs, max_retry_after_secs,
    /// max_step_output_bytes, max_step_events), named models
    /// (default_model, [models.NAME]), the context window ([context]:
    /// compact_at, keep_recent, max_tool_result, summary_model) and
    /// budgets ([budgets]: turn_, conversation_, agent_ max_tokens and
    /// max_cost, warn_at); see docs/configuration.md.
    #[arg(long, env = "TOOLWIRE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Model API [default: scripted demo when no model is configured].
    #[arg(long, env = "TOOLWIRE_PROVIDER", value_enum)]
    pub provider: Option<ProviderKind>,
    /// API base URL [default: the provider's public API].
    #[arg(long, env = "TOOLWIRE_BASE_URL", value_name = "URL")]
    pub base_url: Option<String>,
    /// Model id the provider is asked for; or, when the config file has
    /// `[models.NAME]` tables, the NAME of the one that answers by default.
    #[arg(long, env = "TOOLWIRE_MODEL", value_name = "NAME")]
    pub model: Option<String>,
    /// Environment variable holding the API key
    /// [default: OPENAI_API_KEY or ANTHROPIC_API_KEY].
    #[arg(long, env = "TOOLWIRE_API_KEY_ENV", value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// How the model writes tool calls [default: native].
    #[arg(long, env = "TOOLWIRE_TOOL_FORMAT", value_enum)]
    pub tool_format: Option<ToolFormatArg>,
    /// Script for the scripted provider (JSON or YAML).
    #[arg(long, env = "TOOLWIRE_SCRIPT", value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Root of the built-in file tools [default: the working directory].
    #[arg(long, env = "TOOLWIRE_WORKSPACE", value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// What commands and Python tools may touch: read-only,
    /// workspace-write (write only the workspace and a private temp dir,
    /// no network) or full (no file or network confinement)
    /// [default: workspace-write; the [sandbox] table sets the rest].
    #[arg(long, env = "TOOLWIRE_SANDBOX", value_name = "MODE")]
    pub sandbox: Option<Mode>,
}

/// The config file: the same keys, plus what has no flag.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    db: Option<String>,
    provider: Option<ProviderKind>,
    base_url: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
    tool_format: Option<ToolFormatArg>,
    script: Option<PathBuf>,
    workspace: Option<PathBuf>,
    system_prompt: Option<String>,
    max_steps: Option<u32>,
    /// Seconds to wait for a model server's response headers and first
    /// byte (default 300).
    first_byte_timeout_secs: Option<u64>,
    /// Seconds a model's stream may send nothing before the step fails
    /// (default 300, as codex).
    stream_idle_timeout_secs: Option<u64>,
    /// The longest `Retry-After` honoured, in seconds; a longer one fails
    /// the step at once (default 60).
    max_retry_after_secs: Option<u64>,
    /// Output tokens asked of the model per call (default 8192).
    max_tokens: Option<u32>,
    /// Bytes of text, reasoning and call arguments one model call may
    /// produce before the step is cut (default 4194304).
    max_step_output_bytes: Option<usize>,
    /// Stream events one model call may produce before the step is cut
    /// (default 250000).
    max_step_events: Option<usize>,
    /// The registry name of the model that answers when a turn names none
    /// (`--model NAME` overrides it).
    default_model: Option<String>,
    /// Named models: `[models.NAME]` tables.
    #[serde(default)]
    models: BTreeMap<String, ModelFile>,
    /// US dollars per million tokens, by model: `[prices."gpt-4o"]`
    /// `input = 2.5`, `output = 10.0`, `cached_input = 1.25`.
    #[serde(default)]
    prices: PriceTable,
    /// MCP servers whose tools the model gets as `NAME__tool`:
    /// `[mcp_servers.NAME]` with `command = "npx"`, `args = [...]`,
    /// `env = {...}` (stdio), or `url = "https://…"`, `headers = {...}`
    /// (streamable HTTP).
    #[serde(default)]
    mcp_servers: BTreeMap<String, McpServerConfig>,
    /// Bearer keys `serve` accepts; without any it listens on loopback only.
    #[serde(default)]
    api_keys: Vec<String>,
    /// Names `serve` answers to beyond localhost, 127.0.0.1, [::1] and its
    /// listen address (`host` or `host:port`; `"*"`: any).
    #[serde(default)]
    allowed_hosts: Vec<String>,
    /// Web pages (`scheme://host[:port]`; `"*"`: any) that may change
    /// state and open sockets on `serve` beyond its own page.
    #[serde(default)]
    allowed_origins: Vec<String>,
    /// Connections `serve` keeps open at once (default 512).
    max_connections: Option<usize>,
    /// Seconds a request's head may take to arrive (default 10).
    header_timeout_secs: Option<u64>,
    /// Seconds a request's body may take to arrive after its head
    /// (default 30); a slower one is answered 408.
    body_timeout_secs: Option<u64>,
    /// Seconds a kept-alive connection may wait for its next request
    /// (default 30).
    idle_timeout_secs: Option<u64>,
    /// Seconds a Python-source tool may run (default 60).
    python_timeout_seconds: Option<u64>,
    /// Memory a Python-source tool may use, in MiB (default 512).
    python_memory_mb: Option<u64>,
    /// `serve`: on SIGTERM or Ctrl-C, seconds running turns get to reach
    /// their next stored step before they are cut (default 10).
    shutdown_grace_secs: Option<f64>,
    /// Instances on one database: seconds an instance may go without a
    /// heartbeat before the others take over its turns (its heartbeat,
    /// and their sweep for gone instances, every third of it; default 30).
    failover_secs: Option<f64>,
    /// Where a message typed during a turn goes: `new_message` (a user
    /// message after the running tools, the default) or `reminder` (a
    /// notification on the next tool result).
    interjections: Option<InterjectionArg>,
    /// `[notifications]`: how events reach the agent while it works.
    #[serde(default)]
    notifications: NotificationsFile,
    /// `[acp]`: what `toolwire acp` asks about and how it sends tool calls.
    #[serde(default)]
    acp: AcpFile,
    /// `[sandbox]`: what commands and Python tools may do.
    #[serde(default)]
    sandbox: SandboxFile,
    /// `[context]`: compaction and oversized tool results.
    #[serde(default)]
    context: context::ContextFile,
    /// `[budgets]`: token and cost limits per turn, conversation, agent.
    #[serde(default)]
    budgets: context::BudgetsFile,
}

/// The `[sandbox]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxFile {
    /// `read-only`, `workspace-write` (default) or `full`.
    mode: Option<Mode>,
    /// Sockets allowed (default false).
    network: Option<bool>,
    /// Extra readable directories.
    #[serde(default)]
    read: Vec<PathBuf>,
    /// Extra writable directories (in `workspace-write`).
    #[serde(default)]
    write: Vec<PathBuf>,
    /// Environment variables passed to commands besides the allow-list.
    #[serde(default)]
    env: Vec<String>,
    /// Processes a command may start (default 4096).
    max_processes: Option<u64>,
    /// Largest file a command may write, MiB (default 4096).
    max_file_size_mb: Option<u64>,
    /// CPU seconds per process (default: none).
    cpu_seconds: Option<u64>,
    /// Address space per process, MiB (default: none).
    memory_mb: Option<u64>,
    /// Run confined modes where the kernel lacks Landlock (default false).
    accept_weaker: Option<bool>,
}

impl SandboxFile {
    fn policy(self, mode: Option<Mode>) -> Result<Policy> {
        let defaults = Limits::commands();
        let mib = |v: Option<u64>| v.map(|mb| mb.saturating_mul(1024 * 1024));
        for name in &self.env {
            if toolwire_sandbox::forbidden_env(name) {
                bail!(
                    "[sandbox] env names `{name}`, which commands never get (toolwire's own \
                     settings and keys, provider keys, TMPDIR)"
                );
            }
        }
        let absolute = |dirs: Vec<PathBuf>, key: &str| -> Result<Vec<PathBuf>> {
            dirs.into_iter()
                .map(|d| {
                    if d.is_absolute() {
                        Ok(d)
                    } else {
                        bail!("[sandbox] {key}: `{}` is not an absolute path", d.display())
                    }
                })
                .collect()
        };
        Ok(Policy {
            mode: mode.or(self.mode).unwrap_or_default(),
            network: self.network.unwrap_or(false),
            read: absolute(self.read, "read")?,
            write: absolute(self.write, "write")?,
            env: self.env,
            limits: Limits {
                processes: self.max_processes.or(defaults.processes),
                file_size: mib(self.max_file_size_mb).or(defaults.file_size),
                cpu_seconds: self.cpu_seconds.or(defaults.cpu_seconds),
                memory: mib(self.memory_mb).or(defaults.memory),
            },
            protected: Vec::new(),
            accept_weaker: self.accept_weaker.unwrap_or(false),
        })
    }
}

/// The `[acp]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcpFile {
    /// `[acp.permissions]`: per tool, `"allow"`, `"ask"` or `"deny"`
    /// (default: read-only tools allow, the others ask).
    #[serde(default)]
    permissions: BTreeMap<String, toolwire_acp::Policy>,
    /// Changes to one tool call this close together go out as one update
    /// (default 50; 0 sends each change at once).
    coalesce_ms: Option<u64>,
    /// Updates per tool call per second (default 20; 0: no limit).
    max_updates_per_second: Option<u32>,
    /// Send complete tool call objects instead of only what changed
    /// (default false).
    complete_objects: Option<bool>,
    /// Bytes of a command's output shown when it is replaced rather than
    /// appended (default 65536).
    output_limit_bytes: Option<usize>,
    /// Bytes of updates one tool call may send at the full rate; past them
    /// its output is sent once per second (default 8388608; 0: none).
    call_byte_budget: Option<u64>,
    /// Sessions kept open (tools, MCP servers, file watcher); the least
    /// recently used beyond them is closed until its next prompt
    /// (default 16).
    max_open_sessions: Option<usize>,
    /// A prompt sent while one runs in the session: `"queue"` (answered
    /// after it, in order; the default) or `"interject"` (lands in the
    /// running turn).
    prompt_while_running: Option<toolwire_acp::PromptWhileRunning>,
    /// The mode of a new session: `read-only`, `ask` (default),
    /// `accept-edits` or `full-access`.
    default_mode: Option<toolwire_acp::SessionMode>,
    /// `[acp.modes.MODE]`: per session mode, the sandbox its commands run
    /// under (`sandbox = "read-only" | "workspace-write" | "full"`).
    #[serde(default)]
    modes: BTreeMap<toolwire_acp::SessionMode, AcpModeFile>,
}

/// One `[acp.modes.MODE]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcpModeFile {
    sandbox: Option<Mode>,
}

impl AcpFile {
    fn settings(self) -> toolwire_acp::AcpSettings {
        let defaults = toolwire_acp::AcpSettings::default();
        let mut tracker = defaults.tracker.clone();
        if let Some(ms) = self.coalesce_ms {
            tracker.coalesce = ms > 0;
            tracker.window = std::time::Duration::from_millis(ms);
        }
        if let Some(rate) = self.max_updates_per_second {
            tracker.max_per_second = rate;
        }
        if let Some(complete) = self.complete_objects {
            tracker.complete_objects = complete;
        }
        if let Some(limit) = self.output_limit_bytes {
            tracker.output_limit = limit.max(1024);
        }
        if let Some(budget) = self.call_byte_budget {
            tracker.call_byte_budget = (budget > 0).then_some(budget);
        }
        toolwire_acp::AcpSettings {
            policies: toolwire_acp::Policies(self.permissions),
            tracker,
            // Filled from the database and `[notifications]` by `acp`.
            watch: defaults.watch,
            max_open_sessions: self
                .max_open_sessions
                .map_or(defaults.max_open_sessions, |n| n.max(1)),
            // Filled by `acp` once the engine (and its sandbox) started.
            sandbox: defaults.sandbox,
            prompt_while_running: self
                .prompt_while_running
                .unwrap_or(defaults.prompt_while_running),
            mode_sandboxes: self
                .modes
                .into_iter()
                .filter_map(|(mode, table)| Some((mode, table.sandbox?)))
                .collect(),
            default_mode: self.default_mode.unwrap_or(defaults.default_mode),
            // Filled by `acp` from the default model.
            key: None,
        }
    }
}

/// The `[notifications]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NotificationsFile {
    /// On by default.
    enabled: Option<bool>,
    /// `augment` (appended to the next tool result, the default) or
    /// `synthetic_tool` (a `_system_notification` call and result).
    mode: Option<NotificationMode>,
    /// Same-source events this close together join one line (default 2).
    coalesce_seconds: Option<f64>,
    /// Lines per block (default 8).
    max_lines: Option<usize>,
    /// Sources that start a turn when none runs (e.g. `["diagnostics"]`).
    #[serde(default)]
    wake: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum InterjectionArg {
    NewMessage,
    Reminder,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum NotificationMode {
    Augment,
    SyntheticTool,
}

impl NotificationsFile {
    fn settings(self) -> Result<NotificationSettings> {
        let defaults = NotificationSettings::default();
        let mut queue = defaults.queue.clone();
        if let Some(seconds) = self.coalesce_seconds {
            queue.coalesce_window = std::time::Duration::try_from_secs_f64(seconds)
                .with_context(|| format!("notifications.coalesce_seconds = {seconds}"))?;
        }
        if let Some(lines) = self.max_lines {
            queue.max_lines = lines.max(1);
        }
        Ok(NotificationSettings {
            enabled: self.enabled.unwrap_or(defaults.enabled),
            mode: match self.mode {
                Some(NotificationMode::SyntheticTool) => InjectionMode::SyntheticTool,
                Some(NotificationMode::Augment) | None => InjectionMode::Augment,
            },
            queue,
            activation: self
                .wake
                .into_iter()
                .map(|source| (source, Activation::Wake))
                .collect(),
        })
    }
}

/// `serve`'s browser and connection settings, from the config file.
#[derive(Debug, Clone)]
pub struct HttpServerConfig {
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub max_connections: usize,
    pub header_timeout: std::time::Duration,
    pub body_timeout: std::time::Duration,
    pub idle_timeout: std::time::Duration,
}

impl HttpServerConfig {
    fn from_file(file: &FileConfig) -> Result<HttpServerConfig> {
        use toolwire_server::ServerSettings as D;
        Ok(HttpServerConfig {
            allowed_hosts: file.allowed_hosts.clone(),
            allowed_origins: file.allowed_origins.clone(),
            max_connections: at_least_one("max_connections", file.max_connections)?
                .unwrap_or(D::DEFAULT_MAX_CONNECTIONS),
            header_timeout: seconds(
                "header_timeout_secs",
                file.header_timeout_secs,
                D::DEFAULT_HEADER_TIMEOUT,
            )?,
            body_timeout: seconds(
                "body_timeout_secs",
                file.body_timeout_secs,
                D::DEFAULT_BODY_TIMEOUT,
            )?,
            idle_timeout: seconds(
                "idle_timeout_secs",
                file.idle_timeout_secs,
                D::DEFAULT_IDLE_TIMEOUT,
            )?,
        })
    }
}

fn not_valid(path: &Path) -> String {
    format!("config file {} is not valid", path.display())
}

/// `value` unless it is zero, which is refused naming `key`.
fn at_least_one<N: PartialEq + Default>(key: &str, value: Option<N>) -> Result<Option<N>> {
    match value {
        Some(n) if n == N::default() => bail!("{key} must be at least 1"),
        other => Ok(other),
    }
}

/// A duration of `value` seconds (at least 1, named by `key`), else `default`.
fn seconds(
    key: &str,
    value: Option<u64>,
    default: std::time::Duration,
) -> Result<std::time::Duration> {
    Ok(at_least_one(key, value)?.map_or(default, std::time::Duration::from_secs))
}

/// Everything resolved.
pub struct Settings {
    pub db: String,
    /// The models (the single-model flags, or `[models.NAME]` tables) and
    /// the default.
    pub models: ModelSettings,
    pub workspace: PathBuf,
    pub engine: EngineConfig,
    /// MCP servers from the config file, named by their table key.
    pub mcp_servers: Vec<McpServerConfig>,
    /// Bearer keys `serve` accepts (the config file's, and
    /// `TOOLWIRE_API_KEYS`, comma-separated).
    pub api_keys: Vec<String>,
    /// `serve`'s hosts, origins and connection limits.
    pub http: HttpServerConfig,
    pub python: PythonLimits,
    /// `serve`'s shutdown grace (`shutdown_grace_secs`), if configured.
    pub shutdown_grace: Option<std::time::Duration>,
    /// `toolwire acp`'s settings (the `[acp]` table).
    pub acp: toolwire_acp::AcpSettings,
    /// Bounds on what a model server may do to a step.
    pub model_limits: ModelLimits,
    /// What commands and Python tools run under (the `[sandbox]` table
    /// and `--sandbox`), with the database and config files protected.
    pub sandbox_policy: Policy,
}

/// How long a model server may keep a step waiting and how much it is
/// asked for (the step's output caps are in [`EngineConfig`]).
#[derive(Debug, Clone, Copy)]
pub struct ModelLimits {
    pub stream: StreamLimits,
    pub max_retry_after: std::time::Duration,
    pub max_tokens: u32,
}

impl ModelLimits {
    fn from_file(file: &FileConfig) -> Result<ModelLimits> {
        let stream = StreamLimits::default();
        Ok(ModelLimits {
            stream: StreamLimits {
                first_byte_timeout: seconds(
                    "first_byte_timeout_secs",
                    file.first_byte_timeout_secs,
                    stream.first_byte_timeout,
                )?,
                idle_timeout: seconds(
                    "stream_idle_timeout_secs",
                    file.stream_idle_timeout_secs,
                    stream.idle_timeout,
                )?,
                ..stream
            },
            // 0 is allowed: never wait for a Retry-After.
            max_retry_after: file
                .max_retry_after_secs
                .map(std::time::Duration::from_secs)
                .unwrap_or(RetryPolicy::default().max_retry_after),
            max_tokens: at_least_one("max_tokens", file.max_tokens)?.unwrap_or(DEFAULT_MAX_TOKENS),
        })
    }
}

impl EngineArgs {
    /// Context for an error in a part of the settings: the config file
    /// names where to look when there is one.
    fn invalid(&self, what: &str) -> String {
        match &self.config {
            Some(path) => not_valid(path),
            None => format!("{what} are not valid"),
        }
    }

    pub fn resolve(&self) -> Result<Settings> {
        let file = match &self.config {
            Some(path) => read_config(path)?,
            None => FileConfig::default(),
        };
        let model_limits =
            ModelLimits::from_file(&file).with_context(|| self.invalid("the model limits"))?;
        let http = HttpServerConfig::from_file(&file)
            .with_context(|| self.invalid("the server settings"))?;
        let tool_format = match self.tool_format.or(file.tool_format) {
            Some(ToolFormatArg::Xml) => ToolFormat::Xml,
            _ => ToolFormat::Native,
        };
        let compact_at_per_model = file
            .models
            .iter()
            .filter_map(|(name, m)| m.compact_at().map(|c| (name.clone(), c)))
            .collect();
        let models = ModelSettings::resolve(
            models::Flags {
                provider: self.provider.or(file.provider),
                model: self.model.clone().or(file.model),
                base_url: self.base_url.clone().or(file.base_url),
                api_key_env: self.api_key_env.clone().or(file.api_key_env),
                script: self.script.clone().or(file.script),
                tool_format,
            },
            file.default_model,
            file.models,
        )
        .with_context(|| self.invalid("the model settings"))?;
        let workspace = match self.workspace.clone().or(file.workspace) {
            Some(dir) => dir,
            None => std::env::current_dir().context("reading the working directory")?,
        };
        // Checked here so that a server configured wrong stops the start
        // like any other config error, rather than being a warning later.
        let mcp_servers = file
            .mcp_servers
            .into_iter()
            .map(|(name, config)| {
                let config = McpServerConfig { name, ..config };
                config.validate().map(|()| config)
            })
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| self.invalid("the MCP servers"))?;
        let model_names: Vec<String> = models
            .specs
            .iter()
            .filter_map(|s| s.name.clone().or_else(|| s.model.clone()))
            .collect();
        let context = file
            .context
            .settings(compact_at_per_model, &model_names)
            .with_context(|| self.invalid("the context settings"))?;
        let budgets = file
            .budgets
            .budgets()
            .with_context(|| self.invalid("the budgets"))?;
        let defaults = EngineConfig::default();
        let failover = file
            .failover_secs
            .map(|secs| failover_after(secs).with_context(|| format!("failover_secs = {secs}")))
            .transpose()?;
        let db = match self.db.clone().or(file.db) {
            Some(db) => db,
            None => default_db()?,
        };
        let mut sandbox_policy = file
            .sandbox
            .policy(self.sandbox)
            .with_context(|| self.invalid("the sandbox settings"))?;
        // Commands never open toolwire's own files, wherever they are.
        let mut protected: Vec<PathBuf> = toolwire_store::local_files(&db);
        protected.extend(self.config.clone());
        sandbox_policy.protected = toolwire_sandbox::canonical(protected);
        Ok(Settings {
            http,
            db,
            workspace,
            engine: EngineConfig {
                system_prompt: file.system_prompt.unwrap_or(defaults.system_prompt),
                max_steps: file.max_steps.unwrap_or(defaults.max_steps),
                max_step_output_bytes: file
                    .max_step_output_bytes
                    .unwrap_or(defaults.max_step_output_bytes)
                    .max(1),
                max_step_events: file
                    .max_step_events
                    .unwrap_or(defaults.max_step_events)
                    .max(1),
                // Each model's own format is in its capabilities (see
                // ModelSpec); the engine's stays for callers without a
                // registry.
                tool_format: if models.specs.iter().all(|s| s.name.is_none()) {
                    tool_format
                } else {
                    ToolFormat::Native
                },
                prices: file.prices,
                notifications: file.notifications.settings()?,
                interjections: match file.interjections {
                    Some(InterjectionArg::Reminder) => InterjectionMode::Reminder,
                    Some(InterjectionArg::NewMessage) | None => InterjectionMode::NewMessage,
                },
                stale_owner_after: failover.unwrap_or(defaults.stale_owner_after),
                heartbeat_interval: failover
                    .map(|f| f / 3)
                    .unwrap_or(defaults.heartbeat_interval),
                context,
                budgets,
                ..defaults
            },
            models,
            api_keys: {
                let mut keys = file.api_keys;
                if let Ok(env) = std::env::var("TOOLWIRE_API_KEYS") {
                    keys.extend(
                        env.split(',')
                            .map(str::trim)
                            .filter(|k| !k.is_empty())
                            .map(str::to_owned),
                    );
                }
                keys
            },
            python: {
                let defaults = PythonLimits::default();
                PythonLimits {
                    timeout: file
                        .python_timeout_seconds
                        .map(std::time::Duration::from_secs)
                        .unwrap_or(defaults.timeout),
                    memory_bytes: file
                        .python_memory_mb
                        .map(|mb| mb * 1024 * 1024)
                        .unwrap_or(defaults.memory_bytes),
                }
            },
            shutdown_grace: file
                .shutdown_grace_secs
                .map(|secs| {
                    std::time::Duration::try_from_secs_f64(secs)
                        .with_context(|| format!("shutdown_grace_secs = {secs}"))
                })
                .transpose()?,
            acp: file.acp.settings(),
            mcp_servers,
            model_limits,
            sandbox_policy,
        })
    }
}

fn read_config(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| not_valid(path))
}

impl Settings {
    /// The registry of models the engine starts with: one provider per
    /// model.
    pub fn registry(&self) -> Result<toolwire_providers::Models> {
        self.models
            .registry(&self.model_limits)
            .context("the models are not valid")
    }

    /// The workspace root of the built-in tools.
    pub fn workspace(&self) -> Result<Workspace> {
        Workspace::new(&self.workspace)
            .with_context(|| format!("workspace {}", self.workspace.display()))
    }

    /// The sandbox commands run in: the small `toolwire-sandbox` helper
    /// beside this binary when it is there and of this version, else this
    /// very binary's hidden helper subcommand; probed once. What it found
    /// is logged (a warning when the kernel confines less than the mode
    /// means, or when a helper beside it was passed over).
    pub fn sandbox(&self) -> Result<Arc<Sandbox>> {
        let exe = std::env::current_exe().context("finding the toolwire binary")?;
        let (sandbox, passed_over) =
            Sandbox::for_toolwire(&exe, SANDBOX_SUBCOMMAND, self.sandbox_policy.clone());
        if let Some(why) = passed_over {
            tracing::warn!(
                "sandbox: not using the helper beside toolwire ({why}); commands start through \
                 `toolwire {SANDBOX_SUBCOMMAND}`, which is slower"
            );
        }
        let mut line = sandbox.describe();
        if let Some(helper) = sandbox.helper() {
            let mut words = vec![helper.exe.display().to_string()];
            words.extend(helper.args.iter().map(|a| a.to_string_lossy().into_owned()));
            line.push_str(&format!(" (helper: {})", words.join(" ")));
        }
        if sandbox
            .support()
            .shortfall(self.sandbox_policy.mode, self.sandbox_policy.network)
            .is_some()
        {
            tracing::warn!("sandbox: {line}");
        } else {
            tracing::info!("sandbox: {line}");
        }
        Ok(Arc::new(sandbox))
    }

    /// The built-in tools, confined to `workspace` (commands through
    /// `sandbox`), and the tools of the configured MCP servers (a server
    /// that fails to start is logged as a warning and left out).
    pub async fn tools(
        &self,
        workspace: Arc<Workspace>,
        sandbox: Arc<Sandbox>,
    ) -> Result<ToolRegistry> {
        let mut registry = ToolRegistry::new();
        let launch = mcp::Launch {
            sandbox: sandbox.clone(),
            workspace: workspace.root().to_path_buf(),
        };
        for tool in builtin::all(workspace, sandbox) {
            registry.register(tool);
        }
        // connect_all logs each failed server as a warning itself. Servers
        // are sources, not fixed tools: their tool lists can change.
        let (mcp_servers, _warnings) = mcp::connect_all(self.mcp_servers.clone(), &launch).await;
        for server in mcp_servers {
            registry.register_source(server);
        }
        Ok(registry)
    }

    /// How file watchers behave: the defaults, never reporting the
    /// store's own files (the SQLite database and its `-wal`, `-shm`,
    /// `-journal` siblings), wherever the database is. `None` when
    /// notifications are off: nothing is watched.
    pub fn watch_settings(&self) -> Option<WatchSettings> {
        self.engine.notifications.enabled.then(|| WatchSettings {
            ignore_paths: toolwire_store::local_files(&self.db),
            ..WatchSettings::default()
        })
    }

    /// Opens the store, starts the engine and, when notifications are on,
    /// the file watcher on the workspace (a watcher that cannot start is a
    /// warning, not an error). Keep the result for as long as the engine
    /// runs: dropping it stops the watcher.
    pub async fn start(&self) -> Result<Running> {
        self.start_watching(true).await
    }

    /// [`Settings::start`] without the process-wide file watcher: for
    /// front doors whose sessions watch their own directories (`acp`).
    pub async fn start_unwatched(&self) -> Result<Running> {
        self.start_watching(false).await
    }

    async fn start_watching(&self, watch_workspace: bool) -> Result<Running> {
        if self.models.demo {
            eprintln!(
                "toolwire: no model configured; playing the built-in demo script \
                 (set --provider, --model and --base-url to use a real model)"
            );
        }
        // Before the database: a model configured wrong stops the start
        // with nothing opened.
        let models = self.registry()?;
        let store = toolwire_store::open(&self.db)
            .await
            .with_context(|| format!("opening the database {}", self.db))?;
        let workspace = Arc::new(self.workspace()?);
        let sandbox = self.sandbox()?;
        let engine = Engine::start(
            store,
            models,
            self.tools(workspace.clone(), sandbox.clone()).await?,
            self.engine.clone(),
        )
        .await?;
        let settings = self.watch_settings().filter(|_| watch_workspace);
        let watcher = if let Some(settings) = settings {
            match watch::start(&engine, &workspace, settings).await {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "file changes in the workspace will not be reported");
                    None
                }
            }
        } else {
            None
        };
        Ok(Running {
            engine,
            watcher,
            sandbox,
            workspace,
        })
    }
}

/// A started engine and what runs beside it: the workspace's file watcher,
/// which reports outside changes to the agent (stopped when this is
/// dropped).
pub struct Running {
    pub engine: Engine,
    watcher: Option<WatchHandle>,
    /// What commands run under (shared with the front doors' own tools).
    pub sandbox: Arc<Sandbox>,
    /// The built-in tools' root, opened once at start.
    pub workspace: Arc<Workspace>,
}

impl Running {
    /// Where Python-source tools run: the commands' sandbox, in this
    /// workspace.
    pub fn python_sandbox(&self) -> PythonSandbox {
        PythonSandbox::new(self.sandbox.clone(), self.workspace.root())
    }
}

impl Running {
    /// The directory watched for changes, if any.
    pub fn watching(&self) -> Option<&Path> {
        self.watcher.as_ref().map(WatchHandle::root)
    }

    /// Stops watching, then writes the notifications still pending to the
    /// store (the engine keeps them as they change; this catches the last
    /// changes), so that the next start delivers them.
    pub async fn stop(self) {
        drop(self.watcher);
        if let Err(e) = self.engine.keep_notifications().await {
            tracing::warn!(error = %e, "pending notifications could not be kept in the store");
        }
    }
}

/// How long an instance may stay silent before the others take over its
/// turns (`failover_secs`, `--failover-secs`): at least 0.3 s, so that its
/// heartbeat (a third of it) stays a real interval.
pub fn failover_after(secs: f64) -> Result<std::time::Duration> {
    let after = std::time::Duration::try_from_secs_f64(secs)?;
    anyhow::ensure!(
        after >= std::time::Duration::from_millis(300),
        "must be at least 0.3 seconds"
    );
    Ok(after)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn resolve(toml: &str) -> Result<Settings> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolwire.toml");
        std::fs::write(&path, toml).unwrap();
        EngineArgs {
            config: Some(path),
            workspace: Some(dir.path().to_path_buf()),
            ..Default::default()
        }
        .resolve()
    }

    /// What `toml` is refused with (all its causes).
    fn refusal(toml: &str) -> String {
        match resolve(toml) {
            Ok(_) => panic!("{toml} was accepted"),
            Err(error) => format!("{error:#}"),
        }
    }

    #[test]
    fn model_bounds_come_from_the_config_file() {
        let settings = resolve(
            r#"
            max_tokens = 2048
            first_byte_timeout_secs = 30
            stream_idle_timeout_secs = 90
            max_retry_after_secs = 5
            max_step_output_bytes = 100000
            max_step_events = 1000
            "#,
        )
        .unwrap();
        let limits = settings.model_limits;
        assert_eq!(limits.max_tokens, 2048);
        assert_eq!(limits.stream.first_byte_timeout.as_secs(), 30);
        assert_eq!(limits.stream.idle_timeout.as_secs(), 90);
        assert_eq!(limits.max_retry_after.as_secs(), 5);
        assert_eq!(settings.engine.max_step_output_bytes, 100_000);
        assert_eq!(settings.engine.max_step_events, 1000);

        let defaults = resolve("").unwrap();
        assert_eq!(defaults.model_limits.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(defaults.model_limits.stream.idle_timeout.as_secs(), 300);

        for key in [
            "first_byte_timeout_secs",
            "stream_idle_timeout_secs",
            "max_tokens",
        ] {
            let error = format!("{:#}", resolve(&format!("{key} = 0")).err().unwrap());
            assert!(
                error.contains(key) && error.contains("at least 1"),
                "{error}"
            );
        }
    }

    #[test]
    fn mcp_servers_are_stdio_or_http_and_named_by_their_key() {
        let settings = resolve(
            r#"
            [mcp_servers.local]
            command = "npx"
            args = ["-y", "@modelcontextprotocol/server-everything"]

            [mcp_servers.remote]
            url = "https://mcp.example.com/mcp"
            headers = { Authorization = "Bearer secret" }
            "#,
        )
        .unwrap();
        let [local, remote] = &settings.mcp_servers[..] else {
            panic!("{:?}", settings.mcp_servers);
        };
        assert_eq!(local.name, "local");
        assert_eq!(local.command.as_deref(), Some("npx"));
        assert_eq!(remote.name, "remote");
        assert_eq!(remote.url.as_deref(), Some("https://mcp.example.com/mcp"));
        assert_eq!(remote.headers["Authorization"], "Bearer secret");
    }

    #[test]
    fn an_mcp_server_with_both_or_neither_transport_stops_the_start() {
        for (toml, says) in [
            (
                "[mcp_servers.both]\ncommand = \"npx\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
                "MCP server `both` is not configured right: give either `command`",
            ),
            (
                "[mcp_servers.neither]\ntimeout_secs = 5\n",
                "MCP server `neither` is not configured right: give `command`",
            ),
            (
                "[mcp_servers.web]\nurl = \"http://127.0.0.1:9/mcp\"\n\
                 headers = { mcp-session-id = \"x\" }\n",
                "MCP server `web` is not configured right: header `mcp-session-id` cannot be \
                 given",
            ),
        ] {
            let message = refusal(toml);
            assert!(
                message.contains("is not valid") && message.contains(says),
                "{message}"
            );
        }
    }

    #[test]
    fn serve_hosts_origins_and_limits_come_from_the_file() {
        let settings = resolve(
            "allowed_hosts = [\"toolwire.example.com\"]\n\
             allowed_origins = [\"https://ui.example.com\"]\n\
             max_connections = 64\nheader_timeout_secs = 5\nidle_timeout_secs = 7\n\
             body_timeout_secs = 9\n",
        )
        .unwrap();
        let http = &settings.http;
        assert_eq!(http.allowed_hosts, ["toolwire.example.com"]);
        assert_eq!(http.allowed_origins, ["https://ui.example.com"]);
        assert_eq!(http.max_connections, 64);
        assert_eq!(http.header_timeout, std::time::Duration::from_secs(5));
        assert_eq!(http.idle_timeout, std::time::Duration::from_secs(7));
        assert_eq!(http.body_timeout, std::time::Duration::from_secs(9));
        let defaults = resolve("").unwrap().http;
        assert_eq!(defaults.max_connections, 512);
        assert_eq!(defaults.header_timeout, std::time::Duration::from_secs(10));
        assert_eq!(defaults.idle_timeout, std::time::Duration::from_secs(30));
        assert_eq!(defaults.body_timeout, std::time::Duration::from_secs(30));
        for (toml, says) in [
            (
                "max_connections = 0\n",
                "max_connections must be at least 1",
            ),
            (
                "header_timeout_secs = 0\n",
                "header_timeout_secs must be at least 1",
            ),
            (
                "idle_timeout_secs = 0\n",
                "idle_timeout_secs must be at least 1",
            ),
            (
                "body_timeout_secs = 0\n",
                "body_timeout_secs must be at least 1",
            ),
        ] {
            let message = refusal(toml);
            assert!(message.contains(says), "{message}");
        }
    }

    #[test]
    fn an_mcp_url_that_is_not_valid_is_not_echoed() {
        let toml = "[mcp_servers.web]\nurl = \"ftp://user:s3cret@example.com/mcp?key=s3cret\"\n";
        let message = refusal(toml);
        assert!(
            message.contains("MCP server `web` is not configured right")
                && message.contains("http:// or https://")
                && !message.contains("s3cret"),
            "{message}"
        );
    }

    #[test]
    fn the_sandbox_table_becomes_the_policy_and_names_what_is_wrong() {
        let settings = resolve(
            "db = \"sqlite://t.db\"\n[sandbox]\nmode = \"read-only\"\nnetwork = true\n\
             read = [\"/opt/sdk\"]\nenv = [\"CI\"]\nmax_processes = 64\nmemory_mb = 100\n\
             accept_weaker = true\n",
        )
        .unwrap();
        let p = &settings.sandbox_policy;
        assert_eq!(p.mode, Mode::ReadOnly);
        assert!(p.network && p.accept_weaker);
        assert_eq!(p.read, [PathBuf::from("/opt/sdk")]);
        assert_eq!(p.env, ["CI"]);
        assert_eq!(p.limits.processes, Some(64));
        assert_eq!(p.limits.memory, Some(100 * 1024 * 1024));
        // The database and the config file are protected, by their real paths.
        assert!(p.protected.iter().any(|f| f.ends_with("t.db")));
        assert!(p.protected.iter().any(|f| f.ends_with("toolwire.toml")));
        assert!(p.protected.iter().all(|f| f.is_absolute()));

        for (toml, says) in [
            (
                "[sandbox]\nenv = [\"OPENAI_API_KEY\"]\n",
                "`OPENAI_API_KEY`",
            ),
            ("[sandbox]\nenv = [\"TOOLWIRE_DB\"]\n", "`TOOLWIRE_DB`"),
            ("[sandbox]\nwrite = [\"rel/dir\"]\n", "not an absolute path"),
            ("[sandbox]\nmode = \"open\"\n", "unknown variant"),
        ] {
            let message = refusal(&format!("db = \"sqlite://t.db\"\n{toml}"));
            assert!(message.contains(says), "{message}");
        }
    }

    #[test]
    fn acp_modes_take_a_default_and_a_sandbox_each_and_name_what_is_wrong() {
        let settings = resolve(
            "db = \"sqlite://t.db\"\n[acp]\ndefault_mode = \"accept-edits\"\n\
             [acp.modes.full-access]\nsandbox = \"workspace-write\"\n\
             [acp.modes.read-only]\n",
        )
        .unwrap();
        assert_eq!(
            settings.acp.default_mode,
            toolwire_acp::SessionMode::AcceptEdits
        );
        assert_eq!(
            settings.acp.mode_sandboxes,
            BTreeMap::from([(toolwire_acp::SessionMode::FullAccess, Mode::WorkspaceWrite)])
        );
        for (toml, says) in [
            ("[acp]\ndefault_mode = \"yolo\"\n", "unknown variant `yolo`"),
            (
                "[acp.modes.yolo]\nsandbox = \"full\"\n",
                "unknown variant `yolo`",
            ),
            (
                "[acp.modes.ask]\nsandbox = \"open\"\n",
                "unknown variant `open`",
            ),
            (
                "[acp.modes.ask]\nnetwork = true\n",
                "unknown field `network`",
            ),
        ] {
            let message = refusal(&format!("db = \"sqlite://t.db\"\n{toml}"));
            assert!(message.contains(says), "{message}");
        }
    }

    #[test]
    fn the_context_and_budget_tables_reach_the_engine_and_name_what_is_wrong() {
        let settings = resolve(
            "db = \"sqlite://t.db\"\n[context]\ncompact_at = 0.7\nkeep_recent = 0.2\n\
             max_tool_result = 0.1\n[budgets]\nturn_max_tokens = 5000\n\
             conversation_max_cost = 2.5\nagent_max_tokens = 90000\nwarn_at = 0.9\n",
        )
        .unwrap();
        let c = &settings.engine.context;
        assert_eq!(
            (c.compact_at, c.keep_recent, c.max_tool_result),
            (0.7, 0.2, 0.1)
        );
        let b = &settings.engine.budgets;
        assert_eq!(b.turn.max_tokens, Some(5000));
        assert_eq!(b.conversation.max_cost, Some(2.5));
        assert_eq!(b.agent.max_tokens, Some(90000));
        assert_eq!(b.warn_at, 0.9);

        // A model's own compact_at.
        let with_model =
            TWO_MODELS.replace("[models.gpt]\n", "[models.gpt]\n        compact_at = 0.6\n");
        let settings = resolve(&format!("db = \"sqlite://t.db\"\n{with_model}")).unwrap();
        assert_eq!(settings.engine.context.compact_at_for("gpt"), 0.6);
        assert_eq!(settings.engine.context.compact_at_for("sonnet"), 0.8);

        for (toml, says) in [
            ("[context]\ncompact_at = 1.5\n", "compact_at = 1.5"),
            (
                "[context]\nkeep_recent = 0.9\n",
                "keep_recent = 0.9 must be below",
            ),
            (
                "[context]\nsummary_model = \"nope\"\n",
                "summary_model = \"nope\"",
            ),
            ("[context]\ncompact = 0.5\n", "unknown field"),
            ("[budgets]\nturn_max_cost = -1.0\n", "turn_max_cost = -1"),
            ("[budgets]\nwarn_at = 0\n", "warn_at"),
        ] {
            let message = refusal(&format!("db = \"sqlite://t.db\"\n{toml}"));
            assert!(message.contains(says), "{message}");
        }
    }

    #[test]
    fn acp_lets_the_default_model_start_without_its_key_and_names_the_variable() {
        let mut settings = resolve(
            "db = \"sqlite://t.db\"\ndefault_model = \"gpt\"\n\
             [models.gpt]\nprovider = \"openai\"\nmodel = \"gpt-x\"\napi_key_env = \"TW_TEST_UNSET_KEY\"\n\
             [models.local]\nprovider = \"openai\"\nmodel = \"l\"\nbase_url = \"http://127.0.0.1:9/v1\"\n",
        )
        .unwrap();
        let Err(error) = settings.registry() else {
            panic!("a missing key stops other commands");
        };
        assert!(
            format!("{error:#}").contains("TW_TEST_UNSET_KEY"),
            "{error:#}"
        );
        assert_eq!(
            settings.models.allow_missing_keys(),
            Some(("gpt".to_owned(), "TW_TEST_UNSET_KEY".to_owned()))
        );
        assert!(settings.registry().is_ok());
    }

    /// One model as the tests compare it: name, provider kind, model id,
    /// fallbacks.
    type Described = (String, String, String, Vec<String>);

    /// The registry the settings build, and the default's name.
    fn registry_of(toml: &str) -> Result<(Vec<Described>, String)> {
        let models = resolve(toml)?.registry()?;
        Ok((
            models
                .iter()
                .map(|e| {
                    (
                        e.info.name.clone(),
                        e.info.provider.clone(),
                        e.info.model.clone(),
                        e.info.fallback.clone(),
                    )
                })
                .collect(),
            models.default_entry().info.name.clone(),
        ))
    }

    const TWO_MODELS: &str = r#"
        default_model = "sonnet"
        [models.sonnet]
        provider = "anthropic"
        model = "claude-sonnet-4-5"
        base_url = "http://127.0.0.1:9/v1"
        context_window = 200000
        max_output = 4096
        vision = true
        reasoning = true
        fallback = ["gpt"]
        price = { input = 3.0, output = 15.0, cached_input = 0.3 }
        [models.gpt]
        provider = "openai"
        model = "gpt-4o"
        base_url = "http://127.0.0.1:9/v1"
        tool_format = "xml"
    "#;

    #[test]
    fn model_tables_make_the_registry_with_its_default() {
        let (models, default) = registry_of(TWO_MODELS).unwrap();
        assert_eq!(default, "sonnet");
        assert_eq!(
            models,
            [
                (
                    "gpt".to_owned(),
                    "openai".to_owned(),
                    "gpt-4o".to_owned(),
                    Vec::new()
                ),
                (
                    "sonnet".to_owned(),
                    "anthropic".to_owned(),
                    "claude-sonnet-4-5".to_owned(),
                    vec!["gpt".to_owned()]
                ),
            ]
        );
        let registry = resolve(TWO_MODELS).unwrap().registry().unwrap();
        let sonnet = &registry.get("sonnet").unwrap().info;
        assert_eq!(sonnet.context_window, Some(200_000));
        assert_eq!(sonnet.max_output, Some(4096));
        assert!(sonnet.capabilities.vision && sonnet.capabilities.reasoning);
        assert!(sonnet.capabilities.tools);
        let price = sonnet.price.unwrap();
        assert_eq!((price.input, price.output), (3.0, 15.0));
        assert_eq!(price.cached_input, Some(0.3));
        let gpt = &registry.get("gpt").unwrap().info;
        assert!(!gpt.capabilities.tools, "tool_format = xml");
        assert!(!gpt.capabilities.vision);
        assert_eq!(gpt.price, None);
    }

    #[test]
    fn prompt_caching_is_on_unless_a_table_turns_it_off() {
        let settings = resolve(
            "default_model = \"a\"\n\
             [models.a]\nprovider = \"anthropic\"\nmodel = \"claude-x\"\nbase_url = \"http://127.0.0.1:9\"\n\
             [models.b]\nprovider = \"anthropic\"\nmodel = \"claude-y\"\nbase_url = \"http://127.0.0.1:9\"\nprompt_caching = false\n",
        )
        .unwrap();
        let caching: Vec<(Option<String>, bool)> = settings
            .models
            .specs
            .iter()
            .map(|s| (s.name.clone(), s.prompt_caching))
            .collect();
        assert_eq!(
            caching,
            [(Some("a".to_owned()), true), (Some("b".to_owned()), false)]
        );
    }

    #[test]
    fn model_picks_a_table_as_the_default() {
        let settings = EngineArgs {
            model: Some("gpt".into()),
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolwire.toml");
        std::fs::write(&path, TWO_MODELS).unwrap();
        let settings = EngineArgs {
            config: Some(path.clone()),
            workspace: Some(dir.path().to_path_buf()),
            ..settings
        }
        .resolve()
        .unwrap();
        assert_eq!(
            settings.registry().unwrap().default_entry().info.name,
            "gpt"
        );
        // The file's own `model` key does the same.
        let (_, default) = registry_of(&format!("model = \"gpt\"\n{TWO_MODELS}")).unwrap();
        assert_eq!(default, "gpt");
        // A name that is no table, without --provider, is a mistake.
        let error = format!(
            "{:#}",
            registry_of(&format!("model = \"gpt4\"\n{TWO_MODELS}"))
                .err()
                .unwrap()
        );
        assert!(
            error.contains(
                "--model gpt4 (or TOOLWIRE_MODEL, or the file's `model`) is not one of \
                 the configured models (gpt, sonnet)"
            ),
            "{error}"
        );
        // A table named together with another provider's settings.
        let error = format!(
            "{:#}",
            registry_of(&format!(
                "model = \"gpt\"\nbase_url = \"http://127.0.0.1:1/v1\"\n{TWO_MODELS}"
            ))
            .err()
            .unwrap()
        );
        assert!(
            error.contains("--model gpt names [models.gpt], whose base_url is set in that table"),
            "{error}"
        );
    }

    #[test]
    fn single_model_flags_still_define_the_default() {
        // Alone: a registry of one, named after its model id.
        let (models, default) =
            registry_of("provider = \"openai\"\nmodel = \"gpt-4o-mini\"\nbase_url = \"http://127.0.0.1:9/v1\"\n")
                .unwrap();
        assert_eq!(default, "gpt-4o-mini");
        assert_eq!(models[0].1, "openai");
        // No model at all: the demo script, named as before.
        let settings = resolve("").unwrap();
        assert!(settings.models.demo);
        assert_eq!(
            settings.registry().unwrap().default_entry().info.name,
            "toolwire-demo"
        );
        // Beside tables: one more model, the default.
        let (models, default) = registry_of(&format!(
            "provider = \"openai\"\nmodel = \"local-llama\"\nbase_url = \"http://127.0.0.1:9/v1\"\n{TWO_MODELS}"
        ))
        .unwrap();
        assert_eq!(default, "local-llama");
        assert_eq!(models.len(), 3);
    }

    #[test]
    fn a_model_table_configured_wrong_stops_the_start_naming_it() {
        for (toml, says) in [
            (
                "[models.x]\nprovider = \"gemini\"\nmodel = \"g\"\n",
                "[models.x] provider = \"gemini\" is not a provider",
            ),
            ("[models.x]\nmodel = \"g\"\n", "[models.x] has no provider"),
            (
                "[models.x]\nprovider = \"openai\"\n",
                "[models.x] has no model",
            ),
            (
                "[models.x]\nprovider = \"openai\"\nmodel = \"g\"\nfallback = [\"y\"]\n\
                 base_url = \"http://127.0.0.1:9\"\n",
                "model `x` falls back to `y`, which is not one of the configured models",
            ),
            (
                "[models.x]\nprovider = \"openai\"\nmodel = \"g\"\nfallback = [\"x\"]\n",
                "[models.x] falls back to itself",
            ),
            (
                "default_model = \"z\"\n[models.x]\nprovider = \"scripted\"\n",
                "default_model `z` is not one of the configured models (x)",
            ),
            (
                "default_model = \"z\"\n",
                "default_model = \"z\" but no [models.z] table is configured",
            ),
            (
                "[models.x]\nprovider = \"scripted\"\n[models.y]\nprovider = \"scripted\"\n",
                "several models are configured (x, y): set default_model",
            ),
            (
                "[models.x]\nprovider = \"openai\"\nmodel = \"g\"\n\
                 api_key_env = \"TOOLWIRE_TEST_KEY_THAT_IS_NEVER_SET\"\n",
                "model `x`: no API key: set TOOLWIRE_TEST_KEY_THAT_IS_NEVER_SET",
            ),
            (
                "[models.x]\nprovider = \"openai\"\nmodel = \"g\"\nmax_output = 0\n",
                "[models.x] max_output must be at least 1",
            ),
            (
                "[models.x]\nprovider = \"scripted\"\ncolour = \"red\"\n",
                "unknown field `colour`",
            ),
            // The flags' model named like a table.
            (
                "provider = \"scripted\"\n[models.toolwire-demo]\nprovider = \"scripted\"\n",
                "model `toolwire-demo` is defined twice",
            ),
        ] {
            let error = match registry_of(toml) {
                Ok(models) => panic!("{toml} was accepted: {models:?}"),
                Err(e) => format!("{e:#}"),
            };
            assert!(error.contains(says), "{toml}: {error}");
        }
    }
}
