class SimpleLLMStreamAdapter:
    """Stand-in: only the tests that patch an in-process server use it."""
