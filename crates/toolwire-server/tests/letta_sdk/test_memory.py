"""Memory blocks, an agent's memory tools, its context window and MCP
servers added through the API, through `letta-client`: `client.blocks`,
`client.agents.blocks`, `client.agents.tools`, `client.mcp_servers`."""

import os
from pathlib import Path

import pytest
from letta_client import BadRequestError, NotFoundError, UnprocessableEntityError

from support import of_type, one

MEMORY_SCRIPT = """
model: scripted-sdk
steps:
  - text: "Let me remember that."
    tool_calls:
      - id: call_memory_1
        name: memory_insert
        arguments: {label: human, new_string: "Likes: tea"}
  - text: "Noted."
"""


def test_blocks_crud_limits_and_unknown_ids(serve):
    client = serve("plain.yaml").client()
    human = client.blocks.create(label="human", value="Name: Ada")
    assert human.id.startswith("block-")
    assert human.limit == 100000, "Letta's default limit"
    assert human.description.startswith("The human block")
    persona = client.blocks.create(label="persona", value="I am Sam.", limit=20, read_only=True)
    assert persona.read_only is True

    assert client.blocks.retrieve(human.id).value == "Name: Ada"
    changed = client.blocks.update(human.id, value="Name: Ada Lovelace")
    assert changed.value == "Name: Ada Lovelace"
    assert client.blocks.retrieve(human.id).value == "Name: Ada Lovelace"
    assert [b.id for b in client.blocks.list(label="human")] == [human.id]
    assert {b.id for b in client.blocks.list()} == {human.id, persona.id}

    # Over the limit: refused, naming it; nothing stored. Over the block's
    # stored limit, 400 (Letta's handler); value and limit in one body,
    # 422 (Letta's request validation).
    with pytest.raises(BadRequestError) as refused:
        client.blocks.update(persona.id, value="testing testing testing")
    assert "limit of 20 characters" in str(refused.value)
    with pytest.raises(UnprocessableEntityError):
        client.blocks.create(label="x", value="abc", limit=2)
    assert client.blocks.retrieve(persona.id).value == "I am Sam."

    with pytest.raises(NotFoundError):
        client.blocks.retrieve("block-00000000-0000-0000-0000-000000000000")
    client.blocks.delete(human.id)
    with pytest.raises(NotFoundError):
        client.blocks.retrieve(human.id)


def test_agents_share_attach_and_detach_blocks(serve):
    client = serve("plain.yaml").client()
    shared = client.blocks.create(label="project", value="Ship toolwire.")
    ada = client.agents.create(
        name="ada",
        include_base_tools=False,
        memory_blocks=[{"label": "human", "value": "Name: Ada"}],
        block_ids=[shared.id],
    )
    assert [b.label for b in ada.memory.blocks] == ["project", "human"]
    bob = client.agents.create(name="bob", include_base_tools=False)
    bob = client.agents.blocks.attach(shared.id, agent_id=bob.id)
    assert [b.id for b in bob.memory.blocks] == [shared.id]
    assert {a.id for a in client.blocks.agents.list(shared.id)} == {ada.id, bob.id}

    # One edit, through one agent, is every sharer's.
    client.agents.blocks.update("project", agent_id=ada.id, value="Ship toolwire 1.0.")
    assert client.agents.blocks.retrieve("project", agent_id=bob.id).value == "Ship toolwire 1.0."
    assert [b.label for b in client.agents.blocks.list(agent_id=ada.id)] == ["project", "human"]

    client.agents.blocks.detach(shared.id, agent_id=bob.id)
    assert client.agents.retrieve(bob.id).memory.blocks == []
    assert client.blocks.retrieve(shared.id).value == "Ship toolwire 1.0.", "the block stays"
    with pytest.raises(NotFoundError):
        client.agents.blocks.retrieve("project", agent_id=bob.id)
    with pytest.raises(NotFoundError):
        client.agents.blocks.attach("block-00000000-0000-0000-0000-000000000000", agent_id=bob.id)


def test_the_memory_tool_edit_is_stored_and_shown(serve):
    client = serve(MEMORY_SCRIPT).client()
    agent = client.agents.create(
        name="rememberer",
        system="Be brief.",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        memory_blocks=[{"label": "human", "value": "Name: Ada"}],
    )
    assert agent.embedding == "openai/text-embedding-3-small"
    raw = client.get(f"/v1/agents/{agent.id}", cast_to=dict)
    assert raw["model_settings"]["max_output_tokens"] > 0
    names = {t.name for t in agent.tools}
    assert {"memory_insert", "memory_replace"} <= names, names

    reply = client.agents.messages.create(
        agent_id=agent.id, messages=[{"role": "user", "content": "I like tea."}]
    )
    call = one(reply.messages, "tool_call_message")
    assert call.tool_call.name == "memory_insert"
    result = one(reply.messages, "tool_return_message")
    assert result.status == "success"
    assert result.tool_return == "Name: Ada\nLikes: tea"

    # Stored as it happened: the API shows it, and the prompt the model is
    # sent (the context window) holds it.
    assert client.agents.blocks.retrieve("human", agent_id=agent.id).value == "Name: Ada\nLikes: tea"
    context = client.get(f"/v1/agents/{agent.id}/context", cast_to=dict)
    assert context["system_prompt"].startswith("Be brief.\n\n<memory_blocks>")
    assert "<value>\nName: Ada\nLikes: tea\n</value>" in context["core_memory"]
    assert context["num_tokens_core_memory"] > 0
    assert {f["function"]["name"] for f in context["functions_definitions"]} >= {"memory_insert"}
    # In the conversation too: the call and its result are listed.
    listed = client.agents.messages.list(agent_id=agent.id)
    assert of_type(listed, "tool_return_message")
    assert client.agents.retrieve(agent.id).system == "Be brief."


def test_tools_attach_and_detach(serve):
    client = serve("plain.yaml").client()
    agent = client.agents.create(name="bare", include_base_tools=False)
    rethink = next(t for t in client.tools.list(name="memory_rethink"))
    assert rethink.tool_type == "letta_memory_core"
    agent = client.agents.tools.attach(rethink.id, agent_id=agent.id)
    assert [t.name for t in agent.tools] == ["memory_rethink"]
    assert [t.id for t in client.agents.tools.list(agent_id=agent.id)] == [rethink.id]
    agent = client.agents.tools.detach(rethink.id, agent_id=agent.id)
    assert agent.tools == []


def _everything() -> dict:
    """server-everything over stdio (installed by scripts/test); the test
    is skipped without it outside CI."""
    found = os.environ.get("TOOLWIRE_TEST_MCP_DIR")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("TOOLWIRE_TEST_MCP_DIR is not set but CI is")
        pytest.skip("TOOLWIRE_TEST_MCP_DIR is not set (scripts/test sets it)")
    entry = Path(found) / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
    assert entry.is_file(), entry
    return {"mcp_server_type": "stdio", "command": "node", "args": [str(entry), "stdio"]}


ECHO_SCRIPT = """
model: scripted-sdk
steps:
  - tool_calls:
      - id: call_echo_1
        name: echo
        arguments: {message: "hi there"}
  - text: "Echoed."
"""


def test_mcp_servers_through_the_api(serve):
    config = _everything()
    server = serve(ECHO_SCRIPT)
    client = server.client()
    created = client.mcp_servers.create(server_name="everything", config=config)
    assert created.server_name == "everything"
    assert created.command == "node"
    assert [s.id for s in client.mcp_servers.list()] == [created.id]
    renamed = client.mcp_servers.update(
        created.id, server_name="everything-2", config={"mcp_server_type": "stdio", "args": config["args"]}
    )
    assert renamed.server_name == "everything-2"
    assert renamed.command == "node", "fields not given are kept"

    tools = client.mcp_servers.tools.list(created.id)
    echo = next(t for t in tools if t.name == "echo")
    assert echo.tool_type == "external_mcp"
    assert client.mcp_servers.tools.retrieve(echo.id, mcp_server_id=created.id).name == "echo"
    ran = client.mcp_servers.tools.run(echo.id, mcp_server_id=created.id, args={"message": "direct"})
    assert ran.status == "success"
    assert "direct" in ran.func_return

    agent = client.agents.create(name="echoer", include_base_tools=False, tool_ids=[echo.id])
    reply = client.agents.messages.create(
        agent_id=agent.id, messages=[{"role": "user", "content": "Echo hi there."}]
    )
    result = one(reply.messages, "tool_return_message")
    assert result.status == "success"
    assert "hi there" in result.tool_return

    # Stored: a restarted server has it, and runs its tool again.
    server.restart()
    client = server.client()
    assert [s.server_name for s in client.mcp_servers.list()] == ["everything-2"]
    reply = client.agents.messages.create(
        agent_id=agent.id, messages=[{"role": "user", "content": "Echo hi there."}]
    )
    assert one(reply.messages, "tool_return_message").status == "success"

    client.mcp_servers.delete(created.id)
    with pytest.raises(NotFoundError):
        client.mcp_servers.retrieve(created.id)
    with pytest.raises(NotFoundError):
        client.tools.retrieve(echo.id)


def test_an_mcp_server_that_cannot_start_says_why(serve):
    client = serve("plain.yaml").client()
    broken = client.mcp_servers.create(
        server_name="broken", config={"mcp_server_type": "stdio", "command": "/nonexistent/mcp-server"}
    )
    with pytest.raises(Exception) as failed:
        client.mcp_servers.tools.list(broken.id)
    assert getattr(failed.value, "status_code", None) == 424
    assert "broken" in str(failed.value)
    # The server stays listed; the agents go on.
    assert [s.id for s in client.mcp_servers.list()] == [broken.id]
    agent = client.agents.create(name="fine", include_base_tools=False)
    reply = client.agents.messages.create(
        agent_id=agent.id, messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.stop_reason.stop_reason == "end_turn"
    with pytest.raises(NotFoundError):
        client.mcp_servers.retrieve("mcp_server-00000000-0000-0000-0000-000000000000")
