//! [`crate::rows`]' rows read from tokio-postgres, by position in their
//! select lists (as the SQLite backend reads them): `TIMESTAMPTZ` columns
//! as [`Ts`], `JSONB` ones cast to text by the SQL.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use crate::rows::{
    ConversationRow, DocumentRow, EventRow, InstanceRow, MessageRow, RunRow, SummaryRow, Ts,
    UnfinishedRow,
};

type Result<T> = std::result::Result<T, tokio_postgres::Error>;

fn ts(r: &Row, i: usize) -> Result<Ts> {
    r.try_get::<_, DateTime<Utc>>(i).map(Ts)
}

fn ts_or_null(r: &Row, i: usize) -> Result<Option<Ts>> {
    Ok(r.try_get::<_, Option<DateTime<Utc>>>(i)?.map(Ts))
}

/// A row of one of the select lists of [`crate::rows`].
pub(super) trait FromPostgres: Sized {
    fn from_postgres(r: &Row) -> Result<Self>;
}

impl FromPostgres for MessageRow {
    fn from_postgres(r: &Row) -> Result<MessageRow> {
        Ok(MessageRow {
            id: r.try_get(0)?,
            conversation_id: r.try_get(1)?,
            parent_id: r.try_get(2)?,
            role: r.try_get(3)?,
            content: r.try_get(4)?,
            prompt_tokens: r.try_get(5)?,
            completion_tokens: r.try_get(6)?,
            cached_tokens: r.try_get(7)?,
            cost: r.try_get(8)?,
            model: r.try_get(9)?,
            duration_ms: r.try_get(10)?,
            status: r.try_get(11)?,
            created_at: ts(r, 12)?,
            cache_write_tokens: r.try_get(13)?,
        })
    }
}

impl FromPostgres for ConversationRow {
    fn from_postgres(r: &Row) -> Result<ConversationRow> {
        Ok(ConversationRow {
            id: r.try_get(0)?,
            title: r.try_get(1)?,
            root_id: r.try_get(2)?,
            active_leaf: r.try_get(3)?,
            forked_from_conversation: r.try_get(4)?,
            forked_from_message: r.try_get(5)?,
            created_at: ts(r, 6)?,
            revision: r.try_get(7)?,
        })
    }
}

impl FromPostgres for SummaryRow {
    fn from_postgres(r: &Row) -> Result<SummaryRow> {
        Ok(SummaryRow {
            conversation: ConversationRow::from_postgres(r)?,
            message_count: r.try_get(8)?,
            total_cost: r.try_get(9)?,
        })
    }
}

impl FromPostgres for RunRow {
    fn from_postgres(r: &Row) -> Result<RunRow> {
        Ok(RunRow {
            id: r.try_get(0)?,
            conversation_id: r.try_get(1)?,
            stop_reason: r.try_get(2)?,
            error: r.try_get(3)?,
            started_at: ts(r, 4)?,
            finished_at: ts_or_null(r, 5)?,
            owner: r.try_get(6)?,
        })
    }
}

impl FromPostgres for InstanceRow {
    fn from_postgres(r: &Row) -> Result<InstanceRow> {
        Ok(InstanceRow {
            id: r.try_get(0)?,
            host: r.try_get(1)?,
            pid: r.try_get(2)?,
            started_at: ts(r, 3)?,
            heartbeat_at: ts(r, 4)?,
        })
    }
}

impl FromPostgres for UnfinishedRow {
    fn from_postgres(r: &Row) -> Result<UnfinishedRow> {
        Ok(UnfinishedRow {
            run: RunRow::from_postgres(r)?,
            instance_id: r.try_get(7)?,
            instance_host: r.try_get(8)?,
            instance_pid: r.try_get(9)?,
            instance_started_at: ts_or_null(r, 10)?,
            instance_heartbeat_at: ts_or_null(r, 11)?,
        })
    }
}

impl FromPostgres for DocumentRow {
    fn from_postgres(r: &Row) -> Result<DocumentRow> {
        Ok(DocumentRow {
            kind: r.try_get(0)?,
            id: r.try_get(1)?,
            body: r.try_get(2)?,
            created_at: ts(r, 3)?,
            updated_at: ts(r, 4)?,
        })
    }
}

impl FromPostgres for EventRow {
    fn from_postgres(r: &Row) -> Result<EventRow> {
        Ok(EventRow {
            seq: r.try_get(0)?,
            payload: r.try_get(1)?,
        })
    }
}
