-- How many times a stored message of the conversation was changed (an
-- update: a new system prompt, a message marked interrupted). Messages are
-- otherwise never changed, so a copy of a path that was read when the
-- revision was N is still what the store holds while it is N: the engine
-- keeps the last path of a conversation between turns and checks it
-- against this number, read with the conversation (one process or
-- several on one file).
--
-- Counted by a trigger, so that no writer can change a message without
-- it. A rebuild of `messages` (as 0004 and 0012 did) drops the trigger
-- with the table: such a migration must create it again.
ALTER TABLE conversations ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER messages_revision AFTER UPDATE ON messages
BEGIN
    UPDATE conversations SET revision = revision + 1 WHERE id = NEW.conversation_id;
END;
