"""Stand-in for Letta's EmbeddingConfig."""


class EmbeddingConfig(dict):
    @classmethod
    def default_config(cls, provider: str = "openai", **_):
        return cls(embedding_endpoint_type=provider, embedding_model="text-embedding-3-small",
                   embedding_dim=1536, handle="openai/text-embedding-3-small")
