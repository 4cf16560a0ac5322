//! What an ACP session keeps beside its conversation, so that another
//! agent process on the same database lists, loads and resumes it as it
//! was: its cwd and additional roots, its mode and a title (the first line of its first
//! prompt). Stored through the engine's records as `acp_session` (id: the
//! conversation id); the record's update time is the session's.
//!
//! `session/list` reads these records: newest first, filtered by cwd when
//! asked, [`PAGE`] a page; the cursor is the last session id of the page
//! before. `session/delete` marks a record deleted rather than removing
//! it: a conversation without a record (made by another door) can still
//! be opened by id, a deleted one cannot, and a process that still has
//! it open does not list it again by storing its record.

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::{ListSessionsResponse, SessionId, SessionInfo};
use serde::{Deserialize, Serialize};
use toolwire_core::{Conversation, ConversationId};
use toolwire_engine::Engine;

use crate::errors::{internal, invalid_params};
use crate::modes::SessionMode;
use crate::state::Session;

/// The kind of the records.
const KIND: &str = "acp_session";

/// Sessions a `session/list` page holds.
pub(crate) const PAGE: usize = 32;

/// Titles are cut here (an editor's history list shows one line); the
/// title is the same in `session_info_update` and `session/list`.
const MAX_TITLE_CHARS: usize = 60;

/// One session's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub cwd: PathBuf,
    /// The additional roots it was opened with last
    /// (`additionalDirectories`), reported by `session/list`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional: Vec<PathBuf>,
    #[serde(default)]
    pub mode: SessionMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The reasoning effort chosen (`None`: the provider's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<toolwire_providers::ReasoningEffort>,
    /// Deleted from the history (`session/delete`): not listed, opened or
    /// forked again. Its conversation stays stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

impl SessionRecord {
    pub(crate) fn new(cwd: &Path, additional: &[PathBuf], mode: SessionMode) -> Self {
        SessionRecord {
            cwd: cwd.to_path_buf(),
            additional: additional.to_vec(),
            mode,
            title: None,
            reasoning_effort: None,
            deleted: false,
        }
    }
}

/// Stored session `id`: its conversation, and its record (none for a
/// conversation another door made). An id naming no conversation, or a
/// session deleted from the history, is an error naming it.
pub(crate) async fn stored(
    engine: &Engine,
    id: &SessionId,
) -> Result<(Conversation, Option<SessionRecord>), agent_client_protocol::Error> {
    let unknown = || invalid_params(format!("unknown session `{}`", id.0));
    let conversation = id.0.parse::<ConversationId>().map_err(|_| unknown())?;
    let conversation = engine
        .store()
        .conversation(conversation)
        .await
        .map_err(|_| unknown())?;
    let record = load(engine, conversation.id).await;
    if record.as_ref().is_some_and(|r| r.deleted) {
        return Err(invalid_params(format!(
            "session `{}` was deleted from the history (session/delete)",
            id.0
        )));
    }
    Ok((conversation, record))
}

/// Changes the record of `conversation` (made in `cwd` and `mode` when it
/// has none) and stores it.
pub(crate) async fn update(
    engine: &Engine,
    conversation: ConversationId,
    cwd: &Path,
    mode: SessionMode,
    change: impl FnOnce(&mut SessionRecord),
) {
    let mut record = load(engine, conversation)
        .await
        .unwrap_or_else(|| SessionRecord::new(cwd, &[], mode));
    change(&mut record);
    save(engine, conversation, &record).await;
}

/// The record of `conversation`, if it has one (a conversation made by
/// another door has none; read errors are logged and read as none).
pub(crate) async fn load(engine: &Engine, conversation: ConversationId) -> Option<SessionRecord> {
    match engine
        .store()
        .document(KIND, &conversation.to_string())
        .await
    {
        Ok(Some(doc)) => match serde_json::from_value(doc.body) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!(%conversation, error = %e, "a stored ACP session record is unreadable");
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(%conversation, error = %e, "reading a stored ACP session record");
            None
        }
    }
}

/// Stores `record` for `conversation` (its update time is now).
pub(crate) async fn save(engine: &Engine, conversation: ConversationId, record: &SessionRecord) {
    let body = match serde_json::to_value(record) {
        Ok(body) => body,
        Err(e) => {
            tracing::warn!(%conversation, error = %e, "encoding an ACP session record");
            return;
        }
    };
    if let Err(e) = engine
        .put_record(KIND, &conversation.to_string(), &body)
        .await
    {
        tracing::warn!(%conversation, error = %e, "storing an ACP session record");
    }
}

/// Sets `session`'s mode: its next calls follow it, the engine's own turns
/// too, and it is stored with the session.
pub(crate) async fn apply_mode(engine: &Engine, session: &Session, mode: SessionMode) {
    session.set_mode(mode);
    engine.set_conversation_options(session.conversation, session.turn_options());
    update(engine, session.conversation, &session.cwd, mode, |r| {
        r.mode = mode;
    })
    .await;
}

/// After a prompt: the session was used now, and its first prompt names it.
pub(crate) async fn touch(
    engine: &Engine,
    conversation: ConversationId,
    cwd: &Path,
    mode: SessionMode,
    prompt: &str,
) {
    update(engine, conversation, cwd, mode, |record| {
        if record.title.is_none() {
            record.title = title_of(prompt);
        }
    })
    .await;
}

/// The title a session's first prompt gives it, both the one
/// `session_info_update` tells the editor and the one stored for
/// `session/list`: its first line with words, its spaces collapsed, cut
/// at [`MAX_TITLE_CHARS`] characters (an ellipsis included). `None` for a
/// prompt without text.
pub(crate) fn title_of(prompt: &str) -> Option<String> {
    let line = prompt.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= MAX_TITLE_CHARS {
        return Some(line);
    }
    let mut cut: String = line.chars().take(MAX_TITLE_CHARS - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    Some(cut)
}

/// `session/list`: a page of the stored sessions, newest first.
pub(crate) async fn list(
    engine: &Engine,
    cwd: Option<&Path>,
    cursor: Option<&str>,
) -> Result<ListSessionsResponse, agent_client_protocol::Error> {
    let docs = engine.store().documents(KIND).await.map_err(internal)?;
    let mut rows: Vec<_> = docs
        .into_iter()
        .filter_map(|doc| {
            let record: SessionRecord = serde_json::from_value(doc.body).ok()?;
            let conversation = doc.id.parse::<ConversationId>().ok()?;
            Some((doc.updated_at, conversation, record))
        })
        .filter(|(_, _, record)| !record.deleted && cwd.is_none_or(|cwd| record.cwd == cwd))
        .collect();
    rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
    let start = match cursor {
        None => 0,
        Some(cursor) => {
            rows.iter()
                .position(|(_, id, _)| id.to_string() == cursor)
                .ok_or_else(|| {
                    invalid_params(format!(
                        "unknown cursor `{cursor}`: it names no listed session (pass the \
                         nextCursor of the page before)"
                    ))
                })?
                + 1
        }
    };
    let page: Vec<_> = rows.iter().skip(start).take(PAGE).collect();
    let next = (start + page.len() < rows.len())
        .then(|| page.last().map(|(_, id, _)| id.to_string()))
        .flatten();
    let mut sessions = Vec::with_capacity(page.len());
    for (updated, conversation, record) in page {
        // A title set on the conversation (the page, the live view) wins.
        let title = match engine.store().conversation(*conversation).await {
            Ok(c) => c.title.or_else(|| record.title.clone()),
            // Deleted since: not listed.
            Err(_) => continue,
        };
        sessions.push(
            SessionInfo::new(conversation.to_string(), record.cwd.clone())
                .additional_directories(record.additional.clone())
                .title(title)
                .updated_at(updated.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
    }
    Ok(ListSessionsResponse::new(sessions).next_cursor(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_is_the_first_line_trimmed_and_cut_short() {
        assert_eq!(
            title_of("\n  fix the parser  \nthen more"),
            Some("fix the parser".into())
        );
        assert_eq!(
            title_of("\n  Fix the   parser\nit fails on tabs").as_deref(),
            Some("Fix the parser")
        );
        assert_eq!(title_of("   \n "), None);
        assert_eq!(title_of(" \n\t"), None);
        let long = "x".repeat(100);
        let title = title_of(&long).unwrap();
        assert_eq!(title.chars().count(), MAX_TITLE_CHARS);
        assert!(title.ends_with('…'));
        // Cut between words, no space is left before the ellipsis.
        let words = title_of(&"word ".repeat(40)).unwrap_or_default();
        assert!(words.chars().count() <= MAX_TITLE_CHARS, "{words}");
        assert!(words.ends_with("word…"), "{words}");
    }

    #[test]
    fn a_record_reads_back_and_old_ones_default_to_ask() {
        let record = SessionRecord {
            cwd: "/w".into(),
            additional: vec!["/docs".into()],
            mode: SessionMode::AcceptEdits,
            title: Some("t".into()),
            reasoning_effort: Some(toolwire_providers::ReasoningEffort::High),
            deleted: false,
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["mode"], "accept-edits");
        assert_eq!(json["additional"], serde_json::json!(["/docs"]));
        // Only a deleted record says so.
        assert!(json.get("deleted").is_none(), "{json}");
        assert_eq!(
            serde_json::from_value::<SessionRecord>(json).unwrap(),
            record
        );
        let old: SessionRecord = serde_json::from_value(serde_json::json!({"cwd": "/w"})).unwrap();
        assert_eq!(old.mode, SessionMode::Ask);
        assert!(old.additional.is_empty());
        assert!(!old.deleted);
    }
}
