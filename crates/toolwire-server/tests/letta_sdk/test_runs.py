"""Runs (`/v1/runs`), background streams resumed by `seq_id`, async
sends, per-run cancel, `otid`s, the history's order and cursor, a step's
parallel results in one `tool_return_message`, `last_stop_reason`, and
Letta's conversations API beside the live view's on the same paths."""

import json
import uuid

import httpx
import pytest
from letta_client import NotFoundError

from support import collect, make_agent, of_type, one, types
from test_running import gated_tool_source, running  # noqa: F401  (fixture)

FINAL = "Done: the tool shouted it three times, as you asked."


def wait_run(client, run_id, timeout=20.0):
    import time

    deadline = time.monotonic() + timeout
    while True:
        run = client.runs.retrieve(run_id)
        if run.status != "running":
            return run
        assert time.monotonic() < deadline, f"run {run_id} still running"
        time.sleep(0.05)


def sse_messages(text):
    """The `data:` JSON objects of an SSE body, and whether it ended with
    `[DONE]`."""
    out, done = [], False
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        out.append(json.loads(line[6:]))
    return out, done


def otid_suffix(otid):
    """The index Letta's server writes in an otid's last 7 bits."""
    return int(otid.replace("-", ""), 16) & 0x7F


def test_async_send_is_a_run_to_read_back(serve):
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    run = client.agents.messages.create_async(agent.id, input="Shout hello.")
    assert run.id.startswith("run-") and run.agent_id == agent.id
    run = wait_run(client, run.id)
    assert (run.status, run.stop_reason) == ("completed", "end_turn")
    assert run.completed_at is not None
    messages = client.runs.messages.list(run.id).items
    assert types(messages) == [
        "user_message",
        "reasoning_message",
        "assistant_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert messages[-1].content == FINAL
    assert all(m.run_id == run.id for m in messages)
    usage = client.runs.usage.retrieve(run.id)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    steps = client.runs.steps.list(run.id).items
    assert len(steps) == 2 and all(s.run_id == run.id for s in steps)
    # What the model wrote names its step, and the step the model.
    models = {s.id: s.model for s in steps}
    written = [m for m in messages if m.message_type != "user_message"
               and m.message_type != "tool_return_message"]
    assert written and all(models.get(m.step_id) == "scripted-sdk" for m in written), (
        [(m.message_type, m.step_id) for m in written], models)
    # Listed, newest first, by agent and by status.
    again = client.runs.list(agent_ids=[agent.id]).items
    assert [r.id for r in again] == [run.id]
    assert client.runs.list(agent_id=agent.id, statuses=["running"]).items == []
    assert client.agents.retrieve(agent.id).last_stop_reason == "end_turn"


def test_background_stream_resumes_after_any_seq_id(serve):
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    stream = client.agents.messages.stream(agent.id, input="Shout hello.", background=True)
    first = list(stream)
    seq = [c.seq_id for c in first]
    assert seq == list(range(1, len(first) + 1)), seq
    assert types(first)[-2:] == ["stop_reason", "usage_statistics"]
    run_id = first[0].run_id
    run = client.runs.retrieve(run_id)
    assert run.background is True and run.status == "completed"
    assert client.runs.list(agent_id=agent.id, background=True).items[0].id == run_id
    # From the start, and after each seq_id: the rest, nothing lost or
    # repeated.
    for after in range(0, len(first) + 1):
        rest = list(client.runs.messages.stream(run_id, starting_after=after))
        assert [c.seq_id for c in rest] == seq[after:], after
        assert types(rest) == types(first)[after:]
    # GET works too (a browser's EventSource); past the end it just ends.
    with httpx.Client(base_url=str(client.base_url)) as http:
        r = http.get(f"/v1/runs/{run_id}/stream", params={"starting_after": 2})
        got, done = sse_messages(r.text)
        assert [m["seq_id"] for m in got] == seq[2:] and done
        r = http.get(f"/v1/runs/{run_id}/stream", params={"starting_after": 999})
        assert sse_messages(r.text) == ([], True)


def test_a_background_run_outlives_its_client(running):  # noqa: F811
    client, agent, gate = running
    url = str(client.base_url)
    seen = []
    with httpx.Client(base_url=url, timeout=10) as http:
        with http.stream(
            "POST",
            f"/v1/agents/{agent.id}/messages/stream",
            json={"input": "Wait for the gate.", "background": True},
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["message_type"] == "tool_call_message":
                        break  # the client leaves while the tool runs
    run_id = seen[0]["run_id"]
    assert client.runs.retrieve(run_id).status == "running"
    gate.touch()
    run = wait_run(client, run_id)
    assert run.status == "completed"
    rest = list(client.runs.messages.stream(run_id, starting_after=seen[-1]["seq_id"]))
    assert [c.seq_id for c in rest] == list(range(len(seen) + 1, len(seen) + 1 + len(rest)))
    # (The gate file is a change in the workspace: its notification may
    # come as a system message.)
    assert [t for t in types(rest) if t != "system_message"] == [
        "tool_return_message",
        "assistant_message",
        "stop_reason",
        "usage_statistics",
    ]
    assert rest[0].tool_return == "opened one"


def test_cancel_stops_only_the_run_named(running):  # noqa: F811
    client, agent, gate = running
    run = client.agents.messages.create_async(agent.id, input="Wait for the gate.")
    # Another id: nothing is cancelled.
    other = f"run-{uuid.uuid4()}"
    with pytest.raises(NotFoundError):
        client.agents.messages.cancel(agent.id, run_ids=[other])
    import time

    deadline = time.monotonic() + 10
    while client.runs.retrieve(run.id).status != "running" or not (gate.parent / "started").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.agents.messages.cancel(agent.id, run_ids=[run.id])
    run = wait_run(client, run.id)
    assert (run.status, run.stop_reason) == ("cancelled", "cancelled")
    assert client.agents.retrieve(agent.id).last_stop_reason == "cancelled"


def test_unknown_runs_are_404(serve):
    client = serve("plain.yaml").client()
    for bad in (f"run-{uuid.uuid4()}", "nonsense"):
        with pytest.raises(NotFoundError):
            client.runs.retrieve(bad)
        with pytest.raises(NotFoundError):
            client.runs.messages.list(bad)
        with pytest.raises(NotFoundError):
            list(client.runs.messages.stream(bad))


def test_otids_and_the_history_window(serve):
    client = serve("shout.yaml").client()
    _, agent = make_agent(client)
    mine = str(uuid.uuid4())
    resp = client.agents.messages.create(
        agent.id, messages=[{"role": "user", "content": "Shout hello.", "otid": mine}]
    )
    # Each message's parts count up from 0 in their otids (Letta's rule).
    assert [otid_suffix(m.otid) for m in resp.messages] == [0, 1, 2, 0, 0]
    before = client.agents.messages.list(agent.id, limit=1).items
    assert [m.id for m in before] == [resp.messages[-1].id]
    resp2 = client.agents.messages.create(
        agent.id, messages=[{"role": "user", "content": "Again.", "otid": mine}]
    )
    # `after` is newer; the page is oldest first, the user's otid kept.
    newer = client.agents.messages.list(agent.id, after=before[0].id).items
    assert types(newer)[0] == "user_message" and newer[0].otid == mine
    assert [m.id for m in newer[1:]] == [m.id for m in resp2.messages]
    assert [m.otid for m in newer[1:]] == [m.otid for m in resp2.messages]
    everything = collect(client.agents.messages.list(agent.id, order="asc"))
    # `limit` counts stored messages: the last three are the assistant
    # message with its reasoning, text and call, the result, the answer.
    last3 = client.agents.messages.list(agent.id, limit=3).items
    assert [m.id for m in last3] == [m.id for m in everything[-5:]]
    assert types(last3) == types(resp2.messages)


PARALLEL = """
model: scripted-sdk
steps:
  - tool_calls:
      - {id: call_a, name: shout, arguments: {text: "a"}}
      - {id: call_b, name: shout, arguments: {text: "b"}}
      - {id: call_c, name: shout, arguments: {text: "c"}}
  - text: "Three shouts."
"""


def test_a_steps_parallel_results_are_one_message(serve):
    client = serve(PARALLEL).client()
    _, agent = make_agent(client)
    resp = client.agents.messages.create(agent.id, input="Shout three things.")
    assert types(resp.messages) == ["tool_call_message", "tool_return_message", "assistant_message"]
    group = one(resp.messages, "tool_return_message")
    # In the calls' order, whatever order they finished in (the calls run
    # at once), the group's own fields the first's: as Letta's server.
    assert [(r.tool_call_id, r.tool_return) for r in group.tool_returns] == [
        ("call_a", "A!"),
        ("call_b", "B!"),
        ("call_c", "C!"),
    ]
    assert (group.tool_call_id, group.tool_return) == ("call_a", "A!")
    history = collect(client.agents.messages.list(agent.id, order="asc"))
    stored = one(history, "tool_return_message")
    assert [r.tool_call_id for r in stored.tool_returns] == [r.tool_call_id for r in group.tool_returns]
    assert stored.id == group.id


def test_letta_conversations_beside_the_live_views(serve):
    server = serve("plain.yaml")
    client = server.client()
    _, agent = make_agent(client)
    with httpx.Client(base_url=server.url, timeout=20) as http:
        made = http.post("/v1/conversations/", params={"agent_id": agent.id}, json={})
        assert made.status_code == 200, made.text
        conv = made.json()
        assert conv["id"].startswith("conv-") and conv["agent_id"] == agent.id
        # Streamed by default, in Letta's shape.
        sent = http.post(
            f"/v1/conversations/{conv['id']}/messages",
            json={"messages": [{"role": "user", "content": "Hi there."}], "stream_tokens": True},
        )
        assert sent.status_code == 200, sent.text
        chunks, done = sse_messages(sent.text)
        assert done and chunks[-2]["stop_reason"] == "end_turn"
        assert "".join(c["content"] for c in chunks if c["message_type"] == "assistant_message") == (
            "Hello from the script."
        )
        # Or as JSON.
        sent = http.post(
            f"/v1/conversations/{conv['id']}/messages",
            json={"messages": [{"role": "user", "content": "Once more."}], "streaming": False},
        )
        assert [m["message_type"] for m in sent.json()["messages"]] == ["assistant_message"]
        got = http.get(f"/v1/conversations/{conv['id']}").json()
        assert got["last_message_at"] is not None
        listed = http.get("/v1/conversations/", params={"agent_id": agent.id}).json()
        assert [c["id"] for c in listed] == [conv["id"]]
        history = http.get(f"/v1/conversations/{conv['id']}/messages").json()
        assert [m["message_type"] for m in history] == [
            "system_message", "user_message", "assistant_message",
            "user_message", "assistant_message",
        ]
        # The agent's own conversation is untouched by it.
        assert types(client.agents.messages.list(agent.id).items) == ["system_message"]
        # The same conversation through the live view's routes: its tree,
        # and a send in the live view's shape (a turn of the same agent).
        uuid_id = conv["id"][len("conv-"):]
        tree = http.get(f"/v1/conversations/{uuid_id}/tree")
        assert tree.status_code == 200 and len(tree.json()["nodes"]) == 5
        live = http.post(f"/v1/conversations/{conv['id']}/messages", json={"text": "Live."})
        assert live.status_code == 202, live.text
        # The live view's own list and create keep their shapes.
        assert "conversations" in http.get("/v1/conversations").json()
        assert http.post("/v1/conversations", json={"title": "t"}).status_code == 201
        # Unknown conversations are 404 in Letta's shape.
        missing = http.get(f"/v1/conversations/conv-{uuid.uuid4()}")
        assert missing.status_code == 404 and "detail" in missing.json()
        assert http.get("/v1/conversations/nonsense").status_code == 404




def test_an_answer_sent_again_after_its_run_was_cancelled_goes_on(serve):
    client = serve("keep_alive.yaml").client()
    agent = client.agents.create(name="keep", include_base_tools=False)
    tool = {"name": "get_code", "description": "The code.",
            "parameters": {"type": "object", "properties": {}}}
    first = client.agents.messages.create(agent.id, input="What is the code?", client_tools=[tool])
    assert first.stop_reason.stop_reason == "requires_approval"
    answer = {"type": "approval", "approvals": [
        {"type": "tool", "tool_call_id": "call_code_1", "tool_return": "42", "status": "success"}]}
    stream = client.agents.messages.create(
        agent.id, messages=[answer], client_tools=[tool], streaming=True, stream_tokens=True
    )
    seen = []
    for chunk in stream:
        seen.append(chunk)
        if len(seen) == 1:
            client.agents.messages.cancel(agent.id)
    assert seen[0].message_type == "tool_return_message"
    assert [c.stop_reason for c in of_type(seen, "stop_reason")] == ["cancelled"]
    # The same answer again: the turn goes on from the results, with
    # Letta's keep-alive message; the tool is not asked again.
    again = client.agents.messages.create(agent.id, messages=[answer], client_tools=[tool])
    assert again.stop_reason.stop_reason == "end_turn"
    assert again.messages[-1].content == "Going on from the results."
    history = collect(client.agents.messages.list(agent.id, order="asc"))
    assert "keep-alive" in of_type(history, "user_message")[-1].content
    assert len(of_type(history, "tool_return_message")) == 1
    # Once it answered, the same answer again runs nothing.
    third = client.agents.messages.create(agent.id, messages=[answer], client_tools=[tool])
    assert third.messages == []


def test_runs_are_listed_a_page_at_a_time(serve):
    client = serve("plain.yaml").client()
    _, agent = make_agent(client)
    other = client.agents.create(name="other", model="openai/gpt-4o-mini", include_base_tools=False)
    for i in range(5):
        client.agents.messages.create(agent.id, input=f"message {i}")
    client.agents.messages.create(other.id, input="elsewhere")
    mine = [r.id for r in client.runs.list(agent_id=agent.id).items]
    assert len(mine) == 5
    # Newest first by default: the first page, then the next after it.
    first = client.runs.list(agent_id=agent.id, limit=2).items
    assert [r.id for r in first] == mine[:2]
    rest = client.runs.list(agent_id=agent.id, limit=2, after=first[-1].id).items
    assert [r.id for r in rest] == mine[2:4]
    oldest = client.runs.list(agent_id=agent.id, limit=2, ascending=True).items
    assert [r.id for r in oldest] == mine[::-1][:2]
    # A filter on the stored run (its status) pages the same way.
    done = client.runs.list(agent_id=agent.id, statuses=["completed"], limit=3).items
    assert [r.id for r in done] == mine[:3]
    assert all(r.status == "completed" and r.agent_id == agent.id for r in done)
    everyone = client.runs.list(limit=10).items
    assert len(everyone) == 6 and everyone[0].agent_id == other.id
