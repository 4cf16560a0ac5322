//! Which models a deployment offers: the single-model flags, or the config
//! file's `[models.NAME]` tables and `default_model`; one provider built
//! per model, by the same code whichever way it was described, and the
//! registry the engine starts with.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use toolwire_core::Price;
use toolwire_providers::{
    AnthropicProvider, Capabilities, HttpSettings, ModelEntry, ModelInfo, Models, OpenAiProvider,
    OpenAiResponsesProvider, Provider, RetryPolicy, Script, ScriptedProvider, ToolFormat,
    anthropic, openai, scripted,
};

use super::{ModelLimits, ProviderKind, ToolFormatArg};

/// A `[models.NAME]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelFile {
    /// `openai`, `anthropic` or `scripted` (checked here, so that the error
    /// names the model).
    provider: Option<String>,
    /// The model id its API is asked for.
    model: Option<String>,
    base_url: Option<String>,
    api_key_env: Option<String>,
    context_window: Option<u64>,
    /// Output tokens asked per call (default: the top-level `max_tokens`).
    max_output: Option<u32>,
    /// `native` or `xml` (default: the top-level `tool_format`).
    tool_format: Option<ToolFormatArg>,
    vision: Option<bool>,
    reasoning: Option<bool>,
    /// Models that answer a step this one cannot, in order.
    #[serde(default)]
    fallback: Vec<String>,
    /// US dollars per million tokens (default: the `[prices]` entry of
    /// its model id).
    price: Option<Price>,
    /// The script of a `scripted` model (default: the built-in demo).
    script: Option<PathBuf>,
    /// Anthropic prompt-cache breakpoints in its requests (default true;
    /// other providers cache on their own).
    prompt_caching: Option<bool>,
    /// Share of its window past which a request is compacted first
    /// (default: `[context] compact_at`).
    compact_at: Option<f64>,
}

impl ModelFile {
    /// Its `compact_at`, if set.
    pub(super) fn compact_at(&self) -> Option<f64> {
        self.compact_at
    }
}

/// The single-model settings (flags, `TOOLWIRE_*` variables, top-level
/// keys of the file), as given.
#[derive(Debug, Default)]
pub(super) struct Flags {
    pub(super) provider: Option<ProviderKind>,
    pub(super) model: Option<String>,
    pub(super) base_url: Option<String>,
    pub(super) api_key_env: Option<String>,
    pub(super) script: Option<PathBuf>,
    pub(super) tool_format: ToolFormat,
}

/// One model: its provider's settings and what is known of it.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The registry name; `None` for the single-model flags, which name it
    /// after the model its provider calls (as before there were names).
    pub name: Option<String>,
    pub provider: ProviderKind,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub script: Option<PathBuf>,
    pub tool_format: ToolFormat,
    pub context_window: Option<u64>,
    pub max_output: Option<u32>,
    pub vision: bool,
    pub reasoning: bool,
    pub fallback: Vec<String>,
    pub price: Option<Price>,
    /// Anthropic `cache_control` breakpoints (`prompt_caching`).
    pub prompt_caching: bool,
    /// A missing API key is no error at start (`toolwire acp` tells the
    /// editor instead, as an authentication method).
    pub keyless_ok: bool,
}

/// The models and which answers by default.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    pub specs: Vec<ModelSpec>,
    /// The default's registry name; `None`: the first spec.
    pub default: Option<String>,
    /// No model is configured: the built-in demo script plays.
    pub demo: bool,
}

impl ModelSettings {
    /// The models the flags and the file describe. With `[models]` tables,
    /// `--model NAME` naming one of them makes it the default; other
    /// single-model flags add one more model (named after its model id),
    /// which is then the default.
    pub(super) fn resolve(
        flags: Flags,
        default_model: Option<String>,
        tables: BTreeMap<String, ModelFile>,
    ) -> Result<ModelSettings> {
        let demo = tables.is_empty()
            && flags.provider.is_none()
            && flags.model.is_none()
            && flags.script.is_none();
        if tables.is_empty() {
            if let Some(name) = default_model {
                bail!("default_model = \"{name}\" but no [models.{name}] table is configured");
            }
            return Ok(ModelSettings {
                specs: vec![flags.spec()],
                default: None,
                demo,
            });
        }
        let names = tables.keys().cloned().collect::<Vec<_>>().join(", ");
        let mut specs = tables
            .into_iter()
            .map(|(name, table)| table.spec(name, flags.tool_format))
            .collect::<Result<Vec<_>>>()?;
        let picked = flags
            .model
            .clone()
            .filter(|m| specs.iter().any(|s| s.name.as_deref() == Some(m)));
        let default = if let Some(name) = picked {
            for (given, key) in [
                (flags.provider.is_some(), "provider"),
                (flags.base_url.is_some(), "base_url"),
                (flags.api_key_env.is_some(), "api_key_env"),
                (flags.script.is_some(), "script"),
            ] {
                if given {
                    bail!(
                        "--model {name} names [models.{name}], whose {key} is set in that table: \
                         drop --{} (or its TOOLWIRE_ variable or top-level key)",
                        key.replace('_', "-")
                    );
                }
            }
            Some(name)
        } else if flags.provider.is_some() || flags.script.is_some() {
            // The flags define one more model, which answers by default.
            specs.insert(0, flags.spec());
            None
        } else if let Some(model) = &flags.model {
            bail!(
                "--model {model} (or TOOLWIRE_MODEL, or the file's `model`) is not one of the \
                 configured models ({names}); to use a model outside the [models] tables give \
                 --provider too"
            );
        } else if default_model.is_some() || specs.len() == 1 {
            default_model
        } else {
            bail!(
                "several models are configured ({names}): set default_model (or --model) to the \
                 one that answers when a turn names none"
            );
        };
        Ok(ModelSettings {
            specs,
            default,
            demo: false,
        })
    }

    /// One provider per model and the registry of them; a model whose
    /// provider cannot be built (no key, no script) stops the start,
    /// named.
    /// Lets every model start without its API key, and returns the
    /// default model's name and key variable when it reads one (a public
    /// API, no base_url): for `toolwire acp`, which offers setting it as
    /// an authentication method while it is missing.
    pub fn allow_missing_keys(&mut self) -> Option<(String, String)> {
        for spec in &mut self.specs {
            spec.keyless_ok = true;
        }
        let spec = match &self.default {
            Some(name) => self.specs.iter().find(|s| s.name.as_ref() == Some(name)),
            None => self.specs.first(),
        }?;
        let default_env = match spec.provider {
            ProviderKind::Scripted => return None,
            ProviderKind::Openai | ProviderKind::OpenaiResponses => "OPENAI_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        };
        if spec.base_url.is_some() {
            return None;
        }
        let env = spec
            .api_key_env
            .clone()
            .unwrap_or_else(|| default_env.to_owned());
        let name = spec
            .name
            .clone()
            .or_else(|| spec.model.clone())
            .unwrap_or_default();
        Some((name, env))
    }

    pub fn registry(&self, limits: &ModelLimits) -> Result<Models> {
        let entries = self
            .specs
            .iter()
            .map(|spec| spec.entry(limits))
            .collect::<Result<Vec<_>>>()?;
        Ok(Models::new(entries, self.default.as_deref())?)
    }
}

impl Flags {
    fn spec(&self) -> ModelSpec {
        let provider = self.provider.unwrap_or(if self.model.is_some() {
            ProviderKind::Openai
        } else {
            ProviderKind::Scripted
        });
        ModelSpec {
            name: None,
            provider,
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            api_key_env: self.api_key_env.clone(),
            script: self.script.clone(),
            tool_format: self.tool_format,
            context_window: None,
            max_output: None,
            vision: false,
            reasoning: false,
            fallback: Vec::new(),
            price: None,
            prompt_caching: true,
            keyless_ok: false,
        }
    }
}

impl ModelFile {
    fn spec(self, name: String, tool_format: ToolFormat) -> Result<ModelSpec> {
        let Some(kind) = self.provider else {
            bail!(
                "[models.{name}] has no provider: give openai, openai-responses, anthropic or scripted"
            );
        };
        let Some(provider) = ProviderKind::ALL.into_iter().find(|p| p.as_str() == kind) else {
            bail!(
                "[models.{name}] provider = \"{kind}\" is not a provider: give openai, \
                 openai-responses, anthropic or scripted (an OpenAI-compatible server is openai \
                 with its base_url)"
            );
        };
        if provider != ProviderKind::Scripted && self.model.is_none() {
            bail!("[models.{name}] has no model: give the model id its {kind} API is asked for");
        }
        if self.script.is_some() && provider != ProviderKind::Scripted {
            bail!("[models.{name}] script is only for provider = \"scripted\"");
        }
        if self.fallback.contains(&name) {
            bail!("[models.{name}] falls back to itself");
        }
        if self.max_output == Some(0) {
            bail!("[models.{name}] max_output must be at least 1");
        }
        Ok(ModelSpec {
            name: Some(name),
            provider,
            model: self.model,
            base_url: self.base_url,
            api_key_env: self.api_key_env,
            script: self.script,
            tool_format: match self.tool_format {
                Some(ToolFormatArg::Xml) => ToolFormat::Xml,
                Some(ToolFormatArg::Native) => ToolFormat::Native,
                None => tool_format,
            },
            context_window: self.context_window,
            max_output: self.max_output,
            vision: self.vision.unwrap_or(false),
            reasoning: self.reasoning.unwrap_or(false),
            fallback: self.fallback,
            price: self.price,
            prompt_caching: self.prompt_caching.unwrap_or(true),
            keyless_ok: false,
        })
    }
}

impl ModelSpec {
    /// The registry entry: the provider and what is known of its model.
    fn entry(&self, limits: &ModelLimits) -> Result<ModelEntry> {
        let provider = self.provider(limits)?;
        let model = provider.model().to_owned();
        Ok(ModelEntry {
            info: ModelInfo {
                name: self.name.clone().unwrap_or_else(|| model.clone()),
                provider: self.provider.as_str().to_owned(),
                model,
                context_window: self.context_window,
                max_output: self.max_output,
                capabilities: Capabilities {
                    tools: self.tool_format == ToolFormat::Native,
                    vision: self.vision,
                    reasoning: self.reasoning,
                },
                price: self.price,
                fallback: self.fallback.clone(),
            },
            provider,
        })
    }

    /// The provider this model is called through.
    pub fn provider(&self, limits: &ModelLimits) -> Result<Arc<dyn Provider>> {
        let native = self.tool_format == ToolFormat::Native;
        Ok(match self.provider {
            ProviderKind::Scripted => {
                let text = match &self.script {
                    Some(path) => std::fs::read_to_string(path).with_context(|| {
                        format!("{}reading script {}", self.named(), path.display())
                    })?,
                    None => scripted::DEMO_SCRIPT.to_owned(),
                };
                let mut script = Script::parse(&text).with_context(|| self.named())?;
                // A table's `model` names the scripted model, over the
                // script's own (the flags leave it to the script, as before).
                if let (Some(model), Some(_)) = (&self.model, &self.name) {
                    script.model = Some(model.clone());
                }
                Arc::new(ScriptedProvider::new(script, !native))
            }
            ProviderKind::Openai => {
                let settings = self.http(limits, openai::DEFAULT_BASE_URL, "OPENAI_API_KEY")?;
                Arc::new(OpenAiProvider::new(settings, self.model_id()?, native))
            }
            ProviderKind::OpenaiResponses => {
                let settings = self.http(limits, openai::DEFAULT_BASE_URL, "OPENAI_API_KEY")?;
                Arc::new(OpenAiResponsesProvider::new(
                    settings,
                    self.model_id()?,
                    native,
                ))
            }
            ProviderKind::Anthropic => {
                let settings =
                    self.http(limits, anthropic::DEFAULT_BASE_URL, "ANTHROPIC_API_KEY")?;
                Arc::new(
                    AnthropicProvider::new(settings, self.model_id()?, native)
                        .with_prompt_caching(self.prompt_caching),
                )
            }
        })
    }

    /// `model NAME: ` for a named model, to start its errors with.
    fn named(&self) -> String {
        self.name
            .as_ref()
            .map_or_else(String::new, |n| format!("model `{n}`: "))
    }

    fn model_id(&self) -> Result<String> {
        match (&self.model, &self.name) {
            (Some(m), _) => Ok(m.clone()),
            (None, Some(name)) => bail!("[models.{name}] has no model"),
            (None, None) => {
                bail!("--model is required with --provider openai, openai-responses or anthropic")
            }
        }
    }

    fn http(
        &self,
        limits: &ModelLimits,
        default_url: &str,
        default_key_env: &str,
    ) -> Result<HttpSettings> {
        let base_url = self
            .base_url
            .clone()
            .unwrap_or_else(|| default_url.to_owned());
        let key_env = self.api_key_env.as_deref().unwrap_or(default_key_env);
        let api_key = std::env::var(key_env).ok().filter(|k| !k.is_empty());
        // A server of one's own may need no key; the public APIs do.
        if api_key.is_none() && self.base_url.is_none() && !self.keyless_ok {
            match &self.name {
                Some(name) => bail!(
                    "model `{name}`: no API key: set {key_env} (or api_key_env in \
                     [models.{name}]), or give it the base_url of a local server"
                ),
                None => bail!(
                    "no API key: set {key_env} (or --api-key-env VAR), or point --base-url at a \
                     local server"
                ),
            }
        }
        Ok(HttpSettings {
            base_url,
            api_key,
            retry: RetryPolicy {
                max_retry_after: limits.max_retry_after,
                ..RetryPolicy::default()
            },
            headers: Vec::new(),
            limits: limits.stream,
            max_tokens: self.max_output.unwrap_or(limits.max_tokens),
        })
    }
}
