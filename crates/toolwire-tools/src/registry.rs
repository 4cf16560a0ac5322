//! The tools of an engine, by name: tools registered one by one, and
//! sources whose tools are asked for each time.

use std::collections::BTreeMap;
use std::sync::Arc;

use toolwire_core::ToolSpec;

use crate::Tool;

/// Tools whose list can change while the engine runs: an MCP server's
/// tools change when it says so (`notifications/tools/list_changed`) or when
/// it is restarted. A [`ToolRegistry`] asks a source for its tools each time
/// it is read, so the model is shown what can be called now rather than what
/// could be called at start-up.
pub trait ToolSource: Send + Sync {
    /// The tools now. Called for every model request: keep it cheap.
    fn current_tools(&self) -> Vec<Arc<dyn Tool>>;

    /// The tool named `name` now, if there is one.
    fn current_tool(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.current_tools()
            .into_iter()
            .find(|tool| tool.spec().name == name)
    }
}

/// The tools of an engine, by name: tools registered one by one, and the
/// tools that [`ToolSource`]s have at the moment they are asked. A name
/// registered as a tool wins over a source's tool of the same name, and an
/// earlier source wins over a later one.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    sources: Vec<Arc<dyn ToolSource>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.specs().iter().map(|spec| spec.name.clone()))
            .finish()
    }
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tool`, replacing one of the same name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name.clone(), tool);
    }

    /// Adds a source whose tools are looked up each time the registry is read.
    pub fn register_source(&mut self, source: Arc<dyn ToolSource>) {
        self.sources.push(source);
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        if let Some(tool) = self.tools.get(name) {
            return Some(Arc::clone(tool));
        }
        self.sources
            .iter()
            .find_map(|source| source.current_tool(name))
    }

    /// The tools now, one per name, sorted by name, with the precedence
    /// of [`get`](Self::get): what [`specs`](Self::specs) describes,
    /// without copying a spec.
    pub fn current(&self) -> Vec<Arc<dyn Tool>> {
        if self.sources.is_empty() {
            return self.tools.values().cloned().collect();
        }
        let mut by_name: BTreeMap<String, Arc<dyn Tool>> = self.tools.clone();
        for source in &self.sources {
            for tool in source.current_tools() {
                by_name.entry(tool.spec().name.clone()).or_insert(tool);
            }
        }
        by_name.into_values().collect()
    }

    /// One spec per name, sorted by name (a stable prompt from one request
    /// to the next), with the precedence of [`get`](Self::get). Shared,
    /// not copied: a model request is made of them at every step.
    pub fn specs(&self) -> Vec<Arc<ToolSpec>> {
        self.current()
            .iter()
            .map(|t| Arc::clone(t.spec()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use serde_json::Value;

    use super::*;
    use crate::{ToolContext, ToolError, ToolOutput};

    struct Named(Arc<ToolSpec>);

    #[async_trait]
    impl Tool for Named {
        fn spec(&self) -> &Arc<ToolSpec> {
            &self.0
        }

        async fn call(&self, _: Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::ok(self.0.description.clone()))
        }
    }

    fn tool(name: &str, from: &str) -> Arc<dyn Tool> {
        Arc::new(Named(Arc::new(ToolSpec {
            name: name.to_owned(),
            server: None,
            description: from.to_owned(),
            parameters: serde_json::json!({"type": "object"}),
            read_only: true,
        })))
    }

    /// A source whose list the test changes, as a server's list changes.
    #[derive(Default)]
    struct Changing(Mutex<Vec<Arc<dyn Tool>>>);

    impl ToolSource for Changing {
        fn current_tools(&self) -> Vec<Arc<dyn Tool>> {
            self.0.lock().map(|tools| tools.clone()).unwrap_or_default()
        }
    }

    fn from(registry: &ToolRegistry, name: &str) -> Option<String> {
        registry.get(name).map(|t| t.spec().description.clone())
    }

    #[test]
    fn sources_are_read_each_time_and_registered_tools_win() {
        let source = Arc::new(Changing::default());
        let other = Arc::new(Changing::default());
        let mut registry = ToolRegistry::new();
        registry.register(tool("b", "registered"));
        registry.register_source(source.clone());
        registry.register_source(other.clone());
        *other.0.lock().unwrap() = vec![tool("c", "other")];
        assert_eq!(names(&registry), ["b", "c"]);

        *source.0.lock().unwrap() = vec![
            tool("a", "source"),
            tool("b", "source"),
            tool("c", "source"),
        ];
        assert_eq!(names(&registry), ["a", "b", "c"]);
        assert_eq!(from(&registry, "a").as_deref(), Some("source"));
        assert_eq!(from(&registry, "b").as_deref(), Some("registered"));
        assert_eq!(from(&registry, "c").as_deref(), Some("source"));
        let specs = registry.specs();
        assert_eq!(specs[1].description, "registered");
        assert_eq!(specs[2].description, "source");

        source.0.lock().unwrap().clear();
        assert_eq!(names(&registry), ["b", "c"]);
        assert!(registry.get("a").is_none());
        assert_eq!(from(&registry, "c").as_deref(), Some("other"));
    }

    fn names(registry: &ToolRegistry) -> Vec<String> {
        let names: Vec<String> = registry.specs().iter().map(|s| s.name.clone()).collect();
        // `current` gives the same tools, in the same order, as `specs`
        // describes.
        let current: Vec<(String, String)> = registry
            .current()
            .iter()
            .map(|t| (t.spec().name.clone(), t.spec().description.clone()))
            .collect();
        let described: Vec<(String, String)> = registry
            .specs()
            .iter()
            .map(|s| (s.name.clone(), s.description.clone()))
            .collect();
        assert_eq!(current, described);
        names
    }

    #[test]
    fn specs_are_shared_not_copied() {
        let mut registry = ToolRegistry::new();
        registry.register(Arc::new(crate::builtin::UpdatePlan::new()));
        let first = registry.specs();
        let second = registry.specs();
        assert_eq!(first[0].name, "update_plan");
        assert!(Arc::ptr_eq(&first[0], &second[0]));
    }
}
