//! Compaction on demand: Letta's `POST /v1/agents/{id}/summarize`, ACP's
//! `/compact`, the live page's button.

use toolwire_core::ConversationId;

use crate::engine::{Engine, TurnHandle};
use crate::error::EngineError;
use crate::turn::TurnOptions;

impl Engine {
    /// Compacts `conversation`'s active branch now: the older part of the
    /// path is summarised by a model call and stored as a compaction node
    /// under the active leaf (which becomes the new active leaf); later
    /// turns on that branch send the summary plus the newest messages
    /// (those within `keep_recent` of the window) verbatim. Nothing is
    /// removed: a branch from before the node sends the originals.
    ///
    /// Runs as a turn of its own (a run, `TurnStarted` not sent, a
    /// [`toolwire_core::AgentEvent::ContextCompacted`] then `Stopped`):
    /// `options.model` names the model whose window and provider are used
    /// (the default when `None`; `context.summary_model` writes the
    /// summary when set). Wait on the handle: `end_turn` with the node as
    /// `final_message`; `error` when there is nothing to compact (only
    /// the newest messages) or the summarising call failed (nothing is
    /// stored then). Refused while a turn runs
    /// ([`EngineError::TurnInProgress`]) or calls wait for answers
    /// ([`EngineError::ApprovalPending`]).
    pub async fn compact(
        &self,
        conversation: ConversationId,
        options: TurnOptions,
    ) -> Result<TurnHandle, EngineError> {
        self.start_compaction(conversation, options).await
    }
}
