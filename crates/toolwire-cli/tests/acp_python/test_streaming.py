"""run_command's output reaches the client while the command runs: as
appended `_meta.terminal_output` for clients that advertise it (the
convention of codex-acp and claude-agent-acp), else as replaced content,
and in both cases with bounded bytes on the wire."""

from support import Capabilities, RecordingClient

LINES = [f"line {i}" for i in range(1, 6)]


def run_script(acp, script, capabilities):
    client = RecordingClient(permission="allow_once")

    async def scenario():
        async with acp.agent(script, client) as agent:
            await agent.initialize(capabilities)
            session = await agent.new_session(acp.project)
            return agent, await agent.prompt(session, "run it")

    agent, answer = acp.run(scenario())
    assert answer.stop_reason == "end_turn"
    return agent, client


def call_updates(agent, call_id):
    return [
        u for u in agent.wire.updates()
        if u["sessionUpdate"] in ("tool_call", "tool_call_update") and u["toolCallId"] == call_id
    ]


def text_of(update):
    return "".join(
        c["content"].get("text", "")
        for c in update.get("content") or []
        if c.get("type") == "content"
    )


def test_without_terminal_output_the_content_grows_while_the_command_runs(acp):
    agent, client = run_script(acp, "streaming.yaml", Capabilities())
    updates = call_updates(agent, "call_count")
    running = [
        u for u in updates
        if "content" in u and u.get("status") not in ("completed", "failed")
    ]
    # Output arrived before the end: some content that has the first line
    # and not yet the last.
    partial = [u for u in running if "line 1" in text_of(u) and "line 5" not in text_of(u)]
    assert partial, updates
    # Each content replaces the last (ACP v1 overwrites collections): the
    # final one has all the output.
    final = [u for u in updates if "content" in u][-1]
    for line in LINES:
        assert line in text_of(final), final
    client.assert_lifecycle("call_count", "completed")


def test_with_terminal_output_only_the_appended_output_is_sent(acp):
    agent, client = run_script(acp, "streaming.yaml", Capabilities(terminal_output=True))
    updates = call_updates(agent, "call_count")
    chunks = [u["_meta"]["terminal_output"] for u in updates if "terminal_output" in (u.get("_meta") or {})]
    assert len(chunks) >= 2, updates  # it came as it was printed
    terminal_id = chunks[0]["terminal_id"]
    assert all(c["terminal_id"] == terminal_id for c in chunks)
    assert "".join(c["data"] for c in chunks) == "".join(f"{line}\n" for line in LINES)
    # Only appended: the output is not also sent as replaced content.
    assert not any("line 1" in text_of(u) for u in updates), updates
    # The call shows that terminal.
    shown = [c for u in updates for c in u.get("content") or [] if c.get("type") == "terminal"]
    assert shown and all(c["terminalId"] == terminal_id for c in shown), updates
    # Then the exit, after the last output.
    exits = [(i, u["_meta"]["terminal_exit"]) for i, u in enumerate(updates) if "terminal_exit" in (u.get("_meta") or {})]
    assert len(exits) == 1, updates
    index, exit_ = exits[0]
    assert exit_["terminal_id"] == terminal_id
    assert exit_.get("exit_code") == 0, exit_
    last_output = max(i for i, u in enumerate(updates) if "terminal_output" in (u.get("_meta") or {}))
    assert last_output <= index
    client.assert_lifecycle("call_count", "completed")


def agent_bytes_during_prompt(agent):
    """Bytes the agent wrote from the prompt request to its answer."""
    total, counting = 0, False
    for m in agent.wire.messages:
        if m.sender == "client" and isinstance(m.message, dict) and m.message.get("method") == "session/prompt":
            counting = True
        elif counting and m.sender == "agent":
            total += len(m.raw)
    return total


OUTPUT_BYTES = 35_000 * 80


def test_a_big_output_without_terminal_output_keeps_the_wire_bounded(acp):
    agent, client = run_script(acp, "big_output.yaml", Capabilities())
    client.assert_lifecycle("call_big", "completed")
    sent = agent_bytes_during_prompt(agent)
    assert sent <= 50 * 1024 * 1024, f"{sent} bytes on the wire for {OUTPUT_BYTES} bytes of output"


def test_a_big_output_with_terminal_output_costs_little_more_than_the_output(acp):
    agent, client = run_script(acp, "big_output.yaml", Capabilities(terminal_output=True))
    client.assert_lifecycle("call_big", "completed")
    chunks = [
        u["_meta"]["terminal_output"]["data"]
        for u in call_updates(agent, "call_big")
        if "terminal_output" in (u.get("_meta") or {})
    ]
    assert len("".join(chunks)) == OUTPUT_BYTES
    sent = agent_bytes_during_prompt(agent)
    assert sent <= 1.3 * OUTPUT_BYTES, f"{sent} bytes on the wire for {OUTPUT_BYTES} bytes of output"
