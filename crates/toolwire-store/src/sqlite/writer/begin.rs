//! A turn's beginning as one write: its run, its first message with the
//! events that announce it, and the documents a front door keeps of the
//! run, in one transaction (one hop, one commit) rather than three.

use std::sync::Arc;

use toolwire_core::{AgentEvent, InstanceId, Message, RunId, TreeError};

use super::{Writer, append_on_path, event_rows, insert_run, owned_documents, put_documents};
use crate::Result;
use crate::rows::Ts;

impl Writer {
    /// [`crate::Store::start_run_with_message`].
    pub(in crate::sqlite) async fn start_run_with_message(
        self: &Arc<Self>,
        id: RunId,
        owner: InstanceId,
        message: &Message,
        events: &[AgentEvent],
        documents: &[(&str, &str, &serde_json::Value)],
    ) -> Result<Vec<u64>> {
        let parent = message.parent_id.ok_or(TreeError::RootHasNoParent)?;
        let message = message.clone();
        let conversation = message.conversation_id;
        let events = event_rows(events)?;
        let documents = owned_documents(documents);
        let now = Ts::now();
        self.write(move |tx| {
            insert_run(tx, id, conversation, owner, &now)?;
            let seqs = append_on_path(tx, &message, parent, &events)?;
            put_documents(tx, &documents, &now)?;
            Ok(seqs)
        })
        .await
    }
}
