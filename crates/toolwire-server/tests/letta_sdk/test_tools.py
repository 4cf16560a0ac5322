"""`client.tools`: Python-source tools, their derived schema, pages,
updates, upserts and deletes."""

import pytest
from letta_client import ConflictError, NotFoundError

from support import SHOUT_SCHEMA_PARAMETERS, SHOUT_SOURCE, collect

SHOUT_V2_SOURCE = '''
def shout(text: str, suffix: str = "!") -> str:
    """Shout a text, ending it with a suffix.

    Args:
        text (str): The text to shout.
        suffix (str): What to end it with.

    Returns:
        str: The shouted text.
    """
    return text.upper() + suffix
'''


def test_create_derives_the_schema_from_the_docstring(serve):
    client = serve("plain.yaml").client()
    tool = client.tools.create(source_code=SHOUT_SOURCE, tags=["sdk"])
    assert tool.id.startswith("tool-")
    assert tool.name == "shout"
    assert tool.tool_type == "custom"
    assert tool.source_type == "python"
    assert tool.source_code == SHOUT_SOURCE
    assert tool.tags == ["sdk"]
    assert tool.description == "Repeat a text in capitals."
    schema = tool.json_schema
    assert schema["name"] == "shout"
    assert schema["description"] == "Repeat a text in capitals."
    params = schema["parameters"]
    assert params["type"] == "object"
    assert params["properties"] == SHOUT_SCHEMA_PARAMETERS["properties"]
    assert params["required"] == ["text"]


def test_list_pages_to_the_end(serve):
    client = serve("plain.yaml").client()
    tool = client.tools.create(source_code=SHOUT_SOURCE)
    # Iterating the page asks for more (after=<last id>) until a page is
    # empty: it must end, and see each tool once.
    every = [t.id for t in collect(client.tools.list())]
    assert every.count(tool.id) == 1
    assert len(every) == len(set(every))
    # In pages of 2 and 1: the same tools, in the same order.
    assert [t.id for t in collect(client.tools.list(limit=2))] == every
    assert [t.id for t in collect(client.tools.list(limit=1))] == every
    first = client.tools.list(limit=1)
    assert len(first.items) == 1
    assert [t.id for t in client.tools.list(name="shout").items] == [tool.id]
    assert client.tools.list(name="no_such_tool").items == []


def test_retrieve_update_upsert_delete(serve):
    client = serve("plain.yaml").client()
    tool = client.tools.create(source_code=SHOUT_SOURCE)

    got = client.tools.retrieve(tool.id)
    assert (got.id, got.name, got.source_code) == (tool.id, "shout", SHOUT_SOURCE)
    assert got.json_schema == tool.json_schema

    updated = client.tools.update(tool.id, description="Shout a text.")
    assert updated.id == tool.id
    assert updated.description == "Shout a text."
    got = client.tools.retrieve(tool.id)
    assert got.description == "Shout a text."
    assert got.json_schema["parameters"]["required"] == ["text"]

    # A second create of the same name is a conflict (and must not be
    # retried by the SDK)...
    with pytest.raises(ConflictError) as e:
        client.tools.create(source_code=SHOUT_SOURCE)
    assert e.value.response.headers.get("x-should-retry") == "false"
    # ...while an upsert of the same name changes the tool in place.
    upserted = client.tools.upsert(source_code=SHOUT_V2_SOURCE)
    assert upserted.id == tool.id
    assert upserted.name == "shout"
    assert upserted.source_code == SHOUT_V2_SOURCE
    props = upserted.json_schema["parameters"]["properties"]
    assert set(props) == {"text", "suffix"}
    assert props["suffix"] == {"type": "string", "description": "What to end it with."}
    assert client.tools.retrieve(tool.id).source_code == SHOUT_V2_SOURCE
    assert [t.id for t in collect(client.tools.list(name="shout"))] == [tool.id]

    # An upsert of a new name creates a tool.
    other = client.tools.upsert(source_code=SHOUT_SOURCE.replace("def shout", "def whisper"))
    assert other.name == "whisper" and other.id != tool.id

    client.tools.delete(tool.id)
    with pytest.raises(NotFoundError):
        client.tools.retrieve(tool.id)
    every = [t.id for t in collect(client.tools.list())]
    assert tool.id not in every and other.id in every
    with pytest.raises(NotFoundError):
        client.tools.delete(tool.id)
    # The name is free again.
    again = client.tools.create(source_code=SHOUT_SOURCE)
    assert again.id != tool.id


def test_builtin_tools_match_the_sdk_models(serve):
    # toolwire's own tools are listed with the client's; an agent gets them
    # as its base tools. Their JSON must pass the SDK's models (with strict
    # validation on, an agent holding them cannot be read otherwise).
    client = serve("plain.yaml").client()
    builtins = [t for t in collect(client.tools.list()) if t.tool_type != "custom"]
    assert {t.name for t in builtins} >= {"read_file", "write_file", "list_dir"}
    for tool in builtins:
        assert client.tools.retrieve(tool.id).name == tool.name
    agent = client.agents.create(name="with-base-tools")
    assert {t.name for t in agent.tools} >= {"read_file", "write_file", "list_dir"}
