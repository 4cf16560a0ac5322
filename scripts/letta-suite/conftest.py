"""The fixtures of Letta's tests/conftest.py that the tests run here use,
for a server outside the process (LETTA_SERVER_URL): the server URL, a
client, and the no-op switches of in-process settings.

letta-client 1.12.1 dropped `tools.upsert_from_function`, a helper that
never reached the server on its own: it read the function's source and
called `tools.upsert`. Two of the files' fixtures still call it, so with
that SDK they would fail before sending anything. For SDKs without it,
the helper is put back here as 1.7.12 has it, so those files test the
newer SDK's requests and answers rather than a missing method."""

import inspect
import os
from textwrap import dedent

import pytest
from letta_client import Letta
from letta_client.resources.tools import AsyncToolsResource, ToolsResource


def _upsert_arguments(func, args_schema=None, **rest) -> dict:
    # Exactly 1.7.12's helper: the source, and the schema of a pydantic model.
    arguments = {"source_code": dedent(inspect.getsource(func)), **rest}
    if args_schema is not None:
        arguments["args_json_schema"] = args_schema.model_json_schema()
    return arguments


if not hasattr(ToolsResource, "upsert_from_function"):

    def _upsert_from_function(self, *, func, args_schema=None, **rest):
        return self.upsert(**_upsert_arguments(func, args_schema, **rest))

    async def _async_upsert_from_function(self, *, func, args_schema=None, **rest):
        return await self.upsert(**_upsert_arguments(func, args_schema, **rest))

    ToolsResource.upsert_from_function = _upsert_from_function
    AsyncToolsResource.upsert_from_function = _async_upsert_from_function


@pytest.fixture(scope="session")
def server_url() -> str:
    return os.environ["LETTA_SERVER_URL"]


@pytest.fixture(scope="session")
def client(server_url: str) -> Letta:
    yield Letta(base_url=server_url)


@pytest.fixture
def disable_e2b_api_key():
    yield
