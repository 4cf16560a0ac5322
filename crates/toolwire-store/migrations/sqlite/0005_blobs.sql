-- Blobs: bytes a message refers to (images), each kept once under the
-- SHA-256 of its bytes. Messages and events hold the reference only.

CREATE TABLE blobs (
    sha256     TEXT    NOT NULL PRIMARY KEY,
    media_type TEXT    NOT NULL,
    bytes      BLOB    NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
