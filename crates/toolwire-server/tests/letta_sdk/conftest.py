"""Fixtures of the Letta SDK tests: a real `toolwire serve` process per
test (or several: a test may stop one and start another on the same
database), driven over loopback by the real `letta-client` SDK.

The binary comes from TOOLWIRE_BIN (`scripts/test` builds it and sets it).
Each server gets its own temporary directory: the SQLite database, the
workspace, the script it plays and its log. The log is printed when the
test ends, so a failing test shows what the server said.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional

import httpx
import pydantic
import pytest
from letta_client import Letta
from letta_client._models import validate_type
from letta_client.types import AgentState, Tool
from letta_client.types.agents.message import Message

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"

# How long a server may take to answer after it starts, and to stop.
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
# Per-request timeout of the SDK clients: a hung request fails the test
# instead of hanging the suite.
REQUEST_TIMEOUT = 30.0


# The SDK checks responses against its models when asked
# (_strict_response_validation), except the items of list pages, which it
# always builds leniently: these are checked here, page by page, with the
# SDK's own models.
LIST_ITEM_MODELS = [
    (re.compile(r"^/v1/tools/?$"), Tool),
    (re.compile(r"^/v1/agents/?$"), AgentState),
    (re.compile(r"^/v1/agents/[^/]+/tools/?$"), Tool),
    (re.compile(r"^/v1/agents/[^/]+/messages/?$"), Message),
]


def _binary() -> str:
    path = os.environ.get("TOOLWIRE_BIN")
    if not path:
        raise pytest.UsageError(
            "TOOLWIRE_BIN is not set: point it at a built `toolwire` binary "
            "(cargo build -p toolwire-cli; scripts/test does both)"
        )
    if not os.access(path, os.X_OK):
        raise pytest.UsageError(f"TOOLWIRE_BIN={path} is not an executable file")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_env() -> dict:
    """The caller's environment without anything that would configure the
    server behind the test's back (TOOLWIRE_*: keys, config, provider)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env.setdefault("RUST_LOG", "info,toolwire_server=debug")
    env.setdefault("RUST_BACKTRACE", "1")
    return env


class Server:
    """One `toolwire serve` process on a database in `home`."""

    def __init__(
        self, home: Path, workspace: Path, script: Path, config: Optional[Path], index: int
    ):
        self.home = home
        self.script = script
        self.config = config
        self.db = f"sqlite://{home / 't.db'}"
        self.workspace = workspace
        self.log_path = home / f"server-{index}.log"
        self.proc: Optional[subprocess.Popen] = None
        self.port: Optional[int] = None
        # List items that the SDK's models reject (see LIST_ITEM_MODELS).
        self.invalid: List[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Server":
        # The free port may be taken between the probe and the bind: try
        # a few.
        for _ in range(5):
            self.port = _free_port()
            args = [
                _binary(), "serve",
                "--addr", f"127.0.0.1:{self.port}",
                "--db", self.db,
                "--provider", "scripted",
                "--script", str(self.script),
                "--workspace", str(self.workspace),
            ]
            if self.config is not None:
                args += ["--config", str(self.config)]
            log = open(self.log_path, "ab")
            log.write(f"$ {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                args, cwd=self.home, env=_server_env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
            log.close()
            if self._wait_until_up():
                return self
            if "could not listen" not in self.log():
                break
        raise RuntimeError(f"toolwire serve did not start:\n{self.log()}")

    def _wait_until_up(self) -> bool:
        """Polls until the server answers HTTP (any status) or exits."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/openapi.json", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True  # it answered
            except OSError:
                time.sleep(0.05)
        self.stop(kill=True)
        raise RuntimeError(f"toolwire serve did not answer within {START_TIMEOUT}s:\n{self.log()}")

    def stop(self, kill: bool = False) -> Optional[int]:
        """Stops the process: SIGTERM (graceful) or SIGKILL. Returns its exit
        status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)
            raise RuntimeError(f"toolwire serve did not stop on SIGTERM:\n{self.log()}")

    def restart(self, kill: bool = False) -> "Server":
        """A new process on the same database (and script, and config)."""
        self.stop(kill=kill)
        return self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def client(self, **options) -> Letta:
        """An SDK client of this server. No retries (a retried request would
        hide what the server answered first) and strict response validation
        (every response must match the SDK's models), unless overridden."""
        options.setdefault("max_retries", 0)
        options.setdefault("timeout", REQUEST_TIMEOUT)
        options.setdefault("_strict_response_validation", True)
        if options["_strict_response_validation"] and "http_client" not in options:
            options["http_client"] = httpx.Client(
                event_hooks={"response": [self._check_list_items]}
            )
        return Letta(base_url=self.url, **options)

    def _check_list_items(self, response: httpx.Response) -> None:
        """Records the items of a list page that the SDK's models reject.
        (Raising here would reach the test as an APIConnectionError.)"""
        request = response.request
        if request.method != "GET" or response.status_code != 200:
            return
        model = next(
            (m for pattern, m in LIST_ITEM_MODELS if pattern.match(request.url.path)), None
        )
        if model is None:
            return
        response.read()
        items = response.json()
        if not isinstance(items, list):
            self.invalid.append(f"GET {request.url}: not a JSON array: {items!r:.500}")
            return
        for item in items:
            try:
                validate_type(type_=model, value=item)
            except pydantic.ValidationError as e:
                what = item.get("id") if isinstance(item, dict) else item
                for err in e.errors():
                    loc = ".".join(str(p) for p in err["loc"])
                    line = (
                        f"GET {request.url.path}: item {what}: "
                        f"{loc}: {err['msg']} (got {err.get('input')!r})"
                    )
                    if line not in self.invalid:
                        self.invalid.append(line)


class Servers:
    """Starts servers for one test and stops them all at its end."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        # One workspace for the test's servers, as for a server restarted
        # in the same directory: their tools may write only there (and in
        # their own temp dir), so the files a test's tools write live here.
        self.workspace = tmp_path / "workspace"
        self.workspace.mkdir()
        self.started: List[Server] = []

    def start(self, script: str, *, config: Optional[str] = None) -> Server:
        """Starts a server playing `script` (a file name in scripts/, or
        the script's text), with `config` as its TOML config file."""
        home = self.tmp_path / f"server{len(self.started)}"
        home.mkdir()
        script_path = home / "script.yaml"
        if (SCRIPTS / script).is_file():
            shutil.copyfile(SCRIPTS / script, script_path)
        else:
            script_path.write_text(script)
        config_path = None
        if config is not None:
            config_path = home / "config.toml"
            config_path.write_text(config)
        server = Server(home, self.workspace, script_path, config_path, len(self.started))
        self.started.append(server)
        return server.start()

    def stop_all(self) -> None:
        errors = []
        for server in self.started:
            try:
                status = server.stop()
                if status not in (None, 0):
                    errors.append(f"toolwire serve exited with status {status} on SIGTERM")
            except RuntimeError as e:
                errors.append(str(e))
            print(f"----- {server.log_path} -----\n{server.log()}")
            if server.invalid:
                errors.append(
                    "list items that letta-client's models reject:\n" + "\n".join(server.invalid)
                )
        if errors:
            raise AssertionError("\n".join(errors))


@pytest.fixture(autouse=True)
def _no_letta_env(monkeypatch):
    """The SDK reads these; a developer's shell must not change the tests."""
    for name in ("LETTA_API_KEY", "LETTA_BASE_URL", "LETTA_CUSTOM_HEADERS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def servers(tmp_path):
    s = Servers(tmp_path)
    yield s
    s.stop_all()


@pytest.fixture
def workspace(servers):
    """The servers' workspace: the one place outside their temp dir where
    their Python tools may write (the sandbox refuses the rest)."""
    return servers.workspace


@pytest.fixture
def serve(servers):
    """`serve(script, config=None)` starts a server and returns it."""
    return servers.start
