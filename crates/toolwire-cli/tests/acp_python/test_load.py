"""session/load: an editor restarted, a new agent process on the same
database replays the session, and the session goes on."""

from support import RecordingClient


def test_a_new_process_loads_the_session_and_replays_the_turn(acp):
    (acp.project / "notes.txt").write_text("hello from the notes\n")

    async def first_process():
        async with acp.agent("two_tools.yaml") as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            answer = await agent.prompt(session, "what do the notes say?")
            assert answer.stop_reason == "end_turn"
            return session

    session = acp.run(first_process())

    client = RecordingClient()

    async def second_process():
        async with acp.agent("two_tools.yaml", client) as agent:
            init = await agent.initialize()
            assert init.agent_capabilities.load_session is True
            await agent.call(agent.conn.load_session(cwd=str(acp.project), session_id=session, mcp_servers=[]))
            return agent

    agent = acp.run(second_process())
    assert all(sid == session for sid, _ in client.updates)
    kinds = [u.session_update for _, u in client.updates]
    assert kinds[0] == "user_message_chunk", kinds
    assert client.session_updates("user_message_chunk")[0].content.text == "what do the notes say?"
    assert client.message_text() == "Let me look.The notes say hello."

    # Each call once, as it ended: with its status and its result.
    calls = client.tool_calls()
    assert [c.tool_call_id for c in calls] == ["call_list", "call_read"]
    assert [c.status for c in calls] == ["completed", "completed"]
    assert [c.kind or "other" for c in calls] == ["other", "read"]
    assert calls[1].raw_input == {"path": "notes.txt"}
    assert "hello from the notes" in client.result_text_of("call_read")
    assert "notes.txt" in client.result_text_of("call_list")
    assert client.session_updates("tool_call_update") == []

    # In the order of the conversation: the question, the text before the
    # calls, the calls, the answer.
    # (The session's slash commands follow the answer: no part of it.)
    order = [
        u.session_update if u.session_update != "agent_message_chunk" else u.content.text
        for _, u in client.updates
        if u.session_update != "available_commands_update"
    ]
    assert order == ["user_message_chunk", "Let me look.", "tool_call", "tool_call", "The notes say hello."], order

    # The replay comes before the answer to session/load.
    load_id = next(m["id"] for m in agent.wire.sent_by("client") if m.get("method") == "session/load")
    sent = agent.wire.sent_by("agent")
    load_answer = next(i for i, m in enumerate(sent) if m.get("id") == load_id and "method" not in m)
    last_update = max(
        i for i, m in enumerate(sent)
        if m.get("method") == "session/update"
        and m["params"]["update"]["sessionUpdate"] != "available_commands_update"
    )
    assert last_update < load_answer


def test_a_loaded_session_goes_on_and_remembers_allow_always(acp):
    """"Always" answers are stored with the session: after a restart, the
    loaded session still runs the tool without asking."""
    first = RecordingClient(permission="allow_always")

    async def first_process():
        async with acp.agent("write_twice.yaml", first) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            assert (await agent.prompt(session, "write it")).stop_reason == "end_turn"
            return session

    session = acp.run(first_process())
    assert len(first.permission_requests) == 1

    second = RecordingClient(permission="reject_once")

    async def second_process():
        async with acp.agent("write_twice.yaml", second) as agent:
            await agent.initialize()
            await agent.call(agent.conn.load_session(cwd=str(acp.project), session_id=session, mcp_servers=[]))
            second.updates.clear()
            # The script's second turn: the model writes out2.txt.
            return (await agent.prompt(session, "write again")).stop_reason

    assert acp.run(second_process()) == "end_turn"
    assert second.permission_requests == []
    assert (acp.project / "out2.txt").read_text() == "again\n"
    assert second.message_text() == "Writing again.Done again."


def test_loading_an_unknown_session_is_an_error(acp):
    async def scenario():
        async with acp.agent("two_tools.yaml") as agent:
            await agent.initialize()
            try:
                await agent.call(agent.conn.load_session(
                    cwd=str(acp.project), session_id="01a20000-0000-7000-8000-000000000000", mcp_servers=[]
                ))
            except Exception as e:
                return e
            return None

    error = acp.run(scenario())
    assert error is not None, "an unknown session was loaded"
    assert getattr(error, "code", None) in (-32602, -32002), error
