"""What the ACP tests share: the agent process with a tee on its stdio that
keeps every JSON-RPC message, the schema check of those messages, and a
recording client (the Client interface of the `agent-client-protocol` SDK)
that answers permission requests as a test tells it to and serves files and
terminals like an editor would.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

import jsonschema
from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    CreateTerminalResponse,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    KillTerminalResponse,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)

HERE = Path(__file__).resolve().parent
SCHEMA_FILE = HERE / "schema" / "acp-v1-schema-1.21.0-unstable.json"

# Generous bounds: a slow machine must not fail a test, a hung agent must.
TIMEOUT = 60.0
# A line of the protocol may be long (a tool's whole output).
LINE_LIMIT = 64 * 1024 * 1024


# ---------------------------------------------------------------------------
# The schema check


class SchemaCheck:
    """Validates JSON-RPC messages against ACP's schema: each method's
    params, result or error against its own definition, found by the
    definitions' `x-method` and `x-side` (the side that handles the
    method; `protocol` for either)."""

    def __init__(self, path: Path = SCHEMA_FILE):
        self.schema = json.loads(path.read_text())
        self.defs: Dict[str, Any] = self.schema["$defs"]
        self._validators: Dict[str, jsonschema.Draft202012Validator] = {}
        # (x-side, x-method, "Request" | "Response" | "Notification") -> name
        self.by_method: Dict[Tuple[str, str, str], str] = {}
        for name, d in self.defs.items():
            if "x-method" not in d:
                continue
            for what in ("Request", "Response", "Notification"):
                if name.endswith(what):
                    self.by_method[(d["x-side"], d["x-method"], what)] = name

    def validator(self, name: str) -> jsonschema.Draft202012Validator:
        if name not in self._validators:
            schema = {
                "$schema": self.schema["$schema"],
                "$defs": self.defs,
                "$ref": f"#/$defs/{name}",
            }
            self._validators[name] = jsonschema.Draft202012Validator(schema)
        return self._validators[name]

    def errors(self, name: str, value: Any) -> List[str]:
        out = []
        for e in self.validator(name).iter_errors(value):
            out.extend(_explain(e, f"{name} at "))
        return out


def _explain(error: jsonschema.ValidationError, prefix: str = "", depth: int = 0) -> List[str]:
    """The error, and for an anyOf/oneOf the errors of the branch the value
    was most likely meant for: not one whose tag (a `const`) it misses, and
    of those the one with the fewest errors."""
    where = "/".join(str(p) for p in error.absolute_path) or "(top)"
    lines = [f"{'    ' * depth}{prefix}{where}: {error.message}"]
    if not error.context or depth > 4:
        return lines
    branches: Dict[Any, List[jsonschema.ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    untagged = {k: v for k, v in branches.items() if not any(s.validator == "const" for s in v)}
    candidates = untagged or branches
    best = min(candidates.values(), key=len)
    for sub in best[:8]:
        lines.extend(_explain(sub, "", depth + 1))
    return lines


@dataclass
class WireMessage:
    """One line of the protocol, as it was on the wire."""

    sender: str  # "agent" or "client"
    raw: bytes
    message: Any = None  # the parsed JSON (None if it did not parse)
    problems: List[str] = field(default_factory=list)

    def short(self) -> str:
        text = self.raw.decode("utf-8", errors="replace").rstrip("\n")
        return text if len(text) <= 600 else text[:600] + f"... ({len(text)} bytes)"


class WireLog:
    """Every message of one connection, in the order they were sent, each
    checked against the schema when it is recorded."""

    def __init__(self, check: SchemaCheck):
        self.check = check
        self.messages: List[WireMessage] = []
        # Requests waiting for their response: (sender, id) -> method.
        self._requests: Dict[Tuple[str, Any], str] = {}

    def record(self, sender: str, raw: bytes) -> None:
        item = WireMessage(sender, raw)
        self.messages.append(item)
        try:
            item.message = json.loads(raw)
        except ValueError as e:
            item.problems.append(f"not JSON: {e}")
            return
        item.problems.extend(self._problems(sender, item.message))

    def _problems(self, sender: str, msg: Any) -> List[str]:
        other = "client" if sender == "agent" else "agent"
        if not isinstance(msg, dict):
            return ["not a JSON object (batches are not used by ACP)"]
        problems = []
        if msg.get("jsonrpc") != "2.0":
            problems.append(f'"jsonrpc" is {msg.get("jsonrpc")!r}, not "2.0"')
        method = msg.get("method")
        if method is not None:
            kind = "Request" if "id" in msg else "Notification"
            if kind == "Request":
                if not isinstance(msg["id"], (int, str)) or isinstance(msg["id"], bool):
                    problems.append(f"request id {msg['id']!r} is not a number or string")
                self._requests[(sender, json.dumps(msg["id"]))] = method
            # The method is handled by the other side, or by either
            # (protocol level: `$/cancel_request`).
            name = self.check.by_method.get((other, method, kind)) or self.check.by_method.get(
                ("protocol", method, kind)
            )
            if name is None:
                if isinstance(method, str) and method.startswith("_"):
                    return problems  # an extension method: free-form
                return problems + [f"{method!r} is no {kind.lower()} that the {other} handles in ACP v1"]
            if "params" not in msg:
                return problems + [f"{method}: no params"]
            return problems + self.check.errors(name, msg["params"])
        if "id" not in msg:
            return problems + ["neither a request, a response nor a notification"]
        key = (other, json.dumps(msg["id"]))
        method = self._requests.pop(key, None)
        if method is None:
            return problems + [f"a response to id {msg['id']!r}, which the {other} never sent (or was answered)"]
        has_result, has_error = "result" in msg, "error" in msg
        if has_result == has_error:
            return problems + [f"a response to {method} needs exactly one of result and error"]
        if has_error:
            return problems + self.check.errors("Error", msg["error"])
        name = self.check.by_method.get((sender, method, "Response"))
        if name is None:
            if method.startswith("_"):
                return problems
            return problems + [f"no response type for {method}"]
        return problems + self.check.errors(name, msg["result"])

    def invalid(self) -> List[WireMessage]:
        return [m for m in self.messages if m.problems]

    def report(self) -> str:
        lines = []
        for m in self.invalid():
            lines.append(f"{m.sender} sent a message that ACP's schema rejects: {m.short()}")
            lines.extend(f"  - {p}" for p in m.problems)
        return "\n".join(lines)

    def sent_by(self, sender: str) -> List[dict]:
        return [m.message for m in self.messages if m.sender == sender and isinstance(m.message, dict)]

    def updates(self) -> List[dict]:
        """The `update` of every session/update the agent sent, in order."""
        return [
            m["params"]["update"]
            for m in self.sent_by("agent")
            if m.get("method") == "session/update"
        ]


# ---------------------------------------------------------------------------
# The client


PermissionAnswer = Union[str, None, Callable[[Any], Awaitable[Optional[str]]]]


@dataclass
class Terminal:
    """A terminal the agent asked for: a real process."""

    id: str
    command: str
    args: List[str]
    proc: asyncio.subprocess.Process
    output: bytearray = field(default_factory=bytearray)
    reader: Optional[asyncio.Task] = None
    released: bool = False
    killed: bool = False

    def exit_status(self) -> Optional[TerminalExitStatus]:
        code = self.proc.returncode
        if code is None or self.reader is None or not self.reader.done():
            return None
        if code < 0:
            return TerminalExitStatus(exit_code=None, signal=f"signal {-code}")
        return TerminalExitStatus(exit_code=code)


class RecordingClient:
    """An ACP client, as the SDK's Client interface: keeps every update and
    request it gets. Permission requests are answered with `permission`: an
    option id, None (the `cancelled` outcome) or an async function of the
    request that returns one of these. File requests use `buffers` (unsaved
    editor buffers: absolute path -> text) before the disk; terminals run
    real processes."""

    def __init__(self, permission: PermissionAnswer = "allow_once"):
        self.permission = permission
        self.updates: List[Tuple[str, Any]] = []  # (session id, update model)
        self.permission_requests: List[Any] = []
        self.reads: List[Tuple[str, Optional[int], Optional[int]]] = []
        self.writes: List[Tuple[str, str]] = []
        self.buffers: Dict[str, str] = {}
        self.terminals: Dict[str, Terminal] = {}
        self.terminal_calls: List[Tuple[str, str]] = []  # (method, terminal id or command)
        self.ext: List[Tuple[str, Any]] = []
        self._changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], *, what: str,
                       unless: Optional[asyncio.Future] = None, timeout: float = TIMEOUT) -> None:
        """Waits until `predicate()` holds (checked at each update and
        request the client gets); fails if `unless` (say, the prompt) ends
        first."""

        async def until():
            async with self._changed:
                await self._changed.wait_for(predicate)

        waiter = asyncio.ensure_future(until())
        pending = [waiter] + ([unless] if unless is not None else [])
        done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return
        waiter.cancel()
        if unless is not None and unless in done:
            raise AssertionError(f"ended before {what}: {unless.result()!r}")
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    # -- Client interface -------------------------------------------------

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.permission_requests.append((session_id, tool_call, options))
        await self._notify()
        answer = self.permission
        if callable(answer):
            answer = await answer(tool_call)
        if answer is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=answer, outcome="selected"))

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append((session_id, update))
        await self._notify()

    async def read_text_file(self, session_id, path, line=None, limit=None, **kwargs):
        self.reads.append((path, line, limit))
        await self._notify()
        if path in self.buffers:
            text = self.buffers[path]
        else:
            try:
                text = Path(path).read_text()
            except FileNotFoundError:
                # As editors answer: ACP's "resource not found".
                raise RequestError.resource_not_found(path) from None
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            end = start + limit if limit is not None else None
            text = "".join(lines[start:end])
        return ReadTextFileResponse(content=text)

    async def write_text_file(self, session_id, path, content, **kwargs):
        self.writes.append((path, content))
        Path(path).write_text(content)
        self.buffers.pop(path, None)
        await self._notify()
        return WriteTextFileResponse()

    async def create_terminal(self, session_id, command, args=None, env=None, cwd=None, output_byte_limit=None, **kwargs):
        self.terminal_calls.append(("terminal/create", command))
        environ = dict(os.environ)
        for var in env or []:
            environ[var.name] = var.value
        argv = [command, *(args or [])]
        if not args:
            # One string with no args: a shell command line.
            argv = ["sh", "-c", command]
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=environ,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        tid = f"term-{len(self.terminals) + 1}"
        term = Terminal(tid, command, list(args or []), proc)

        async def read():
            while chunk := await proc.stdout.read(65536):
                term.output.extend(chunk)
            await proc.wait()

        term.reader = asyncio.ensure_future(read())
        self.terminals[tid] = term
        await self._notify()
        return CreateTerminalResponse(terminal_id=tid)

    async def terminal_output(self, session_id, terminal_id, **kwargs):
        self.terminal_calls.append(("terminal/output", terminal_id))
        term = self.terminals[terminal_id]
        return TerminalOutputResponse(
            output=term.output.decode("utf-8", errors="replace"),
            truncated=False,
            exit_status=term.exit_status(),
        )

    async def wait_for_terminal_exit(self, session_id, terminal_id, **kwargs):
        self.terminal_calls.append(("terminal/wait_for_exit", terminal_id))
        term = self.terminals[terminal_id]
        await term.reader
        status = term.exit_status()
        return WaitForTerminalExitResponse(exit_code=status.exit_code, signal=status.signal)

    async def kill_terminal(self, session_id, terminal_id, **kwargs):
        self.terminal_calls.append(("terminal/kill", terminal_id))
        term = self.terminals[terminal_id]
        term.killed = True
        if term.proc.returncode is None:
            try:
                os.killpg(term.proc.pid, 9)
            except ProcessLookupError:
                pass
        return KillTerminalResponse()

    async def release_terminal(self, session_id, terminal_id, **kwargs):
        self.terminal_calls.append(("terminal/release", terminal_id))
        await self.kill_terminal(session_id, terminal_id)
        self.terminals[terminal_id].released = True
        return ReleaseTerminalResponse()

    async def ext_method(self, method, params):
        self.ext.append((method, params))
        return {}

    async def ext_notification(self, method, params):
        self.ext.append((method, params))

    def on_connect(self, conn) -> None:
        pass

    async def close(self) -> None:
        for term in self.terminals.values():
            if term.proc.returncode is None:
                try:
                    os.killpg(term.proc.pid, 9)
                except ProcessLookupError:
                    pass
            if term.reader is not None:
                try:
                    await asyncio.wait_for(term.reader, 5)
                except (asyncio.TimeoutError, Exception):
                    pass

    # -- What the tests look at ------------------------------------------

    def session_updates(self, kind: Optional[str] = None) -> List[Any]:
        return [u for _, u in self.updates if kind is None or u.session_update == kind]

    def message_text(self) -> str:
        return "".join(u.content.text for u in self.session_updates("agent_message_chunk"))

    def tool_calls(self) -> List[Any]:
        return self.session_updates("tool_call")

    def updates_of(self, tool_call_id: str) -> List[Any]:
        return [
            u for _, u in self.updates
            if u.session_update in ("tool_call", "tool_call_update") and u.tool_call_id == tool_call_id
        ]

    def statuses_of(self, tool_call_id: str) -> List[str]:
        """The statuses the call went through. A `tool_call` without a
        status is `pending` (ACP's default, which may be left out)."""
        return [
            u.status or "pending"
            for u in self.updates_of(tool_call_id)
            if u.status is not None or u.session_update == "tool_call"
        ]

    def assert_lifecycle(self, tool_call_id: str, final: str, ran: bool = True) -> None:
        """The call's statuses follow ACP's order: pending first, then
        in_progress (if it `ran`; a short call may go straight to its end,
        its updates coalesced), then `final`, and nothing after it."""
        statuses = self.statuses_of(tool_call_id)
        allowed = [["pending", final]]
        if ran:
            allowed.append(["pending", "in_progress", final])
        assert statuses in allowed, f"{tool_call_id}: statuses {statuses}, expected one of {allowed}"
        updates = self.updates_of(tool_call_id)
        last = max(i for i, u in enumerate(updates) if u.status is not None or i == 0)
        assert last == len(updates) - 1, f"{tool_call_id}: updates after its final status: {updates[last + 1:]}"

    def result_text_of(self, tool_call_id: str) -> str:
        """The text of the call's last content."""
        content = None
        for u in self.updates_of(tool_call_id):
            if u.content is not None:
                content = u.content
        return "".join(
            c.content.text for c in content or [] if c.type == "content" and c.content.type == "text"
        )


# ---------------------------------------------------------------------------
# The agent process, teed


class _PipeWriterProtocol(asyncio.Protocol):
    """Flow control of a pipe the SDK writes to (what StreamWriter.drain
    waits on)."""

    def __init__(self) -> None:
        self._paused = False
        self._waiters: List[asyncio.Future] = []

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for w in self._waiters:
            if not w.done():
                w.set_result(None)
        self._waiters.clear()

    def connection_lost(self, exc) -> None:
        self.resume_writing()

    async def _drain_helper(self) -> None:
        if self._paused:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


@dataclass
class Capabilities:
    """What the test client advertises in `initialize`."""

    fs: bool = False
    terminal: bool = False
    terminal_output: bool = False  # the `_meta.terminal_output` convention

    def model(self) -> ClientCapabilities:
        return ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=self.fs, write_text_file=self.fs),
            terminal=self.terminal,
            field_meta={"terminal_output": True} if self.terminal_output else None,
        )


class AgentProcess:
    """One `toolwire acp` process, connected to the SDK's client side
    through a tee: the SDK reads and writes its own pipes, two pumps copy
    each line between those and the agent's stdio and record it."""

    def __init__(self, argv: List[str], cwd: Path, env: Dict[str, str], log_path: Path,
                 client: RecordingClient, check: SchemaCheck):
        self.argv, self.cwd, self.env, self.log_path = argv, cwd, env, log_path
        self.client = client
        self.wire = WireLog(check)
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.conn: Optional[ClientSideConnection] = None
        self._tasks: List[asyncio.Task] = []
        self._sdk_writer: Optional[asyncio.StreamWriter] = None

    async def __aenter__(self) -> "AgentProcess":
        loop = asyncio.get_running_loop()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, cwd=self.cwd, env=self.env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                limit=LINE_LIMIT,
            )
        # Agent -> SDK: the SDK reads a StreamReader that the pump feeds.
        sdk_reader = asyncio.StreamReader(limit=LINE_LIMIT)
        # SDK -> agent: the SDK writes to a pipe that the pump reads.
        r, w = os.pipe()
        pipe_in = asyncio.StreamReader(limit=LINE_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(pipe_in), os.fdopen(r, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(_PipeWriterProtocol, os.fdopen(w, "wb", 0))
        self._sdk_writer = asyncio.StreamWriter(transport, protocol, None, loop)

        async def agent_to_client():
            while line := await self.proc.stdout.readline():
                self.wire.record("agent", line)
                sdk_reader.feed_data(line)
            sdk_reader.feed_eof()

        async def client_to_agent():
            while line := await pipe_in.readline():
                self.wire.record("client", line)
                self.proc.stdin.write(line)
                await self.proc.stdin.drain()
            self.proc.stdin.close()

        self._tasks = [
            asyncio.ensure_future(agent_to_client()),
            asyncio.ensure_future(client_to_agent()),
        ]
        self.conn = ClientSideConnection(self.client, self._sdk_writer, sdk_reader)
        return self

    async def initialize(self, capabilities: Optional[Capabilities] = None):
        return await self.call(self.conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=(capabilities or Capabilities()).model(),
            client_info=Implementation(name="toolwire-acp-pytest", version="0"),
        ))

    async def new_session(self, cwd: Path) -> str:
        return (await self.call(self.conn.new_session(cwd=str(cwd), mcp_servers=[]))).session_id

    async def prompt(self, session_id: str, text: str):
        return await self.call(self.conn.prompt(session_id=session_id, prompt=[text_block(text)]))

    async def call(self, awaitable, timeout: float = TIMEOUT):
        try:
            return await asyncio.wait_for(awaitable, timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"the agent did not answer within {timeout}s") from None

    async def close(self) -> Optional[int]:
        """Closes the agent's stdin (which ends it) and waits for it."""
        if self._sdk_writer is not None:
            self._sdk_writer.close()
        status = None
        if self.proc is not None:
            try:
                # The pumps end when the SDK's pipe closes and the agent exits.
                await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 15)
                status = await asyncio.wait_for(self.proc.wait(), 15)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
                status = "killed: it did not exit within 15s of its stdin closing"
        if self.conn is not None:
            await self.conn.close()
        await self.client.close()
        return status

    async def __aexit__(self, *exc) -> None:
        self.exit_status = await self.close()
