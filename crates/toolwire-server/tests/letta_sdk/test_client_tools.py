"""Client-side tools: declared per request (`client_tools`), called by the
model, run by the client, whose result continues the turn."""

import pytest
from letta_client import ConflictError

from support import arguments, make_agent, of_type, one, types

GET_ANSWER = {
    "name": "get_answer",
    "description": "Ask the user's machine for the answer to a question.",
    "parameters": {
        "type": "object",
        "properties": {"question": {"type": "string", "description": "The question."}},
        "required": ["question"],
    },
}


def test_client_tool_round_trip(serve):
    client = serve("client_tool.yaml").client()
    _, agent = make_agent(client)

    resp = client.agents.messages.create(
        agent.id, input="What is the answer?", client_tools=[GET_ANSWER]
    )
    assert resp.stop_reason.stop_reason == "requires_approval"
    assert types(resp.messages) == ["assistant_message", "approval_request_message"]
    req = resp.messages[-1]
    assert req.tool_call.name == "get_answer"
    assert req.tool_call.tool_call_id == "call_client_1"
    assert arguments(req) == {"question": "life"}
    # Waiting for the client's result like an approval.
    with pytest.raises(ConflictError) as e:
        client.agents.messages.create(agent.id, input="hello?")
    assert e.value.body["code"] == "PENDING_APPROVAL"

    resp = client.agents.messages.create(
        agent.id,
        messages=[
            {
                "type": "approval",
                "approvals": [
                    {
                        "type": "tool",
                        "tool_call_id": "call_client_1",
                        "tool_return": "42",
                        "status": "success",
                    }
                ],
            }
        ],
        client_tools=[GET_ANSWER],
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    ret = one(resp.messages, "tool_return_message")
    assert (ret.tool_call_id, ret.status, ret.tool_return) == ("call_client_1", "success", "42")
    assert of_type(resp.messages, "assistant_message")[-1].content == "Your machine says 42."

    # The history, as Letta keeps it: the request, the client's answer,
    # the result.
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
    assert history[3].tool_call.name == "get_answer"
    [answer] = history[4].approvals
    assert (answer.type, answer.tool_call_id, answer.tool_return) == ("tool", "call_client_1", "42")
    assert history[5].tool_return == "42"


def test_client_tool_result_in_the_tool_return_form(serve):
    # The newer message form: {"type": "tool_return", "tool_returns": [...]}.
    client = serve("client_tool.yaml").client()
    _, agent = make_agent(client)
    chunks = list(
        client.agents.messages.create(
            agent.id, input="What is the answer?", client_tools=[GET_ANSWER], streaming=True
        )
    )
    assert chunks[-2].stop_reason == "requires_approval"
    req = one(chunks, "approval_request_message")
    assert req.tool_call.name == "get_answer"
    resp = client.agents.messages.create(
        agent.id,
        messages=[
            {
                "type": "tool_return",
                "tool_returns": [
                    {
                        "type": "tool",
                        "tool_call_id": req.tool_call.tool_call_id,
                        "tool_return": "no idea",
                        "status": "error",
                    }
                ],
            }
        ],
        client_tools=[GET_ANSWER],
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    ret = one(resp.messages, "tool_return_message")
    assert (ret.status, ret.tool_return) == ("error", "no idea")
