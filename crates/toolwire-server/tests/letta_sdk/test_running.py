"""A turn that is running (its tool blocks until the test lets it go): a
second message is refused, and cancel stops the turn."""

import pytest
from letta_client import ConflictError

from support import of_type, one, types


def gated_tool_source(gate, started):
    return f'''
def wait_for_gate(label: str) -> str:
    """Wait until the test opens the gate.

    Args:
        label (str): Returned once the gate opens.

    Returns:
        str: What it waited for.
    """
    import os, time
    open({str(started)!r}, "w").close()
    while not os.path.exists({str(gate)!r}):
        time.sleep(0.01)
    return "opened " + label
'''


@pytest.fixture
def running(serve, workspace):
    """A server, a client, an agent with `wait_for_gate`, and the gate.
    Notifications are off: the watcher would report the gate files (in
    the workspace, where the tool may write) once they are 300 ms old, on
    a loaded machine while the turn still runs, as a `system_message`
    the streams here do not expect."""
    client = serve("blocking.yaml", config="[notifications]\nenabled = false\n").client()
    gate, started = workspace / "gate", workspace / "started"
    tool = client.tools.create(source_code=gated_tool_source(gate, started))
    agent = client.agents.create(name="busy", include_base_tools=False, tool_ids=[tool.id])
    try:
        yield client, agent, gate
    finally:
        gate.touch()  # never leave a tool blocked


def start_turn(client, agent):
    """Streams the first turn until its call is announced (the tool then
    runs, blocked on the gate). Returns the stream and what it sent."""
    stream = client.agents.messages.create(agent.id, input="Wait for the gate.", streaming=True)
    seen = []
    for chunk in stream:
        seen.append(chunk)
        if chunk.message_type == "tool_call_message":
            return stream, seen
    pytest.fail(f"the stream ended before the tool call: {types(seen)}")


def test_a_message_while_a_turn_runs_is_refused(running):
    client, agent, gate = running
    stream, seen = start_turn(client, agent)
    refused = None
    try:
        client.agents.messages.create(agent.id, input="Are you there?")
    except ConflictError as e:
        refused = e
    gate.touch()
    rest = list(stream)
    # The running turn is not disturbed.
    assert types(seen + rest) == [
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
        "stop_reason",
        "usage_statistics",
    ]
    assert one(rest, "tool_return_message").tool_return == "opened one"
    assert rest[-2].stop_reason == "end_turn"
    # It was refused with 409, not retried, in words that Letta's clients
    # (letta-code) recognise.
    assert refused is not None, "a second message while a turn runs must be refused"
    assert refused.response.headers.get("x-should-retry") == "false"
    assert "is currently being processed" in refused.body["detail"].lower(), refused.body
    # Once the turn is over, messages are welcome again.
    resp = client.agents.messages.create(agent.id, input="And now?")
    assert [m.content for m in resp.messages] == ["A second turn."]


def test_cancel_stops_a_running_turn(running):
    client, agent, gate = running
    stream, seen = start_turn(client, agent)
    result = client.agents.messages.cancel(agent.id)
    assert isinstance(result, dict)
    rest = list(stream)
    assert rest[-2:] and rest[-2].stop_reason == "cancelled", types(rest)
    assert not of_type(rest, "assistant_message")
    assert not gate.exists(), "the tool was cancelled, not let through"
    # The agent is not stuck.
    resp = client.agents.messages.create(agent.id, input="Still there?")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert [m.content for m in resp.messages] == ["A second turn."]
    # Every call has an answer in the history.
    history = list(client.agents.messages.list(agent.id, order="asc"))
    ret = one(history, "tool_return_message")
    assert (ret.tool_call_id, ret.status) == ("call_wait_1", "error")
