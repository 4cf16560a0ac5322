"""`client.models` and an agent's `model`: the server plays a script by
default and has one more model configured, `gpt-4o-mini` on a mock
OpenAI server over loopback (the real chat-completions SSE format); an
agent created with Letta's handle `openai/gpt-4o-mini` is answered by it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List

import pytest
from letta_client import NotFoundError

from support import one

MOCK_ANSWER = "Answered by the mock gpt-4o-mini."


class MockOpenAI:
    """A chat-completions server on 127.0.0.1 that answers every request
    with MOCK_ANSWER as an SSE stream and records the request bodies."""

    def __init__(self) -> None:
        self.requests: List[dict] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                requests.append({"path": self.path, "body": body})
                chunks = [
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                    {"choices": [{"index": 0, "delta": {"content": MOCK_ANSWER}}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                ]
                payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
                payload += "data: [DONE]\n\n"
                data = payload.encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mock_openai():
    mock = MockOpenAI()
    yield mock
    mock.close()


def config_for(mock: MockOpenAI) -> str:
    return (
        "[models.mini]\n"
        'provider = "openai"\n'
        'model = "gpt-4o-mini"\n'
        f'base_url = "{mock.url}"\n'
        "context_window = 128000\n"
    )


def test_an_agent_made_with_a_handle_is_answered_by_that_model(serve, mock_openai):
    client = serve("plain.yaml", config=config_for(mock_openai)).client()

    agent = client.agents.create(
        name="on-mini", model="openai/gpt-4o-mini", include_base_tools=False
    )
    assert agent.model == "openai/gpt-4o-mini"
    assert agent.llm_config.model == "gpt-4o-mini"
    assert agent.llm_config.handle == "openai/gpt-4o-mini"
    resp = client.agents.messages.create(
        agent.id, messages=[{"role": "user", "content": "Who answers?"}]
    )
    assert resp.stop_reason.stop_reason == "end_turn"
    assert one(resp.messages, "assistant_message").content == MOCK_ANSWER
    assert len(mock_openai.requests) == 1
    asked = mock_openai.requests[0]
    assert asked["path"] == "/v1/chat/completions"
    assert asked["body"]["model"] == "gpt-4o-mini"
    assert asked["body"]["messages"][-1]["content"] == "Who answers?"

    # An agent without a model: the default, the script.
    plain = client.agents.create(name="default", include_base_tools=False)
    resp = client.agents.messages.create(
        plain.id, messages=[{"role": "user", "content": "And you?"}]
    )
    assert one(resp.messages, "assistant_message").content == "Hello from the script."
    assert len(mock_openai.requests) == 1


def test_models_lists_the_configured_models(serve, mock_openai):
    client = serve("plain.yaml", config=config_for(mock_openai)).client()
    models = client.models.list()
    by_handle = {m.handle: m for m in models}
    # The script's model (the default, first) and the configured one.
    assert models[0].handle == "scripted/scripted-sdk"
    mini = by_handle["openai/gpt-4o-mini"]
    assert mini.name == mini.model == "gpt-4o-mini"
    assert mini.display_name == "mini"
    assert mini.provider_type == "openai"
    assert mini.context_window == mini.max_context_window == 128000

    # Every listed handle makes an agent; another is Letta's 404.
    for model in models:
        agent = client.agents.create(model=model.handle, include_base_tools=False)
        assert agent.llm_config.model == model.model
    with pytest.raises(NotFoundError) as raised:
        client.agents.create(model="google_ai/gemini-2.5-pro", include_base_tools=False)
    assert "google_ai/gemini-2.5-pro" in str(raised.value)
