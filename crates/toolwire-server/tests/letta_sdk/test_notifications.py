"""Notifications posted to an agent (`POST /v1/agents/{id}/notifications`,
toolwire's own route beside the Letta API) wait for its next message, and
a restart of the server does not lose them, whether it was asked to stop or
killed."""

import sqlite3
import time

import httpx
import pytest

from support import types

BLOCK = "<notifications count=\"1\">\n- [ci] deploy finished (exit 0)\n</notifications>"


def kept(server) -> int:
    """How many conversations have notifications kept in the server's
    database."""
    db = sqlite3.connect(server.home / "t.db")
    try:
        (n,) = db.execute(
            "SELECT count(*) FROM documents WHERE kind = 'pending_notifications'"
        ).fetchone()
        return n
    finally:
        db.close()


def wait_until_kept(server, want: int) -> None:
    deadline = time.monotonic() + 10
    while kept(server) != want:
        assert time.monotonic() < deadline, f"kept {kept(server)}, want {want}"
        time.sleep(0.02)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_a_notification_posted_before_a_restart_comes_with_the_next_message(serve, kill):
    server = serve("plain.yaml")
    client = server.client()
    agent = client.agents.create(
        name="notified", system="You are a test agent.", include_base_tools=False
    )
    posted = httpx.post(
        f"{server.url}/v1/agents/{agent.id}/notifications",
        json={"source": "ci", "text": "deploy finished (exit 0)"},
        timeout=30,
    )
    assert posted.status_code == 200, posted.text
    assert posted.json()["status"] == "queued"
    if kill:
        # Killed, the server writes nothing more: it was kept already.
        wait_until_kept(server, 1)

    server.restart(kill=kill)
    client = server.client()

    resp = client.agents.messages.create(
        agent.id, messages=[{"role": "user", "content": "news?"}]
    )
    assert types(resp.messages) == ["system_message", "assistant_message"]
    assert resp.messages[0].content == BLOCK
    # Delivered: nothing is kept any more, and it comes once.
    wait_until_kept(server, 0)
    resp = client.agents.messages.create(
        agent.id, messages=[{"role": "user", "content": "more news?"}]
    )
    assert types(resp.messages) == ["assistant_message"]
