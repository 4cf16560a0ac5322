-- Run ownership: several processes may share one database, so a process
-- starting up must tell a turn whose process is gone (to be marked
-- interrupted) from one another live process is running.

-- The toolwire processes (engines) that use the database.
CREATE TABLE instances (
    id           BLOB    NOT NULL PRIMARY KEY,
    -- Where `pid` names a process: instances with the same host see each
    -- other's processes.
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    -- Renewed while the instance lives; a silent instance is presumed gone.
    heartbeat_at INTEGER NOT NULL
);

-- The instance that runs (or ran) the turn. No foreign key: instances long
-- gone are forgotten while their finished runs stay. NULL for runs stored
-- before this migration, which no live process can own.
ALTER TABLE runs ADD COLUMN owner BLOB;
