"""Human approval of a server tool: the turn pauses with an
`approval_request_message`, the client approves or denies (or cancels),
and the pause survives a restart of the server."""

import json

import pytest
from letta_client import BadRequestError, ConflictError

from support import approve, arguments, counting_shout_source, make_agent, of_type, one, runs, types

PENDING_DETAIL = "waiting for approval"
ANSWER = "That was the shout."
FRESH = "A fresh answer: nothing is pending."


@pytest.fixture
def log(workspace):
    """Where the counting `shout` writes a line per real execution."""
    return workspace / "shout-runs.log"


def gated_agent(client, log):
    """An agent whose `shout` waits for approval."""
    _, agent = make_agent(client, counting_shout_source(log))
    client.agents.tools.update_approval("shout", agent_id=agent.id, body_requires_approval=True)
    return agent


def ask(client, agent):
    """Sends the first message of approval.yaml: the turn pauses on the
    call of `shout`. Returns the approval request."""
    resp = client.agents.messages.create(agent.id, input="Shout hi, twice.")
    assert resp.stop_reason.stop_reason == "requires_approval"
    assert types(resp.messages) == ["assistant_message", "approval_request_message"]
    assert not of_type(resp.messages, "tool_call_message")
    req = resp.messages[-1]
    assert req.tool_call.name == "shout"
    assert req.tool_call.tool_call_id == "call_approve_1"
    assert arguments(req) == {"text": "hi", "times": 2}
    return req


def assert_pending(client, agent, req):
    """A new user message is refused with 409 PENDING_APPROVAL, naming the
    request; streamed or not."""
    for streaming in (False, True):
        with pytest.raises(ConflictError) as e:
            client.agents.messages.create(agent.id, input="hello?", streaming=streaming)
        body = e.value.body
        assert body["code"] == "PENDING_APPROVAL", body
        assert body["pending_request_id"] == req.id, body
        assert PENDING_DETAIL in body["detail"].lower(), body
        # The SDK must not send the message again.
        assert e.value.response.headers.get("x-should-retry") == "false"


def test_approve_runs_the_tool_once(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    req = ask(client, agent)
    assert runs(log) == [], "the tool waits for approval"
    assert_pending(client, agent, req)

    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert types(history)[-1] == "approval_request_message"
    assert history[-1].id == req.id
    assert history[-1].tool_call.tool_call_id == "call_approve_1"

    resp = client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert resp.stop_reason.stop_reason == "end_turn"
    ret = one(resp.messages, "tool_return_message")
    assert (ret.tool_call_id, ret.status) == ("call_approve_1", "success")
    assert ret.tool_return == "HI! HI!"
    assert of_type(resp.messages, "assistant_message")[-1].content == ANSWER
    assert runs(log) == ["hi"]

    # The same answer again (a client retrying): no error, nothing runs.
    again = client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert not of_type(again.messages, "tool_return_message")
    assert runs(log) == ["hi"]
    # The history, as Letta keeps it: the request, the answer, the one
    # result.
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
    assert history[3].tool_call.tool_call_id == "call_approve_1"
    [answer] = history[4].approvals
    assert (answer.tool_call_id, answer.approve) == ("call_approve_1", True)
    assert (history[5].tool_call_id, history[5].tool_return) == ("call_approve_1", "HI! HI!")

    # Nothing pends: a plain message is a new turn.
    resp = client.agents.messages.create(agent.id, input="Anything else?")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert [m.content for m in resp.messages] == [FRESH]


def test_deny_with_reason(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    ask(client, agent)
    resp = client.agents.messages.create(
        agent.id, messages=[approve("call_approve_1", approve=False, reason="too loud")]
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    ret = one(resp.messages, "tool_return_message")
    assert ret.tool_call_id == "call_approve_1"
    assert ret.status == "error"
    assert ret.tool_return == "Error: request to call tool denied. User reason: too loud"
    assert of_type(resp.messages, "assistant_message")[-1].content == ANSWER
    assert runs(log) == []
    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert one(history, "tool_return_message").tool_return == ret.tool_return


def test_wrong_tool_call_id_is_refused(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    req = ask(client, agent)
    with pytest.raises(BadRequestError) as e:
        client.agents.messages.create(agent.id, messages=[approve("call_not_waiting")])
    assert "invalid tool call ids" in e.value.body["detail"].lower(), e.value.body
    assert runs(log) == []
    # Still waiting, and the right answer still works.
    assert_pending(client, agent, req)
    resp = client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert resp.stop_reason.stop_reason == "end_turn"
    assert runs(log) == ["hi"]


def test_approval_with_nothing_pending_is_refused(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    with pytest.raises(BadRequestError) as e:
        client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert "no tool call is currently awaiting approval" in e.value.body["detail"].lower()
    # Legacy form (one answer for the pending request) too.
    with pytest.raises(BadRequestError):
        legacy = {"type": "approval", "approve": True, "approval_request_id": "message-x"}
        client.agents.messages.create(agent.id, messages=[legacy])
    assert runs(log) == []


def test_legacy_approval_form(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    req = ask(client, agent)
    resp = client.agents.messages.create(
        agent.id, messages=[{"type": "approval", "approve": True, "approval_request_id": req.id}]
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    assert one(resp.messages, "tool_return_message").tool_return == "HI! HI!"
    assert runs(log) == ["hi"]


def test_streamed_approval(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    chunks = list(client.agents.messages.create(agent.id, input="Shout hi.", streaming=True))
    assert types(chunks) == [
        "assistant_message",
        "approval_request_message",
        "stop_reason",
        "usage_statistics",
    ]
    req = chunks[1]
    assert json.loads(req.tool_call.arguments) == {"text": "hi", "times": 2}
    assert chunks[2].stop_reason == "requires_approval"
    assert runs(log) == []
    assert_pending(client, agent, req)

    chunks = list(
        client.agents.messages.create(
            agent.id, messages=[approve(req.tool_call.tool_call_id)], streaming=True
        )
    )
    kinds = types(chunks)
    assert kinds[-2:] == ["stop_reason", "usage_statistics"]
    assert chunks[-2].stop_reason == "end_turn"
    assert one(chunks, "tool_return_message").tool_return == "HI! HI!"
    assert kinds.index("tool_return_message") < kinds.index("assistant_message")
    assert of_type(chunks, "assistant_message")[-1].content == ANSWER
    assert runs(log) == ["hi"]


def test_token_streamed_approval_request(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    chunks = list(
        client.agents.messages.create(
            agent.id, input="Shout hi.", streaming=True, stream_tokens=True
        )
    )
    assert chunks[-2].stop_reason == "requires_approval"
    # The gated call streams as an approval request from its first piece.
    assert not of_type(chunks, "tool_call_message")
    pieces = of_type(chunks, "approval_request_message")
    assert pieces and pieces[0].tool_call.name == "shout"
    assert len({p.id for p in pieces}) == 1
    assert json.loads("".join(p.tool_call.arguments or "" for p in pieces)) == {
        "text": "hi",
        "times": 2,
    }
    resp = client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert resp.stop_reason.stop_reason == "end_turn"
    assert runs(log) == ["hi"]


def test_approval_can_be_turned_off(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    client.agents.tools.update_approval("shout", agent_id=agent.id, body_requires_approval=False)
    resp = client.agents.messages.create(agent.id, input="Shout hi.")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert one(resp.messages, "tool_return_message").tool_return == "HI! HI!"
    assert runs(log) == ["hi"]


def test_cancel_clears_a_pending_approval(serve, log):
    client = serve("approval.yaml").client()
    agent = gated_agent(client, log)
    req = ask(client, agent)
    assert_pending(client, agent, req)

    result = client.agents.messages.cancel(agent.id)
    assert isinstance(result, dict)

    resp = client.agents.messages.create(agent.id, input="Never mind; anything else?")
    assert resp.stop_reason.stop_reason == "end_turn"
    assert [m.content for m in resp.messages] == [FRESH]
    assert runs(log) == [], "a cancelled call does not run"
    # The cancelled call has its (error) result in the history.
    history = list(client.agents.messages.list(agent.id, order="asc"))
    ret = one(history, "tool_return_message")
    assert (ret.tool_call_id, ret.status) == ("call_approve_1", "error")
    assert types(history)[-2:] == ["user_message", "assistant_message"]
    # Answering the cancelled request now is refused: nothing waits.
    with pytest.raises(BadRequestError):
        client.agents.messages.create(agent.id, messages=[approve("call_not_waiting")])


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_pending_approval_survives_a_restart(serve, log, kill):
    server = serve("approval.yaml")
    client = server.client()
    agent = gated_agent(client, log)
    req = ask(client, agent)

    server.restart(kill=kill)
    client = server.client()

    history = list(client.agents.messages.list(agent.id, order="asc"))
    assert history[-1].message_type == "approval_request_message"
    assert history[-1].id == req.id
    assert_pending(client, agent, req)
    resp = client.agents.messages.create(agent.id, messages=[approve("call_approve_1")])
    assert resp.stop_reason.stop_reason == "end_turn"
    assert one(resp.messages, "tool_return_message").tool_return == "HI! HI!"
    assert of_type(resp.messages, "assistant_message")[-1].content == ANSWER
    assert runs(log) == ["hi"]
