-- A conversation's unfinished runs, read at each turn's start: through
-- this index the read costs the few unfinished runs of that conversation,
-- not all of its runs (`runs_conversation`) nor the unfinished runs of
-- every conversation (`runs_running`). In the read's order, so that no
-- sort follows.
CREATE INDEX runs_conversation_running ON runs (conversation_id, started_at, id)
    WHERE stop_reason IS NULL;
