//! A path's rows between the reader's blocking thread, which steps SQLite,
//! and the caller's, which decodes them: copied out raw in chunks (of 128
//! rows, growing to 512), so that decoding goes on while SQLite reads the
//! next rows, in buffers the two threads pass back and forth.
//!
//! The caller decodes chunks from the front of the queue. Once the reader
//! has read every row it decodes from the back of it, so that a path whose
//! decoding takes longer than its reading (a tool loop's, where content
//! is calls and their results) is decoded on both threads: its chunks
//! meet in the middle, the caller's first and the reader's after them.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::Row as SqlRow;
use tokio::sync::Notify;
use toolwire_core::{ContentBlock, Message};
use uuid::Uuid;

use crate::rows::Fields;
use crate::{Result, StoreError};

/// Rows of a read's first chunk: few, so that decoding starts soon after
/// the read does. Each further chunk is twice the one before, up to
/// [`CHUNK_ROWS_MAX`]: every chunk may wake the caller (a futex wake and a
/// context switch on each side), while the chunks left when the read ends
/// are what the two threads share, so they must stay short (at 1,024 rows
/// a 10,000-row tool loop took 5% longer, in alternating runs).
const CHUNK_ROWS_FIRST: usize = 128;
const CHUNK_ROWS_MAX: usize = 512;

/// What a row's text takes, about, before a chunk's buffer grows.
const ROW_BYTES: usize = 256;

/// A message's columns as read, its text in its chunk's buffer.
struct RawRow {
    seq: i64,
    id: Uuid,
    parent: Option<Uuid>,
    content: Range<usize>,
    cost: Option<f64>,
    /// The generated column `fields` (see [`Fields`]), read by whichever
    /// thread decodes the row.
    fields: Range<usize>,
}

/// Rows of one path, in path order.
struct Chunk {
    conversation: Uuid,
    rows: Vec<RawRow>,
    text: Vec<u8>,
}

/// Chunk buffers done with, for the reads' next chunks: allocated afresh
/// each time, they cost page faults on every chunk (the allocator hands
/// such memory back to the system between reads).
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

/// What the two threads share of one read.
#[derive(Default)]
pub(super) struct Handoff {
    queue: Mutex<Queue>,
    /// Wakes the caller: a chunk was queued or decoded, or the reader is
    /// done.
    woken: Notify,
}

#[derive(Default)]
struct Queue {
    /// How many rows the whole read sends (to allocate the path once).
    expect: usize,
    /// Chunks read and not yet taken, in path order.
    raw: VecDeque<Chunk>,
    /// Chunks the reader decoded, last first, and the error it met.
    decoded: Vec<Decoded>,
    failed: Option<StoreError>,
    /// The reader is done: it will queue or decode nothing more.
    done: bool,
    /// The caller has failed or stopped waiting (its read was dropped):
    /// the reader decodes nothing more, for nobody.
    given_up: bool,
}

/// Gives the read up when the caller's side ends, however it ends.
struct GiveUp<'a>(&'a Handoff);

impl Drop for GiveUp<'_> {
    fn drop(&mut self) {
        self.0.queue().given_up = true;
    }
}

impl Handoff {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The caller's side: decodes the chunks as they come, from the front,
    /// until the reader is done; then the path's messages, in order.
    pub(super) async fn decode(&self, pool: &Pool) -> Result<Decoded> {
        let _give_up = GiveUp(self);
        let mut decoded = Decoded::default();
        let mut failed = Ok(());
        loop {
            let next = {
                let mut queue = self.queue();
                if decoded.messages.capacity() == 0 && queue.expect > 0 {
                    decoded.reserve(queue.expect);
                }
                match queue.raw.pop_front() {
                    Some(chunk) => Some(chunk),
                    None if queue.done => break,
                    None => None,
                }
            };
            match next {
                Some(chunk) if failed.is_ok() => {
                    failed = decoded.decode(chunk, pool);
                    if failed.is_err() {
                        self.queue().given_up = true;
                    }
                }
                Some(chunk) => pool.give(chunk.rows, chunk.text),
                // A wake-up given while the queue was looked at is kept.
                None => self.woken.notified().await,
            }
        }
        failed?;
        let mut queue = self.queue();
        if let Some(e) = queue.failed.take() {
            return Err(e);
        }
        // The reader's chunks come after the caller's, last first.
        for mut part in queue.decoded.drain(..).rev() {
            decoded.messages.append(&mut part.messages);
            decoded.seqs.append(&mut part.seqs);
            decoded.sizes.append(&mut part.sizes);
        }
        Ok(decoded)
    }

    /// The reader's side, once it has read every row: decodes the chunks
    /// the caller has not taken, from the back.
    fn help(&self, pool: &Pool) {
        loop {
            let chunk = {
                let mut queue = self.queue();
                if queue.given_up || queue.failed.is_some() {
                    return;
                }
                queue.raw.pop_back()
            };
            let Some(chunk) = chunk else {
                return;
            };
            let mut part = Decoded::default();
            part.reserve(chunk.rows.len());
            let result = part.decode(chunk, pool);
            let mut queue = self.queue();
            match result {
                Ok(()) => queue.decoded.push(part),
                // The caller's own error, if any, comes first on the path.
                Err(e) => queue.failed = Some(e),
            }
        }
    }
}

/// The blocking side: copies rows out and queues them in chunks. Dropped,
/// it tells the caller the reader is done (whether the read ended, failed
/// or panicked).
pub(super) struct Sink {
    handoff: Arc<Handoff>,
    pool: Arc<Pool>,
    conversation: Uuid,
    expect: usize,
    /// Rows the chunk being filled is queued at.
    rows: usize,
    chunk: Chunk,
    /// The caller has given the read up (seen when a chunk is queued):
    /// the reader may stop.
    given_up: bool,
}

impl Sink {
    pub(super) fn new(handoff: Arc<Handoff>, pool: Arc<Pool>) -> Sink {
        Sink {
            handoff,
            pool,
            conversation: Uuid::nil(),
            expect: 0,
            rows: CHUNK_ROWS_FIRST,
            chunk: Chunk {
                conversation: Uuid::nil(),
                rows: Vec::new(),
                text: Vec::new(),
            },
            given_up: false,
        }
    }

    /// Starts a path of `expect` rows of `conversation`.
    pub(super) fn start(&mut self, conversation: Uuid, expect: usize) {
        self.conversation = conversation;
        self.expect = expect;
        self.handoff.queue().expect = expect;
        self.rows = CHUNK_ROWS_FIRST;
        self.chunk = self.empty();
    }

    /// Copies the row `r` (of the reader's `LINE_ROWS`), whose parent is
    /// `parent`, and returns its id.
    pub(super) fn push(&mut self, r: &SqlRow<'_>, parent: Option<Uuid>) -> Result<Uuid> {
        let id: Uuid = r.get(1)?;
        let text = &mut self.chunk.text;
        // Values read in place (`get` would copy them).
        let mut copy = |i: usize| -> Result<Range<usize>> {
            let bytes = r
                .get_ref(i)?
                .as_bytes()
                .map_err(|e| StoreError::Corrupt(format!("message {id}: column {i}: {e}")))?;
            let start = text.len();
            text.extend_from_slice(bytes);
            Ok(start..text.len())
        };
        let (content, fields) = (copy(2)?, copy(4)?);
        self.chunk.rows.push(RawRow {
            seq: r.get(0)?,
            id,
            parent,
            content,
            // As `get` reads it: REAL, or an INTEGER.
            cost: r.get(3)?,
            fields,
        });
        if self.chunk.rows.len() >= self.rows {
            self.flush();
        }
        Ok(id)
    }

    /// Queues the rows copied so far.
    pub(super) fn flush(&mut self) {
        if self.chunk.rows.is_empty() {
            return;
        }
        self.rows = (self.rows * 2).min(CHUNK_ROWS_MAX);
        let next = self.empty();
        let chunk = std::mem::replace(&mut self.chunk, next);
        {
            let mut queue = self.handoff.queue();
            queue.raw.push_back(chunk);
            self.given_up = queue.given_up;
        }
        self.handoff.woken.notify_one();
    }

    /// Whether the caller has given the read up: reading on is for nobody.
    pub(super) fn given_up(&self) -> bool {
        self.given_up
    }

    /// Every row is read: decodes what the caller has not (see [`Handoff`]).
    pub(super) fn help(&self) {
        self.handoff.help(&self.pool);
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
            rows,
            text,
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.handoff.queue().done = true;
        self.handoff.woken.notify_one();
    }
}

/// Rows of a read, decoded in order.
#[derive(Default)]
pub(super) struct Decoded {
    pub(super) messages: Vec<Message>,
    pub(super) seqs: Vec<i64>,
    /// About how much memory each message takes.
    pub(super) sizes: Vec<usize>,
}

impl Decoded {
    fn reserve(&mut self, rows: usize) {
        self.messages.reserve_exact(rows);
        self.seqs.reserve_exact(rows);
        self.sizes.reserve_exact(rows);
    }

    /// Decodes `chunk` and gives its buffers back to `pool`.
    fn decode(&mut self, chunk: Chunk, pool: &Pool) -> Result<()> {
        let decoded = self.decode_rows(&chunk);
        pool.give(chunk.rows, chunk.text);
        decoded
    }

    fn decode_rows(&mut self, chunk: &Chunk) -> Result<()> {
        for r in &chunk.rows {
            let content = &chunk.text[r.content.clone()];
            let message = Message::try_from(fields(r.id, &chunk.text[r.fields.clone()])?.parts(
                r.id,
                chunk.conversation,
                r.parent,
                content,
                r.cost,
            )?)?;
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

/// The [`Fields`] of message `id` in `text`, as read from its row. An
/// error quotes the text: a space inside a role or a status shifts the
/// fields after it, so the field named may not be the culprit.
pub(super) fn fields(id: Uuid, text: &[u8]) -> Result<Fields<'_>> {
    let corrupt = |e: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!(
            "message {id}: column `fields` ({:?}): {e}",
            String::from_utf8_lossy(text)
        ))
    };
    Fields::parse(std::str::from_utf8(text).map_err(|e| corrupt(&e))?).map_err(|e| corrupt(&e))
}
