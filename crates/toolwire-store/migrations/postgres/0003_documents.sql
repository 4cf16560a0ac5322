-- Documents: what the front doors keep beside the conversations (agents,
-- tools) and the engine's paused turns, each a JSON body under (kind, id).
-- The store does not read the bodies; their owners do.

CREATE TABLE documents (
    kind       TEXT        NOT NULL,
    id         TEXT        NOT NULL,
    body       JSONB       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (kind, id)
);

CREATE INDEX documents_oldest ON documents (kind, created_at);
