"""Wire semantics of Letta's server that its own tests rely on and the
other files do not cover: `response_format` (structured output) reaching
the model, `include=["agent.pending_approval"]`, the summarize route
(`agents.messages.compact`, `mode: all`) and an approval sent again after
it, and unknown ids of each resource answered 404 in Letta's error shape."""

import uuid

import httpx
import pytest
from letta_client import BadRequestError, NotFoundError, UnprocessableEntityError

from support import collect, counting_shout_source, make_agent, of_type, types
from test_models import config_for, mock_openai  # noqa: F401  (fixture)

CAPITAL = {
    "name": "capital_response",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def test_response_format_reaches_the_model(serve, mock_openai):  # noqa: F811
    client = serve("plain.yaml", config=config_for(mock_openai)).client()
    fmt = {"type": "json_schema", "json_schema": CAPITAL}
    agent = client.agents.create(
        name="structured",
        model="openai/gpt-4o-mini",
        model_settings={"provider_type": "openai", "response_format": fmt},
        include_base_tools=False,
    )
    stored = client.get(f"/v1/agents/{agent.id}", cast_to=dict)["model_settings"]
    assert stored["response_format"] == fmt
    client.agents.messages.create(agent.id, input="The capital of France?")
    assert len(mock_openai.requests) == 1
    assert mock_openai.requests[0]["body"]["response_format"] == fmt
    # `text` is no format: the request carries none.
    client.agents.update(
        agent.id, model_settings={"provider_type": "openai", "response_format": {"type": "text"}}
    )
    client.agents.messages.create(agent.id, input="Again?")
    assert "response_format" not in mock_openai.requests[1]["body"]


def test_pending_approval_is_included_while_a_call_waits(serve, workspace):
    client = serve("approval.yaml").client()
    _, agent = make_agent(client, counting_shout_source(workspace / "runs.log"))
    client.agents.tools.update_approval("shout", agent_id=agent.id, body_requires_approval=True)
    assert client.agents.retrieve(agent.id, include=["agent.pending_approval"]).pending_approval is None
    resp = client.agents.messages.create(agent.id, input="Shout hi, twice.")
    asked = resp.messages[-1]
    assert asked.message_type == "approval_request_message"

    waiting = client.agents.retrieve(agent.id, include=["agent.pending_approval"]).pending_approval
    assert waiting is not None and waiting.id == asked.id
    assert waiting.tool_call.name == "shout"
    assert [c.tool_call_id for c in waiting.tool_calls] == ["call_approve_1"]

    client.agents.messages.create(
        agent.id,
        messages=[{"type": "approval", "approvals": [
            {"type": "approval", "tool_call_id": "call_approve_1", "approve": True}]}],
    )
    assert client.agents.retrieve(agent.id, include=["agent.pending_approval"]).pending_approval is None


def test_compact_all_leaves_the_system_prompt_and_the_summary(serve):
    client = serve("plain.yaml").client()
    agent = client.agents.create(name="compacted", include_base_tools=False)
    # Only the system prompt: nothing to compact, Letta's counts as they are.
    nothing = client.agents.messages.compact(agent.id, compaction_settings={"mode": "all"})
    assert (nothing.num_messages_before, nothing.num_messages_after) == (1, 1)
    for text in ("First.", "Second."):
        client.agents.messages.create(agent.id, input=text)
    with pytest.raises(UnprocessableEntityError):
        client.agents.messages.compact(agent.id, compaction_settings={"mode": "everything"})

    before = client.get(f"/v1/agents/{agent.id}/context", cast_to=dict)
    assert (before["num_messages"], before["num_recall_memory"]) == (5, 4)
    assert before["summary_memory"] is None and len(before["messages"]) == 4

    done = client.agents.messages.compact(agent.id, compaction_settings={"mode": "all"})
    assert (done.num_messages_before, done.num_messages_after) == (5, 2)
    assert done.summary == "Hello from the script."
    # The context window is what the next step is sent: the system prompt
    # and the summary, which stands apart; every message is still recalled.
    after = client.get(f"/v1/agents/{agent.id}/context", cast_to=dict)
    assert (after["num_messages"], after["num_recall_memory"]) == (2, 4)
    assert after["summary_memory"] == "Hello from the script."
    assert after["num_tokens_summary_memory"] > 0
    assert after["messages"] == [] and after["num_tokens_messages"] == 0
    assert after["context_window_size_current"] < before["context_window_size_current"] + \
        after["num_tokens_summary_memory"]
    # Nothing is lost: the history still lists every message, and the
    # agent answers on from the summary.
    history = collect(client.agents.messages.list(agent.id, order="asc"))
    assert types(history).count("user_message") == 2
    reply = client.agents.messages.create(agent.id, input="Third.")
    assert reply.stop_reason.stop_reason == "end_turn"
    later = client.get(f"/v1/agents/{agent.id}/context", cast_to=dict)
    assert (later["num_messages"], later["num_recall_memory"]) == (4, 6)
    assert [m["role"] for m in later["messages"]] == ["user", "assistant"]
    again = client.agents.messages.compact(agent.id, compaction_settings={"mode": "all"})
    assert (again.num_messages_before, again.num_messages_after) == (4, 2)


KEEP_ALIVE_SCRIPT = "keep_alive_summary.yaml"


def test_an_answer_sent_again_after_compact_all_goes_on(serve):
    """Letta's test_retry_with_summarization: an approval answered, its
    run cancelled before the model answered the result, everything
    summarised; the same answer again goes on from the summary."""
    client = serve(KEEP_ALIVE_SCRIPT).client()
    agent = client.agents.create(name="keep", include_base_tools=False)
    tool = {"name": "get_code", "description": "The code.",
            "parameters": {"type": "object", "properties": {}}}
    first = client.agents.messages.create(agent.id, input="What is the code?", client_tools=[tool])
    assert first.stop_reason.stop_reason == "requires_approval"
    answer = {"type": "approval", "approvals": [
        {"type": "tool", "tool_call_id": "call_code_1", "tool_return": "42", "status": "success"}]}
    seen = []
    for chunk in client.agents.messages.create(
        agent.id, messages=[answer], client_tools=[tool], streaming=True, stream_tokens=True
    ):
        seen.append(chunk)
        if len(seen) == 1:
            client.agents.messages.cancel(agent.id)
    assert [c.stop_reason for c in of_type(seen, "stop_reason")] == ["cancelled"]
    done = client.agents.messages.compact(agent.id, compaction_settings={"mode": "all"})
    assert done.num_messages_after == 2

    again = client.agents.messages.create(agent.id, messages=[answer], client_tools=[tool])
    assert again.stop_reason.stop_reason == "end_turn"
    assert again.messages[-1].content == "Going on from the results."
    history = collect(client.agents.messages.list(agent.id, order="asc"))
    assert len(of_type(history, "tool_return_message")) == 1, "the tool was not asked again"


def test_unknown_ids_are_404_in_lettas_shape(serve):
    server = serve("plain.yaml")
    client = server.client()
    agent = client.agents.create(name="plain", include_base_tools=False)
    missing = [
        f"/v1/blocks/block-{uuid.uuid4()}",
        f"/v1/runs/run-{uuid.uuid4()}",
        f"/v1/runs/run-{uuid.uuid4()}/messages",
        f"/v1/mcp-servers/mcp_server-{uuid.uuid4()}",
        f"/v1/mcp-servers/mcp_server-{uuid.uuid4()}/tools",
        f"/v1/conversations/conv-{uuid.uuid4()}",
        f"/v1/agents/{agent.id}/core-memory/blocks/nope",
        "/v1/blocks/nonsense",
        "/v1/runs/nonsense",
    ]
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for path in missing:
            r = http.get(path)
            assert r.status_code == 404, (path, r.text)
            # Letta's shape: the message under `detail`.
            assert "not found" in r.json()["detail"], (path, r.text)
    with pytest.raises(NotFoundError):
        client.blocks.update(f"block-{uuid.uuid4()}", value="x")
    with pytest.raises(NotFoundError):
        client.mcp_servers.delete(f"mcp_server-{uuid.uuid4()}")


def test_a_block_over_its_limit_is_refused_as_lettas_server_does(serve):
    client = serve("plain.yaml").client()
    block = client.blocks.create(label="persona", value="I am Sam.", limit=20)
    # Value and limit in one body: invalid (422), as Letta's SDK test of
    # blocks expects.
    with pytest.raises(UnprocessableEntityError) as invalid:
        client.blocks.update(block.id, value="testing testing testing", limit=10)
    assert "limit of 10 characters" in str(invalid.value)
    # Over the block's stored limit: 400 naming it.
    with pytest.raises(BadRequestError) as bad:
        client.blocks.update(block.id, value="testing testing testing")
    assert "limit of 20 characters" in str(bad.value)
    assert bad.value.body["limit"] == 20
    assert client.blocks.retrieve(block.id).value == "I am Sam.", "nothing stored"
