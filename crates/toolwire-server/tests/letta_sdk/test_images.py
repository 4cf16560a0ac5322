"""`client.agents.messages.create` with an image part (Letta's
`ImageContent` with a base64 source): the turn runs, the image is stored
once by hash and served at `/v1/blobs/{sha256}`, and the history names
it."""

import base64
import hashlib

import httpx
import pytest
from letta_client import BadRequestError

from support import collect, make_agent, of_type

# One red pixel.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def image_message(data: str, media_type: str = "image/png"):
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}},
        ],
    }


def test_an_image_part_is_stored_and_named(serve):
    server = serve("plain.yaml")
    client = server.client()
    _, agent = make_agent(client)

    resp = client.agents.messages.create(
        agent.id, messages=[image_message(base64.b64encode(PNG).decode())]
    )
    assert resp.stop_reason.stop_reason == "end_turn"

    sha = hashlib.sha256(PNG).hexdigest()
    history = collect(client.agents.messages.list(agent.id, order="asc"))
    user = of_type(history, "user_message")[0]
    assert user.content.startswith("What is in this picture?\n[image: image/png, 70 B, sha256 ")
    assert sha[:12] in user.content

    blob = httpx.get(f"{server.url}/v1/blobs/{sha}")
    assert blob.status_code == 200
    assert blob.headers["content-type"] == "image/png"
    assert blob.headers["x-content-type-options"] == "nosniff"
    assert blob.content == PNG


def test_a_bad_image_is_refused(serve):
    client = serve("plain.yaml").client()
    _, agent = make_agent(client)
    with pytest.raises(BadRequestError) as refused:
        client.agents.messages.create(
            agent.id, messages=[image_message(base64.b64encode(b"<svg/>").decode(), "image/svg+xml")]
        )
    assert "declared as image/svg+xml" in str(refused.value)
