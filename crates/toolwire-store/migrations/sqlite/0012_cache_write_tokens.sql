-- no-transaction
-- Prompt tokens written to the provider's cache (Anthropic reports them;
-- part of prompt_tokens, as cached_tokens is), kept beside the other
-- counts and in the generated column `fields`, which becomes `role status
-- created_at duration_ms prompt_tokens completion_tokens cached_tokens
-- cache_write_tokens[ model]` (the model is everything after the eighth
-- space). Rows stored before it was counted hold NULL: read as 0.
--
-- A stored generated column changes only by rebuilding the table, as
-- 0004 did (foreign keys off while the table is swapped, outside a
-- transaction: hence the marker and the explicit one). Run again after a
-- crash before it was recorded, it does the same again.

PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

DROP TABLE IF EXISTS messages_rebuilt;

CREATE TABLE messages_rebuilt (
    -- Insertion order: "oldest first" is ORDER BY seq.
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                BLOB    NOT NULL UNIQUE,
    conversation_id   BLOB    NOT NULL REFERENCES conversations (id),
    parent_id         BLOB,
    -- The id of the first message of this message's line: a message that
    -- is its parent's first child continues its parent's line, any later
    -- child starts a line of its own. A line is a chain (each message the
    -- parent of the next, in seq order), so the path to a message is a few
    -- index ranges (one per line it crosses) instead of a walk of its
    -- ancestors one by one.
    line              BLOB    NOT NULL,
    role              TEXT    NOT NULL,
    content           TEXT    NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    cached_tokens     INTEGER,
    cache_write_tokens INTEGER,
    cost              REAL,
    model             TEXT,
    duration_ms       INTEGER,
    status            TEXT    NOT NULL,
    created_at        INTEGER NOT NULL,
    fields            TEXT    NOT NULL GENERATED ALWAYS AS (
        role || ' ' || status
        || ' ' || CASE typeof(created_at) WHEN 'integer' THEN created_at
                  ELSE '!' || typeof(created_at) END
        || ' ' || CASE typeof(duration_ms) WHEN 'integer' THEN duration_ms WHEN 'null' THEN ''
                  ELSE '!' || typeof(duration_ms) END
        || ' ' || CASE typeof(prompt_tokens) WHEN 'integer' THEN prompt_tokens WHEN 'null' THEN ''
                  ELSE '!' || typeof(prompt_tokens) END
        || ' ' || CASE typeof(completion_tokens) WHEN 'integer' THEN completion_tokens
                  WHEN 'null' THEN '' ELSE '!' || typeof(completion_tokens) END
        || ' ' || CASE typeof(cached_tokens) WHEN 'integer' THEN cached_tokens WHEN 'null' THEN ''
                  ELSE '!' || typeof(cached_tokens) END
        || ' ' || CASE typeof(cache_write_tokens) WHEN 'integer' THEN cache_write_tokens
                  WHEN 'null' THEN '' ELSE '!' || typeof(cache_write_tokens) END
        || ifnull(' ' || model, '')
    ) STORED,
    UNIQUE (id, conversation_id),
    -- A parent is a message of the same conversation.
    FOREIGN KEY (parent_id, conversation_id) REFERENCES messages (id, conversation_id),
    CHECK ((prompt_tokens IS NULL) = (completion_tokens IS NULL)
       AND (prompt_tokens IS NULL) = (cached_tokens IS NULL)
       AND (prompt_tokens IS NOT NULL OR cache_write_tokens IS NULL))
);

INSERT INTO messages_rebuilt (seq, id, conversation_id, parent_id, line, role, content,
                              prompt_tokens, completion_tokens, cached_tokens, cost, model,
                              duration_ms, status, created_at)
SELECT seq, id, conversation_id, parent_id, line, role, content,
       prompt_tokens, completion_tokens, cached_tokens, cost, model,
       duration_ms, status, created_at
FROM messages ORDER BY seq;

-- Seqs are never given out twice, even those of deleted messages: the
-- new table's counter goes on from the old one's.
DELETE FROM sqlite_sequence WHERE name = 'messages_rebuilt';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'messages_rebuilt', seq FROM sqlite_sequence WHERE name = 'messages';

DROP TABLE messages;

ALTER TABLE messages_rebuilt RENAME TO messages;

-- Children of a node, oldest first (also siblings and leaves).
CREATE INDEX messages_children ON messages (parent_id, seq);
-- Messages of a conversation (leaves, totals, lists).
CREATE INDEX messages_conversation ON messages (conversation_id, seq);
-- A line in order (paths).
CREATE INDEX messages_line ON messages (line, seq);

COMMIT;

PRAGMA foreign_keys = ON;

-- The copy went through the WAL: give its space back now rather than keep
-- a WAL file as large as the table.
PRAGMA wal_checkpoint(TRUNCATE);
