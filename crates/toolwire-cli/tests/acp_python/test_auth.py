"""Authentication: with the default model's key missing the agent starts,
offers a method naming the variable, refuses to open a session with
auth_required, and authenticate checks the variable again."""

import pytest
from acp import RequestError


def test_a_missing_key_is_an_auth_method(acp):
    provider = ["--provider", "openai", "--model", "gpt-test",
                "--api-key-env", "ACP_PYTEST_NO_SUCH_KEY"]

    async def run():
        async with acp.agent("answer.yaml", provider=provider) as agent:
            init = await agent.initialize()
            with pytest.raises(RequestError) as refused:
                await agent.new_session(acp.project)
            method = init.auth_methods[0]
            with pytest.raises(RequestError) as still_missing:
                await agent.call(agent.conn.authenticate(method_id=method.id))
            return init.auth_methods, refused.value, still_missing.value

    methods, refused, still_missing = acp.run(run())
    assert len(methods) == 1
    assert "ACP_PYTEST_NO_SUCH_KEY" in methods[0].name
    for error in (refused, still_missing):
        assert error.code == -32000
        assert "ACP_PYTEST_NO_SUCH_KEY" in str(error.data)
