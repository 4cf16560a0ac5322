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
use toolwire_engine::provider::{
    AnthropicProvider, HttpSettings, OpenAiProvider, Provider, RetryPolicy, Script,
    ScriptedProvider, ToolFormat, anthropic, openai, scripted,
};
use toolwire_engine::tools::ToolRegistry;
use toolwire_engine::tools::builtin::{self, Workspace};
use toolwire_engine::tools::mcp::{self, McpServerConfig};
use toolwire_engine::tools::python::PythonLimits;
use toolwire_engine::watch::{self, WatchHandle, WatchSettings};
use toolwire_engine::{Engine, EngineConfig, InterjectionMode};

pub const DEFAULT_DB: &str = "sqlite://toolwire.db";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions (OpenAI, vLLM, llama.cpp, Ollama…).
    Openai,
    /// Anthropic messages.
    Anthropic,
    /// Plays a script file (or the built-in demo): deterministic, offline.
    Scripted,
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
    /// Database URL: sqlite://PATH or postgres://… [default: sqlite://toolwire.db]
    #[arg(long, env = "TOOLWIRE_DB", value_name = "URL")]
    pub db: Option<String>,
    /// TOML config file with the same keys as these flags (and prices).
    #[arg(long, env = "TOOLWIRE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Model API [default: scripted demo when no model is configured].
    #[arg(long, env = "TOOLWIRE_PROVIDER", value_enum)]
    pub provider: Option<ProviderKind>,
    /// API base URL [default: the provider's public API].
    #[arg(long, env = "TOOLWIRE_BASE_URL", value_name = "URL")]
    pub base_url: Option<String>,
    /// Model name.
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
    /// Seconds a Python-source tool may run (default 60).
    python_timeout_seconds: Option<u64>,
    /// Memory a Python-source tool may use, in MiB (default 512).
    python_memory_mb: Option<u64>,
    /// `serve`: on SIGTERM or Ctrl-C, seconds running turns get to reach
    /// their next stored step before they are cut (default 10).
    shutdown_grace_secs: Option<f64>,
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

/// Everything resolved.
pub struct Settings {
    pub db: String,
    pub provider: ProviderKind,
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub api_key_env: Option<String>,
    pub tool_format: ToolFormat,
    pub script: Option<PathBuf>,
    pub workspace: PathBuf,
    pub engine: EngineConfig,
    /// The built-in demo script plays because no model is configured.
    pub demo: bool,
    /// MCP servers from the config file, named by their table key.
    pub mcp_servers: Vec<McpServerConfig>,
    /// Bearer keys `serve` accepts (the config file's, and
    /// `TOOLWIRE_API_KEYS`, comma-separated).
    pub api_keys: Vec<String>,
    pub python: PythonLimits,
    /// `serve`'s shutdown grace (`shutdown_grace_secs`), if configured.
    pub shutdown_grace: Option<std::time::Duration>,
    /// `toolwire acp`'s settings (the `[acp]` table).
    pub acp: toolwire_acp::AcpSettings,
}

impl EngineArgs {
    pub fn resolve(&self) -> Result<Settings> {
        let file = match &self.config {
            Some(path) => read_config(path)?,
            None => FileConfig::default(),
        };
        let model = self.model.clone().or(file.model);
        let script = self.script.clone().or(file.script);
        let explicit = self.provider.or(file.provider);
        let demo = explicit.is_none() && model.is_none() && script.is_none();
        let provider = explicit.unwrap_or(if model.is_some() {
            ProviderKind::Openai
        } else {
            ProviderKind::Scripted
        });
        let tool_format = match self.tool_format.or(file.tool_format) {
            Some(ToolFormatArg::Xml) => ToolFormat::Xml,
            _ => ToolFormat::Native,
        };
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
            .with_context(|| match &self.config {
                Some(path) => format!("config file {} is not valid", path.display()),
                None => "the MCP servers are not valid".to_owned(),
            })?;
        let defaults = EngineConfig::default();
        Ok(Settings {
            db: self
                .db
                .clone()
                .or(file.db)
                .unwrap_or_else(|| DEFAULT_DB.to_owned()),
            provider,
            base_url: self.base_url.clone().or(file.base_url),
            model,
            api_key_env: self.api_key_env.clone().or(file.api_key_env),
            tool_format,
            script,
            workspace,
            engine: EngineConfig {
                system_prompt: file.system_prompt.unwrap_or(defaults.system_prompt),
                max_steps: file.max_steps.unwrap_or(defaults.max_steps),
                tool_format,
                prices: file.prices,
                notifications: file.notifications.settings()?,
                interjections: match file.interjections {
                    Some(InterjectionArg::Reminder) => InterjectionMode::Reminder,
                    Some(InterjectionArg::NewMessage) | None => InterjectionMode::NewMessage,
                },
                ..defaults
            },
            demo,
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
        })
    }
}

fn read_config(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {} is not valid", path.display()))
}

impl Settings {
    /// The model provider these settings describe.
    pub fn provider(&self) -> Result<Arc<dyn Provider>> {
        let native = self.tool_format == ToolFormat::Native;
        Ok(match self.provider {
            ProviderKind::Scripted => {
                let text = match &self.script {
                    Some(path) => std::fs::read_to_string(path)
                        .with_context(|| format!("reading script {}", path.display()))?,
                    None => scripted::DEMO_SCRIPT.to_owned(),
                };
                let script = Script::parse(&text)?;
                Arc::new(ScriptedProvider::new(script, !native))
            }
            ProviderKind::Openai => {
                let settings = self.http(openai::DEFAULT_BASE_URL, "OPENAI_API_KEY")?;
                Arc::new(OpenAiProvider::new(settings, self.model_name()?, native))
            }
            ProviderKind::Anthropic => {
                let settings = self.http(anthropic::DEFAULT_BASE_URL, "ANTHROPIC_API_KEY")?;
                Arc::new(AnthropicProvider::new(settings, self.model_name()?, native))
            }
        })
    }

    fn model_name(&self) -> Result<String> {
        match &self.model {
            Some(m) => Ok(m.clone()),
            None => bail!("--model is required with --provider openai or anthropic"),
        }
    }

    fn http(&self, default_url: &str, default_key_env: &str) -> Result<HttpSettings> {
        let base_url = self
            .base_url
            .clone()
            .unwrap_or_else(|| default_url.to_owned());
        let key_env = self.api_key_env.as_deref().unwrap_or(default_key_env);
        let api_key = std::env::var(key_env).ok().filter(|k| !k.is_empty());
        if api_key.is_none() && self.base_url.is_none() {
            bail!(
                "no API key: set {key_env} (or --api-key-env VAR), or point --base-url at a local server"
            );
        }
        Ok(HttpSettings {
            base_url,
            api_key,
            retry: RetryPolicy::default(),
            headers: Vec::new(),
        })
    }

    /// The workspace root of the built-in tools.
    pub fn workspace(&self) -> Result<Workspace> {
        Workspace::new(&self.workspace)
            .with_context(|| format!("workspace {}", self.workspace.display()))
    }

    /// The built-in tools, confined to `workspace`, and the tools of the
    /// configured MCP servers (a server that fails to start is logged as a
    /// warning and left out).
    pub async fn tools(&self, workspace: Arc<Workspace>) -> Result<ToolRegistry> {
        let mut registry = ToolRegistry::new();
        for tool in builtin::all(workspace) {
            registry.register(tool);
        }
        // connect_all logs each failed server as a warning itself. Servers
        // are sources, not fixed tools: their tool lists can change.
        let (mcp_servers, _warnings) = mcp::connect_all(self.mcp_servers.clone()).await;
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
        if self.demo {
            eprintln!(
                "toolwire: no model configured; playing the built-in demo script \
                 (set --provider, --model and --base-url to use a real model)"
            );
        }
        let store = toolwire_store::open(&self.db)
            .await
            .with_context(|| format!("opening the database {}", self.db))?;
        let workspace = Arc::new(self.workspace()?);
        let engine = Engine::start(
            store,
            self.provider()?,
            self.tools(workspace.clone()).await?,
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
        Ok(Running { engine, watcher })
    }
}

/// A started engine and what runs beside it: the workspace's file watcher,
/// which reports outside changes to the agent (stopped when this is
/// dropped).
pub struct Running {
    pub engine: Engine,
    watcher: Option<WatchHandle>,
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
            let Err(error) = resolve(toml) else {
                panic!("{toml} was accepted");
            };
            let message = format!("{error:#}");
            assert!(
                message.contains("is not valid") && message.contains(says),
                "{message}"
            );
        }
    }

    #[test]
    fn an_mcp_url_that_is_not_valid_is_not_echoed() {
        let toml = "[mcp_servers.web]\nurl = \"ftp://user:s3cret@example.com/mcp?key=s3cret\"\n";
        let Err(error) = resolve(toml) else {
            panic!("{toml} was accepted");
        };
        let message = format!("{error:#}");
        assert!(
            message.contains("MCP server `web` is not configured right")
                && message.contains("http:// or https://")
                && !message.contains("s3cret"),
            "{message}"
        );
    }
}
