-- Blobs: bytes a message refers to (images), each kept once under the
-- SHA-256 of its bytes. Messages and events hold the reference only.
-- (Numbered as SQLite's: 0004 there is a SQLite-only column.)

CREATE TABLE blobs (
    sha256     TEXT        NOT NULL PRIMARY KEY,
    media_type TEXT        NOT NULL,
    bytes      BYTEA       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);
