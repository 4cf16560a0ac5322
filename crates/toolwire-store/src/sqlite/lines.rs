//! A path's rows on one SQLite connection: which lines a path crosses,
//! and their messages read as raw rows (for the readers' pipeline) or
//! decoded (for a read inside the writer's transaction, as a fork does).
//! The readers' cache of long paths is `reader.rs`'s.

use rusqlite::{Connection, OptionalExtension};
use toolwire_core::{Message, MessageId};
use uuid::Uuid;

use super::raw::Sink;
use crate::{Result, StoreError};

/// A message as it is kept, with its place in its line.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) seq: i64,
    pub(super) message: Message,
    /// About how much memory the message takes.
    pub(super) size: usize,
}

/// The columns a path read takes of each message, in the order
/// `raw::Sink::push` and `read_rows` read them: the small ones as the
/// one generated column `fields` (see [`crate::rows::Fields`]), since
/// every column taken costs about as much as the rest of the row. The
/// conversation and the parent are known (the leaf's conversation, the
/// message before), so they are not read again.
macro_rules! line_rows {
    ($from_where:literal) => {
        concat!(
            "SELECT seq, id, content, cost, fields ",
            $from_where,
            " ORDER BY seq"
        )
    };
}

/// Messages of a line in a range of seqs, in order: one range of the
/// `(line, seq)` index.
pub(super) const LINE_ROWS: &str =
    line_rows!("FROM messages WHERE line = ?1 AND seq > ?2 AND seq <= ?3");

/// [`LINE_ROWS`] through the table's own order (seq is the rowid)
/// rather than the line's index, skipping other lines' rows in the seq
/// range: when the line holds most of the range (a conversation
/// written alone), a step down the table is cheaper than one along the
/// index followed by a seek into the table.
pub(super) const LINE_ROWS_BY_SEQ: &str =
    line_rows!("FROM messages NOT INDEXED WHERE seq > ?2 AND seq <= ?3 AND line = ?1");

/// [`LINE_ROWS_BY_SEQ`] for a range that holds nothing but the line's
/// rows (as many as the range has seqs): no row needs its line checked.
/// `?1` is bound but not used, so that all three take the same values.
pub(super) const LINE_ONLY_ROWS: &str =
    line_rows!("FROM messages NOT INDEXED WHERE seq > ?2 AND seq <= ?3 AND ?1 IS NOT NULL");

const LINE_COUNT: &str =
    "SELECT count(*), min(seq) FROM messages WHERE line = ?1 AND seq > ?2 AND seq <= ?3";

/// [`LINE_COUNT`] from the line's start, counting no further than `?3`
/// rows (a long line's count is not wanted, only that it is long).
const LINE_COUNT_UPTO: &str = "SELECT count(*) FROM \
    (SELECT 1 FROM messages WHERE line = ?1 AND seq <= ?2 LIMIT ?3)";

/// The conversation of `leaf` and the lines its path crosses, root
/// first, each with the seq of its last message on the path.
pub(super) fn segments(tx: &Connection, leaf: MessageId) -> Result<(Uuid, Vec<(Uuid, i64)>)> {
    let conversation: Uuid = tx
        .prepare_cached("SELECT conversation_id FROM messages WHERE id = ?1")?
        .query_row([leaf.0], |r| r.get(0))
        .optional()?
        .ok_or(StoreError::MessageNotFound(leaf))?;
    let mut segments = tx
        .prepare_cached(crate::sql::PATH_LINES)?
        .query_map([leaf.0], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    segments.reverse();
    Ok((conversation, segments))
}

/// The messages of `line` with `after < seq <= upto`: how many (rows
/// and paths are allocated at their size, where growing a
/// 10,000-message path by doubling took a fifth of the read: copies,
/// and page faults on each new buffer), and the first one's seq.
pub(super) fn count(tx: &Connection, line: Uuid, after: i64, upto: i64) -> Result<(usize, i64)> {
    let (n, first): (i64, Option<i64>) = tx
        .prepare_cached(LINE_COUNT)?
        .query_row((line, after, upto), |r| Ok((r.get(0)?, r.get(1)?)))?;
    // A count is never negative.
    Ok((usize::try_from(n).unwrap_or(0), first.unwrap_or(upto)))
}

/// The path along `segments`, read whole (nothing kept); `len` is its
/// length when known.
pub(super) fn read_segments(
    tx: &Connection,
    conversation: Uuid,
    segments: &[(Uuid, i64)],
    len: Option<usize>,
) -> Result<Vec<Message>> {
    let len = match len {
        Some(len) => len,
        None => {
            let mut len = 0;
            for &(line, upto) in segments {
                len += count(tx, line, 0, upto)?.0;
            }
            len
        }
    };
    let mut path: Vec<Message> = Vec::with_capacity(len);
    for &(line, upto) in segments {
        let parent = path.last().map(|m| m.id.0);
        read_rows(tx, conversation, line, (0, upto), parent, |row| {
            path.push(row.message)
        })?;
    }
    Ok(path)
}

/// Messages of a line to read: those with `after < seq <= upto`.
pub(super) struct Range {
    pub(super) line: Uuid,
    pub(super) after: i64,
    pub(super) upto: i64,
    /// How many there are, and the first one's seq.
    pub(super) rows: usize,
    pub(super) first: i64,
    /// The parent of the first, when it is not the last row read
    /// before it.
    pub(super) parent: Option<Option<Uuid>>,
}

/// The rows of `ranges`, in order, sent raw to `sink`.
pub(super) fn read_raw(tx: &Connection, ranges: &[Range], sink: &mut Sink) -> Result<()> {
    let mut last = None;
    for range in ranges {
        let mut parent = range.parent.unwrap_or(last);
        // By seq, other lines' rows between the first and the last
        // cost a step each: the line must hold at least half of them.
        let span = u64::try_from(range.upto - range.first + 1).unwrap_or(u64::MAX);
        let rows = range.rows as u64;
        let (sql, after) = if span == rows {
            (LINE_ONLY_ROWS, range.first - 1)
        } else if span <= 2 * rows {
            (LINE_ROWS_BY_SEQ, range.first - 1)
        } else {
            (LINE_ROWS, range.after)
        };
        let mut statement = tx.prepare_cached(sql)?;
        let mut rows = statement.query((range.line, after, range.upto))?;
        while let Some(r) = rows.next()? {
            parent = Some(sink.push(r, parent)?);
            if sink.given_up() {
                return Ok(());
            }
        }
        last = parent;
    }
    sink.flush();
    Ok(())
}

/// The path to `leaf`, root first, read whole in the transaction going
/// on on `tx` (the writer's).
pub(super) fn read_path(tx: &Connection, leaf: MessageId) -> Result<Vec<Message>> {
    let (conversation, segments) = segments(tx, leaf)?;
    read_segments(tx, conversation, &segments, None)
}

/// The path to `leaf`, root first, read whole in the transaction going
/// on on `tx` if it holds at most `most` messages and crosses no line
/// that `kept` says is kept; `None` if not (nothing of it read but its
/// lines and up to `most + 1` index entries).
pub(super) fn short_path(
    tx: &Connection,
    leaf: MessageId,
    most: usize,
    kept: impl Fn(Uuid) -> bool,
) -> Result<Option<Vec<Message>>> {
    let (conversation, segments) = segments(tx, leaf)?;
    if segments.iter().any(|&(line, _)| kept(line)) {
        return Ok(None);
    }
    let mut len = 0;
    for &(line, upto) in &segments {
        // One more than is left, to tell "exactly" from "more".
        let left = i64::try_from(most - len + 1).unwrap_or(i64::MAX);
        let rows: i64 = tx
            .prepare_cached(LINE_COUNT_UPTO)?
            .query_row((line, upto, left), |r| r.get(0))?;
        // A count is never negative.
        len += usize::try_from(rows).unwrap_or(0);
        if len > most {
            return Ok(None);
        }
    }
    read_segments(tx, conversation, &segments, Some(len)).map(Some)
}

/// The messages of `line` with `after < seq <= upto`, in order, each
/// handed to `each`; the first one's parent is `parent`.
pub(super) fn read_rows(
    tx: &Connection,
    conversation: Uuid,
    line: Uuid,
    (after, upto): (i64, i64),
    mut parent: Option<Uuid>,
    mut each: impl FnMut(Row),
) -> Result<()> {
    let mut statement = tx.prepare_cached(LINE_ROWS)?;
    let mut rows = statement.query((line, after, upto))?;
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let id: Uuid = r.get(1)?;
        let bytes = |i: usize| -> Result<&[u8]> {
            r.get_ref(i)?
                .as_bytes()
                .map_err(|e| StoreError::Corrupt(format!("message {id}: column {i}: {e}")))
        };
        let content = bytes(2)?;
        // The decoded content takes about as much as its JSON.
        let mut size = std::mem::size_of::<Row>() + content.len();
        let message = Message::try_from(super::raw::fields(id, bytes(4)?)?.parts(
            id,
            conversation,
            parent,
            content,
            r.get(3)?,
        )?)?;
        size += message.content.len() * std::mem::size_of::<toolwire_core::ContentBlock>()
            + message.model.as_ref().map_or(0, String::capacity);
        parent = Some(id);
        each(Row { seq, message, size });
    }
    Ok(())
}
