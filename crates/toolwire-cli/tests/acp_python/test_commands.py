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
    assert [c.name for c in commands] == ["compact", "fork", "model"]
    assert forked.stop_reason == "end_turn"
    assert len(listed.sessions) == 2
    assert "Forked this session into" in client.message_text()
    assert plain.stop_reason == "end_turn"


def test_an_mcp_servers_prompt_is_a_command_whose_text_reaches_the_model(acp):
    import os
    from pathlib import Path

    import pytest
    from acp.schema import McpServerStdio

    mcp_dir = os.environ.get("TOOLWIRE_TEST_MCP_DIR")
    if not mcp_dir:
        pytest.skip("TOOLWIRE_TEST_MCP_DIR is not set (scripts/test installs the MCP servers)")
    entry = Path(mcp_dir) / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
    import shutil
    node = shutil.which("node")
    if not node:
        pytest.skip("node is not installed")
    server = McpServerStdio(name="everything", command=node, args=[str(entry), "stdio"], env=[])
    client = RecordingClient()

    async def run():
        async with acp.agent("answer.yaml", client) as agent:
            await agent.initialize()
            new = await agent.call(agent.conn.new_session(cwd=str(acp.project), mcp_servers=[server]))
            await client.wait_for(lambda: client.session_updates("available_commands_update"),
                                  what="the commands")
            answer = await agent.prompt(new.session_id, "/mcp__everything__args-prompt Oslo")
            return new.session_id, answer

    session, answer = acp.run(run())
    names = [c.name for c in client.session_updates("available_commands_update")[-1].available_commands]
    assert "mcp__everything__args-prompt" in names and "mcp__everything__simple-prompt" in names, names
    assert answer.stop_reason == "end_turn"

    # The prompt the model got is the server's text: a new process replays it.
    replay = RecordingClient()

    async def load():
        async with acp.agent("answer.yaml", replay) as agent:
            await agent.initialize()
            await agent.call(agent.conn.load_session(cwd=str(acp.project), session_id=session, mcp_servers=[]))

    acp.run(load())
    said = [u.content.text for u in replay.session_updates("user_message_chunk")]
    assert said == ["What's weather in Oslo?"], said
