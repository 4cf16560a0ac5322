//! A turn's beginning as one write: its run, its first message with the
//! events that announce it, and the documents a front door keeps of the
//! run, in one transaction (one hop, one commit) rather than three.

use std::sync::Arc;

use rusqlite::OptionalExtension;
use toolwire_core::{AgentEvent, InstanceId, Message, RunId, TreeError};
use uuid::Uuid;

use super::{Writer, event_rows, insert_events, insert_message, numbered};
use crate::rows::Ts;
use crate::sql;
use crate::{Result, StoreError};

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
        let documents: Vec<(String, String, String)> = documents
            .iter()
            .map(|(kind, id, body)| ((*kind).to_owned(), (*id).to_owned(), body.to_string()))
            .collect();
        let now = Ts::now();
        self.write(move |tx| {
            let inserted = tx
                .prepare_cached(sql::START_RUN)?
                .execute(numbered(&[&id.0, &conversation.0, &now, &owner.0]).as_slice())?;
            if inserted == 0 {
                return Err(StoreError::ConversationNotFound(conversation));
            }
            let parent_conversation: Option<Uuid> = tx
                .prepare_cached(sql::MESSAGE_CONVERSATION)?
                .query_row(numbered(&[&parent.0]).as_slice(), |r| r.get(0))
                .optional()?;
            sql::check_parent(&message, parent, parent_conversation)?;
            tx.prepare_cached(sql::SET_ACTIVE_LEAF)?
                .execute(numbered(&[&conversation.0, &message.id.0]).as_slice())?;
            insert_message(tx, &message)?;
            let seqs = insert_events(tx, conversation, &events)?;
            for (kind, id, body) in &documents {
                tx.prepare_cached(sql::PUT_DOCUMENT)?
                    .execute(numbered(&[kind, id, body, &now]).as_slice())?;
            }
            Ok(seqs)
        })
        .await
    }
}
