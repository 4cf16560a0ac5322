"""Streaming a turn: `messages.create(..., streaming=True)` (the 1.12 way)
and the deprecated `messages.stream(...)`, by step and by token."""

import json
import warnings
from collections import OrderedDict

from support import make_agent, of_type, one, types

REASONING = "The user wants it loud; the shout tool does that."
PRELUDE = "Let me shout it."
FINAL = "Done: the tool shouted it three times, as you asked."

STEP_TYPES = [
    "reasoning_message",
    "assistant_message",
    "tool_call_message",
    "tool_return_message",
    "assistant_message",
    "stop_reason",
    "usage_statistics",
]


def check_steps(chunks):
    """A step-streamed turn of shout.yaml: each message whole, in order."""
    assert types(chunks) == STEP_TYPES
    assert chunks[0].reasoning == REASONING
    assert chunks[1].content == PRELUDE
    call = chunks[2]
    assert call.tool_call.name == "shout"
    assert json.loads(call.tool_call.arguments) == {"text": "hello", "times": 3}
    ret = chunks[3]
    assert (ret.tool_call_id, ret.status, ret.tool_return) == (
        call.tool_call.tool_call_id,
        "success",
        "HELLO! HELLO! HELLO!",
    )
    assert chunks[4].content == FINAL
    assert chunks[5].stop_reason == "end_turn"
    assert chunks[6].step_count == 2


def by_id(chunks, kind):
    """The chunks of `kind`, grouped by message id, in order of arrival."""
    groups = OrderedDict()
    for c in of_type(chunks, kind):
        groups.setdefault(c.id, []).append(c)
    return groups


def check_tokens(chunks):
    """A token-streamed turn of shout.yaml: pieces that share their
    message's id and add up to the whole."""
    kinds = types(chunks)
    assert kinds[-2:] == ["stop_reason", "usage_statistics"]
    assert chunks[-2].stop_reason == "end_turn"
    assert kinds.count("tool_return_message") == 1
    ret_at = kinds.index("tool_return_message")

    reasoning = by_id(chunks, "reasoning_message")
    assert len(reasoning) == 1
    [pieces] = reasoning.values()
    assert "".join(p.reasoning for p in pieces) == REASONING

    text = by_id(chunks, "assistant_message")
    assert len(text) == 2, "one assistant message per model step"
    (first_id, first), (final_id, final) = text.items()
    assert "".join(p.content for p in first) == PRELUDE
    assert "".join(p.content for p in final) == FINAL
    assert len(final) >= 2, "the answer streams in several chunks"
    # The answer comes after the tool's result, the prelude before it.
    assert all(chunks.index(p) < ret_at for p in first)
    assert all(chunks.index(p) > ret_at for p in final)
    # The reasoning, the prelude and the call are parts of the first step's
    # message; the answer is another message.
    calls = by_id(chunks, "tool_call_message")
    assert list(calls) == [first_id] and list(reasoning) == [first_id]
    assert final_id != first_id
    # The call: its name first, then its arguments in fragments.
    [call_pieces] = calls.values()
    assert call_pieces[0].tool_call.name == "shout"
    assert {p.tool_call.tool_call_id for p in call_pieces} == {"call_shout_1"}
    args = "".join(p.tool_call.arguments or "" for p in call_pieces)
    assert json.loads(args) == {"text": "hello", "times": 3}
    ret = chunks[ret_at]
    assert (ret.tool_call_id, ret.tool_return) == ("call_shout_1", "HELLO! HELLO! HELLO!")


def test_streaming_by_step(serve):
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    stream = client.agents.messages.create(
        agent.id, messages=[{"role": "user", "content": "Shout hello."}], streaming=True
    )
    check_steps(list(stream))
    # The streamed turn is in the history like any other.
    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert one(history, "tool_return_message").tool_return == "HELLO! HELLO! HELLO!"
    assert history[-1].content == FINAL


def test_streaming_by_token(serve):
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    stream = client.agents.messages.create(
        agent.id, input="Shout hello.", streaming=True, stream_tokens=True
    )
    chunks = list(stream)
    check_tokens(chunks)
    # The history holds whole messages, with the ids the pieces carried.
    history = list(client.agents.messages.list(agent.id, order="asc"))
    streamed_ids = {c.id for c in chunks if c.message_type.endswith("_message")}
    assert streamed_ids == {m.id for m in history[2:]}
    assert history[-1].content == FINAL


def test_streaming_with_pings_asked(serve):
    # include_pings is accepted; a turn this short needs none, and the
    # stream is the same.
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    chunks = list(
        client.agents.messages.create(
            agent.id, input="Shout hello.", streaming=True, include_pings=True
        )
    )
    check_steps([c for c in chunks if c.message_type != "ping"])


def test_deprecated_stream_endpoint(serve):
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        check_steps(list(client.agents.messages.stream(agent.id, input="Shout hello.")))
        check_tokens(
            list(client.agents.messages.stream(agent.id, input="Once more.", stream_tokens=True))
        )
