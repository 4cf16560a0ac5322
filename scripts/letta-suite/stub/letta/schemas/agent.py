from letta_client.types import AgentState  # noqa
