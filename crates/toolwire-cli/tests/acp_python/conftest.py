"""Fixtures of the ACP tests: real `toolwire acp` processes (the scripted
model, a temporary SQLite database, a temporary project as the session's
cwd), driven over their stdio by the client side of the real
`agent-client-protocol` SDK from PyPI.

The binary is TOOLWIRE_BIN, else target/debug/toolwire (CARGO_TARGET_DIR
respected): `scripts/test` builds it. Every message either side sends is
validated against ACP's JSON schema (see support.py); a test fails on any
message the schema rejects, and on an agent that does not exit cleanly
when its stdin closes. Each agent's stderr log is printed at the end of its
test (pytest shows it when the test fails).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from support import TIMEOUT, AgentProcess, RecordingClient, SchemaCheck

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
REPO = HERE.parents[3]

# The longest a whole test may take.
TEST_TIMEOUT = 4 * TIMEOUT


def _binary() -> str:
    path = os.environ.get("TOOLWIRE_BIN")
    if not path:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
        path = str(target / "debug" / "toolwire")
    if not os.access(path, os.X_OK):
        raise pytest.UsageError(
            f"{path} is not an executable file: build it (cargo build -p toolwire-cli) "
            "or point TOOLWIRE_BIN at a built `toolwire`"
        )
    return path


def _agent_env() -> dict:
    """The caller's environment without anything that would configure the
    agent behind the test's back (TOOLWIRE_*: config, keys, provider)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env.setdefault("RUST_LOG", "info")
    env.setdefault("RUST_BACKTRACE", "1")
    env["NO_COLOR"] = "1"
    return env


_SCHEMA: Optional[SchemaCheck] = None


def schema() -> SchemaCheck:
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = SchemaCheck()
    return _SCHEMA


class Acp:
    """A test's agents: all on one database (so a later process can load an
    earlier one's session), each playing a script from scripts/."""

    def __init__(self, tmp_path: Path):
        self.home = tmp_path
        self.project = tmp_path / "project"
        self.project.mkdir()
        self.db = f"sqlite://{tmp_path / 't.db'}"
        self.agents: List[AgentProcess] = []

    def agent(
        self,
        script: str,
        client: Optional[RecordingClient] = None,
        args: Tuple[str, ...] = (),
        provider: Optional[List[str]] = None,
    ) -> AgentProcess:
        """An agent process (start it with `async with`) playing
        scripts/`script`, with `client` (a new RecordingClient if None),
        `provider` (flags) in place of the scripted model when given, and
        `args` after the others (a `--config`, say)."""
        index = len(self.agents)
        script_path = self.home / f"script-{index}.yaml"
        shutil.copyfile(SCRIPTS / script, script_path)
        argv = [
            _binary(), "acp",
            *(provider or ["--provider", "scripted", "--script", str(script_path)]),
            "--db", self.db,
            *args,
        ]
        agent = AgentProcess(
            # In the project, as editors start agents.
            argv, cwd=self.project, env=_agent_env(), log_path=self.home / f"agent-{index}.log",
            client=client or RecordingClient(), check=schema(),
        )
        self.agents.append(agent)
        return agent

    def run(self, coro, timeout: float = TEST_TIMEOUT):
        """Runs a test's async body to its end."""

        async def bounded():
            return await asyncio.wait_for(coro, timeout)

        return asyncio.run(bounded())

    def finish(self) -> None:
        errors = []
        for index, agent in enumerate(self.agents):
            try:
                log = agent.log_path.read_text(errors="replace")
            except FileNotFoundError:
                log = ""
            print(f"----- toolwire acp #{index}: {agent.log_path} -----\n{log}")
            if agent.proc is not None and not agent.wire.messages:
                errors.append(f"toolwire acp #{index}: nothing went over the wire (is the tee broken?)")
            report = agent.wire.report()
            if report:
                errors.append(f"toolwire acp #{index}:\n{report}")
            status = getattr(agent, "exit_status", None)
            if agent.proc is not None and status != 0:
                errors.append(f"toolwire acp #{index} exited with {status!r} after its stdin closed")
        if errors:
            raise AssertionError("\n".join(errors))


@pytest.fixture
def acp(tmp_path):
    harness = Acp(tmp_path)
    yield harness
    harness.finish()
