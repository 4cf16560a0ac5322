"""The fixtures of Letta's tests/conftest.py that the tests run here use,
for a server outside the process (LETTA_SERVER_URL): the server URL, a
client, and the no-op switches of in-process settings."""

import os

import pytest
from letta_client import Letta


@pytest.fixture(scope="session")
def server_url() -> str:
    return os.environ["LETTA_SERVER_URL"]


@pytest.fixture(scope="session")
def client(server_url: str) -> Letta:
    yield Letta(base_url=server_url)


@pytest.fixture
def disable_e2b_api_key():
    yield
