"""Stand-in for Letta's LLMConfig: the default config of a model, as a
dict the SDK sends as `llm_config`."""


class LLMConfig(dict):
    @classmethod
    def default_config(cls, model_name: str = "gpt-4o-mini", **_):
        return cls(model=model_name, model_endpoint_type="openai", context_window=128000,
                   handle=f"openai/{model_name}")
