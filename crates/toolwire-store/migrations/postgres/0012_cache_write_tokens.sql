-- Prompt tokens written to the provider's cache (Anthropic reports them;
-- part of prompt_tokens, as cached_tokens is). Rows stored before it was
-- counted hold NULL: read as 0.
ALTER TABLE messages ADD COLUMN cache_write_tokens BIGINT;
ALTER TABLE messages ADD CONSTRAINT messages_cache_write_with_usage
    CHECK (prompt_tokens IS NOT NULL OR cache_write_tokens IS NULL);
