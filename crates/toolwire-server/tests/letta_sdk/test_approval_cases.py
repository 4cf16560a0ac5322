"""More cases of human approval and client tools, through the SDK only:
approval by the tool's own default, denials and client results streamed
or not, the history an approved call leaves, a user message sent with the
answer, several waiting calls answered at once next to a call that needs
no approval, and a client tool that shadows a server tool."""

import json

import pytest

from support import approve, arguments, counting_shout_source, make_agent, of_type, one, runs, types

DENIED = "Error: request to call tool denied. User reason: {}"

GET_ANSWER = {
    "name": "get_answer",
    "description": "Ask the user's machine for the answer to a question.",
    "parameters": {
        "type": "object",
        "properties": {"question": {"type": "string", "description": "The question."}},
        "required": ["question"],
    },
}

# What a request sent itself: its approval answer, its user message.
# Letta does not echo them in the response or the stream (they are in the
# history only); the tests here neither require nor forbid them, and
# check everything else the request produced, in order.
ECHOES = ("approval_response_message", "user_message")


def produced(messages):
    return [m for m in messages if m.message_type not in ECHOES]


@pytest.fixture
def log(workspace):
    """Where the counting `shout` writes a line per real execution."""
    return workspace / "shout-runs.log"


def send(client, agent_id, streaming, **request):
    """Sends one request, as JSON or as an SSE stream. Returns its messages
    (without the closing chunks) and its stop reason."""
    if not streaming:
        resp = client.agents.messages.create(agent_id, **request)
        return list(resp.messages), resp.stop_reason.stop_reason
    chunks = list(client.agents.messages.create(agent_id, streaming=True, **request))
    assert types(chunks)[-2:] == ["stop_reason", "usage_statistics"], types(chunks)
    return chunks[:-2], chunks[-2].stop_reason


def check_return(ret, call_id, status, content):
    """A tool_return_message: for `call_id`, with `status` and `content`,
    in its own fields and in its `tool_returns`."""
    assert ret.message_type == "tool_return_message"
    assert (ret.tool_call_id, ret.status, ret.tool_return) == (call_id, status, content)
    if ret.tool_returns is not None:
        assert [(r.tool_call_id, r.status, r.tool_return) for r in ret.tool_returns] == [
            (call_id, status, content)
        ]


def returns_by_call(messages):
    """Every tool result among `messages`, by call id: (status, text).
    Reads each message's `tool_returns` (Letta may put the results of one
    step's calls in one message), else its own fields."""
    out = {}
    for m in of_type(messages, "tool_return_message"):
        items = m.tool_returns or [m]
        for r in items:
            assert r.tool_call_id not in out, f"two results for {r.tool_call_id}"
            out[r.tool_call_id] = (r.status, r.tool_return)
    return out


def gated_agent(client, log):
    """An agent whose counting `shout` waits for approval (an agent
    setting)."""
    _, agent = make_agent(client, counting_shout_source(log))
    client.agents.tools.update_approval("shout", agent_id=agent.id, body_requires_approval=True)
    return agent


def ask_shout(client, agent, streaming=False):
    """The first message of approval.yaml: the turn pauses on the call of
    `shout`. Returns the approval request."""
    msgs, stop = send(client, agent.id, streaming, input="Shout hi, twice.")
    assert stop == "requires_approval"
    assert types(msgs) == ["assistant_message", "approval_request_message"]
    req = msgs[-1]
    assert (req.tool_call.tool_call_id, req.tool_call.name) == ("call_approve_1", "shout")
    assert arguments(req) == {"text": "hi", "times": 2}
    return req


# 1. -----------------------------------------------------------------------


def test_tool_default_requires_approval(serve, log):
    # Only the tool says so: no agent rule, no per-agent setting.
    client = serve("approval.yaml").client()
    tool = client.tools.create(source_code=counting_shout_source(log), default_requires_approval=True)
    assert tool.default_requires_approval is True
    assert client.tools.retrieve(tool.id).default_requires_approval is True
    agent = client.agents.create(
        name="default-approval",
        system="You are a test agent.",
        model="openai/gpt-4o-mini",
        include_base_tools=False,
        tool_ids=[tool.id],
    )
    assert not [r for r in (agent.tool_rules or []) if r.type == "requires_approval"]

    resp = client.agents.messages.create(agent.id, input="Shout hi, twice.")
    assert resp.stop_reason.stop_reason == "requires_approval"
    assert types(resp.messages) == ["assistant_message", "approval_request_message"]
    req = resp.messages[-1]
    assert (req.tool_call.tool_call_id, req.tool_call.name) == ("call_approve_1", "shout")
    assert arguments(req) == {"text": "hi", "times": 2}
    assert runs(log) == [], "the call waits for approval"

    resp = client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert resp.stop_reason.stop_reason == "end_turn"
    check_return(one(resp.messages, "tool_return_message"), "call_approve_1", "success", "HI! HI!")
    assert runs(log) == ["hi"]


# 2. -----------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_deny(serve, log, streaming):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    ask_shout(client, agent, streaming)

    msgs, stop = send(
        client,
        agent.id,
        streaming,
        messages=[approve("call_approve_1", approve=False, reason="too loud")],
    )
    assert stop == "end_turn"
    assert types(produced(msgs)) == ["tool_return_message", "assistant_message"]
    ret, answer = produced(msgs)
    check_return(ret, "call_approve_1", "error", DENIED.format("too loud"))
    assert answer.content == "That was the shout."
    assert runs(log) == [], "a denied call does not run"

    history = list(client.agents.messages.list(agent.id, order="asc"))
    check_return(one(history, "tool_return_message"), "call_approve_1", "error", DENIED.format("too loud"))
    [answer] = one(history, "approval_response_message").approvals
    assert (answer.tool_call_id, answer.approve, answer.reason) == ("call_approve_1", False, "too loud")


@pytest.mark.parametrize("status", ["success", "error"])
@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_client_tool_return(serve, streaming, status):
    client = serve("client_tool.yaml").client()
    _, agent = make_agent(client)
    msgs, stop = send(
        client, agent.id, streaming, input="What is the answer?", client_tools=[GET_ANSWER]
    )
    assert stop == "requires_approval"
    assert types(msgs) == ["assistant_message", "approval_request_message"]
    req = msgs[-1]
    assert (req.tool_call.tool_call_id, req.tool_call.name) == ("call_client_1", "get_answer")
    assert arguments(req) == {"question": "life"}

    content = "42" if status == "success" else "the machine is off"
    result = {
        "type": "tool",
        "tool_call_id": "call_client_1",
        "tool_return": content,
        "status": status,
    }
    msgs, stop = send(
        client,
        agent.id,
        streaming,
        messages=[{"type": "approval", "approvals": [result]}],
        client_tools=[GET_ANSWER],
    )
    assert stop == "end_turn"
    assert types(produced(msgs)) == ["tool_return_message", "assistant_message"]
    ret, answer = produced(msgs)
    check_return(ret, "call_client_1", status, content)
    assert answer.content == "Your machine says 42."

    history = list(client.agents.messages.list(agent.id, order="asc"))
    check_return(one(history, "tool_return_message"), "call_client_1", status, content)


# 3. -----------------------------------------------------------------------


def test_history_of_an_approved_call_then_a_follow_up(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    req = ask_shout(client, agent)
    resp = client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert resp.stop_reason.stop_reason == "end_turn"
    assert types(produced(resp.messages)) == ["tool_return_message", "assistant_message"]
    assert runs(log) == ["hi"]

    # The turn is over: a plain message is a new turn.
    resp = client.agents.messages.create(agent.id, input="Anything else?")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert types(resp.messages) == ["assistant_message"]
    assert resp.messages[0].content == "A fresh answer: nothing is pending."
    assert runs(log) == ["hi"], "nothing ran again"

    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert types(history) == [
        "system_message",
        "user_message",
        "assistant_message",
        "approval_request_message",
        "approval_response_message",
        "tool_return_message",
        "assistant_message",
        "user_message",
        "assistant_message",
    ]
    # For the approved call: its request, then the answer, then the result.
    asked = [
        i
        for i, m in enumerate(history)
        if m.message_type == "approval_request_message"
        and m.tool_call.tool_call_id == "call_approve_1"
    ]
    answered = [
        i
        for i, m in enumerate(history)
        if m.message_type == "approval_response_message"
        and [a.tool_call_id for a in m.approvals] == ["call_approve_1"]
    ]
    returned = [
        i
        for i, m in enumerate(history)
        if m.message_type == "tool_return_message" and m.tool_call_id == "call_approve_1"
    ]
    assert len(asked) == len(answered) == len(returned) == 1
    assert asked[0] < answered[0] < returned[0]
    assert history[asked[0]].id == req.id
    [answer] = history[answered[0]].approvals
    assert answer.approve is True
    check_return(history[returned[0]], "call_approve_1", "success", "HI! HI!")
    assert history[6].content == "That was the shout."
    assert (history[7].content, history[8].content) == (
        "Anything else?",
        "A fresh answer: nothing is pending.",
    )


# 4. -----------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_user_message_with_the_approval(serve, log, streaming):
    client = serve("approval_then_user.yaml").client()
    agent = gated_agent(client, log)
    ask_shout(client, agent)

    msgs, stop = send(
        client,
        agent.id,
        streaming,
        messages=[approve("call_approve_1"), {"role": "user", "content": "Is that all?"}],
    )
    assert stop == "end_turn"
    # The call's result, then the model's answer to the user's message
    # (turn 1 of the script: turn 0's own answer is not played).
    assert types(produced(msgs)) == ["tool_return_message", "assistant_message"]
    ret, answer = produced(msgs)
    check_return(ret, "call_approve_1", "success", "HI! HI!")
    assert answer.content == "Shouted it; and yes, that was all."
    # If the user message is echoed, it comes after the result, before
    # the answer.
    kinds = types(msgs)
    if "user_message" in kinds:
        assert kinds.index("tool_return_message") < kinds.index("user_message")
        assert kinds.index("user_message") < kinds.index("assistant_message")
        assert one(msgs, "user_message").content == "Is that all?"
    assert runs(log) == ["hi"]

    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert types(history) == [
        "system_message",
        "user_message",
        "assistant_message",
        "approval_request_message",
        "approval_response_message",
        "tool_return_message",
        "user_message",
        "assistant_message",
    ]
    check_return(history[5], "call_approve_1", "success", "HI! HI!")
    assert history[6].content == "Is that all?"
    assert history[7].content == "Shouted it; and yes, that was all."

    # Nothing pends.
    resp = client.agents.messages.create(agent.id, input="Anything else?")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert [m.content for m in resp.messages] == ["A fresh answer: nothing is pending."]


# 5. -----------------------------------------------------------------------


def counting_whisper_source(log):
    """`whisper`, which needs no approval and appends a line to `log` each
    time it runs."""
    return f'''
def whisper(text: str) -> str:
    """Say a text quietly.

    Args:
        text (str): The text to whisper.

    Returns:
        str: The whispered text.
    """
    with open({str(log)!r}, "a") as f:
        f.write(text + "\\n")
    return text.lower() + "..."
'''


def test_three_approvals_and_a_plain_call_in_one_step(serve, log, workspace):
    whispers = workspace / "whisper-runs.log"
    client = serve("parallel_approvals.yaml").client()
    shout = client.tools.create(source_code=counting_shout_source(log), default_requires_approval=True)
    whisper = client.tools.create(source_code=counting_whisper_source(whispers))
    agent = client.agents.create(
        name="parallel",
        system="You are a test agent.",
        model="openai/gpt-4o-mini",
        include_base_tools=False,
        tool_ids=[shout.id, whisper.id],
    )

    resp = client.agents.messages.create(agent.id, input="Shout three things, whisper one.")
    assert resp.stop_reason.stop_reason == "requires_approval"
    # As Letta: the calls that need no approval, then those that wait.
    assert types(resp.messages) == [
        "assistant_message",
        "tool_call_message",
        "approval_request_message",
    ]
    plain, req = resp.messages[1], resp.messages[2]
    assert [(c.tool_call_id, c.name) for c in plain.tool_calls] == [("call_whisper", "whisper")]
    assert plain.tool_call.tool_call_id == "call_whisper"
    assert [(c.tool_call_id, c.name, json.loads(c.arguments)) for c in req.tool_calls] == [
        ("call_shout_one", "shout", {"text": "one"}),
        ("call_shout_two", "shout", {"text": "two"}),
        ("call_shout_three", "shout", {"text": "three"}),
    ]
    assert req.tool_call.tool_call_id == "call_shout_one"
    # Nothing of the step ran yet, not even the plain call.
    assert runs(log) == [] and runs(whispers) == []

    # One answer for all three (not in the order asked): two approved,
    # one denied.
    answer = {
        "type": "approval",
        "approvals": [
            {"type": "approval", "tool_call_id": "call_shout_three", "approve": True},
            {
                "type": "approval",
                "tool_call_id": "call_shout_two",
                "approve": False,
                "reason": "not that one",
            },
            {"type": "approval", "tool_call_id": "call_shout_one", "approve": True},
        ],
    }
    resp = client.agents.messages.create(agent.id, messages=[answer])
    assert resp.stop_reason.stop_reason == "end_turn"
    kinds = types(produced(resp.messages))
    # The step's four results in one message (as Letta's server sends a
    # step's parallel results).
    assert kinds == ["tool_return_message", "assistant_message"], kinds
    assert len(produced(resp.messages)[0].tool_returns) == 4
    expected = {
        "call_shout_one": ("success", "ONE!"),
        "call_shout_two": ("error", DENIED.format("not that one")),
        "call_whisper": ("success", "quiet please..."),
        "call_shout_three": ("success", "THREE!"),
    }
    assert returns_by_call(resp.messages) == expected
    group = one(resp.messages, "tool_return_message")
    first = group.tool_returns[0].tool_call_id
    assert (group.tool_call_id, group.status, group.tool_return) == (first, *expected[first])
    for r in group.tool_returns:
        assert (r.status, r.tool_return) == expected[r.tool_call_id]
    assert produced(resp.messages)[-1].content == "Two shouts, one refusal and a whisper."
    # The two approved calls and the plain one ran, once each.
    assert sorted(runs(log)) == ["one", "three"]
    assert runs(whispers) == ["Quiet Please"]

    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert types(history) == [
        "system_message",
        "user_message",
        "assistant_message",
        "tool_call_message",
        "approval_request_message",
        "approval_response_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert [r.tool_call_id for r in history[6].tool_returns] == [
        r.tool_call_id for r in group.tool_returns
    ]
    assert [c.tool_call_id for c in history[4].tool_calls] == [
        "call_shout_one",
        "call_shout_two",
        "call_shout_three",
    ]
    answers = {a.tool_call_id: (a.approve, a.reason) for a in history[5].approvals}
    assert answers == {
        "call_shout_one": (True, None),
        "call_shout_two": (False, "not that one"),
        "call_shout_three": (True, None),
    }
    assert returns_by_call(history) == expected

    # Nothing pends.
    resp = client.agents.messages.create(agent.id, input="Anything else?")
    assert [m.content for m in resp.messages] == ["A fresh answer: nothing is pending."]


# 6. -----------------------------------------------------------------------


def lookup_source(marker):
    """A server tool `lookup` that leaves `marker` behind when it runs."""
    return f'''
def lookup(key: str) -> str:
    """Look a key up on the server.

    Args:
        key (str): The key to look up.

    Returns:
        str: The value.
    """
    with open({str(marker)!r}, "a") as f:
        f.write(key + "\\n")
    return "server value of " + key
'''


LOOKUP_CLIENT = {
    "name": "lookup",
    "description": "Look a key up on the user's machine.",
    "parameters": {
        "type": "object",
        "properties": {"key": {"type": "string", "description": "The key to look up."}},
        "required": ["key"],
    },
}


def test_client_tool_overrides_a_server_tool(serve, workspace):
    marker = workspace / "server-lookup-ran"
    client = serve("client_override.yaml").client()
    tool = client.tools.create(source_code=lookup_source(marker))
    assert tool.name == "lookup"
    agent = client.agents.create(
        name="override",
        system="You are a test agent.",
        model="openai/gpt-4o-mini",
        include_base_tools=False,
        tool_ids=[tool.id],
    )

    resp = client.agents.messages.create(
        agent.id, input="What color is it?", client_tools=[LOOKUP_CLIENT]
    )
    # The client's `lookup` wins: the call waits for the client.
    assert resp.stop_reason.stop_reason == "requires_approval"
    assert types(resp.messages) == ["assistant_message", "approval_request_message"]
    req = resp.messages[-1]
    assert (req.tool_call.tool_call_id, req.tool_call.name) == ("call_lookup_1", "lookup")
    assert arguments(req) == {"key": "color"}
    assert not marker.exists(), "the server tool must not run"

    result = {
        "type": "tool",
        "tool_call_id": "call_lookup_1",
        "tool_return": "teal, says the client",
        "status": "success",
    }
    resp = client.agents.messages.create(
        agent.id,
        messages=[{"type": "approval", "approvals": [result]}],
        client_tools=[LOOKUP_CLIENT],
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    assert types(produced(resp.messages)) == ["tool_return_message", "assistant_message"]
    ret, answer = produced(resp.messages)
    check_return(ret, "call_lookup_1", "success", "teal, says the client")
    assert answer.content == "Your machine had the answer."
    assert not marker.exists(), "the server tool must not run"

    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert types(history) == [
        "system_message",
        "user_message",
        "assistant_message",
        "approval_request_message",
        "approval_response_message",
        "tool_return_message",
        "assistant_message",
    ]
    check_return(history[5], "call_lookup_1", "success", "teal, says the client")

    # Without the client tool, the same name is the server's tool again,
    # and it runs (so the marker above would have shown a server run).
    resp = client.agents.messages.create(agent.id, input="And the size?")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert types(resp.messages) == ["tool_call_message", "tool_return_message", "assistant_message"]
    check_return(resp.messages[1], "call_lookup_2", "success", "server value of size")
    assert marker.read_text().splitlines() == ["size"]
