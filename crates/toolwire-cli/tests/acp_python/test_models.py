"""The model picker and images against model servers over real HTTP: a
small OpenAI-compatible mock (chat completions, streamed) records each
request body. Switching the model between two prompts reaches the other
model; an image prompt's body carries the image as OpenAI's data URL."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from acp import image_block, text_block

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0").decode()


class MockModel:
    """Answers every chat completion with `text`, streamed as OpenAI does;
    keeps the request bodies."""

    def __init__(self, text: str):
        self.bodies = []
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                mock.bodies.append(json.loads(self.rfile.read(length)))
                chunks = [
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}},
                ]
                body = "".join(f"data: {json.dumps({'id': 'm', 'object': 'chat.completion.chunk', **c})}\n\n"
                               for c in chunks) + "data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(body.encode())))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_switching_the_model_reaches_the_other_model_and_images_go_in_its_format(acp):
    alpha, beta = MockModel("From alpha."), MockModel("From beta.")
    try:
        config = acp.home / "toolwire.toml"
        config.write_text(
            'default_model = "alpha"\n'
            f'[models.alpha]\nprovider = "openai"\nmodel = "alpha-1"\nbase_url = "{alpha.url}"\nvision = true\n'
            f'[models.beta]\nprovider = "openai"\nmodel = "beta-1"\nbase_url = "{beta.url}"\n'
        )
        provider = ["--config", str(config)]

        async def body():
            async with acp.agent("answer.yaml", provider=provider) as agent:
                init = await agent.initialize()
                session = await agent.new_session(acp.project)
                first = await agent.call(agent.conn.prompt(
                    session_id=session, prompt=[text_block("What is this?"), image_block(PNG, "image/png")]))
                await agent.call(agent.conn.set_config_option(
                    config_id="model", session_id=session, value="beta"))
                second = await agent.prompt(session, "and you?")
                return init, first, second

        init, first, second = acp.run(body())
    finally:
        alpha.close()
        beta.close()
    # The default model can see: images are offered.
    assert init.agent_capabilities.prompt_capabilities.image is True
    assert first.stop_reason == "end_turn" and second.stop_reason == "end_turn"
    assert len(alpha.bodies) == 1 and len(beta.bodies) == 1, (alpha.bodies, beta.bodies)
    assert alpha.bodies[0]["model"] == "alpha-1"
    assert beta.bodies[0]["model"] == "beta-1"
    user = [m for m in alpha.bodies[0]["messages"] if m["role"] == "user"][-1]["content"]
    assert user[0] == {"type": "text", "text": "What is this?"}, user
    assert user[1]["image_url"]["url"] == f"data:image/png;base64,{PNG}", user
    # The second model read the first one's answer.
    assert "From alpha." in json.dumps(beta.bodies[0]["messages"])
