//! A path's rows between the reader's blocking thread, which steps SQLite,
//! and the caller's, which decodes them: copied out raw in chunks (of 128
//! rows, growing to 1,024), so that decoding goes on while SQLite reads the
//! next rows, in buffers the two threads pass back and forth, and the
//! messages are allocated on the thread that will free them (decoded on a
//! blocking thread and freed on the caller's, a 10,000-message path took
//! hundreds of page faults a read, glibc handing the memory back to the
//! system after each read).

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::Row as SqlRow;
use rusqlite::types::ValueRef;
use tokio::sync::mpsc::UnboundedSender;
use toolwire_core::{ContentBlock, Message};
use uuid::Uuid;

use crate::rows::{MessageParts, Ts};
use crate::{Result, StoreError};

/// Rows of a read's first chunk: few, so that decoding starts soon after
/// the read does. Each further chunk is twice the one before, up to
/// [`CHUNK_ROWS_MAX`]: every chunk wakes the caller (a futex wake and a
/// context switch on each side, 40 of them a 10,000-row read at a fixed
/// 256 rows), while the last chunk is decoded after the read has ended, so
/// it must stay short.
const CHUNK_ROWS_FIRST: usize = 128;
const CHUNK_ROWS_MAX: usize = 1024;

/// What a row's text takes, about, before a chunk's buffer grows.
const ROW_BYTES: usize = 256;

/// A message's columns as read, its text in its chunk's buffer.
struct RawRow {
    seq: i64,
    id: Uuid,
    parent: Option<Uuid>,
    role: Range<usize>,
    content: Range<usize>,
    model: Option<Range<usize>>,
    status: Range<usize>,
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    cached_tokens: Option<i64>,
    cost: Option<f64>,
    duration_ms: Option<i64>,
    created_at: i64,
}

/// Rows of one path, in path order.
pub(super) struct Chunk {
    conversation: Uuid,
    /// How many rows the whole read sends (to allocate the path once).
    expect: usize,
    rows: Vec<RawRow>,
    text: Vec<u8>,
}

/// Chunk buffers the caller is done with, for the reader's next chunks:
/// a chunk's buffers are written on one thread and freed on another, and
/// allocated afresh each time they cost page faults on every chunk (the
/// allocator hands such memory back to the system between reads).
#[derive(Default)]
pub(super) struct Pool {
    free: Mutex<Vec<(Vec<RawRow>, Vec<u8>)>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let free = self.free.lock().map_or(0, |free| free.len());
        f.debug_struct("Pool").field("free", &free).finish()
    }
}

/// Buffers kept in a [`Pool`]: enough for a read in flight.
const POOL_KEPT: usize = 16;

impl Pool {
    fn take(&self) -> Option<(Vec<RawRow>, Vec<u8>)> {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    fn give(&self, mut rows: Vec<RawRow>, mut text: Vec<u8>) {
        rows.clear();
        text.clear();
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < POOL_KEPT {
            free.push((rows, text));
        }
    }
}

/// The blocking side: copies rows out and sends them on in chunks.
pub(super) struct Sink {
    to: UnboundedSender<Chunk>,
    pool: Arc<Pool>,
    conversation: Uuid,
    expect: usize,
    /// Rows the chunk being filled is sent at.
    rows: usize,
    chunk: Chunk,
}

impl Sink {
    pub(super) fn new(to: UnboundedSender<Chunk>, pool: Arc<Pool>) -> Sink {
        Sink {
            to,
            pool,
            conversation: Uuid::nil(),
            expect: 0,
            rows: CHUNK_ROWS_FIRST,
            chunk: Chunk {
                conversation: Uuid::nil(),
                expect: 0,
                rows: Vec::new(),
                text: Vec::new(),
            },
        }
    }

    /// Starts a path of `expect` rows of `conversation`.
    pub(super) fn start(&mut self, conversation: Uuid, expect: usize) {
        self.conversation = conversation;
        self.expect = expect;
        self.rows = CHUNK_ROWS_FIRST;
        self.chunk = self.empty();
    }

    /// Copies the row `r` (of the reader's `LINE_ROWS`), whose parent is
    /// `parent`, and returns its id.
    pub(super) fn push(&mut self, r: &SqlRow<'_>, parent: Option<Uuid>) -> Result<Uuid> {
        let id: Uuid = r.get(1)?;
        let corrupt = |i: usize, e: &dyn std::fmt::Display| {
            StoreError::Corrupt(format!("message {id}: column {i}: {e}"))
        };
        // Values read in place (`get` would check each one's type twice).
        let int = |i: usize| -> Result<Option<i64>> {
            r.get_ref(i)?.as_i64_or_null().map_err(|e| corrupt(i, &e))
        };
        let text = &mut self.chunk.text;
        let mut copy = |i: usize| -> Result<Option<Range<usize>>> {
            let value = r.get_ref(i)?;
            if value == ValueRef::Null {
                return Ok(None);
            }
            let bytes = value.as_bytes().map_err(|e| corrupt(i, &e))?;
            let start = text.len();
            text.extend_from_slice(bytes);
            Ok(Some(start..text.len()))
        };
        let mut required = |i: usize| copy(i)?.ok_or_else(|| corrupt(i, &"NULL"));
        let (role, content, status) = (required(2)?, required(3)?, required(10)?);
        let model = copy(8)?;
        self.chunk.rows.push(RawRow {
            seq: r.get(0)?,
            id,
            parent,
            role,
            content,
            model,
            status,
            prompt_tokens: int(4)?,
            completion_tokens: int(5)?,
            cached_tokens: int(6)?,
            // As `get` reads it: REAL, or an INTEGER.
            cost: r.get(7)?,
            duration_ms: int(9)?,
            created_at: r.get(11)?,
        });
        if self.chunk.rows.len() >= self.rows {
            self.flush();
        }
        Ok(id)
    }

    /// Sends the rows copied so far.
    pub(super) fn flush(&mut self) {
        if self.chunk.rows.is_empty() {
            return;
        }
        self.rows = (self.rows * 2).min(CHUNK_ROWS_MAX);
        let next = self.empty();
        let chunk = std::mem::replace(&mut self.chunk, next);
        // The caller stopped listening: it has given up on the read.
        let _ = self.to.send(chunk);
    }

    /// A chunk to fill, in buffers from the pool when it has some.
    fn empty(&self) -> Chunk {
        let rows = self.rows.min(self.expect);
        let (rows, text) = self.pool.take().unwrap_or_else(|| {
            (
                Vec::with_capacity(rows),
                Vec::with_capacity(rows * ROW_BYTES),
            )
        });
        Chunk {
            conversation: self.conversation,
            expect: self.expect,
            rows,
            text,
        }
    }
}

/// The caller's side: the rows of a read, decoded in order.
#[derive(Default)]
pub(super) struct Decoded {
    pub(super) messages: Vec<Message>,
    pub(super) seqs: Vec<i64>,
    /// About how much memory each message takes.
    pub(super) sizes: Vec<usize>,
}

impl Decoded {
    /// Decodes `chunk` and gives its buffers back to `pool`.
    pub(super) fn decode(&mut self, chunk: Chunk, pool: &Pool) -> Result<()> {
        let decoded = self.decode_rows(&chunk);
        pool.give(chunk.rows, chunk.text);
        decoded
    }

    fn decode_rows(&mut self, chunk: &Chunk) -> Result<()> {
        if self.messages.capacity() == 0 {
            self.messages.reserve_exact(chunk.expect);
            self.seqs.reserve_exact(chunk.expect);
            self.sizes.reserve_exact(chunk.expect);
        }
        for r in &chunk.rows {
            let id = r.id;
            let corrupt = |what: &str| StoreError::Corrupt(format!("message {id}: {what}"));
            let text = |range: &Range<usize>| -> Result<&str> {
                std::str::from_utf8(&chunk.text[range.clone()])
                    .map_err(|e| corrupt(&format!("not UTF-8: {e}")))
            };
            let content = &chunk.text[r.content.clone()];
            let message = Message::try_from(MessageParts {
                id,
                conversation_id: chunk.conversation,
                parent_id: r.parent,
                role: text(&r.role)?,
                content,
                prompt_tokens: r.prompt_tokens,
                completion_tokens: r.completion_tokens,
                cached_tokens: r.cached_tokens,
                cost: r.cost,
                model: r.model.as_ref().map(text).transpose()?.map(str::to_owned),
                duration_ms: r.duration_ms,
                status: text(&r.status)?,
                created_at: chrono::DateTime::from_timestamp_micros(r.created_at)
                    .map(Ts)
                    .ok_or_else(|| {
                        corrupt(&format!("timestamp {} µs is out of range", r.created_at))
                    })?,
            })?;
            // The decoded content takes about as much as its JSON.
            let size = std::mem::size_of::<Message>()
                + content.len()
                + message.content.len() * std::mem::size_of::<ContentBlock>()
                + message.model.as_ref().map_or(0, String::capacity);
            self.messages.push(message);
            self.seqs.push(r.seq);
            self.sizes.push(size);
        }
        Ok(())
    }
}
