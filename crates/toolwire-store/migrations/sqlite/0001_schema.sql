-- toolwire's schema on SQLite.
-- Ids are 16-byte UUID blobs; timestamps are INTEGER microseconds since the
-- Unix epoch (UTC), so they sort as numbers; JSON is stored as TEXT.

CREATE TABLE conversations (
    id                       BLOB    NOT NULL PRIMARY KEY,
    title                    TEXT,
    root_id                  BLOB    NOT NULL,
    active_leaf              BLOB    NOT NULL,
    forked_from_conversation BLOB    REFERENCES conversations (id),
    forked_from_message      BLOB    REFERENCES messages (id),
    -- The seq of the conversation's last event (0 before the first).
    last_event_seq           INTEGER NOT NULL DEFAULT 0,
    created_at               INTEGER NOT NULL,
    -- The root and the active leaf are messages of this conversation.
    FOREIGN KEY (root_id, id) REFERENCES messages (id, conversation_id)
        DEFERRABLE INITIALLY DEFERRED,
    FOREIGN KEY (active_leaf, id) REFERENCES messages (id, conversation_id)
        DEFERRABLE INITIALLY DEFERRED
);

CREATE INDEX conversations_newest ON conversations (created_at);

CREATE TABLE messages (
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
    cost              REAL,
    model             TEXT,
    duration_ms       INTEGER,
    status            TEXT    NOT NULL,
    created_at        INTEGER NOT NULL,
    UNIQUE (id, conversation_id),
    -- A parent is a message of the same conversation.
    FOREIGN KEY (parent_id, conversation_id) REFERENCES messages (id, conversation_id),
    CHECK ((prompt_tokens IS NULL) = (completion_tokens IS NULL)
       AND (prompt_tokens IS NULL) = (cached_tokens IS NULL))
);

-- Children of a node, oldest first (also siblings and leaves).
CREATE INDEX messages_children ON messages (parent_id, seq);
-- Messages of a conversation (leaves, totals, lists).
CREATE INDEX messages_conversation ON messages (conversation_id, seq);
-- A line in order (paths).
CREATE INDEX messages_line ON messages (line, seq);

CREATE TABLE runs (
    id              BLOB    NOT NULL PRIMARY KEY,
    conversation_id BLOB    NOT NULL REFERENCES conversations (id),
    -- NULL while the run is going on.
    stop_reason     TEXT,
    error           TEXT,
    started_at      INTEGER NOT NULL,
    finished_at     INTEGER
);

-- Runs still going on (found again at start-up).
CREATE INDEX runs_running ON runs (started_at) WHERE stop_reason IS NULL;
CREATE INDEX runs_conversation ON runs (conversation_id);

CREATE TABLE events (
    conversation_id BLOB    NOT NULL REFERENCES conversations (id),
    seq             INTEGER NOT NULL,
    type            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;
