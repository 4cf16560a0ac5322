"""A prompt turn: text, two tool calls and their lives, the end of the turn."""

from support import Capabilities


def test_initialize_says_what_the_agent_can_do(acp):
    async def scenario():
        async with acp.agent("two_tools.yaml") as agent:
            init = await agent.initialize()
            assert init.protocol_version == 1
            assert init.agent_capabilities.load_session is True
            assert init.agent_capabilities.prompt_capabilities.embedded_context is True
            assert init.agent_info.name == "toolwire"

    acp.run(scenario())


def test_a_turn_with_two_tools_streams_each_call_then_ends(acp):
    (acp.project / "notes.txt").write_text("hello from the notes\n")

    async def scenario():
        async with acp.agent("two_tools.yaml") as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            answer = await agent.prompt(session, "what do the notes say?")
            return agent, session, answer

    agent, session, answer = acp.run(scenario())
    client = agent.client
    assert answer.stop_reason == "end_turn"
    assert all(sid == session for sid, _ in client.updates)
    assert client.message_text() == "Let me look.The notes say hello."
    # Read-only tools run without asking.
    assert client.permission_requests == []

    calls = client.tool_calls()
    # ACP's default kind, "other", may be left out.
    assert [(c.tool_call_id, c.kind or "other") for c in calls] == [
        ("call_list", "other"),
        ("call_read", "read"),
    ]
    for call in calls:
        assert (call.status or "pending") == "pending"
        assert call.title

    for call_id in ("call_list", "call_read"):
        updates = client.updates_of(call_id)
        # The tool_call comes first, then only tool_call_updates.
        assert updates[0].session_update == "tool_call", updates
        assert all(u.session_update == "tool_call_update" for u in updates[1:]), updates
        client.assert_lifecycle(call_id, "completed")

    assert "notes.txt" in client.result_text_of("call_list")
    assert "hello from the notes" in client.result_text_of("call_read")

    # Order on the wire: both calls finish before the final answer's text,
    # which comes after "Let me look.".
    updates = agent.wire.updates()
    kinds = [u["sessionUpdate"] for u in updates]
    first_text = kinds.index("agent_message_chunk")
    completed = [
        i for i, u in enumerate(updates)
        if u["sessionUpdate"] == "tool_call_update" and u.get("status") == "completed"
    ]
    last_text = max(i for i, k in enumerate(kinds) if k == "agent_message_chunk")
    assert first_text < min(completed) and max(completed) < last_text, kinds

    # Minimal updates: an update carries only what changed, so no field
    # of a call is sent twice with the same value.
    sent = {}
    for u in updates:
        if u["sessionUpdate"] not in ("tool_call", "tool_call_update"):
            continue
        last = sent.setdefault(u["toolCallId"], {})
        for key, value in u.items():
            if key in ("sessionUpdate", "toolCallId"):
                continue
            assert last.get(key) != value, f"{key} sent again unchanged: {u}"
            last[key] = value


def test_a_prompt_on_an_unknown_session_is_an_error(acp):
    async def scenario():
        async with acp.agent("two_tools.yaml") as agent:
            await agent.initialize(Capabilities())
            try:
                await agent.prompt("no-such-session", "hello")
            except Exception as e:  # the SDK's RequestError
                return e
            return None

    error = acp.run(scenario())
    assert error is not None, "a prompt on an unknown session was answered"
    assert getattr(error, "code", None) == -32602, error


def test_every_status_change_reaches_the_client(acp):
    """The issue: "Status changes and the final content are never held
    longer than the window and never dropped": each call of the turn shows
    pending, then in_progress, then completed, even when it runs in less
    than the coalescing window."""
    (acp.project / "notes.txt").write_text("hello from the notes\n")

    async def scenario():
        async with acp.agent("two_tools.yaml") as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            await agent.prompt(session, "what do the notes say?")
            return agent.client

    client = acp.run(scenario())
    for call_id in ("call_list", "call_read"):
        assert client.statuses_of(call_id) == ["pending", "in_progress", "completed"], call_id
