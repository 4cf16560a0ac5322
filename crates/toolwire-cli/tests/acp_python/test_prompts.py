"""What a prompt carries and gets back beyond text (issue 21): images for a
model that cannot see are refused with a clear error, the turn's usage and
the session's title arrive, a prompt sent while a turn runs is queued or
interjected, and an edit sends its hunk once and replays as it was shown."""

import asyncio
import base64

from acp import RequestError, image_block, text_block

from support import RecordingClient

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0").decode()


def test_an_image_for_a_model_that_cannot_see_is_an_error_and_the_session_goes_on(acp):
    async def body():
        async with acp.agent("queued.yaml") as agent:
            init = await agent.initialize()
            # The scripted model has no vision: images are not offered.
            assert init.agent_capabilities.prompt_capabilities.image is False
            session = await agent.new_session(acp.project)
            errors = []
            too_big = base64.b64encode(b"\0" * (5 * 1024 * 1024 + 1)).decode()
            for block in [
                image_block(PNG, "image/png"),
                image_block("not base64!", "image/png"),
                # Over the 5 MB limit; a data URI without `;base64`.
                image_block(too_big, "image/png"),
                image_block("", "image/png", uri="data:image/png,AAAA"),
            ]:
                try:
                    await agent.call(agent.conn.prompt(session_id=session, prompt=[text_block("see"), block]))
                except RequestError as e:
                    errors.append(str(e.data))
            answer = await agent.prompt(session, "just text")
            return errors, answer

    errors, answer = acp.run(body())
    assert len(errors) == 4, errors
    assert "cannot see images" in errors[0], errors
    assert "base64" in errors[1], errors
    assert "over the limit" in errors[2], errors
    assert "data URI" in errors[3] and ";base64" in errors[3], errors
    assert answer.stop_reason == "end_turn"


def test_the_turns_usage_and_the_sessions_title_arrive(acp):
    client = RecordingClient()

    async def body():
        async with acp.agent("read_notes.yaml", client) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            first = await agent.prompt(session, "  Copy the notes \nplease")
            second = await agent.prompt(session, "Again")
            return first, second

    (acp.project / "notes.txt").write_text("hello\n")
    first, second = acp.run(body())
    titles = [u.title for u in client.session_updates("session_info_update")]
    assert titles == ["Copy the notes"], titles
    assert first.usage is not None and first.usage.total_tokens > 0, first
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    assert second.usage is not None


def _two_prompts(acp, script, args=()):
    """Two prompts of one session, the second sent while the first one's
    turn streams; their answers in the order they came, and the client."""
    client = RecordingClient()

    async def body():
        async with acp.agent(script, client, args=args) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            order = []

            async def ask(text):
                answer = await agent.call(agent.conn.prompt(session_id=session, prompt=[text_block(text)]))
                order.append((text, answer.stop_reason))

            first = asyncio.ensure_future(ask("first question"))
            await client.wait_for(lambda: client.session_updates("agent_message_chunk"), what="the first words",
                                  unless=first)
            await ask("second question")
            await first
            return session, order

    session, order = acp.run(body())
    return session, order, client


def test_a_prompt_during_a_turn_is_queued(acp):
    _, order, client = _two_prompts(acp, "queued.yaml")
    assert order == [("first question", "end_turn"), ("second question", "end_turn")], order
    text = client.message_text()
    assert text.endswith("The second answer."), text
    assert text.index("while it runs.") < text.index("The second answer.")


def test_a_prompt_during_a_turn_can_be_interjected(acp):
    config = acp.home / "toolwire.toml"
    config.write_text('[acp]\nprompt_while_running = "interject"\n')
    session, order, client = _two_prompts(acp, "interjected.yaml", args=("--config", str(config)))
    assert order == [("first question", "end_turn"), ("second question", "end_turn")], order
    assert client.message_text().endswith("Answered both.")

    # One turn: replayed, the second question comes after the listing and
    # before the answer.
    replay = RecordingClient()

    async def load():
        async with acp.agent("interjected.yaml", replay) as agent:
            await agent.initialize()
            await agent.call(agent.conn.load_session(cwd=str(acp.project), session_id=session, mcp_servers=[]))

    acp.run(load())
    order = [
        u.content.text if u.session_update in ("user_message_chunk", "agent_message_chunk") else u.session_update
        for _, u in replay.updates
    ]
    assert order[0] == "first question", order
    assert order.index("tool_call") < order.index("second question") < order.index("Answered both."), order


def test_an_edit_sends_its_hunk_once_and_replays_its_diff(acp):
    lines = "".join(f"line {i:03}\n" for i in range(1, 201))
    (acp.project / "big.txt").write_text(lines)
    client = RecordingClient()

    async def first_process():
        async with acp.agent("edit_one_line.yaml", client) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            assert (await agent.prompt(session, "edit")).stop_reason == "end_turn"
            return session

    session = acp.run(first_process())
    assert (acp.project / "big.txt").read_text() == lines.replace("line 100\n", "line one hundred\n")
    (_, asked, _) = client.permission_requests[0]
    diff = next(c for c in asked.content if c.type == "diff")
    assert diff.old_text == "".join(f"line {i:03}\n" for i in range(97, 104)), diff.old_text
    assert diff.new_text == diff.old_text.replace("line 100\n", "line one hundred\n")
    completed = [u for u in client.updates_of("call_edit") if u.status == "completed"]
    assert len(completed) == 1 and completed[0].content is None, completed
    assert completed[0].raw_output == "applied 1 hunk to `big.txt`"

    replay = RecordingClient()

    async def second_process():
        async with acp.agent("edit_one_line.yaml", replay) as agent:
            await agent.initialize()
            await agent.call(agent.conn.load_session(cwd=str(acp.project), session_id=session, mcp_servers=[]))

    acp.run(second_process())
    (call,) = replay.tool_calls()
    replayed = next(c for c in call.content if c.type == "diff")
    assert (replayed.path, replayed.old_text, replayed.new_text) == (diff.path, diff.old_text, diff.new_text)
