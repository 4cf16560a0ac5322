-- toolwire's schema on PostgreSQL.

CREATE TABLE conversations (
    id                       UUID        NOT NULL PRIMARY KEY,
    title                    TEXT,
    root_id                  UUID        NOT NULL,
    active_leaf              UUID        NOT NULL,
    forked_from_conversation UUID        REFERENCES conversations (id),
    forked_from_message      UUID,
    -- The seq of the conversation's last event (0 before the first); its
    -- row lock serialises concurrent appends to one conversation's log.
    last_event_seq           BIGINT      NOT NULL DEFAULT 0,
    created_at               TIMESTAMPTZ NOT NULL
);

CREATE INDEX conversations_newest ON conversations (created_at);

CREATE TABLE messages (
    -- Insertion order: "oldest first" is ORDER BY seq.
    seq               BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    id                UUID             NOT NULL PRIMARY KEY,
    conversation_id   UUID             NOT NULL REFERENCES conversations (id),
    parent_id         UUID,
    -- The id of the first message of this message's line: a message that
    -- is its parent's first child continues its parent's line, any later
    -- child starts a line of its own. A line is a chain (each message the
    -- parent of the next, in seq order), so the path to a message is a few
    -- index ranges (one per line it crosses) instead of a walk of its
    -- ancestors one by one.
    line              UUID             NOT NULL,
    role              TEXT             NOT NULL,
    content           JSONB            NOT NULL,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    cached_tokens     BIGINT,
    cost              DOUBLE PRECISION,
    model             TEXT,
    duration_ms       BIGINT,
    status            TEXT             NOT NULL,
    created_at        TIMESTAMPTZ      NOT NULL,
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

-- The root and the active leaf are messages of this conversation.
ALTER TABLE conversations
    ADD FOREIGN KEY (root_id, id) REFERENCES messages (id, conversation_id)
        DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (active_leaf, id) REFERENCES messages (id, conversation_id)
        DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (forked_from_message) REFERENCES messages (id);

CREATE TABLE runs (
    id              UUID        NOT NULL PRIMARY KEY,
    conversation_id UUID        NOT NULL REFERENCES conversations (id),
    -- NULL while the run is going on.
    stop_reason     TEXT,
    error           TEXT,
    started_at      TIMESTAMPTZ NOT NULL,
    finished_at     TIMESTAMPTZ
);

-- Runs still going on (found again at start-up).
CREATE INDEX runs_running ON runs (started_at) WHERE stop_reason IS NULL;
CREATE INDEX runs_conversation ON runs (conversation_id);

CREATE TABLE events (
    conversation_id UUID        NOT NULL REFERENCES conversations (id),
    seq             BIGINT      NOT NULL,
    type            TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
