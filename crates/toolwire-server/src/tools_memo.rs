//! What the server makes from the engine's tools (their records), kept
//! while the engine has the same tools, so that a message does not make
//! it again. The engine's tools are its own (built-ins, the configured
//! MCP servers' tools): nothing stored, and nothing another instance
//! changes, so the memo is keyed on the tools themselves. An MCP server
//! whose list changes gives new tools, and the memo is made again.

use std::any::Any;
use std::sync::{Arc, Mutex};

use toolwire_tools::Tool;

type Kept = (Vec<Arc<dyn Tool>>, Arc<dyn Any + Send + Sync>);

/// See the module documentation. One value is kept; its type is the
/// caller's.
#[derive(Default)]
pub struct ToolsMemo {
    kept: Mutex<Option<Kept>>,
}

impl ToolsMemo {
    /// The value made by `make` from `tools` (the engine's tools now),
    /// made again only when they are not the tools it was made from. The
    /// tools are held while kept, so that none is dropped and its address
    /// taken by another.
    pub fn get<T: Any + Send + Sync>(
        &self,
        tools: Vec<Arc<dyn Tool>>,
        make: impl FnOnce(&[Arc<dyn Tool>]) -> T,
    ) -> Arc<T> {
        if let Ok(kept) = self.kept.lock()
            && let Some((from, value)) = kept.as_ref()
            && same(from, &tools)
            && let Ok(value) = Arc::clone(value).downcast::<T>()
        {
            return value;
        }
        let value = Arc::new(make(&tools));
        if let Ok(mut kept) = self.kept.lock() {
            let erased: Arc<dyn Any + Send + Sync> = value.clone();
            *kept = Some((tools, erased));
        }
        value
    }
}

/// A value read from the store with the version record read before it
/// (see `agents::tools::stored_tools`): its type is the caller's, so that
/// the server's state names no type of the agents' modules.
#[derive(Default)]
pub struct Versioned {
    kept: Mutex<Option<(Option<serde_json::Value>, Erased)>>,
}

type Erased = Arc<dyn Any + Send + Sync>;

impl Versioned {
    /// The value kept under `version`, if that is the version kept.
    pub fn get<T: Any + Send + Sync>(&self, version: &Option<serde_json::Value>) -> Option<Arc<T>> {
        let kept = self.kept.lock().ok()?;
        let (kept_version, value) = kept.as_ref()?;
        if kept_version != version {
            return None;
        }
        Arc::clone(value).downcast::<T>().ok()
    }

    /// Keeps `value`, read after `version`.
    pub fn set<T: Any + Send + Sync>(&self, version: Option<serde_json::Value>, value: Arc<T>) {
        if let Ok(mut kept) = self.kept.lock() {
            *kept = Some((version, value));
        }
    }
}

fn same(a: &[Arc<dyn Tool>], b: &[Arc<dyn Tool>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use toolwire_tools::{ToolContext, ToolError, ToolOutput, ToolSpec};

    struct Named(Arc<ToolSpec>);

    #[async_trait]
    impl Tool for Named {
        fn spec(&self) -> &Arc<ToolSpec> {
            &self.0
        }
        async fn call(
            &self,
            _args: serde_json::Value,
            _cx: ToolContext,
        ) -> Result<ToolOutput, ToolError> {
            Err(ToolError::Failed("not called".into()))
        }
    }

    fn tool(name: &str) -> Arc<dyn Tool> {
        Arc::new(Named(Arc::new(ToolSpec {
            name: name.into(),
            server: None,
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
            read_only: true,
        })))
    }

    fn names(tools: &[Arc<dyn Tool>]) -> Vec<String> {
        tools.iter().map(|t| t.spec().name.clone()).collect()
    }

    #[test]
    fn made_once_for_the_same_tools_and_again_for_others() {
        let memo = ToolsMemo::default();
        let (a, b) = (tool("a"), tool("b"));
        let mut made = 0;
        let first = memo.get(vec![a.clone(), b.clone()], |t| {
            made += 1;
            names(t)
        });
        let again = memo.get(vec![a.clone(), b.clone()], |t| {
            made += 1;
            names(t)
        });
        assert_eq!(made, 1);
        assert!(Arc::ptr_eq(&first, &again));
        // A tool of the same name but another one (an MCP server's new list).
        let other = memo.get(vec![a.clone(), tool("b")], |t| {
            made += 1;
            names(t)
        });
        assert_eq!(made, 2);
        assert_eq!(*other, vec!["a".to_owned(), "b".to_owned()]);
        let fewer = memo.get(vec![a], |t| {
            made += 1;
            names(t)
        });
        assert_eq!(made, 3);
        assert_eq!(*fewer, vec!["a".to_owned()]);
    }
}
