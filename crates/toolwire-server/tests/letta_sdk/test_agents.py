"""`client.agents`: create with a Python tool, retrieve, list, update,
delete."""

import pytest
from letta_client import NotFoundError

from support import SHOUT_SOURCE, collect


def test_agent_lifecycle(serve):
    client = serve("plain.yaml").client()
    tool = client.tools.create(source_code=SHOUT_SOURCE)

    agent = client.agents.create(
        name="sdk-agent",
        system="You are a test agent.",
        model="openai/gpt-4o-mini",
        include_base_tools=False,
        tool_ids=[tool.id],
    )
    assert agent.id.startswith("agent-")
    assert agent.name == "sdk-agent"
    assert agent.system == "You are a test agent."
    # Only the tool asked for: no base tools.
    assert [(t.id, t.name) for t in agent.tools] == [(tool.id, "shout")]

    got = client.agents.retrieve(agent.id, include=["agent.tools"])
    assert (got.id, got.name, got.system) == (agent.id, "sdk-agent", "You are a test agent.")
    assert [t.id for t in got.tools] == [tool.id]
    assert got.llm_config.model
    assert got.tags == [] and got.sources == []

    others = [
        client.agents.create(name=f"other-{i}", include_base_tools=False) for i in range(3)
    ]
    ids = {agent.id} | {a.id for a in others}
    # Every agent once, whatever the page size; the pages end.
    for limit in (None, 1, 2):
        kwargs = {} if limit is None else {"limit": limit}
        listed = [a.id for a in collect(client.agents.list(**kwargs))]
        assert sorted(listed) == sorted(ids), f"limit={limit}"
    assert [a.id for a in client.agents.list(name="other-1").items] == [others[1].id]

    updated = client.agents.update(agent.id, name="sdk-agent-renamed", system="You are renamed.")
    assert (updated.id, updated.name, updated.system) == (
        agent.id,
        "sdk-agent-renamed",
        "You are renamed.",
    )
    got = client.agents.retrieve(agent.id)
    assert (got.name, got.system) == ("sdk-agent-renamed", "You are renamed.")
    assert [t.id for t in got.tools] == [tool.id], "an update without tool_ids keeps the tools"

    client.agents.delete(agent.id)
    with pytest.raises(NotFoundError):
        client.agents.retrieve(agent.id)
    with pytest.raises(NotFoundError):
        client.agents.messages.create(agent.id, input="hello?")
    assert sorted(a.id for a in collect(client.agents.list())) == sorted(a.id for a in others)
    # The tool outlives the agent.
    assert client.tools.retrieve(tool.id).id == tool.id


def test_unknown_agent_is_not_found(serve):
    client = serve("plain.yaml").client()
    with pytest.raises(NotFoundError):
        client.agents.retrieve("agent-00000000-0000-4000-8000-000000000000")
    with pytest.raises(NotFoundError):
        client.agents.retrieve("not-an-agent-id")
