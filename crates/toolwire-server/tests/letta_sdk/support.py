"""What the Letta SDK tests share: the Python tool they define, and small
helpers over the SDK's message objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, List, Optional

from letta_client import Letta

# A Python-source tool with a Google-style docstring: the server derives
# its JSON schema from the signature and the docstring.
SHOUT_SOURCE = '''
def shout(text: str, times: int = 1) -> str:
    """Repeat a text in capitals.

    Args:
        text (str): The text to shout.
        times (int): How many times to repeat it.

    Returns:
        str: The shouted text.
    """
    return " ".join([text.upper() + "!"] * times)
'''

SHOUT_SCHEMA_PARAMETERS = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "description": "The text to shout."},
        "times": {"type": "integer", "description": "How many times to repeat it."},
    },
    "required": ["text"],
}


def counting_shout_source(log: Path) -> str:
    """`shout`, which also appends a line to `log` each time it runs, so a
    test can count the tool's real executions."""
    return f'''
def shout(text: str, times: int = 1) -> str:
    """Repeat a text in capitals.

    Args:
        text (str): The text to shout.
        times (int): How many times to repeat it.

    Returns:
        str: The shouted text.
    """
    with open({str(log)!r}, "a") as f:
        f.write(text + "\\n")
    return " ".join([text.upper() + "!"] * times)
'''


def runs(log: Path) -> List[str]:
    """The `text` of each real execution of the counting `shout`."""
    return log.read_text().splitlines() if log.exists() else []


def make_agent(client: Letta, tool_source: str = SHOUT_SOURCE, name: str = "sdk-test"):
    """Creates the `shout` tool and an agent with only that tool."""
    tool = client.tools.create(source_code=tool_source)
    agent = client.agents.create(
        name=name,
        system="You are a test agent.",
        model="openai/gpt-4o-mini",
        include_base_tools=False,
        tool_ids=[tool.id],
    )
    return tool, agent


def types(messages: Iterable[Any]) -> List[str]:
    return [m.message_type for m in messages]


def of_type(messages: Iterable[Any], kind: str) -> List[Any]:
    return [m for m in messages if m.message_type == kind]


def one(messages: Iterable[Any], kind: str) -> Any:
    found = of_type(messages, kind)
    assert len(found) == 1, f"expected one {kind}, got {types(messages)}"
    return found[0]


def arguments(message: Any) -> Any:
    """The parsed arguments of a tool call / approval request message (the
    wire carries them as a JSON string)."""
    raw = message.tool_call.arguments
    assert isinstance(raw, str), f"arguments must be a JSON string, got {raw!r}"
    return json.loads(raw)


def approve(tool_call_id: str, approve: bool = True, reason: Optional[str] = None) -> dict:
    item = {"type": "approval", "tool_call_id": tool_call_id, "approve": approve}
    if reason is not None:
        item["reason"] = reason
    return {"type": "approval", "approvals": [item]}


def collect(page: Iterable[Any], cap: int = 1000) -> List[Any]:
    """Every item of an auto-paginating SDK page, failing (rather than
    looping forever) if the pages never end."""
    out = []
    for item in page:
        out.append(item)
        assert len(out) <= cap, f"pagination did not end after {cap} items"
    return out
