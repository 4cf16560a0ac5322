from letta_client.types.agents import ToolCallMessage  # noqa
from letta_client.types import ToolReturnMessage  # noqa
