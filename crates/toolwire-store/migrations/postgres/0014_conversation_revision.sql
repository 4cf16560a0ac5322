-- How many times a stored message of the conversation was changed (an
-- update: a new system prompt, a message marked interrupted). Messages are
-- otherwise never changed, so a copy of a path that was read when the
-- revision was N is still what the store holds while it is N: the engine
-- keeps the last path of a conversation between turns and checks it
-- against this number, read with the conversation (on any instance).
--
-- Counted by a trigger, so that no writer can change a message without it.
ALTER TABLE conversations ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;

CREATE FUNCTION messages_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conversations SET revision = revision + 1 WHERE id = NEW.conversation_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_revision AFTER UPDATE ON messages
    FOR EACH ROW EXECUTE FUNCTION messages_revision();
