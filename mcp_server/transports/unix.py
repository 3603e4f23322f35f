"""The unix-socket transport: NDJSON per connection, many clients at once.

Some facts about unix socket files.  ``bind`` creates the file with the mode
``0777 & ~umask``, so the mode is set through the umask *during* bind (there is no
window where another user could connect) and fixed with chmod after.  The file outlives
the process that bound it: a server that crashed leaves a stale file whose ``connect``
fails with ECONNREFUSED, and which ``bind`` refuses with EADDRINUSE.  So at start a
leftover path is probed: a live server answering on it is an error (two servers must
not share one path), a dead one is unlinked; a path that is not a socket is never
touched.  On shutdown the listener closes and the file is unlinked before in-flight
requests finish, so a new instance can start at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from mcp_server.logs import LOGGER
from sandbox.errors import CcwError, from_oserror

if TYPE_CHECKING:  # the SDK's import (a second) is not paid by a ``ccw`` command that only asks
    from mcp_server.server import CcwServer

BACKLOG = 128


def _clear_stale(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise CcwError(
            "CONFLICT", f"{path!r} exists and is not a socket; remove it or set MCP_SOCKET_PATH elsewhere"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        LOGGER.info(f"mcp:stale socket {path} removed (no server was listening)")
        os.unlink(path)
        return
    except OSError as exc:
        raise from_oserror(exc, "probe existing socket", path, "remove the stale socket file") from exc
    finally:
        probe.close()
    raise CcwError("CONFLICT", f"another server is listening on {path!r}; stop it or choose another MCP_SOCKET_PATH")


def bind_socket(path: str, mode: int) -> socket.socket:
    """A listening unix socket at ``path`` with ``mode``, replacing a stale file."""
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o777 & ~mode)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        hint = "another server may be starting on it" if exc.errno == errno.EADDRINUSE else "check the directory"
        raise from_oserror(exc, "bind unix socket", path, hint) from exc
    finally:
        os.umask(old_umask)
    os.chmod(path, mode)
    sock.listen(BACKLOG)
    return sock


async def serve(
    app: CcwServer, draining: trio.Event, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Accept clients on MCP_SOCKET_PATH until ``draining``; then finish their requests."""
    async def stop_accepting(accepting: trio.CancelScope) -> None:
        await draining.wait()
        accepting.cancel()

    await listen(app.config.socket_path, app.config.socket_mode, stop_accepting,
                 lambda stream: _serve_client(app, stream, draining), task_status=task_status)


async def listen(
    path: str, mode: int, stop_accepting: Callable[[trio.CancelScope], Awaitable[None]],
    serve_client: Callable[[trio.SocketStream], Awaitable[None]],
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``path`` and serve each client with ``serve_client`` until ``stop_accepting``
    cancels the accepting scope it is given; then wait for the clients' connections."""
    raw = bind_socket(path, mode)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(raw))
    try:
        async with trio.open_nursery() as connections:
            with trio.CancelScope() as accepting:
                connections.start_soon(stop_accepting, accepting)
                task_status.started(path)
                while True:
                    stream = await listener.accept()
                    connections.start_soon(serve_client, stream)
            await listener.aclose()
            _unlink(path)
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        _unlink(path)


async def _serve_client(app: CcwServer, stream: trio.SocketStream, draining: trio.Event) -> None:
    async with stream:
        from mcp_server.transports.ndjson import NdjsonConnection  # see the imports' note

        await NdjsonConnection(app, stream, stream, draining).run()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


MAX_ANSWER = 256 << 20  # what the client side accepts in one answer line


@contextlib.asynccontextmanager
async def connect(path: str) -> AsyncIterator[tuple[Any, Any]]:
    """Client side: an SDK ``Transport`` (read, write streams) over a unix socket.

    Usable as ``mcp.Client(connect(path))``; the tests use it.
    """
    import anyio

    stream = await anyio.connect_unix(path)
    try:
        async with ndjson_client(stream, stream) as streams:
            yield streams
    finally:
        await stream.aclose()


@contextlib.asynccontextmanager
async def ndjson_client(incoming: Any, outgoing: Any) -> AsyncIterator[tuple[Any, Any]]:
    """An SDK ``Transport``'s (read, write) streams over anyio byte streams, one JSON-RPC
    message per line: ``connect``'s, and the benchmark's on a socket or on a server
    process's stdout and stdin (so ccw and the reference server sit behind one client).

    An answer that is not JSON-RPC, or is over MAX_ANSWER, reaches the reader as an
    exception; the connection ending ends the read stream.
    """
    import anyio
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    from mcp_server.framing import Line, LineSplitter, Oversized

    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](32)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](32)
    gone = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError)

    async def reader() -> None:
        # The 1 MiB guard is on requests (seed 001); answers may be larger (a whole file
        # read back), so the client reads up to MAX_ANSWER and reports anything bigger.
        # The splitter's buffer grows by each chunk: no quadratic joining of a large answer.
        splitter = LineSplitter(max_frame=MAX_ANSWER)
        async with read_send:
            while True:
                try:
                    data = await incoming.receive(1 << 20)
                except gone:
                    return
                for event in splitter.feed(data):
                    if isinstance(event, Oversized):
                        await read_send.send(ValueError(f"an answer over {MAX_ANSWER} bytes was dropped"))
                        continue
                    if isinstance(event, Line):
                        try:
                            message = types.jsonrpc_message_adapter.validate_json(event.data, by_name=False)
                        except ValueError as exc:
                            await read_send.send(exc)
                            continue
                        await read_send.send(SessionMessage(message))

    async def writer() -> None:
        async with write_recv:
            async for item in write_recv:
                line = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                try:
                    await outgoing.send(line.encode("utf-8"))
                except gone:
                    return

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            group.cancel_scope.cancel()
