"""The model's task list (`update_plan`) reaches the editor as a plan."""


def test_an_update_plan_call_is_a_plan_update_not_a_tool_call(acp):
    async def scenario():
        async with acp.agent("plan.yaml") as agent:
            await agent.initialize()
            session = await agent.new_session(acp.project)
            answer = await agent.prompt(session, "make a plan")
            return agent, answer

    agent, answer = acp.run(scenario())
    client = agent.client
    assert answer.stop_reason == "end_turn"
    plans = client.session_updates("plan")
    assert len(plans) == 1, plans
    assert [(e.content, e.status, e.priority) for e in plans[0].entries] == [
        ("Read the notes", "completed", "medium"),
        ("Write the summary", "in_progress", "medium"),
        ("Run the tests", "pending", "medium"),
    ]
    # Shown as the plan only: no tool call, nothing asked.
    assert client.tool_calls() == []
    assert client.permission_requests == []
    # The plan comes before the answer's text.
    kinds = [u["sessionUpdate"] for u in agent.wire.updates()]
    assert kinds.index("plan") < len(kinds) - 1 - kinds[::-1].index("agent_message_chunk")
    assert client.message_text() == "Planning.Plan made."
