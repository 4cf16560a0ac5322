-- Commands for the instance running a conversation's turn (cancel,
-- interjections, notifications), sent by any other instance: a row here,
-- then a NOTIFY on `toolwire_commands` naming the target instance, which
-- takes (deletes) its rows. A row outlives a missed NOTIFY: the target
-- reads its rows again whenever its connection is made again.
CREATE TABLE cluster_commands (
    id         BIGSERIAL   PRIMARY KEY,
    target     UUID        NOT NULL,
    body       JSONB       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX cluster_commands_target ON cluster_commands (target, id);
