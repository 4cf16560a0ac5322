//! The models a deployment can use, by name: each one a provider with
//! what is known of its model (window, output cap, capabilities, prices,
//! fallbacks), and one default. A turn names the model it wants; a name
//! that is not here is refused before anything is stored.

use std::sync::Arc;

use toolwire_core::Price;

use crate::Provider;

/// What a model can take and do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Native tool calling (without it the XML tool format is used).
    pub tools: bool,
    /// Images in user messages and tool results.
    pub vision: bool,
    /// Reasoning output (thinking blocks, reasoning items).
    pub reasoning: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            tools: true,
            vision: false,
            reasoning: false,
        }
    }
}

/// What is known of one named model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelInfo {
    /// The registry name (`sonnet`), unique; what a turn asks for and what
    /// an assistant message records.
    pub name: String,
    /// The provider kind as configured: `openai`, `anthropic`,
    /// `openai-responses`, `scripted`.
    pub provider: String,
    /// The model id the provider's API is asked for (`claude-sonnet-4-5`).
    pub model: String,
    /// Tokens of context the model takes, when known.
    pub context_window: Option<u64>,
    /// Output tokens asked of it per call, when set apart from the
    /// deployment's `max_tokens`.
    pub max_output: Option<u32>,
    pub capabilities: Capabilities,
    /// Its own price; else the price table's entry for `model`.
    pub price: Option<Price>,
    /// Models that answer a step this one cannot (overloaded, rate
    /// limited, unreachable), in order.
    pub fallback: Vec<String>,
}

impl ModelInfo {
    /// Letta's handle for it: `provider/model`.
    pub fn handle(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

/// One model of the registry.
#[derive(Clone)]
pub struct ModelEntry {
    pub info: ModelInfo,
    pub provider: Arc<dyn Provider>,
}

impl std::fmt::Debug for ModelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEntry")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Why a registry cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("no model is configured")]
    Empty,
    #[error("model `{0}` is defined twice")]
    Duplicate(String),
    #[error("default_model `{0}` is not one of the configured models ({1})")]
    UnknownDefault(String, String),
    #[error(
        "model `{model}` falls back to `{fallback}`, which is not one of the configured models"
    )]
    UnknownFallback { model: String, fallback: String },
}

/// The named models and the default.
#[derive(Debug, Clone)]
pub struct Models {
    entries: Vec<ModelEntry>,
    default: usize,
}

impl Models {
    /// A registry of `entries`; `default` names one of them (the first
    /// when `None`). Names are unique and every fallback is a name.
    pub fn new(entries: Vec<ModelEntry>, default: Option<&str>) -> Result<Models, RegistryError> {
        if entries.is_empty() {
            return Err(RegistryError::Empty);
        }
        for (i, e) in entries.iter().enumerate() {
            if entries[..i].iter().any(|o| o.info.name == e.info.name) {
                return Err(RegistryError::Duplicate(e.info.name.clone()));
            }
        }
        for e in &entries {
            if let Some(f) = e
                .info
                .fallback
                .iter()
                .find(|f| !entries.iter().any(|o| &o.info.name == *f))
            {
                return Err(RegistryError::UnknownFallback {
                    model: e.info.name.clone(),
                    fallback: f.clone(),
                });
            }
        }
        let default = match default {
            None => 0,
            Some(name) => entries
                .iter()
                .position(|e| e.info.name == name)
                .ok_or_else(|| RegistryError::UnknownDefault(name.to_owned(), names(&entries)))?,
        };
        Ok(Models { entries, default })
    }

    /// One provider as the whole registry, named after its model.
    pub fn single(provider: Arc<dyn Provider>) -> Models {
        let model = provider.model().to_owned();
        Models {
            entries: vec![ModelEntry {
                info: ModelInfo {
                    name: model.clone(),
                    model,
                    ..ModelInfo::default()
                },
                provider,
            }],
            default: 0,
        }
    }

    /// The model a turn gets when it names none.
    pub fn default_entry(&self) -> &ModelEntry {
        // `new` and `single` never leave the index outside the entries.
        &self.entries[self.default.min(self.entries.len() - 1)]
    }

    /// The model named `name`.
    pub fn get(&self, name: &str) -> Option<&ModelEntry> {
        self.entries.iter().find(|e| e.info.name == name)
    }

    /// The model a client's word means: a registry name, a Letta handle
    /// (`provider/model`, matched on the model id when the provider part
    /// names another API family, as Letta's `openai/…` handles do for
    /// OpenAI-compatible servers), or a bare model id.
    pub fn resolve(&self, handle: &str) -> Option<&ModelEntry> {
        if let Some(e) = self.get(handle) {
            return Some(e);
        }
        let (provider, model) = match handle.split_once('/') {
            Some((p, m)) => (Some(p), m),
            None => (None, handle),
        };
        let by_model = || self.entries.iter().filter(|e| e.info.model == model);
        provider
            .and_then(|p| by_model().find(|e| e.info.provider == p))
            .or_else(|| by_model().next())
            .or_else(|| provider.and_then(|_| self.get(model)))
    }

    /// Every model, in the order configured.
    pub fn iter(&self) -> impl Iterator<Item = &ModelEntry> {
        self.entries.iter()
    }

    /// The names, comma-separated, for messages that list them.
    pub fn names(&self) -> String {
        names(&self.entries)
    }

    /// What a client is told when it names a model the registry lacks:
    /// the name (at most 100 characters of it) and the ones there are.
    pub fn unknown(&self, name: &str) -> String {
        format!(
            "no model named `{}` is configured; the models are: {}",
            name.chars().take(100).collect::<String>(),
            self.names()
        )
    }
}

fn names(entries: &[ModelEntry]) -> String {
    entries
        .iter()
        .map(|e| e.info.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl From<Arc<dyn Provider>> for Models {
    fn from(provider: Arc<dyn Provider>) -> Models {
        Models::single(provider)
    }
}

impl<P: Provider + 'static> From<Arc<P>> for Models {
    fn from(provider: Arc<P>) -> Models {
        Models::single(provider)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Script, ScriptedProvider};

    fn entry(name: &str, provider: &str, model: &str, fallback: &[&str]) -> ModelEntry {
        ModelEntry {
            info: ModelInfo {
                name: name.into(),
                provider: provider.into(),
                model: model.into(),
                fallback: fallback.iter().map(|s| (*s).to_owned()).collect(),
                ..ModelInfo::default()
            },
            provider: Arc::new(ScriptedProvider::new(
                Script::parse("steps: [{text: hi}]").expect("a script"),
                false,
            )),
        }
    }

    #[test]
    fn names_are_unique_and_fallbacks_and_the_default_exist() {
        let dup = Models::new(
            vec![
                entry("a", "openai", "x", &[]),
                entry("a", "openai", "y", &[]),
            ],
            None,
        );
        assert_eq!(dup.unwrap_err(), RegistryError::Duplicate("a".into()));
        let fallback = Models::new(vec![entry("a", "openai", "x", &["b"])], None);
        assert_eq!(
            fallback.unwrap_err().to_string(),
            "model `a` falls back to `b`, which is not one of the configured models"
        );
        let default = Models::new(vec![entry("a", "openai", "x", &[])], Some("z"));
        assert_eq!(
            default.unwrap_err().to_string(),
            "default_model `z` is not one of the configured models (a)"
        );
        assert_eq!(
            Models::new(Vec::new(), None).unwrap_err(),
            RegistryError::Empty
        );
    }

    #[test]
    fn a_name_a_handle_or_a_model_id_resolves() {
        let models = Models::new(
            vec![
                entry("sonnet", "anthropic", "claude-sonnet-4-5", &["gpt"]),
                entry("gpt", "openai", "gpt-4o-mini", &[]),
            ],
            Some("gpt"),
        )
        .expect("valid registry");
        assert_eq!(models.default_entry().info.name, "gpt");
        let name = |h: &str| models.resolve(h).map(|e| e.info.name.clone());
        assert_eq!(name("sonnet").as_deref(), Some("sonnet"));
        assert_eq!(name("openai/gpt-4o-mini").as_deref(), Some("gpt"));
        assert_eq!(
            name("anthropic/claude-sonnet-4-5").as_deref(),
            Some("sonnet")
        );
        assert_eq!(name("claude-sonnet-4-5").as_deref(), Some("sonnet"));
        assert_eq!(name("openai/sonnet").as_deref(), Some("sonnet"));
        assert_eq!(name("openai/gpt-5"), None);
    }
}
