"""The session history: session/list (title, cwd, update time; by cwd),
session/resume (no replay), session/close, session/delete and
session/fork, across agent processes on one database; unknown ids are
errors naming them."""

import pytest
from acp import RequestError
from acp.meta import AGENT_METHODS
from acp.schema import DeleteSessionRequest, DeleteSessionResponse
from acp.utils import request_model_from_dict

from support import RecordingClient


def test_sessions_are_listed_resumed_forked_and_closed_by_another_process(acp, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    async def first_process():
        async with acp.agent("answer.yaml") as agent:
            init = await agent.initialize()
            caps = init.agent_capabilities.session_capabilities
            assert caps.list is not None and caps.resume is not None and caps.close is not None
            first = await agent.new_session(acp.project)
            await agent.prompt(first, "fix the parser\nthen the lexer")
            second = await agent.new_session(elsewhere)
            await agent.prompt(second, "second thread")
            await agent.call(agent.conn.close_session(session_id=second))
            with pytest.raises(RequestError) as closed_twice:
                await agent.call(agent.conn.close_session(session_id=second))
            assert second in str(closed_twice.value.data)
            with pytest.raises(RequestError) as never_opened:
                await agent.call(agent.conn.close_session(session_id="no-such-session"))
            assert "`no-such-session`" in str(never_opened.value.data)
            return first, second

    first, second = acp.run(first_process())

    client = RecordingClient()

    async def second_process():
        async with acp.agent("answer.yaml", client) as agent:
            await agent.initialize()
            listed = await agent.call(agent.conn.list_sessions())
            by_cwd = await agent.call(agent.conn.list_sessions(cwd=str(acp.project)))
            with pytest.raises(RequestError) as bad_cursor:
                await agent.call(agent.conn.list_sessions(cursor="nope"))
            resumed = await agent.call(agent.conn.resume_session(
                session_id=first, cwd=str(acp.project), mcp_servers=[]))
            updates_after_resume = [u.session_update for _, u in client.updates]
            await agent.prompt(first, "resumed")
            with pytest.raises(RequestError) as unknown:
                await agent.call(agent.conn.resume_session(
                    session_id="no-such-session", cwd=str(acp.project), mcp_servers=[]))
            forked = await agent.call(agent.conn.fork_session(
                session_id=first, cwd=str(acp.project), mcp_servers=[]))
            after_fork = await agent.call(agent.conn.list_sessions(cwd=str(acp.project)))
            return listed, by_cwd, bad_cursor.value, resumed, updates_after_resume, unknown.value, forked, after_fork

    listed, by_cwd, bad_cursor, resumed, updates_after_resume, unknown, forked, after_fork = acp.run(second_process())
    assert [s.session_id for s in listed.sessions] == [second, first]
    assert listed.next_cursor is None
    titles = {s.session_id: s.title for s in listed.sessions}
    assert titles == {first: "fix the parser", second: "second thread"}
    assert all(s.updated_at and s.updated_at.endswith("Z") for s in listed.sessions)
    assert [(s.session_id, s.cwd) for s in by_cwd.sessions] == [(first, str(acp.project))]
    assert "`nope`" in str(bad_cursor.data)
    assert resumed.modes.current_mode_id == "ask"
    # No replay: nothing of the conversation was sent.
    assert "user_message_chunk" not in updates_after_resume
    assert "agent_message_chunk" not in updates_after_resume
    assert "`no-such-session`" in str(unknown.data)
    assert forked.session_id not in (first, second)
    assert [s.session_id for s in after_fork.sessions] == [forked.session_id, first]

    # A third process loads the fork: the first session's history.
    client = RecordingClient()

    async def third_process():
        async with acp.agent("answer.yaml", client) as agent:
            await agent.initialize()
            await agent.call(agent.conn.load_session(
                cwd=str(acp.project), session_id=forked.session_id, mcp_servers=[]))

    acp.run(third_process())
    said = [u.content.text for u in client.session_updates("user_message_chunk")]
    assert said == ["fix the parser\nthen the lexer", "resumed"], said


async def delete_session(agent, session_id):
    """session/delete: the SDK (0.12.1) has its types and method name but
    no call of its own, so it is sent the way the SDK sends the others."""
    return await agent.call(request_model_from_dict(
        agent.conn._conn, AGENT_METHODS["session_delete"],
        DeleteSessionRequest(session_id=session_id), DeleteSessionResponse))


def test_a_deleted_session_is_gone_from_every_process_history(acp):
    async def first_process():
        async with acp.agent("answer.yaml") as agent:
            init = await agent.initialize()
            assert init.agent_capabilities.session_capabilities.delete is not None
            kept = await agent.new_session(acp.project)
            await agent.prompt(kept, "keep me")
            deleted = await agent.new_session(acp.project)
            await agent.prompt(deleted, "delete me")
            await delete_session(agent, deleted)
            listed = await agent.call(agent.conn.list_sessions())
            with pytest.raises(RequestError) as load_deleted:
                await agent.call(agent.conn.load_session(
                    cwd=str(acp.project), session_id=deleted, mcp_servers=[]))
            with pytest.raises(RequestError) as unknown:
                await delete_session(agent, "no-such-session")
            return kept, deleted, listed, load_deleted.value, unknown.value

    kept, deleted, listed, load_deleted, unknown = acp.run(first_process())
    assert [s.session_id for s in listed.sessions] == [kept]
    assert f"`{deleted}` was deleted" in str(load_deleted.data)
    assert "`no-such-session`" in str(unknown.data)

    async def second_process():
        async with acp.agent("answer.yaml") as agent:
            await agent.initialize()
            listed = await agent.call(agent.conn.list_sessions())
            with pytest.raises(RequestError) as resume_deleted:
                await agent.call(agent.conn.resume_session(
                    session_id=deleted, cwd=str(acp.project), mcp_servers=[]))
            return listed, resume_deleted.value

    listed, resume_deleted = acp.run(second_process())
    assert [s.session_id for s in listed.sessions] == [kept]
    assert f"`{deleted}` was deleted" in str(resume_deleted.data)
