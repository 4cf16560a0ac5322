"""session/request_permission: a write tool asks, and runs only when allowed;
"always" answers are remembered for the session."""

import pytest

from support import RecordingClient


def prompts_answered_with(acp, permission, prompts=1):
    """A session whose client answers every permission request with
    `permission`, after `prompts` prompts of write_twice.yaml (each writes a
    file). Returns the client and the stop reasons."""
    client = RecordingClient(permission=permission)

    async def scenario():
        async with acp.agent("write_twice.yaml", client) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            stops = []
            for _ in range(prompts):
                stops.append((await agent.prompt(session, "write it")).stop_reason)
            return stops

    return client, acp.run(scenario())


def test_the_request_shows_the_call_and_offers_the_four_options(acp):
    (acp.project / "out.txt").write_text("old\n")
    client, stops = prompts_answered_with(acp, "allow_once")
    assert stops == ["end_turn"]
    assert len(client.permission_requests) == 1
    _, call, options = client.permission_requests[0]
    assert call.tool_call_id == "call_w1"
    assert call.title
    assert call.kind == "edit"
    assert call.raw_input == {"path": "out.txt", "content": "hello\n"}
    diffs = [c for c in call.content or [] if c.type == "diff"]
    assert len(diffs) == 1, call.content
    assert diffs[0].path.endswith("out.txt")
    assert diffs[0].old_text == "old\n"
    assert diffs[0].new_text == "hello\n"
    assert [(o.option_id, o.kind) for o in options] == [
        ("allow_once", "allow_once"),
        ("allow_always", "allow_always"),
        ("reject_once", "reject_once"),
        ("reject_always", "reject_always"),
    ]
    assert all(o.name for o in options)
    # The call was announced before the question.
    assert client.tool_calls()[0].tool_call_id == "call_w1"


def test_allow_once_runs_the_tool(acp):
    client, stops = prompts_answered_with(acp, "allow_once")
    assert stops == ["end_turn"]
    assert (acp.project / "out.txt").read_text() == "hello\n"
    client.assert_lifecycle("call_w1", "completed")
    assert client.message_text() == "Writing.Done."


def test_allow_once_asks_again_for_the_next_call(acp):
    client, stops = prompts_answered_with(acp, "allow_once", prompts=2)
    assert stops == ["end_turn", "end_turn"]
    assert [r[1].tool_call_id for r in client.permission_requests] == ["call_w1", "call_w2"]
    assert (acp.project / "out2.txt").read_text() == "again\n"


def test_reject_once_does_not_run_the_tool(acp):
    client, stops = prompts_answered_with(acp, "reject_once")
    assert stops == ["end_turn"]
    assert len(client.permission_requests) == 1
    assert not (acp.project / "out.txt").exists()
    # Never started (and ends failed: test_a_call_that_did_not_run_ends_failed).
    statuses = client.statuses_of("call_w1")
    assert statuses[0] == "pending" and statuses[-1] in ("completed", "failed"), statuses
    assert "in_progress" not in statuses, statuses
    # The model is told, and the turn goes on to its answer.
    assert "denied" in client.result_text_of("call_w1")
    assert client.message_text() == "Writing.Done."


def test_allow_always_is_not_asked_again_in_the_session(acp):
    client, stops = prompts_answered_with(acp, "allow_always", prompts=2)
    assert stops == ["end_turn", "end_turn"]
    assert [r[1].tool_call_id for r in client.permission_requests] == ["call_w1"]
    assert (acp.project / "out.txt").read_text() == "hello\n"
    assert (acp.project / "out2.txt").read_text() == "again\n"
    client.assert_lifecycle("call_w2", "completed")


def test_reject_always_rejects_later_calls_without_asking(acp):
    client, stops = prompts_answered_with(acp, "reject_always", prompts=2)
    assert stops == ["end_turn", "end_turn"]
    assert [r[1].tool_call_id for r in client.permission_requests] == ["call_w1"]
    assert not (acp.project / "out.txt").exists()
    assert not (acp.project / "out2.txt").exists()
    assert "in_progress" not in client.statuses_of("call_w2")
    assert "denied" in client.result_text_of("call_w2")


def test_a_cancelled_outcome_does_not_run_the_tool(acp):
    client, stops = prompts_answered_with(acp, None)
    assert len(client.permission_requests) == 1
    assert not (acp.project / "out.txt").exists()
    statuses = client.statuses_of("call_w1")
    assert "in_progress" not in statuses, statuses
    # Without a session/cancel the turn is not cancelled: the model hears
    # that the call did not run and answers.
    assert stops == ["end_turn"]


def test_session_cancel_while_asking_ends_the_prompt_cancelled(acp):
    """The editor cancels the turn while the question is open: it answers
    the question `cancelled` (as ACP requires) and the prompt ends
    `cancelled`, the tool not run."""
    client = RecordingClient()
    holder = {}

    async def cancel_then_answer(tool_call):
        await holder["agent"].conn.cancel(session_id=holder["session"])
        return None

    client.permission = cancel_then_answer

    async def scenario():
        async with acp.agent("write_twice.yaml", client) as agent:
            holder["agent"] = agent
            await agent.initialize()
            holder["session"] = await agent.new_session(acp.project)
            first = await agent.prompt(holder["session"], "write it")
            # The session is usable afterwards: the next prompt asks again.
            client.permission = "allow_once"
            second = await agent.prompt(holder["session"], "write it again")
            return first.stop_reason, second.stop_reason

    first, second = acp.run(scenario())
    assert first == "cancelled"
    assert not (acp.project / "out.txt").exists()
    assert "in_progress" not in client.statuses_of("call_w1")
    assert second == "end_turn"
    assert len(client.permission_requests) == 2
    assert (acp.project / "out2.txt").read_text() == "again\n"


@pytest.mark.parametrize("answer", ["reject_once", None], ids=["rejected", "cancelled"])
def test_a_call_that_did_not_run_ends_failed(acp, answer):
    """A rejected or cancelled call never ran: `failed`, not `completed`."""
    client, _ = prompts_answered_with(acp, answer)
    assert client.statuses_of("call_w1") == ["pending", "failed"]


def test_the_diff_path_is_absolute(acp):
    """ACP: every file path in the protocol is absolute (the model wrote
    "out.txt")."""
    client, _ = prompts_answered_with(acp, "allow_once")
    _, call, _ = client.permission_requests[0]
    diff = next(c for c in call.content if c.type == "diff")
    assert diff.path == str(acp.project / "out.txt")
