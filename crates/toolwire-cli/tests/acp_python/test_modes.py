"""Session modes: offered with the session and as the `mode` config option,
switched by session/set_mode or the option (which sends
current_mode_update); read-only refuses a write without asking,
accept-edits writes without asking; unknown modes are errors naming them."""

import pytest
from acp import RequestError

from support import RecordingClient


def test_modes_decide_what_asks_and_follow_the_config_option(acp):
    client = RecordingClient()

    async def run():
        async with acp.agent("write_twice.yaml", client) as agent:
            await agent.initialize()
            new = await agent.call(agent.conn.new_session(cwd=str(acp.project), mcp_servers=[]))
            session = new.session_id
            assert new.modes.current_mode_id == "ask"
            assert [m.id for m in new.modes.available_modes] == [
                "read-only", "ask", "accept-edits", "full-access"]
            mode_option = next(o for o in new.config_options if o.id == "mode")
            assert mode_option.current_value == "ask"
            await agent.call(agent.conn.set_session_mode(session_id=session, mode_id="read-only"))
            await agent.prompt(session, "write it")
            asked_in_read_only = len(client.permission_requests)
            changed = await agent.call(agent.conn.set_config_option(
                config_id="mode", session_id=session, value="accept-edits"))
            await agent.prompt(session, "write again")
            with pytest.raises(RequestError) as unknown:
                await agent.call(agent.conn.set_session_mode(session_id=session, mode_id="yolo"))
            with pytest.raises(RequestError) as unknown_value:
                await agent.call(agent.conn.set_config_option(
                    config_id="mode", session_id=session, value="sometimes"))
            with pytest.raises(RequestError) as unknown_session:
                await agent.call(agent.conn.set_session_mode(
                    session_id="no-such-session", mode_id="ask"))
            # The session is still usable, in the mode it was in.
            await agent.call(agent.conn.set_session_mode(session_id=session, mode_id="ask"))
            bad = (unknown.value, unknown_value.value, unknown_session.value)
            return asked_in_read_only, changed, bad

    asked_in_read_only, changed, (unknown, unknown_value, unknown_session) = acp.run(run())
    assert asked_in_read_only == 0
    assert client.permission_requests == []
    assert not (acp.project / "out.txt").exists()
    assert "read-only mode" in client.result_text_of("call_w1")
    assert (acp.project / "out2.txt").read_text() == "again\n"
    current = next(o for o in changed.config_options if o.id == "mode")
    assert current.current_value == "accept-edits"
    assert [u.current_mode_id for u in client.session_updates("current_mode_update")] == ["accept-edits"]
    assert "`yolo`" in str(unknown.data)
    assert "`sometimes`" in str(unknown_value.data)
    assert "`no-such-session`" in str(unknown_session.data)
