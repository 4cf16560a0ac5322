//! Rows as both backends read them, and their conversion to and from the
//! domain types. Everything here is backend-neutral: ids are [`Uuid`]s,
//! numbers `i64`/`f64`, JSON is read as text (`CAST(… AS TEXT)`) and written
//! as JSON (PostgreSQL) or text (SQLite), and timestamps go through [`Ts`].
//! Each row reads by position in its select list, from rusqlite
//! (`from_sqlite`, here) and from tokio-postgres (`from_postgres`, in
//! `postgres/rows.rs`).

use chrono::{DateTime, Utc};
use toolwire_core::{
    AgentEvent, ContentBlock, Conversation, ConversationId, ForkOrigin, InstanceId, Message,
    MessageId, MessageStatus, Role, RunId, StopReason, Usage,
};
use uuid::Uuid;

use crate::{
    ConversationSummary, InstanceRecord, Result, RunRecord, StoreError, StoredEvent, UnfinishedRun,
};

/// A timestamp, kept to the microsecond on both backends: `TIMESTAMPTZ` on
/// PostgreSQL, `INTEGER` microseconds since the Unix epoch on SQLite (so
/// that it sorts as a number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ts(pub DateTime<Utc>);

impl Ts {
    pub(crate) fn now() -> Ts {
        Ts::from(Utc::now())
    }
}

impl From<DateTime<Utc>> for Ts {
    /// Drops what is finer than a microsecond, as both databases do.
    fn from(t: DateTime<Utc>) -> Ts {
        Ts(DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t))
    }
}

impl rusqlite::types::ToSql for Ts {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.0.timestamp_micros().into())
    }
}

impl rusqlite::types::FromSql for Ts {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Ts> {
        let micros = value.as_i64()?;
        DateTime::from_timestamp_micros(micros)
            .map(Ts)
            .ok_or(rusqlite::types::FromSqlError::OutOfRange(micros))
    }
}

/// The columns of `messages`, in the order of [`MESSAGE_COLUMNS`].
pub(crate) struct MessageRow {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub parent_id: Option<Uuid>,
    pub role: String,
    pub content: String,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub cost: Option<f64>,
    pub model: Option<String>,
    pub duration_ms: Option<i64>,
    pub status: String,
    pub created_at: Ts,
    pub cache_write_tokens: Option<i64>,
}

/// The select list for a [`MessageRow`] of the table aliased `m`
/// (`cache_write_tokens`, added last, comes last).
macro_rules! message_columns {
    () => {
        "m.id, m.conversation_id, m.parent_id, m.role, CAST(m.content AS TEXT) AS content, \
         m.prompt_tokens, m.completion_tokens, m.cached_tokens, m.cost, m.model, \
         m.duration_ms, m.status, m.created_at, m.cache_write_tokens"
    };
}
pub(crate) use message_columns;

impl TryFrom<MessageRow> for Message {
    type Error = StoreError;

    fn try_from(r: MessageRow) -> Result<Message> {
        MessageParts {
            id: r.id,
            conversation_id: r.conversation_id,
            parent_id: r.parent_id,
            role: &r.role,
            content: r.content.as_bytes(),
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cached_tokens: r.cached_tokens,
            cache_write_tokens: r.cache_write_tokens,
            cost: r.cost,
            model: r.model,
            duration_ms: r.duration_ms,
            status: &r.status,
            created_at: r.created_at,
        }
        .try_into()
    }
}

/// A message's columns as read, text borrowed from the row where the
/// reader allows it: what every reader ([`MessageRow`] or the SQLite
/// backend's own) turns into a [`Message`].
pub(crate) struct MessageParts<'a> {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub parent_id: Option<Uuid>,
    pub role: &'a str,
    /// The JSON list of content blocks, as stored (UTF-8 is checked while it
    /// is parsed).
    pub content: &'a [u8],
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    /// NULL in rows stored before it was counted.
    pub cache_write_tokens: Option<i64>,
    pub cost: Option<f64>,
    pub model: Option<String>,
    pub duration_ms: Option<i64>,
    pub status: &'a str,
    pub created_at: Ts,
}

impl TryFrom<MessageParts<'_>> for Message {
    type Error = StoreError;

    fn try_from(r: MessageParts<'_>) -> Result<Message> {
        let id = MessageId(r.id);
        let corrupt = |what: &str| StoreError::Corrupt(format!("message {id}: {what}"));
        let content = content_blocks(r.content)
            .map_err(|e| corrupt(&format!("content is not a list of content blocks: {e}")))?;
        let count = |v: i64| u64::try_from(v).map_err(|_| corrupt("negative token count"));
        let usage = match (r.prompt_tokens, r.completion_tokens, r.cached_tokens) {
            (Some(p), Some(c), Some(k)) => Some(Usage {
                prompt_tokens: count(p)?,
                completion_tokens: count(c)?,
                cached_tokens: count(k)?,
                cache_write_tokens: r.cache_write_tokens.map(count).transpose()?.unwrap_or(0),
            }),
            (None, None, None) => None,
            _ => return Err(corrupt("usage is partly missing")),
        };
        Ok(Message {
            id,
            conversation_id: ConversationId(r.conversation_id),
            parent_id: r.parent_id.map(MessageId),
            role: Role::parse(r.role).ok_or_else(|| corrupt(&format!("role `{}`", r.role)))?,
            content,
            usage,
            cost: r.cost,
            model: r.model,
            duration_ms: r
                .duration_ms
                .map(|d| u64::try_from(d).map_err(|_| corrupt("negative duration")))
                .transpose()?,
            status: MessageStatus::parse(r.status)
                .ok_or_else(|| corrupt(&format!("status `{}`", r.status)))?,
            created_at: r.created_at.0,
        })
    }
}

/// A message's small fields as SQLite's generated column `fields` holds
/// them (see `migrations/sqlite/0012_cache_write_tokens.sql`, which
/// writes them): `role status created_at duration_ms prompt_tokens
/// completion_tokens cached_tokens cache_write_tokens[ model]`, a NULL as
/// nothing.
pub(crate) struct Fields<'a> {
    pub role: &'a str,
    pub status: &'a str,
    pub created_at: i64,
    pub duration_ms: Option<i64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub cache_write_tokens: Option<i64>,
    pub model: Option<&'a str>,
}

impl<'a> Fields<'a> {
    /// Reads `text`; the error says what was wrong with it.
    pub(crate) fn parse(text: &'a str) -> std::result::Result<Fields<'a>, String> {
        // Read by hand: a path reads one a row, and `splitn` with `parse`
        // took some 60 ns of each row's decoding.
        // Where the first eight spaces are (the model may hold more).
        let mut spaces = [0; 8];
        let mut found = 0;
        for (i, &b) in text.as_bytes().iter().enumerate() {
            if b == b' ' {
                spaces[found] = i;
                found += 1;
                if found == spaces.len() {
                    break;
                }
            }
        }
        const NAMES: [&str; 8] = [
            "status",
            "created_at",
            "duration_ms",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "cache_write_tokens",
            "model",
        ];
        if found < 7 {
            return Err(format!("no {}", NAMES[found]));
        }
        // Spaces are ASCII: every slice below is on a char boundary.
        let field = |k: usize| {
            let start = if k == 0 { 0 } else { spaces[k - 1] + 1 };
            let end = if k < found { spaces[k] } else { text.len() };
            &text[start..end]
        };
        let role = field(0);
        let status = field(1);
        let created_at =
            number("created_at", field(2))?.ok_or_else(|| "no created_at".to_owned())?;
        let duration_ms = number("duration_ms", field(3))?;
        let prompt_tokens = number("prompt_tokens", field(4))?;
        let completion_tokens = number("completion_tokens", field(5))?;
        let cached_tokens = number("cached_tokens", field(6))?;
        let cache_write_tokens = number("cache_write_tokens", field(7))?;
        let model = (found == 8).then(|| &text[spaces[7] + 1..]);
        Ok(Fields {
            role,
            status,
            created_at,
            duration_ms,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            cache_write_tokens,
            model,
        })
    }

    /// The message's parts, these fields with the other columns read.
    pub(crate) fn parts<'c>(
        self,
        id: Uuid,
        conversation_id: Uuid,
        parent_id: Option<Uuid>,
        content: &'c [u8],
        cost: Option<f64>,
    ) -> Result<MessageParts<'c>>
    where
        'a: 'c,
    {
        Ok(MessageParts {
            id,
            conversation_id,
            parent_id,
            role: self.role,
            content,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            cached_tokens: self.cached_tokens,
            cache_write_tokens: self.cache_write_tokens,
            cost,
            model: self.model.map(str::to_owned),
            duration_ms: self.duration_ms,
            status: self.status,
            created_at: DateTime::from_timestamp_micros(self.created_at)
                .map(Ts)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "message {id}: timestamp {} µs is out of range",
                        self.created_at
                    ))
                })?,
        })
    }
}

/// A decimal integer of [`Fields`], `None` for nothing.
fn number(what: &str, s: &str) -> std::result::Result<Option<i64>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    if let Some(kind) = s.strip_prefix('!') {
        return Err(format!("{what} is {kind}, not an integer"));
    }
    s.parse().map(Some).map_err(|_| format!("{what} `{s}`"))
}

/// How serde_json writes a content list holding one text block, up to the
/// text's opening quote and from its closing quote.
const ONE_TEXT_BLOCK: (&[u8], &[u8]) = (br#"[{"type":"text","text":"#, b"}]");

/// A stored content list. Most messages are one text block, and
/// `ContentBlock` is an internally tagged enum, which serde can only read by
/// buffering each object's fields first (a third of the time a 10,000-message
/// path took to read): that shape, exactly as serde_json writes it, is read
/// as the one JSON string it holds. Other lists as serde_json writes them
/// are read in one pass by [`crate::content`]; anything else — other key
/// orders, malformed lists — takes the general way. Both shortcuts accept
/// only what that would read the same.
pub(crate) fn content_blocks(json: &[u8]) -> serde_json::Result<Vec<ContentBlock>> {
    let (head, tail) = ONE_TEXT_BLOCK;
    if let Some(text) = json
        .strip_prefix(head)
        .and_then(|rest| rest.strip_suffix(tail))
        // A single JSON string and nothing else (bar whitespace), or the
        // general way decides.
        .and_then(|text| std::str::from_utf8(text).ok())
        .and_then(|text| serde_json::from_str::<String>(text).ok())
    {
        return Ok(vec![ContentBlock::Text { text }]);
    }
    if let Some(blocks) = crate::content::blocks(json) {
        return Ok(blocks);
    }
    serde_json::from_slice(json)
}

impl MessageRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<MessageRow> {
        Ok(MessageRow {
            id: r.get(0)?,
            conversation_id: r.get(1)?,
            parent_id: r.get(2)?,
            role: r.get(3)?,
            content: r.get(4)?,
            prompt_tokens: r.get(5)?,
            completion_tokens: r.get(6)?,
            cached_tokens: r.get(7)?,
            cost: r.get(8)?,
            model: r.get(9)?,
            duration_ms: r.get(10)?,
            status: r.get(11)?,
            created_at: r.get(12)?,
            cache_write_tokens: r.get(13)?,
        })
    }
}

pub(crate) fn messages(rows: Vec<MessageRow>) -> Result<Vec<Message>> {
    rows.into_iter().map(Message::try_from).collect()
}

/// A message's columns as they are bound, in the order of `INSERT_MESSAGE`.
pub(crate) struct MessageValues<'a> {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub parent_id: Option<Uuid>,
    pub role: &'static str,
    pub content: &'a [ContentBlock],
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub cache_write_tokens: Option<i64>,
    pub cost: Option<f64>,
    pub model: Option<&'a str>,
    pub duration_ms: Option<i64>,
    pub status: &'static str,
    pub created_at: Ts,
}

/// Counts above `i64::MAX` (never met in practice) are stored as `i64::MAX`.
fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl<'a> From<&'a Message> for MessageValues<'a> {
    fn from(m: &'a Message) -> Self {
        MessageValues {
            id: m.id.0,
            conversation_id: m.conversation_id.0,
            parent_id: m.parent_id.map(|p| p.0),
            role: m.role.as_str(),
            content: &m.content,
            prompt_tokens: m.usage.map(|u| count(u.prompt_tokens)),
            completion_tokens: m.usage.map(|u| count(u.completion_tokens)),
            cached_tokens: m.usage.map(|u| count(u.cached_tokens)),
            cache_write_tokens: m.usage.map(|u| count(u.cache_write_tokens)),
            cost: m.cost,
            model: m.model.as_deref(),
            duration_ms: m.duration_ms.map(count),
            status: m.status.as_str(),
            created_at: Ts::from(m.created_at),
        }
    }
}

/// The columns of `conversations` (and, for lists, its totals).
pub(crate) struct ConversationRow {
    pub id: Uuid,
    pub title: Option<String>,
    pub root_id: Uuid,
    pub active_leaf: Uuid,
    pub forked_from_conversation: Option<Uuid>,
    pub forked_from_message: Option<Uuid>,
    pub created_at: Ts,
    pub revision: i64,
}

impl ConversationRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<ConversationRow> {
        Ok(ConversationRow {
            id: r.get(0)?,
            title: r.get(1)?,
            root_id: r.get(2)?,
            active_leaf: r.get(3)?,
            forked_from_conversation: r.get(4)?,
            forked_from_message: r.get(5)?,
            created_at: r.get(6)?,
            revision: r.get(7)?,
        })
    }
}

/// The select list for a [`ConversationRow`] of the table aliased `c`.
macro_rules! conversation_columns {
    () => {
        "c.id, c.title, c.root_id, c.active_leaf, c.forked_from_conversation, \
         c.forked_from_message, c.created_at, c.revision"
    };
}
pub(crate) use conversation_columns;

impl TryFrom<ConversationRow> for Conversation {
    type Error = StoreError;

    fn try_from(r: ConversationRow) -> Result<Conversation> {
        let id = ConversationId(r.id);
        let forked_from = match (r.forked_from_conversation, r.forked_from_message) {
            (Some(c), Some(m)) => Some(ForkOrigin {
                conversation_id: ConversationId(c),
                message_id: MessageId(m),
            }),
            (None, None) => None,
            _ => {
                return Err(StoreError::Corrupt(format!(
                    "conversation {id}: fork origin is partly missing"
                )));
            }
        };
        Ok(Conversation {
            id,
            title: r.title,
            root_id: MessageId(r.root_id),
            active_leaf: MessageId(r.active_leaf),
            forked_from,
            created_at: r.created_at.0,
            // Never negative: it only grows from 0.
            revision: u64::try_from(r.revision).unwrap_or(0),
        })
    }
}

pub(crate) struct SummaryRow {
    pub conversation: ConversationRow,
    pub message_count: i64,
    pub total_cost: f64,
}

impl SummaryRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<SummaryRow> {
        Ok(SummaryRow {
            conversation: ConversationRow::from_sqlite(r)?,
            message_count: r.get(8)?,
            total_cost: r.get(9)?,
        })
    }
}

impl TryFrom<SummaryRow> for ConversationSummary {
    type Error = StoreError;

    fn try_from(r: SummaryRow) -> Result<ConversationSummary> {
        Ok(ConversationSummary {
            conversation: r.conversation.try_into()?,
            message_count: u64::try_from(r.message_count).unwrap_or(0),
            total_cost: r.total_cost,
        })
    }
}

/// The select list for a [`RunRow`].
macro_rules! run_columns {
    () => {
        "id, conversation_id, stop_reason, error, started_at, finished_at, owner"
    };
}
pub(crate) use run_columns;

pub(crate) struct RunRow {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub stop_reason: Option<String>,
    pub error: Option<String>,
    pub started_at: Ts,
    pub finished_at: Option<Ts>,
    pub owner: Option<Uuid>,
}

impl RunRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
        Ok(RunRow {
            id: r.get(0)?,
            conversation_id: r.get(1)?,
            stop_reason: r.get(2)?,
            error: r.get(3)?,
            started_at: r.get(4)?,
            finished_at: r.get(5)?,
            owner: r.get(6)?,
        })
    }
}

impl TryFrom<RunRow> for RunRecord {
    type Error = StoreError;

    fn try_from(r: RunRow) -> Result<RunRecord> {
        let id = RunId(r.id);
        let stop_reason = r
            .stop_reason
            .map(|s| {
                StopReason::parse(&s)
                    .ok_or_else(|| StoreError::Corrupt(format!("run {id}: stop reason `{s}`")))
            })
            .transpose()?;
        Ok(RunRecord {
            id,
            conversation_id: ConversationId(r.conversation_id),
            stop_reason,
            error: r.error,
            started_at: r.started_at.0,
            finished_at: r.finished_at.map(|t| t.0),
            owner: r.owner.map(InstanceId),
        })
    }
}

/// The select list for an [`InstanceRow`].
macro_rules! instance_columns {
    () => {
        "id, host, pid, started_at, heartbeat_at"
    };
}
pub(crate) use instance_columns;

pub(crate) struct InstanceRow {
    pub id: Uuid,
    pub host: String,
    pub pid: i64,
    pub started_at: Ts,
    pub heartbeat_at: Ts,
}

impl InstanceRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<InstanceRow> {
        Ok(InstanceRow {
            id: r.get(0)?,
            host: r.get(1)?,
            pid: r.get(2)?,
            started_at: r.get(3)?,
            heartbeat_at: r.get(4)?,
        })
    }
}

impl TryFrom<InstanceRow> for InstanceRecord {
    type Error = StoreError;

    fn try_from(r: InstanceRow) -> Result<InstanceRecord> {
        let id = InstanceId(r.id);
        Ok(InstanceRecord {
            id,
            pid: u32::try_from(r.pid)
                .map_err(|_| StoreError::Corrupt(format!("instance {id}: pid {}", r.pid)))?,
            host: r.host,
            started_at: r.started_at.0,
            heartbeat_at: r.heartbeat_at.0,
        })
    }
}

/// A run and, through a left join, its owner's columns (all `NULL` when
/// the owner is unknown).
pub(crate) struct UnfinishedRow {
    pub run: RunRow,
    pub instance_id: Option<Uuid>,
    pub instance_host: Option<String>,
    pub instance_pid: Option<i64>,
    pub instance_started_at: Option<Ts>,
    pub instance_heartbeat_at: Option<Ts>,
}

impl UnfinishedRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<UnfinishedRow> {
        Ok(UnfinishedRow {
            run: RunRow::from_sqlite(r)?,
            instance_id: r.get(7)?,
            instance_host: r.get(8)?,
            instance_pid: r.get(9)?,
            instance_started_at: r.get(10)?,
            instance_heartbeat_at: r.get(11)?,
        })
    }
}

impl TryFrom<UnfinishedRow> for UnfinishedRun {
    type Error = StoreError;

    fn try_from(r: UnfinishedRow) -> Result<UnfinishedRun> {
        let owner = match (
            r.instance_id,
            r.instance_host,
            r.instance_pid,
            r.instance_started_at,
            r.instance_heartbeat_at,
        ) {
            (Some(id), Some(host), Some(pid), Some(started_at), Some(heartbeat_at)) => Some(
                InstanceRow {
                    id,
                    host,
                    pid,
                    started_at,
                    heartbeat_at,
                }
                .try_into()?,
            ),
            _ => None,
        };
        Ok(UnfinishedRun {
            run: r.run.try_into()?,
            owner,
        })
    }
}

pub(crate) struct DocumentRow {
    pub kind: String,
    pub id: String,
    pub body: String,
    pub created_at: Ts,
    pub updated_at: Ts,
}

impl DocumentRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<DocumentRow> {
        Ok(DocumentRow {
            kind: r.get(0)?,
            id: r.get(1)?,
            body: r.get(2)?,
            created_at: r.get(3)?,
            updated_at: r.get(4)?,
        })
    }
}

impl TryFrom<DocumentRow> for crate::Document {
    type Error = StoreError;

    fn try_from(row: DocumentRow) -> Result<Self> {
        let body = serde_json::from_str(&row.body)
            .map_err(|e| StoreError::Corrupt(format!("document {} {}: {e}", row.kind, row.id)))?;
        Ok(crate::Document {
            kind: row.kind,
            id: row.id,
            body,
            created_at: row.created_at.0,
            updated_at: row.updated_at.0,
        })
    }
}

pub(crate) struct EventRow {
    pub seq: i64,
    pub payload: String,
}

impl EventRow {
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
        Ok(EventRow {
            seq: r.get(0)?,
            payload: r.get(1)?,
        })
    }

    pub(crate) fn into_event(self, conversation: ConversationId) -> Result<StoredEvent> {
        let corrupt = |what: String| {
            StoreError::Corrupt(format!(
                "event {} of conversation {conversation}: {what}",
                self.seq
            ))
        };
        let seq = u64::try_from(self.seq).map_err(|_| corrupt("negative seq".into()))?;
        let event = serde_json::from_str(&self.payload).map_err(|e| corrupt(e.to_string()))?;
        Ok(StoredEvent { seq, event })
    }
}

/// An event as it is stored: its `type` (the serde tag) and its JSON.
pub(crate) fn event_json(event: &AgentEvent) -> Result<(String, serde_json::Value)> {
    let value = serde_json::to_value(event)
        .map_err(|e| StoreError::Corrupt(format!("event cannot be serialised: {e}")))?;
    let kind = value
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or_default()
        .to_owned();
    Ok((kind, value))
}

/// An event as it is stored: its `type` and its JSON text, written
/// straight from the event (no `serde_json::Value` built and dropped on
/// the way: the text is the same, keys in the same order). serde writes
/// an internally tagged enum's tag as its first field, so the type is
/// read off the text's start.
pub(crate) fn event_text(event: &AgentEvent) -> Result<(String, String)> {
    let text = serde_json::to_string(event)
        .map_err(|e| StoreError::Corrupt(format!("event cannot be serialised: {e}")))?;
    let kind = text
        .strip_prefix(r#"{"type":""#)
        .and_then(|rest| rest.split_once('"'))
        .map(|(kind, _)| kind.to_owned())
        .ok_or_else(|| {
            StoreError::Corrupt(format!("event serialised without its type first: {text}"))
        })?;
    Ok((kind, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event's stored text and type are those of the `Value` route
    /// (what was stored before, and PostgreSQL's): the same keys in the
    /// same order, the same type.
    #[test]
    fn event_text_is_what_the_value_gives() {
        use toolwire_core::{ContentBlock, Message, Role, RunId};
        let conversation = toolwire_core::ConversationId::new();
        let message = Message::new(
            conversation,
            None,
            Role::Assistant,
            vec![ContentBlock::Text {
                text: "quote \" backslash \\ é 😀".into(),
            }],
        );
        let run = RunId::new();
        let events = [
            AgentEvent::TurnStarted {
                run_id: run,
                conversation_id: conversation,
                message: message.clone(),
            },
            AgentEvent::TextDelta {
                run_id: run,
                text: "a \n piece".into(),
            },
            AgentEvent::ArgumentField {
                run_id: run,
                call_id: toolwire_core::ToolCallId("call_1".into()),
                key: "path".into(),
                value: serde_json::json!({"z": 1, "a": [1.5, null, "x"]}),
            },
            AgentEvent::AssistantMessageCreated {
                run_id: run,
                message,
            },
        ];
        for event in &events {
            let (kind, value) = event_json(event).unwrap();
            let (text_kind, text) = event_text(event).unwrap();
            assert_eq!(text_kind, kind);
            assert_eq!(text, value.to_string());
        }
    }

    /// The shortcut for one text block reads exactly what the general way
    /// reads, and fails where it fails.
    #[test]
    fn content_reads_as_the_general_way_does() {
        let cases = [
            r#"[{"type":"text","text":"plain"}]"#,
            r#"[{"type":"text","text":""}]"#,
            r#"[{"type":"text","text":"quote \" backslash \\ newline \n é \u00e9 😀 \ud83d\ude00"}]"#,
            r#"[{"type":"text","text":"looks like an end\"}]"}]"#,
            r#"[{"type":"text","text":"a"},{"type":"text","text":"b"}]"#,
            r#"[{"type":"text","text":"a"}, {"type":"text","text":"b"}]"#,
            r#"[{"type":"text","text": "spaced" }]"#,
            r#"[{"text":"other order","type":"text"}]"#,
            r#"[{"type":"text","text":"extra","more":1}]"#,
            r#"[{"type":"reasoning","text":"hm"}]"#,
            r#"[]"#,
            // Not content: each must fail as the general way fails.
            r#"[{"type":"text","text":"a" "b"}]"#,
            "[{\"type\":\"text\",\"text\":\"raw\tcontrol\"}]",
            r#"[{"type":"text","text":"lone \ud800"}]"#,
            r#"[{"type":"text","text":"unclosed}]"#,
            r#"[{"type":"text","text":7}]"#,
            r#"[{"type":"text","text":null}]"#,
            r#"{"not": "blocks"}"#,
        ];
        for json in cases {
            let general = serde_json::from_slice::<Vec<ContentBlock>>(json.as_bytes());
            match (content_blocks(json.as_bytes()), general) {
                (Ok(fast), Ok(general)) => assert_eq!(fast, general, "{json}"),
                (Err(_), Err(_)) => {}
                (fast, general) => panic!("{json}: {fast:?} but {general:?}"),
            }
        }
        assert!(content_blocks(b"[{\"type\":\"text\",\"text\":\"\xff\"}]").is_err());
    }

    /// What SQLite's `fields` holds reads back; anything else is an error
    /// naming the field. (That SQLite writes it so is the store tests'
    /// concern: they read paths through it.)
    #[test]
    fn fields_read_as_written() {
        let f = Fields::parse("assistant complete 1700000000000001 12 1000 100 -5 7 a model name")
            .unwrap();
        assert_eq!(
            (f.role, f.status, f.created_at, f.duration_ms),
            ("assistant", "complete", 1_700_000_000_000_001, Some(12))
        );
        assert_eq!(
            (
                f.prompt_tokens,
                f.completion_tokens,
                f.cached_tokens,
                f.cache_write_tokens
            ),
            (Some(1000), Some(100), Some(-5), Some(7))
        );
        assert_eq!(f.model, Some("a model name"));

        // Counted before cache writes were: NULL.
        let f = Fields::parse("assistant complete 1 12 1000 100 5  gpt").unwrap();
        assert_eq!((f.cached_tokens, f.cache_write_tokens), (Some(5), None));
        assert_eq!(f.model, Some("gpt"));

        let f = Fields::parse("user interrupted -3     ").unwrap();
        assert_eq!(
            (f.role, f.status, f.created_at),
            ("user", "interrupted", -3)
        );
        assert_eq!(
            (f.duration_ms, f.prompt_tokens, f.cached_tokens, f.model),
            (None, None, None, None)
        );
        // An empty model is a model.
        assert_eq!(
            Fields::parse("tool complete 0      ").unwrap().model,
            Some("")
        );

        for (text, error) in [
            ("", "no status"),
            ("user", "no status"),
            ("user complete", "no created_at"),
            ("user complete 1 2 3 4", "no cached_tokens"),
            ("user complete 1 2 3 4 5", "no cache_write_tokens"),
            ("user complete  1 2 3 4 5", "no created_at"),
            ("user complete x     ", "created_at `x`"),
            ("user complete 1.5     ", "created_at `1.5`"),
            ("user complete 1 - 1 1 1 1", "duration_ms `-`"),
            (
                "user complete !text     ",
                "created_at is text, not an integer",
            ),
            (
                "user complete 1  !real   ",
                "prompt_tokens is real, not an integer",
            ),
            (
                "user complete 1  1 1 99999999999999999999 ",
                "cached_tokens `99999999999999999999`",
            ),
            (
                "user complete 1  1 1 1 !real",
                "cache_write_tokens is real, not an integer",
            ),
        ] {
            let Err(e) = Fields::parse(text) else {
                panic!("{text:?} read")
            };
            assert_eq!(e, error, "{text:?}");
        }
    }
}
