"""Config options: the reasoning effort where the session's model reasons
(and not where it does not), kept with the session for another process;
an unknown value is an error naming it."""

import pytest
from acp import RequestError

from conftest import SCRIPTS


def test_the_reasoning_effort_is_offered_for_a_model_that_reasons_and_kept(acp):
    script = SCRIPTS / "answer.yaml"
    config = acp.home / "toolwire.toml"
    config.write_text(
        'default_model = "thinker"\n'
        f'[models.thinker]\nprovider = "scripted"\nscript = "{script}"\nreasoning = true\n'
        f'[models.plain]\nprovider = "scripted"\nscript = "{script}"\n'
    )
    provider = ["--config", str(config)]

    def option(options, option_id):
        return next((o for o in options if o.id == option_id), None)

    async def first():
        async with acp.agent("answer.yaml", provider=provider) as agent:
            await agent.initialize()
            new = await agent.call(agent.conn.new_session(cwd=str(acp.project), mcp_servers=[]))
            effort = option(new.config_options, "reasoning_effort")
            assert effort is not None and effort.current_value == "default"
            assert [c.value for c in effort.options] == ["default", "low", "medium", "high"]
            set_high = await agent.call(agent.conn.set_config_option(
                config_id="reasoning_effort", session_id=new.session_id, value="high"))
            assert option(set_high.config_options, "reasoning_effort").current_value == "high"
            with pytest.raises(RequestError) as bad:
                await agent.call(agent.conn.set_config_option(
                    config_id="reasoning_effort", session_id=new.session_id, value="extreme"))
            assert "`extreme`" in str(bad.value.data)
            answer = await agent.prompt(new.session_id, "think")
            assert answer.stop_reason == "end_turn"
            plain = await agent.call(agent.conn.set_config_option(
                config_id="model", session_id=new.session_id, value="plain"))
            assert option(plain.config_options, "reasoning_effort") is None
            back = await agent.call(agent.conn.set_config_option(
                config_id="model", session_id=new.session_id, value="thinker"))
            assert option(back.config_options, "reasoning_effort").current_value == "high"
            return new.session_id

    session = acp.run(first())

    async def second():
        async with acp.agent("answer.yaml", provider=provider) as agent:
            await agent.initialize()
            resumed = await agent.call(agent.conn.resume_session(
                session_id=session, cwd=str(acp.project), mcp_servers=[]))
            return resumed

    resumed = acp.run(second())
    assert option(resumed.config_options, "reasoning_effort").current_value == "high"
    assert option(resumed.config_options, "model").current_value == "thinker"
