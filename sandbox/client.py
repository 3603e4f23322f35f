"""The one client of ccw-helper: a sans-IO core, a trio wrapper and a blocking wrapper.

``ClientConnection`` (the core) does no I/O, as h11 does not: it turns a request into
the bytes to send, takes the bytes received, and hands back the replies and progress
reports of the request in flight, or raises its error.  The wrappers only move bytes:

* ``HelperClient`` (trio), the front end's: ``call(request)`` sends one typed request of
  the closed op set (``sandbox/ops.py``) and returns the op's typed reply
  (``sandbox/replies.py``), or raises the helper's CcwError rebuilt from the error reply.
  Requests on one connection are answered in order, and an ``exec`` can run for minutes, so
  each in-flight request holds a connection of its own: idle connections are kept in a small
  pool and new ones opened when all are busy.  A request that is cancelled or fails
  mid-frame closes its connection (its stream position is unknown) and the pool opens a
  fresh one next time.  So a diff or a file read sent while an exec runs travels on a
  connection of its own and is not held behind it; the helper notices a cancelled exec's
  closed connection at its next progress report and ends the command.
* ``BlockingClient``, for short-lived commands (``ccw helper status``, ``ccw doctor``):
  one connection and a timeout, for ``hello`` (and ``net_open``, for callers without trio).

Replies are read with ``recvmsg`` so that a descriptor passed with SCM_RIGHTS
(``open_root``, ``net_open``) is never lost; descriptors arrive close-on-exec, and any the
caller did not ask for are closed at once.  A request that holds descriptors (an exec on a
terminal: ``ExecRequest.tty_fd``) sends copies with its frame's first byte (``sendmsg``).  A
helper that goes away mid-request (EOF, or a reset when it died with our bytes unread, or
EPIPE on send) is UNAVAILABLE with the advice to retry, never an internal error.  The helper
process itself never imports this module.
"""

from __future__ import annotations

import array
import itertools
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import trio

from sandbox import opsurface
from sandbox.errors import CcwError, ProtocolError
from sandbox.ops import (
    MAX_SPARES,
    HelloRequest,
    NetConnectRequest,
    NetOpenRequest,
    OpRequest,
    RunReadsRequest,
    encode_request,
)
from sandbox.protocol import FrameDecoder, Reply, check_id, descriptors_of, encode_frame
from sandbox.replies import NetConnectReply, NetOpenReply, ReplyT, RunReadsReply
from sandbox.syscalls import unix_address

RECV_CHUNK = 256 * 1024
ANCILLARY_SPACE = socket.CMSG_SPACE(4 * max(16, MAX_SPARES))  # room for the most a reply carries: net_connect's spares
MAX_IDLE = 4  # idle connections kept open
BLOCKING_TIMEOUT_S = 10.0

ProgressSink = Callable[[dict[str, Any]], Awaitable[None]]


def gone() -> CcwError:
    """The helper went away mid-request (EOF, ECONNRESET or EPIPE on its socket)."""
    return CcwError("UNAVAILABLE", "the helper closed the connection before replying; "
                    "it may have been stopped or crashed (see its log on stderr); the request "
                    "did not complete: retry it (an embedded helper is restarted on the next call)")


# --- the sans-IO core -------------------------------------------------------------------


class ClientConnection:
    """One connection's side of the protocol: requests out as bytes, bytes in, replies out."""

    def __init__(self) -> None:
        self._decoder = FrameDecoder("reply")
        self._pending: int | None = None  # the id of the request in flight
        self._eof = False

    @property
    def idle(self) -> bool:
        """No request in flight: the last one was answered (ok or error) and nothing else came."""
        return self._pending is None and self._decoder.buffered == 0 and not self._eof

    def send_request(self, request_id: int, op: str, args: dict[str, Any], check: bool = True) -> bytes:
        """The frame for one request, its arguments checked against the op table first.

        ``check=False`` for a typed request's (``OpRequest.to_args()``): its types hold by
        construction, and its values are checked where they must be, by the helper as it
        reads them, whose error (the same code and message) comes back as the reply.
        """
        if self._pending is not None:
            raise ProtocolError(f"request {self._pending} is still in flight on this connection")
        frame = encode_request(request_id, op, args) if check else encode_frame(
            {"id": check_id(request_id, nullable=False), "op": op, "args": args})
        self._pending = request_id
        return frame

    def receive_data(self, data: bytes) -> None:
        """Bytes from the helper; b"" means it closed the connection."""
        if data:
            self._decoder.feed(data)
        else:
            self._eof = True
            self._decoder.feed_eof()

    def next_event(self) -> Reply | None:
        """A progress report or the final reply of the request in flight, or None for more bytes.

        An error reply raises its CcwError; a reply to another request is a ProtocolError;
        the connection closing first is UNAVAILABLE.
        """
        reply = self._decoder.next_message()
        if reply is None:
            if self._eof:
                raise gone()
            return None
        assert isinstance(reply, Reply)
        if reply.progress is not None and reply.id == self._pending:
            return reply
        if reply.id != self._pending:
            if reply.error is not None:  # the helper could not read our frame at all
                raise reply.error
            raise ProtocolError(f"reply id {reply.id} does not answer request {self._pending}")
        self._pending = None
        if reply.error is not None:
            raise reply.error
        return reply


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _expect_fds(fds: list[int], count: int, op: str) -> list[int]:
    """``fds`` if the reply carried exactly ``count`` descriptors; else they are closed and INTERNAL."""
    if len(fds) != count:
        _close_all(fds)
        raise CcwError("INTERNAL", f"{op} reply carried {len(fds)} descriptors, not {count}")
    return fds


def _net_open_reply(result: dict[str, Any], fds: list[int]) -> tuple[NetOpenReply, list[int]]:
    """A net_open result read, with its three descriptors (closed if the result is malformed)."""
    _expect_fds(fds, 3, "net_open")
    try:
        return NetOpenReply.from_args(result), fds
    except BaseException:
        _close_all(fds)
        raise


# --- trio -------------------------------------------------------------------------------


class TrioConnection:
    """One trio socket to the helper around a ClientConnection."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.core = ClientConnection()

    async def send(self, frame: bytes, fds: list[int] | None = None) -> None:
        """Send all of ``frame``, ``fds`` (copies) with its first byte; a helper that is gone is UNAVAILABLE."""
        view = memoryview(frame)
        while view:
            try:
                if fds:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                    sent = await self.sock.sendmsg([view], rights)
                    fds = None
                else:
                    sent = await self.sock.send(view)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise gone() from exc
            view = view[sent:]

    async def receive(self, fds: list[int]) -> Reply:
        """The next event; descriptors that arrive with it are appended to ``fds``."""
        while (event := self.core.next_event()) is None:
            try:
                data, ancdata, _flags, _addr = await self.sock.recvmsg(
                    RECV_CHUNK, ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC
                )
            except ConnectionResetError as exc:
                # A helper killed with bytes of ours still unread in its socket resets
                # the connection instead of closing it: the same event as an EOF.
                raise gone() from exc
            fds.extend(descriptors_of(ancdata))
            self.core.receive_data(data)
        return event

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class HelperProcess(Protocol):
    """A helper this client started and owns (mcp_server's embedded helper)."""

    def describe_death(self) -> str:
        """A sentence on how it ended, or '' while it runs."""

    def ending(self) -> bool:
        """Whether it has exited or begun to."""

    async def stop(self) -> None:
        """Stop it."""


class HelperClient:
    """A trio client of one helper socket; optionally owns the helper process it started."""

    def __init__(self, socket_path: str, process: HelperProcess | None = None) -> None:
        self.socket_path = socket_path
        self.process = process
        self._ids = itertools.count(1)
        self._idle: list[TrioConnection] = []
        self._closed = False

    async def _connect(self) -> TrioConnection:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with unix_address(self.socket_path) as address:
                await sock.connect(address)
        except OSError as exc:
            sock.close()
            hint = self.process.describe_death() if self.process is not None else ""
            raise CcwError(
                "UNAVAILABLE",
                f"cannot reach the helper at {self.socket_path}: {exc.strerror or exc}; "
                "start ccw-helper (or unset CCW_HELPER_SOCKET to use the embedded one)" + hint,
                {"socket": self.socket_path},
            ) from exc
        return TrioConnection(sock)

    async def _round_trip(
        self, op: str, args: dict[str, Any], on_progress: ProgressSink | None = None, sent_fds: list[int] | None = None,
        check: bool = True,
    ) -> tuple[dict[str, Any], list[int]]:
        if self._closed:
            raise CcwError("UNAVAILABLE", "the helper client is closed")
        conn = self._idle.pop() if self._idle else await self._connect()
        fds: list[int] = []
        try:
            await conn.send(conn.core.send_request(next(self._ids), op, args, check), sent_fds)
            reply = await conn.receive(fds)
            while reply.progress is not None:
                if on_progress is not None:
                    await on_progress(reply.progress)
                reply = await conn.receive(fds)
            assert reply.result is not None
            return reply.result, fds
        except BaseException:
            _close_all(fds)
            raise
        finally:
            if conn.core.idle and not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                conn.close()

    async def request(self, op: str, args: dict[str, Any], on_progress: ProgressSink | None = None) -> dict[str, Any]:
        """``call``'s wire form: an op's name and ``args`` object in, the ``result`` object out.

        Code holds typed requests and uses ``call``; this form is for what only the wire
        can say (the tests of the wire: an unknown op, a raw result).  The arguments are
        still checked against the op table before they are sent.
        """
        result, fds = await self._round_trip(op, args, on_progress)
        _close_all(fds)
        return result

    async def call(self, request: OpRequest[ReplyT], on_progress: ProgressSink | None = None) -> ReplyT:
        """Send a typed request and return the op's typed reply; an error reply raises its CcwError.

        The request's values are checked once, by the helper (the trust boundary), not here
        as well: a bad one is refused with the helper's error.

        With ``on_progress`` (exec with ``progress_ms``), each interim report the helper
        sends is awaited in order before the result arrives.  The descriptors the request
        holds (an exec's terminal) travel with it; the caller keeps and closes its own.
        """
        result, fds = await self._round_trip(request.op, request.to_args(), on_progress, request.descriptors(), False)
        _close_all(fds)
        return cast(ReplyT, request.reply.from_args(result))  # reply is the class OpRequest[ReplyT] names

    async def open_root(self, capsule_id: str) -> int:
        """An O_PATH descriptor of the capsule's merged view; the caller closes it."""
        _result, fds = await self._round_trip("open_root", {"capsule_id": capsule_id})
        return _expect_fds(fds, 1, "open_root")[0]

    async def net_open(self, capsule_id: str) -> tuple[NetOpenReply, list[int]]:
        """An egress capsule's kit: the reply and [http listener, socks listener, sniffer]; the caller closes them."""
        request = NetOpenRequest(capsule_id)
        return _net_open_reply(*await self._round_trip(request.op, request.to_args()))

    async def net_runs(self, capsule_id: str) -> tuple[dict[str, int | None], socket.socket]:
        """Each running service's cgroup v2 id (None: it has none) and a sock_diag socket in the
        capsule's jail namespace, which the caller closes (sandbox/run_sockets.py)."""
        request = NetOpenRequest(capsule_id, runs=True)
        result, fds = await self._round_trip(request.op, request.to_args())
        _close_all(_expect_fds(fds, 4, "net_open")[:3])  # the kit's three: the caller's session has its own
        try:
            reply = NetOpenReply.from_args(result)
        except BaseException:
            _close_all(fds[3:])
            raise
        return reply.services or {}, socket.socket(fileno=fds[3])

    async def net_spares(self, capsule_id: str, port: int, count: int, v6: bool = False) -> list[socket.socket]:
        """``count`` unconnected TCP sockets (IPv6 ones with ``v6``) of the capsule's namespace, for
        the caller to connect to ``port`` there; the caller closes them."""
        request = NetConnectRequest(capsule_id, port, count, v6 or None)
        result, fds = await self._round_trip(request.op, request.to_args())
        try:
            NetConnectReply.from_args(result)
        except BaseException:
            _close_all(fds)
            raise
        return [socket.socket(fileno=fd) for fd in _expect_fds(fds, count, "net_connect")]

    async def net_connect(self, capsule_id: str, port: int) -> trio.socket.SocketType:
        """A trio socket connected to ``port`` on the capsule's own loopback (the caller closes it);
        CONFLICT (reason ``refused``) when nothing listens there."""
        request = NetConnectRequest(capsule_id, port)
        _result, fds = await self._round_trip(request.op, request.to_args())
        fd = _expect_fds(fds, 1, "net_connect")[0]
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        return trio.socket.from_stdlib_socket(sock)

    async def run_reads(self, capsule_id: str, service: str) -> RunReadsReply:
        """What a running service of the capsule has touched so far (``touched`` None: not known,
        ``unavailable`` says why); NOT_FOUND when no service of that name runs there."""
        return await self.call(RunReadsRequest(capsule_id, service))

    def usable(self) -> bool:
        """False once the helper this client started has exited or is exiting (kill -9,
        crash): its socket will never answer again, so the caller should start a new one."""
        return self.process is None or not self.process.ending()

    async def hello(self) -> dict[str, Any]:
        """The helper's version, mode, mechanisms in force and op list; UNSUPPORTED from a helper
        of another install, which would refuse or misread calls later (sandbox/opsurface.py)."""
        request = HelloRequest()
        try:
            info = await self.request(request.op, request.to_args())
        except CcwError as exc:
            if exc.code == "UNSUPPORTED":  # a protocol version of its own
                raise opsurface.refused(exc, self.socket_path) from exc
            raise
        opsurface.check(info, self.socket_path)
        return info

    async def aclose(self) -> None:
        """Close every idle connection and stop the helper process, if this client owns one."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self.process is not None:
            await self.process.stop()


# --- blocking ---------------------------------------------------------------------------


class BlockingClient:
    """One blocking connection to a helper, for short-lived commands; a context manager.

    Connecting raises OSError when nothing listens; every call is bounded by ``timeout_s``.
    """

    def __init__(self, socket_path: str, timeout_s: float = BLOCKING_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._core = ClientConnection()
        self._ids = itertools.count(1)
        try:
            self._sock.settimeout(timeout_s)
            with unix_address(socket_path) as address:
                self._sock.connect(address)
        except BaseException:
            self._sock.close()
            raise

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def hello(self) -> dict[str, Any]:
        """As ``HelperClient.hello``: what the helper sent, from a helper of this install only."""
        request = HelloRequest()
        try:
            result, fds = self._round_trip(request.op, request.to_args())
        except CcwError as exc:
            if exc.code == "UNSUPPORTED":  # a protocol version of its own
                raise opsurface.refused(exc, self.socket_path) from exc
            raise
        _close_all(fds)
        opsurface.check(result, self.socket_path)
        return result

    def net_open(self, capsule_id: str) -> tuple[NetOpenReply, list[int]]:
        """As ``HelperClient.net_open``: the reply and the three descriptors the caller now owns."""
        request = NetOpenRequest(capsule_id)
        return _net_open_reply(*self._round_trip(request.op, request.to_args()))

    def _round_trip(self, op: str, args: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        fds: list[int] = []
        try:
            self._sock.sendall(self._core.send_request(next(self._ids), op, args))
            while True:
                reply = self._core.next_event()
                if reply is not None and reply.result is not None:
                    return reply.result, fds
                if reply is None:
                    try:
                        data, ancdata, _flags, _addr = self._sock.recvmsg(
                            RECV_CHUNK, ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC
                        )
                    except ConnectionResetError as exc:
                        raise gone() from exc
                    fds.extend(descriptors_of(ancdata))
                    self._core.receive_data(data)
        except BrokenPipeError as exc:
            _close_all(fds)
            raise gone() from exc
        except BaseException:
            _close_all(fds)
            raise
