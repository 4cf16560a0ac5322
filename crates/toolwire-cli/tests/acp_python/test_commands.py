"""Slash commands: available_commands_update after session/new; /fork
copies the session into a new one in the history; a word after a slash
that names no command is an ordinary prompt."""

from support import RecordingClient


def test_commands_are_offered_and_fork_runs(acp):
    client = RecordingClient()

    async def run():
        async with acp.agent("answer.yaml", client) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            await client.wait_for(lambda: client.session_updates("available_commands_update"),
                                  what="the commands")
            await agent.prompt(session, "hello")
            forked = await agent.prompt(session, "/fork")
            listed = await agent.call(agent.conn.list_sessions())
            plain = await agent.prompt(session, "/not-a-command hello")
            return forked, listed, plain

    forked, listed, plain = acp.run(run())
    commands = client.session_updates("available_commands_update")[-1].available_commands
    assert [c.name for c in commands] == ["fork", "model"]
    assert forked.stop_reason == "end_turn"
    assert len(listed.sessions) == 2
    assert "Forked this session into" in client.message_text()
    assert plain.stop_reason == "end_turn"
