"""The ``ccw`` command as an MCP client of its state dir's front end.

A ``ccw capsule`` command does not run a front end of its own (``mcp_server/frontdoor.py``
says why there is one per state dir): it connects to ``<state>/frontend.sock``, and when
nobody answers there it starts the state dir's front-end daemon (a detached ``ccw-mcp``
on that socket, which exits after ``frontdoor.DAEMON_IDLE_S`` without a connection) and
connects once a front end answers, the daemon or whichever owner took the lock first.

One call is an MCP session of its own: ``initialize``, ``notifications/initialized``,
then ``tools/call`` with a progress token (its progress notifications draw the
terminal's progress line) and the caller's context under ``_meta["ccw/caller"]`` (cwd and
the environment: the front end runs calls with its own, so what depends on the caller's,
toolchain discovery and whitelisted variables' values, comes with the call; paths in the
arguments are already absolute).  A tool
error comes back as the CcwError it carries, a JSON-RPC error, or arguments the tool's
input schema refused, as a ``CallError``.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import select
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

import trio

from mcp_server import __version__, framing, frontdaemon
from mcp_server.caller import CALLER_META, CALLER_OUTPUT, CALLER_TERMINAL
from mcp_server.config import Config
from mcp_server.frontdoor import FrontendPaths, opening_line, owner_of
from mcp_server.launcher import READY_TIMEOUT_S, answering, log_tail, spawn_detached
from mcp_server.statedir import make_state_dir
from sandbox.errors import CcwError

PROTOCOL = "2025-11-25"
MAX_ANSWER = 256 << 20
CALL_ID = 2
YIELD_TRIES = 10  # how often a command asks a daemon with another helper to yield, 0.1 s apart


class CallError(Exception):
    """A JSON-RPC error the front end answered.  Not the SDK's MCPError: importing ``mcp``
    costs a ``ccw`` command about a second, and this module needs none of it."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def caller_context() -> dict[str, Any]:
    """What the front end may take from this command's own environment."""
    # All of it: the front end takes PATH and HOME for discovery and the values of a
    # capsule's whitelisted variables (--env) for its commands, as an in-process run did.
    return {"cwd": os.getcwd(), "env": dict(os.environ)}


async def call_tool(config: Config, name: str, args: dict[str, Any], progress: Any = None,
                    terminal: int | None = None, output: bool = False) -> dict[str, Any]:
    """Call tool ``name`` on the state dir's front end; its structured result.

    ``progress`` (an ``output.Progress``, or anything with its ``update``) hears the call's
    progress notifications, with the exec's output they carry when ``output`` asked for it
    (``_meta["ccw/output"]``).  ``terminal``: a pty slave sent with the call (SCM_RIGHTS), on
    which the front end runs the command (``ccw capsule shell``)."""
    stream = await attach(config)
    async with stream:
        # Its own tool families, as an attached ccw-mcp lends them: a person's command is
        # served what its CCW_TOOLSETS chooses (all of them unless set), not the agent's.
        await stream.send_all(opening_line(caller_context(), sorted(config.toolsets)))
        session = _Session(stream)
        await session.request(1, "initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                                "clientInfo": {"name": "ccw", "version": __version__}})
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        meta: dict[str, Any] = {"progressToken": 1, CALLER_META: caller_context()}
        if terminal is not None:
            meta[CALLER_TERMINAL] = True
        if output:
            meta[CALLER_OUTPUT] = True
        answer = await session.request(CALL_ID, "tools/call", {"name": name, "arguments": args, "_meta": meta},
                                       progress, () if terminal is None else (terminal,))
    structured = answer.get("structuredContent")
    if answer.get("isError"):
        error = (structured or {}).get("error") or {}
        details = error.get("details") or {}
        if details.get("schema") == f"tool.{name}.input":
            # Arguments the tool's schema refuses: the command was given bad ones (a usage error),
            # as the -32602 that sessions before 2025-11-25 are answered says.  Told without the
            # message's advice to a model (change them as tools/list's inputSchema says).
            summary = "; ".join(f"{problem['path'] or '/'}: {problem['msg']}" for problem in details["errors"][:5])
            raise CallError(framing.INVALID_PARAMS, f"{name}: arguments do not match the input schema: {summary}",
                            details)
        raise CcwError(str(error.get("code") or "INTERNAL"), str(error.get("message") or answer),
                       error.get("details") or {})
    if not isinstance(structured, dict):
        raise CcwError("INTERNAL", f"the front end answered {name} without a structured result: {answer}")
    return structured


class _Session:
    """Lines to and from the front end, on one socket."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.lines = framing.LineSplitter(max_frame=MAX_ANSWER)
        self.waiting: list[dict[str, Any]] = []

    async def send(self, message: Mapping[str, Any], fds: tuple[int, ...] = ()) -> None:
        data = framing.dumps(dict(message)) + b"\n"
        if fds:  # with the message's first bytes, so the front end has them before it reads the line
            sock: Any = self.stream.socket
            data = data[await sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]):]
        if data:
            await self.stream.send_all(data)

    async def request(self, request_id: int, method: str, params: dict[str, Any], progress: Any = None,
                      fds: tuple[int, ...] = ()) -> Any:
        """Send a request (with ``fds``) and read up to its answer: its result, or its error raised."""
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, fds)
        while True:
            message = await self._next()
            if "method" in message:
                await self._serve(message, progress)
            elif message.get("id") == request_id:
                if "error" in message:
                    error = message["error"]
                    code = error.get("code", framing.INTERNAL_ERROR)
                    raise CallError(code, str(error.get("message", "")), error.get("data"))
                return message.get("result")

    async def _serve(self, message: dict[str, Any], progress: Any) -> None:
        """The front end's own messages: progress drawn, any request of its refused."""
        params = message.get("params") or {}
        if message["method"] == "notifications/progress" and progress is not None:
            progress.update(params.get("progress", 0), params.get("total"), params.get("message"),
                            (params.get("_meta") or {}).get(CALLER_OUTPUT))
        elif "id" in message:
            await self.send(framing.error_message(message["id"], framing.METHOD_NOT_FOUND,
                                                  "the ccw command answers no requests"))

    async def _next(self) -> dict[str, Any]:
        while not self.waiting:
            data = await self.stream.receive_some(1 << 20)
            if not data:
                raise CcwError("UNAVAILABLE", "the ccw front end of this state dir stopped before answering; "
                               "retry the command (ccw helper status shows what serves the state dir)")
            for event in self.lines.feed(data):
                if isinstance(event, framing.Line):
                    self.waiting.append(json.loads(event.data))
        return self.waiting.pop(0)


async def attach(config: Config) -> trio.SocketStream:
    """A connection to the state dir's front end, starting its daemon if none answers.

    Even under ``--no-autostart``, which is about the helper (a command pinned to a system
    helper must not start one of its own): the daemon is this user's own unprivileged
    process, which the command needs to run at all, and it leaves when idle."""
    path = str(FrontendPaths.of(config.state_dir).socket)
    await trio.to_thread.run_sync(_served_with_our_helper, config)
    with contextlib.suppress(OSError):
        return await trio.open_unix_socket(path)
    await trio.to_thread.run_sync(start_daemon, config.state_dir)
    return await trio.open_unix_socket(path)


def _served_with_our_helper(config: Config) -> None:
    """Make sure the front end this command attaches to uses the helper it was given.

    The front end's own helper runs every call's capsules, so a command given
    CCW_HELPER_SOCKET (the system service, installed after the first capsules) would
    otherwise be served by the rootless helper of a daemon started before, with no limits
    and no read tracing, and not told.  The ccw command's own idle daemon yields (the
    caller then starts one with this command's settings); a busy one, or an agent's
    ccw-mcp, is not ours to end: CONFLICT, as an attaching ccw-mcp gets
    (frontdoor.refuse_unlike)."""
    if not config.helper_socket:
        return
    owner = owner_of(config.state_dir) or {}
    settings = owner.get("settings")
    theirs = settings.get("helper_socket") if isinstance(settings, dict) else None
    if theirs is None or theirs == config.helper_socket or answering(config.helper_socket) is None:
        return  # an owner that recorded none, the same helper, or one we could not use either
    daemon = bool(owner.get("daemon"))
    for _ in range(YIELD_TRIES if daemon else 0):
        said = frontdaemon.ask_to_yield(config.state_dir)
        if said == "now":
            frontdaemon.stop_daemon(config.state_dir, send_signal=False)
            return
        if said != "busy":
            break
        # a connection that has just ended (a probe's, the last command's) still counts as
        # a client until the daemon reads its end: "busy" for a few milliseconds more
        time.sleep(0.1)
    helper = repr(theirs) if theirs else "the state dir's own helper"
    who = "the ccw command's daemon" if daemon else f"ccw-mcp ({owner.get('endpoint', '?')})"
    way = ("it keeps a service, a forwarded port or another client: stop them, then ccw helper stop "
           "(the next command starts a front end on CCW_HELPER_SOCKET)" if daemon else
           "start that ccw-mcp with the same CCW_HELPER_SOCKET")
    raise CcwError("CONFLICT", (
        f"state dir {config.state_dir} is served by {who}, pid {owner.get('pid', '?')}, with "
        f"{helper} as its helper, not CCW_HELPER_SOCKET="
        f"{config.helper_socket}: this command's capsules would run under that one. To use "
        f"{config.helper_socket}, {way}, or give this command its own --state-dir"),
        {"settings": ["helper_socket"], "frontend_pid": owner.get("pid")})


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def start_daemon(state_dir: str, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Start the state dir's front-end daemon unless a front end answers; ready when one does."""
    paths = FrontendPaths.of(state_dir)
    make_state_dir(state_dir)
    with open(f"{paths.lock}.start", "a") as starting:
        fcntl.flock(starting, fcntl.LOCK_EX)  # two commands at once start one daemon
        if _answers(str(paths.socket)):
            return {"frontend_started": False}
        env = {**os.environ, "MCP_ENDPOINT": "socket", "MCP_SOCKET_PATH": str(paths.socket),
               "MCP_SOCKET_MODE": "0600", "MCP_READY_FILE": os.path.join(state_dir, "frontend.ready"),
               "CCW_STATE_DIR": os.path.abspath(state_dir)}
        ready_r, ready_w = os.pipe()
        try:
            with open(paths.log, "ab") as log:
                log.write(f"--- ccw front end start {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode())
            # The pipe's write end lives in the daemon; its closing says the daemon ended.
            spawn_detached([sys.executable, "-m", "mcp_server"], paths.log, ready_w, env)
            os.close(ready_w)
            ready_w = -1
            _wait_ready(str(paths.socket), ready_r, state_dir, timeout_s)
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)
        with contextlib.suppress(OSError):
            print(f"ccw: started the front end of {state_dir} (ccw helper status shows it, "
                  "ccw helper stop ends it)", file=sys.stderr)
        return {"frontend_started": True}


def _wait_ready(path: str, ready_r: int, state_dir: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    ended = False
    while time.monotonic() < deadline:
        if _answers(path):
            return
        if not ended and select.select([ready_r], [], [], 0.05)[0]:
            ended = not os.read(ready_r, 1)
        if ended:
            # It left: fine if another front end owns the state dir (it will answer soon).
            if owner_of(state_dir) is None:
                break
            time.sleep(0.05)
    log = FrontendPaths.of(state_dir).log
    raise CcwError("UNAVAILABLE", f"the ccw front end of {state_dir} did not start; its log ({log}) ends with:\n"
                   + log_tail(log), {"log": str(log)})
