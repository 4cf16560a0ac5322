//! A session's additional workspace roots (`additionalDirectories`: the
//! editor's other folders of a multi-root project). The built-in tools
//! reach them by absolute path (`Workspace::with_additional_roots`); the
//! model is told they exist by a line added to each step's system prompt,
//! never stored in the conversation (another editor may open the session
//! with other roots). Their file watchers name a change by its absolute
//! path.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use toolwire_core::Incoming;
use toolwire_engine::SystemPrompt;

/// `incoming` from the watcher of additional root `root`: a changed file
/// named by its absolute path, since the model reads a relative path as
/// the cwd's.
pub(crate) fn beneath(root: &Path, mut incoming: Incoming) -> Incoming {
    if let Incoming::File { path, .. } = &mut incoming {
        *path = root.join(&*path).display().to_string();
    }
    incoming
}

/// The addition to the system prompt naming the additional roots.
#[derive(Debug)]
pub(crate) struct Roots(pub(crate) Arc<[PathBuf]>);

impl Roots {
    /// The prompt addition for `roots`, none when there are none.
    pub(crate) fn prompt(roots: &Arc<[PathBuf]>) -> Option<Arc<dyn SystemPrompt>> {
        (!roots.is_empty()).then(|| Arc::new(Roots(roots.clone())) as Arc<dyn SystemPrompt>)
    }

    fn line(&self) -> String {
        let roots: Vec<String> = self.0.iter().map(|r| r.display().to_string()).collect();
        format!(
            "The project has more folders than the working directory: {}. The file and \
             search tools and commands reach them by absolute path.",
            roots.join(", ")
        )
    }
}

#[async_trait::async_trait]
impl SystemPrompt for Roots {
    async fn render(&self, stored: &str) -> Result<String, String> {
        Ok(if stored.is_empty() {
            self.line()
        } else {
            format!("{stored}\n\n{}", self.line())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_in_another_root_is_named_absolutely() {
        let changed = beneath(
            Path::new("/docs"),
            Incoming::file(
                "file_watcher",
                "guide/intro.md",
                toolwire_core::FileChange::Modified,
            ),
        );
        assert!(
            matches!(&changed, Incoming::File { path, .. } if path == "/docs/guide/intro.md"),
            "{changed:?}"
        );
        let text = Incoming::text("task", toolwire_core::Priority::Normal, "done");
        assert_eq!(beneath(Path::new("/docs"), text.clone()), text);
    }

    #[tokio::test]
    async fn the_roots_follow_the_stored_prompt_and_none_add_nothing() {
        let roots: Arc<[PathBuf]> = Arc::from(vec![PathBuf::from("/a"), PathBuf::from("/b c")]);
        let prompt = Roots::prompt(&roots).unwrap();
        let rendered = prompt.render("Be brief.").await.unwrap();
        assert!(
            rendered.starts_with("Be brief.\n\nThe project has more folders"),
            "{rendered}"
        );
        assert!(rendered.contains(": /a, /b c."), "{rendered}");
        assert!(!prompt.render("").await.unwrap().starts_with('\n'));
        assert!(Roots::prompt(&Arc::from(Vec::new())).is_none());
    }
}
