"""MCP logging: ccw's own log records sent to a client as ``notifications/message``, at or
above the level its connection set with ``logging/setLevel``.

Which records a connection hears, and why:

- Those logged while one of its own requests is served: ``SERVING`` names the connection,
  set around every request by the server's middleware (``serving``) and inherited by the
  tasks and worker threads the request starts (trio copies the context into both).
- Those logged outside any request (a run ending, recovery at start) only where no bearer
  token came with ``logging/setLevel``: stdio and the unix socket serve the process's own
  operator, while over HTTP several owners share the process and one must not read
  another's capsule ids and paths.  A token holder also gets only the first line of each
  record: a traceback's internals stay in the server's stderr.
- Never a record of another connection's request.

The process's own level (``--log-level``, mcp_server/logs.py) is a floor: a record below it
is never made, so a client asking for ``debug`` of a server at ``info`` hears ``info`` and up.
Only loggers under ``ccw`` are forwarded: the SDK's own (``mcp.*``) log while sending,
which would feed on itself.

Delivery: logging calls a handler synchronously, in whatever thread logged, while sending is
async on the connection's stream.  The handler hands each record to the trio loop
(``TrioToken.run_sync_soon``, safe from any thread) into one bounded queue, which a system
task drains in order.  A full queue (a client not reading) drops the record for MCP only;
stderr has it.

Eras: ``logging/setLevel`` exists up to 2025-11-25.  The 2026-07-28 era removed it (SEP-2577)
for a per-request opt-in, which this server does not serve: there the method is not found.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import trio
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_server.tasks import token_name

# MCP's levels (RFC 5424's names), each with the Python level from which a record is sent.
THRESHOLDS = {"debug": logging.DEBUG, "info": logging.INFO, "notice": 25, "warning": logging.WARNING,
              "error": logging.ERROR, "critical": logging.CRITICAL, "alert": 60, "emergency": 70}
QUEUE_LIMIT = 256  # records waiting to be sent, across connections; more are dropped for MCP
SERVING: contextvars.ContextVar[Any] = contextvars.ContextVar("ccw_serving_connection", default=None)


def mcp_level(levelno: int) -> str:
    """The MCP level of a Python record level."""
    for name in ("critical", "error", "warning", "info"):
        if levelno >= THRESHOLDS[name]:
            return name
    return "debug"


@dataclass
class _Listener:
    threshold: int
    owner: str | None  # the bearer token's name; None: the process's operator


class LogForwarder(logging.Handler):
    """The handler on the ``ccw`` logger that sends records to connections that asked."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._lock = threading.Lock()  # emit runs in worker threads too
        self._listeners: weakref.WeakKeyDictionary[Any, _Listener] = weakref.WeakKeyDictionary()
        self._token: trio.lowlevel.TrioToken | None = None
        self._queue: trio.MemorySendChannel[tuple[weakref.ref[Any], dict[str, Any]]] | None = None

    def set_level(self, connection: Any, level: str, owner: str | None) -> None:
        """From now on send ``connection`` the records at ``level`` and above that it may hear
        (called in the trio thread, from the ``logging/setLevel`` handler)."""
        token = trio.lowlevel.current_trio_token()
        with self._lock:
            self._listeners[connection] = _Listener(THRESHOLDS[level], owner)
            if self._token is not token:  # the first listener of this trio run: start its sender
                send, receive = trio.open_memory_channel[tuple[weakref.ref[Any], dict[str, Any]]](QUEUE_LIMIT)
                self._token, self._queue = token, send
                trio.lowlevel.spawn_system_task(_send_all, receive, name="ccw-mcp-log-forwarder")

    def emit(self, record: logging.LogRecord) -> None:
        """Queue ``record`` for each connection that hears it."""
        origin = SERVING.get()
        with self._lock:
            if not self._listeners or self._token is None:
                return
            targets = [(connection, listener) for connection, listener in self._listeners.items()
                       if record.levelno >= listener.threshold
                       and (connection is origin or (origin is None and listener.owner is None))]
            token, queue = self._token, self._queue
        if not targets or queue is None:
            return
        try:
            message = record.getMessage()
        except Exception:
            self.handleError(record)
            return
        items = [(weakref.ref(connection), {
            "level": mcp_level(record.levelno), "logger": record.name,
            "data": message if listener.owner is None else message.split("\n", 1)[0],
        }) for connection, listener in targets]
        try:
            token.run_sync_soon(_put, queue, items)
        except trio.RunFinishedError:  # the loop that listened has ended; its connections with it
            pass


def _put(queue: trio.MemorySendChannel[Any], items: list[tuple[weakref.ref[Any], dict[str, Any]]]) -> None:
    for item in items:
        try:
            queue.send_nowait(item)
        except (trio.WouldBlock, trio.ClosedResourceError):
            return  # a client not reading: MCP loses these records, stderr has them


async def _send_all(receive: trio.MemoryReceiveChannel[tuple[weakref.ref[Any], dict[str, Any]]]) -> None:
    """The sender: each queued record to its connection, in order.  A system task, so it
    never raises (that would end the whole process)."""
    async for connection_ref, params in receive:
        connection = connection_ref()
        if connection is None:
            continue
        try:
            await connection.notify("notifications/message", params)
        except Exception:  # a closed or broken connection loses its records, no one else's
            continue


FORWARDER = LogForwarder()


def install() -> None:
    """Put ``FORWARDER`` on the ``ccw`` logger, once per process."""
    ccw = logging.getLogger("ccw")
    if FORWARDER not in ccw.handlers:
        ccw.addHandler(FORWARDER)


async def on_set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    """``logging/setLevel``: the asking connection hears records at ``params.level`` and up."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        raise MCPError(code=types.METHOD_NOT_FOUND, message=(
            "Method not found: logging/setLevel left MCP in 2026-07-28 (SEP-2577); "
            "a 2025-era client may set a level, and the server's stderr has every record"))
    FORWARDER.set_level(ctx.session._connection, params.level, token_name(ctx))
    return types.EmptyResult()


async def serving(ctx: Any, call_next: Any) -> Any:
    """The server's middleware: while a request is served, ``SERVING`` names its connection."""
    reset = SERVING.set(getattr(ctx.session, "_connection", None))
    try:
        return await call_next(ctx)
    finally:
        SERVING.reset(reset)
