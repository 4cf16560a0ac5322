"""`client.agents.messages`: a turn in which the model calls a Python tool
the client defined, and the history it leaves."""

from support import arguments, collect, make_agent, of_type, one, types

FINAL = "Done: the tool shouted it three times, as you asked."


def test_message_runs_the_python_tool(serve):
    client = serve("shout.yaml").client()
    tool, agent = make_agent(client)

    resp = client.agents.messages.create(
        agent.id, messages=[{"role": "user", "content": "Shout hello, three times."}]
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    # Only what the turn produced (the user message is not echoed).
    assert types(resp.messages) == [
        "reasoning_message",
        "assistant_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert resp.messages[0].reasoning == "The user wants it loud; the shout tool does that."
    assert resp.messages[1].content == "Let me shout it."
    call = one(resp.messages, "tool_call_message")
    assert call.tool_call.name == "shout"
    assert call.tool_call.tool_call_id == "call_shout_1"
    assert arguments(call) == {"text": "hello", "times": 3}
    ret = one(resp.messages, "tool_return_message")
    assert ret.tool_call_id == "call_shout_1"
    assert ret.status == "success"
    # The Python function's real return value.
    assert ret.tool_return == "HELLO! HELLO! HELLO!"
    assert resp.messages[-1].content == FINAL
    assert resp.usage.step_count == 2

    history = collect(client.agents.messages.list(agent.id, order="asc"))
    assert types(history) == [
        "system_message",
        "user_message",
        "reasoning_message",
        "assistant_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert history[0].content == "You are a test agent."
    assert history[1].content == "Shout hello, three times."
    assert one(history, "tool_return_message").tool_return == "HELLO! HELLO! HELLO!"
    assert arguments(one(history, "tool_call_message")) == {"text": "hello", "times": 3}
    assert history[-1].content == FINAL
    # The response's messages are the history's, with the same ids.
    assert [(m.message_type, m.id) for m in history[2:]] == [
        (m.message_type, m.id) for m in resp.messages
    ]

    key = [(m.message_type, m.id) for m in history]
    # Small pages give the same history (parts of one message stay together).
    for limit in (1, 2, 3):
        page = collect(client.agents.messages.list(agent.id, order="asc", limit=limit))
        assert [(m.message_type, m.id) for m in page] == key, f"limit={limit}"
    # As Letta's server lists them: `order=desc` (the default) takes the
    # newest `limit` messages, `asc` the oldest; a page is oldest first
    # either way, and `after` is newer.
    desc = collect(client.agents.messages.list(agent.id, order="desc"))
    assert [(m.message_type, m.id) for m in desc] == key
    default = collect(client.agents.messages.list(agent.id))
    assert [(m.message_type, m.id) for m in default] == key
    newest_two = client.agents.messages.list(agent.id, limit=2).items
    assert [m.id for m in newest_two] == [m.id for m in history[-2:]]
    # The newest message alone.
    newest = client.agents.messages.list(agent.id, limit=1).items
    assert [m.id for m in newest] == [history[-1].id]


def test_return_message_types_filter_the_response(serve):
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    resp = client.agents.messages.create(
        agent.id,
        input="Shout again.",
        include_return_message_types=["assistant_message", "tool_return_message"],
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    assert types(resp.messages) == ["assistant_message", "tool_return_message", "assistant_message"]
    assert of_type(resp.messages, "tool_return_message")[0].tool_return == "HELLO! HELLO! HELLO!"
