-- Run ownership: several instances may share one database, so an instance
-- starting up must tell a turn whose instance is gone (to be marked
-- interrupted) from one another live instance is running.

-- The toolwire processes (engines) that use the database.
CREATE TABLE instances (
    id           UUID        NOT NULL PRIMARY KEY,
    -- Where `pid` names a process: instances with the same host see each
    -- other's processes.
    host         TEXT        NOT NULL,
    pid          BIGINT      NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    -- Renewed while the instance lives; a silent instance is presumed gone.
    heartbeat_at TIMESTAMPTZ NOT NULL
);

-- The instance that runs (or ran) the turn. No foreign key: instances long
-- gone are forgotten while their finished runs stay. NULL for runs stored
-- before this migration, which no live instance can own.
ALTER TABLE runs ADD COLUMN owner UUID;
