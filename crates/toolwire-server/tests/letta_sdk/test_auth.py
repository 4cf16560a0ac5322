"""API keys: with `api_keys` configured, every `/v1` request needs
`Authorization: Bearer KEY`, which the SDK sends from `api_key`."""

import pytest
from letta_client import AuthenticationError

from support import make_agent, types


def test_api_key_is_required(serve):
    server = serve("plain.yaml", config='api_keys = ["k1"]\n')

    for client in (server.client(), server.client(api_key="wrong")):
        with pytest.raises(AuthenticationError) as e:
            client.tools.list().items
        assert e.value.status_code == 401
        with pytest.raises(AuthenticationError):
            client.agents.create(name="nope")
        with pytest.raises(AuthenticationError):
            client.agents.messages.create(
                "agent-00000000-0000-4000-8000-000000000000", input="hi", streaming=True
            )

    client = server.client(api_key="k1")
    _, agent = make_agent(client)
    resp = client.agents.messages.create(agent.id, input="Hello?")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert types(resp.messages) == ["assistant_message"]
    assert resp.messages[0].content == "Hello from the script."
    assert [a.id for a in client.agents.list()] == [agent.id]


def test_refusals_keep_the_connection_usable(serve):
    # The SDK keeps its connection alive between requests. A refused
    # request that carried a body must leave that connection usable (or
    # say `Connection: close`): each of these must be a 401, never a
    # dropped connection (APIConnectionError).
    server = serve("plain.yaml", config='api_keys = ["k1"]\n')
    client = server.client()
    outcomes = []
    for i in range(40):
        try:
            client.agents.create(name=f"nope-{i}", description="x" * 200)
            outcomes.append("created")
        except AuthenticationError:
            outcomes.append("401")
        except Exception as e:  # noqa: BLE001 - we report what it was
            outcomes.append(f"{type(e).__name__}: {e.__cause__!r}")
    assert [o for o in outcomes if o != "401"] == []
