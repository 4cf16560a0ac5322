"""session/cancel while a tool runs: the tool is stopped and the prompt
answers `cancelled` at once."""

import asyncio
import os
import time

from support import RecordingClient

# The command sleeps 30 s: a prompt answered well before that was cancelled,
# not finished.
CANCEL_BOUND = 15.0


def gone(argv: list, timeout: float = 10.0) -> bool:
    """Whether no process runs `argv` (zombies aside) within `timeout`."""
    wanted = "\0".join(argv).encode() + b"\0"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(
            cmdline == wanted and not zombie
            for cmdline, zombie in processes()
        ):
            return True
        time.sleep(0.05)
    return False


def processes():
    """(command line, is a zombie) of every process on the machine."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        yield cmdline, zombie


def test_cancel_mid_tool_stops_the_command_and_ends_the_prompt_cancelled(acp):
    client = RecordingClient(permission="allow_once")

    async def scenario():
        async with acp.agent("slow_command.yaml", client) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            prompt = asyncio.ensure_future(agent.prompt(session, "run it"))
            # Wait until the command runs (its first output streamed).
            await client.wait_for(
                lambda: "started" in client.result_text_of("call_sleep"),
                what="the command's first output", unless=prompt,
            )
            started = time.monotonic()
            await agent.conn.cancel(session_id=session)
            answer = await prompt
            elapsed = time.monotonic() - started
            return answer, elapsed, session

    answer, elapsed, session = acp.run(scenario())
    assert answer.stop_reason == "cancelled"
    assert elapsed < CANCEL_BOUND, f"the cancelled prompt was answered after {elapsed:.1f}s"
    # The command was killed, not left running.
    assert gone(["sleep", "30.0417"]), "the command's sleep still runs after the cancel"
    assert not (acp.project / "finished.txt").exists()
    # The call ends `failed` before the prompt is answered (the updates
    # were all handled when the answer came: the SDK waits for them).
    assert client.statuses_of("call_sleep") == ["pending", "in_progress", "failed"]
    assert "cancelled" in client.result_text_of("call_sleep")
    # After the cancel, no more model text ("It finished." is the script's
    # answer after the tool).
    assert "It finished." not in client.message_text()


def test_cancel_while_the_model_streams_ends_the_prompt_cancelled(acp):
    client = RecordingClient()

    async def scenario():
        async with acp.agent("slow_text.yaml", client) as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            prompt = asyncio.ensure_future(agent.prompt(session, "talk"))
            await client.wait_for(lambda: client.message_text(), what="the first text", unless=prompt)
            await agent.conn.cancel(session_id=session)
            answer = await prompt
            # The session goes on: the next prompt is answered in full.
            client.updates.clear()
            next_answer = await agent.prompt(session, "again, briefly")
            return answer, next_answer

    answer, next_answer = acp.run(scenario())
    assert answer.stop_reason == "cancelled"
    assert next_answer.stop_reason == "end_turn"
    assert client.message_text() == "Short."
