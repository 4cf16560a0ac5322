//! The options of each conversation's last turn started by a front door,
//! for the turns the engine starts itself (a wake, an interjection that
//! finds no turn running or comes too late for one): those must keep the
//! conversation's tools and gates, or a wake could run a tool that the
//! conversation's client wants to approve.
//!
//! Kept in memory only, so after a restart nothing is remembered until a
//! front door starts a turn or sets the options. Bounded: past
//! [`CAPACITY`] conversations, the one set longest ago is forgotten.
//!
//! Beside them, the runs the engine started itself ([`OwnRuns`]), so that
//! a front door following a conversation can tell them from the turns it
//! or another instance started.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use toolwire_core::{ConversationId, RunId};

use crate::turn::TurnOptions;

/// How many conversations' options are kept. Generous for one process;
/// the bound is only there so that a long-lived server does not grow
/// without end.
pub(crate) const CAPACITY: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct Remembered {
    inner: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    options: HashMap<ConversationId, TurnOptions>,
    /// Least recently set first.
    order: VecDeque<ConversationId>,
}

impl Remembered {
    pub(crate) fn set(&self, conversation: ConversationId, options: TurnOptions) {
        // A front door's records of one run are that run's alone.
        let options = TurnOptions {
            run_records: None,
            ..options
        };
        self.set_bounded(conversation, options, CAPACITY);
    }

    fn set_bounded(&self, conversation: ConversationId, options: TurnOptions, capacity: usize) {
        let mut entries = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if entries.options.insert(conversation, options).is_some() {
            entries.order.retain(|c| *c != conversation);
        }
        entries.order.push_back(conversation);
        while entries.order.len() > capacity {
            if let Some(oldest) = entries.order.pop_front() {
                entries.options.remove(&oldest);
            }
        }
    }

    pub(crate) fn get(&self, conversation: ConversationId) -> Option<TurnOptions> {
        let entries = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        entries.options.get(&conversation).cloned()
    }

    pub(crate) fn forget(&self, conversation: ConversationId) {
        let mut entries = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if entries.options.remove(&conversation).is_some() {
            entries.order.retain(|c| *c != conversation);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let entries = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        entries.options.len()
    }
}

/// The runs this engine started itself, the most recent [`CAPACITY`].
#[derive(Debug, Default)]
pub(crate) struct OwnRuns {
    inner: Mutex<VecDeque<RunId>>,
}

impl OwnRuns {
    pub(crate) fn note(&self, run: RunId) {
        if let Ok(mut runs) = self.inner.lock() {
            if runs.len() >= CAPACITY {
                runs.pop_front();
            }
            runs.push_back(run);
        }
    }

    pub(crate) fn contains(&self, run: RunId) -> bool {
        self.inner
            .lock()
            .map(|runs| runs.iter().rev().any(|r| *r == run))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn steps(n: u32) -> TurnOptions {
        TurnOptions {
            max_steps: Some(n),
            ..TurnOptions::default()
        }
    }

    #[test]
    fn the_newest_options_win_and_the_oldest_conversation_goes_first() {
        let remembered = Remembered::default();
        let (a, b, c) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        remembered.set_bounded(a, steps(1), 2);
        remembered.set_bounded(b, steps(2), 2);
        // Setting `a` again makes `b` the oldest.
        remembered.set_bounded(a, steps(3), 2);
        remembered.set_bounded(c, steps(4), 2);
        assert_eq!(remembered.len(), 2);
        assert_eq!(remembered.get(a).unwrap().max_steps, Some(3));
        assert!(remembered.get(b).is_none());
        assert_eq!(remembered.get(c).unwrap().max_steps, Some(4));
        remembered.forget(a);
        assert!(remembered.get(a).is_none());
        assert_eq!(remembered.len(), 1);
    }

    #[test]
    fn own_runs_keep_the_most_recent() {
        let runs = OwnRuns::default();
        let first = RunId::new();
        runs.note(first);
        assert!(runs.contains(first));
        assert!(!runs.contains(RunId::new()));
        for _ in 0..CAPACITY {
            runs.note(RunId::new());
        }
        assert!(
            !runs.contains(first),
            "the oldest is forgotten past the bound"
        );
    }
}
