"""The client's capabilities: with `fs.readTextFile` / `fs.writeTextFile`
the built-in file tools go through the editor (so unsaved buffers count);
with `terminal`, run_command runs in a client terminal."""

import asyncio

from support import Capabilities, RecordingClient


def run_read_notes(acp, capabilities, script="read_notes.yaml", buffers=None):
    client = RecordingClient(permission="allow_once")
    client.buffers.update(buffers or {})

    async def scenario():
        async with acp.agent(script, client) as agent:
            await agent.initialize(capabilities)
            session = await agent.new_session(acp.project)
            answer = await agent.prompt(session, "copy the notes")
            return agent, answer

    agent, answer = acp.run(scenario())
    assert answer.stop_reason == "end_turn"
    return agent, client


def test_without_fs_the_agent_uses_the_disk(acp):
    (acp.project / "notes.txt").write_text("on disk\n")
    agent, client = run_read_notes(acp, Capabilities())
    assert client.reads == [] and client.writes == []
    assert not any(
        m.get("method", "").startswith("fs/") for m in agent.wire.sent_by("agent")
    )
    assert "on disk" in client.result_text_of("call_read")
    assert (acp.project / "copy.txt").read_text() == "copied\n"


def test_with_fs_reads_see_the_editors_unsaved_buffer(acp):
    notes = acp.project / "notes.txt"
    notes.write_text("on disk\n")
    agent, client = run_read_notes(
        acp, Capabilities(fs=True), buffers={str(notes): "unsaved in the editor\n"}
    )
    # ACP file paths are absolute. (The agent may read copy.txt too, for
    # the diff of the write.)
    assert [r[0] for r in client.reads if r[0].endswith("notes.txt")] == [str(notes)]
    assert "unsaved in the editor" in client.result_text_of("call_read")
    assert "on disk" not in client.result_text_of("call_read")
    client.assert_lifecycle("call_read", "completed")


def test_with_fs_writes_go_through_the_editor(acp):
    (acp.project / "notes.txt").write_text("on disk\n")
    agent, client = run_read_notes(acp, Capabilities(fs=True))
    copy = acp.project / "copy.txt"
    assert client.writes == [(str(copy), "copied\n")]
    assert copy.read_text() == "copied\n"  # written by the client
    assert len(client.permission_requests) == 1  # still asked first
    client.assert_lifecycle("call_write", "completed")


def test_without_terminal_the_agent_runs_the_command_itself(acp):
    client = RecordingClient(permission="allow_once")

    async def scenario():
        async with acp.agent("streaming.yaml", client) as agent:
            await agent.initialize(Capabilities())
            session = await agent.new_session(acp.project)
            return await agent.prompt(session, "count")

    assert acp.run(scenario()).stop_reason == "end_turn"
    assert client.terminal_calls == []
    assert "line 5" in client.result_text_of("call_count")
    client.assert_lifecycle("call_count", "completed")


def test_with_terminal_run_command_runs_in_a_client_terminal(acp):
    client = RecordingClient(permission="allow_once")

    async def scenario():
        async with acp.agent("streaming.yaml", client) as agent:
            await agent.initialize(Capabilities(terminal=True))
            session = await agent.new_session(acp.project)
            return agent, await agent.prompt(session, "count")

    agent, answer = acp.run(scenario())
    assert answer.stop_reason == "end_turn"
    assert len(client.terminals) == 1, client.terminal_calls
    (tid, term), = client.terminals.items()
    assert term.output.decode().splitlines() == [f"line {i}" for i in range(1, 6)]
    create = next(m for m in agent.wire.sent_by("agent") if m.get("method") == "terminal/create")
    assert create["params"].get("cwd") in (None, str(acp.project)), create
    # The call shows the terminal, and the agent releases it when done.
    terminals = [
        c.terminal_id
        for u in client.updates_of("call_count") + [r[1] for r in client.permission_requests]
        for c in (u.content or [])
        if c.type == "terminal"
    ]
    assert tid in terminals, client.updates_of("call_count")
    assert ("terminal/release", tid) in client.terminal_calls
    client.assert_lifecycle("call_count", "completed")
    # The model still got the output.
    assert "Counted." in client.message_text()


def test_cancel_kills_the_command_in_the_client_terminal(acp):
    client = RecordingClient(permission="allow_once")

    async def scenario():
        async with acp.agent("slow_command.yaml", client) as agent:
            await agent.initialize(Capabilities(terminal=True))
            session = await agent.new_session(acp.project)
            prompt = asyncio.ensure_future(agent.prompt(session, "run it"))
            await client.wait_for(lambda: len(client.terminals) == 1, what="a terminal", unless=prompt)
            (term,) = client.terminals.values()
            await client.wait_for(lambda: b"started" in term.output, what="the command's output", unless=prompt)
            await agent.conn.cancel(session_id=session)
            answer = await agent.call(prompt, timeout=15)
            # The agent ended the command (kill or release) before answering.
            ended = [m for m, tid in client.terminal_calls if tid == term.id and m in ("terminal/kill", "terminal/release")]
            return answer, ended, term

    answer, ended, term = acp.run(scenario())
    assert answer.stop_reason == "cancelled"
    assert ended, client.terminal_calls
    assert ("terminal/release", term.id) in client.terminal_calls
    assert not (acp.project / "finished.txt").exists()
    assert client.statuses_of("call_sleep")[-1] == "failed"


def test_an_editors_other_folder_is_read_through_it(acp, tmp_path):
    """A multi-root project: the folder given in `additionalDirectories`
    is in the file tools' reach, through the editor's fs as the cwd is,
    and `session/list` reports it."""
    other = tmp_path / "other"
    other.mkdir()
    target = other.resolve() / "lib.txt"
    target.write_text("on disk\n")
    script = tmp_path / "read_other.yaml"
    script.write_text(
        "steps:\n"
        '  - text: "Reading."\n'
        f'    tool_calls: [{{id: call_read, name: read_file, arguments: {{path: "{target}"}}}}]\n'
        '  - text: "Done."\n'
    )
    client = RecordingClient()
    client.buffers[str(target)] = "unsaved in the editor\n"

    async def scenario():
        async with acp.agent(str(script), client) as agent:
            init = await agent.initialize(Capabilities(fs=True))
            assert init.agent_capabilities.session_capabilities.additional_directories is not None
            session = await agent.call(agent.conn.new_session(
                cwd=str(acp.project), additional_directories=[str(other)], mcp_servers=[]))
            answer = await agent.prompt(session.session_id, "read it")
            listed = await agent.call(agent.conn.list_sessions())
            return answer, session.session_id, listed

    answer, session_id, listed = acp.run(scenario())
    assert answer.stop_reason == "end_turn"
    # The history reports the session with its other root.
    [info] = [s for s in listed.sessions if s.session_id == session_id]
    assert info.additional_directories == [str(other)]
    assert [r[0] for r in client.reads] == [str(target)]
    assert "unsaved in the editor" in client.result_text_of("call_read")
