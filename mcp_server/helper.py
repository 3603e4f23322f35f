"""The front end's IPC client for ccw-helper (trio), and the embedded default.

``HelperClient.request(op, args)`` sends one request of the closed op set
(``sandbox/protocol.py``) and returns its result, or raises the helper's CcwError
rebuilt from the error reply.  Requests on one connection are answered in order, and an
``exec`` can run for minutes, so each in-flight request holds a connection of its own:
idle connections are kept in a small pool and new ones opened when all are busy.  A
request that is cancelled or fails mid-frame closes its connection (its stream position
is unknown) and the pool opens a fresh one next time.  So a diff or a file read sent
while an exec runs travels on a connection of its own and is not held behind it; the
helper notices a cancelled exec's closed connection at its next progress report and
ends the command.

Replies are read with ``recvmsg`` so that a descriptor passed with SCM_RIGHTS
(``open_root``) is never lost; descriptors arrive close-on-exec, and any the caller did
not ask for are closed at once.

``connect_or_spawn(config)``: with ``CCW_HELPER_SOCKET`` set and answering, connect to
it (the service).  Otherwise start the embedded helper as a child,
``python -m sandbox --socket <state>/helper/helper.sock --state-dir <state>/helper
--ready-fd N --die-with-parent``, wait for its ready byte, and stop it (SIGTERM, then
SIGKILL) on ``aclose``.  The child never gets the front end's stdout (which carries MCP
frames on stdio): its stdout and stderr go to a pipe whose lines are copied to our
stderr, and whose tail is quoted if the child dies before it is ready.  An embedded
helper already serving the same state dir (another ccw-mcp) is reused, not replaced.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from mcp_server.config import Config
from sandbox.errors import CcwError
from sandbox.protocol import PROTOCOL_VERSION, FrameDecoder, ProtocolError, Reply, encode_request
from sandbox.server import unix_address

log = logging.getLogger("ccw.helper_client")
HELPER_LOG = logging.getLogger("ccw.helper")  # the embedded helper's own lines

RECV_CHUNK = 256 * 1024
ANCILLARY_SPACE = socket.CMSG_SPACE(4 * 4)  # room for a few descriptors
MAX_IDLE = 4  # idle connections kept open
READY_TIMEOUT_S = 60.0  # the helper recovers existing capsules before it listens
STOP_TIMEOUT_S = 10.0  # SIGTERM lets in-flight execs finish; then SIGKILL
STDERR_TAIL_LINES = 40
PF_EXITING = 0x4  # /proc/<pid>/stat flags: the task has begun to exit


ProgressSink = Callable[[dict[str, Any]], Awaitable[None]]


def _gone() -> CcwError:
    """The helper went away mid-request (EOF, ECONNRESET or EPIPE on its socket)."""
    return CcwError("UNAVAILABLE", "the helper closed the connection before replying; "
                    "it may have been stopped or crashed (see its log on stderr); the request "
                    "did not complete: retry it (an embedded helper is restarted on the next call)")


class _Connection:
    """One socket to the helper and the decoder of its reply stream."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.decoder = FrameDecoder("reply")

    async def send(self, frame: bytes) -> None:
        view = memoryview(frame)
        while view:
            try:
                sent = await self.sock.send(view)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _gone() from exc
            view = view[sent:]

    async def receive(self, fds: list[int]) -> Reply:
        """The next reply; descriptors that arrive with it are appended to ``fds``."""
        while True:
            reply = self.decoder.next_message()
            if reply is not None:
                assert isinstance(reply, Reply)
                return reply
            try:
                data, ancdata, _flags, _addr = await self.sock.recvmsg(
                    RECV_CHUNK, ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC
                )
            except ConnectionResetError as exc:
                # A helper killed with bytes of ours still unread in its socket resets
                # the connection instead of closing it: the same event as an EOF.
                raise _gone() from exc
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    fds.extend(int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
                               for i in range(0, usable, 4))
            if data:
                self.decoder.feed(data)
            else:
                self.decoder.feed_eof()
                if self.decoder.next_message() is None:
                    raise _gone()

    def close(self) -> None:
        self.sock.close()


class HelperClient:
    """A client of one helper socket; optionally owns the embedded helper process."""

    def __init__(self, socket_path: str, process: EmbeddedHelper | None = None) -> None:
        self.socket_path = socket_path
        self.process = process
        self._ids = itertools.count(1)
        self._idle: list[_Connection] = []
        self._closed = False

    async def _connect(self) -> _Connection:
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
        return _Connection(sock)

    async def _round_trip(
        self, op: str, args: dict[str, Any], on_progress: ProgressSink | None = None
    ) -> tuple[dict[str, Any], list[int]]:
        if self._closed:
            raise CcwError("UNAVAILABLE", "the helper client is closed")
        request_id = next(self._ids)
        frame = encode_request(request_id, op, args)  # refuses what the helper would refuse
        conn = self._idle.pop() if self._idle else await self._connect()
        fds: list[int] = []
        reusable = False
        try:
            await conn.send(frame)
            reply = await conn.receive(fds)
            while reply.progress is not None and reply.id == request_id:
                if on_progress is not None:
                    await on_progress(reply.progress)
                reply = await conn.receive(fds)
            if reply.id != request_id:
                if reply.error is not None:  # the helper could not read our frame at all
                    raise reply.error
                raise ProtocolError(f"reply id {reply.id} does not answer request {request_id}")
            reusable = True
            if reply.error is not None:
                raise reply.error
            assert reply.result is not None
            return reply.result, fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            if reusable and not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                conn.close()

    async def request(self, op: str, args: dict[str, Any], on_progress: ProgressSink | None = None) -> dict[str, Any]:
        """Send one request and return its result; an error reply raises its CcwError.

        With ``on_progress`` (exec with ``progress_ms``), each interim report the helper
        sends is awaited in order before the result arrives.
        """
        result, fds = await self._round_trip(op, args, on_progress)
        for fd in fds:
            os.close(fd)
        return result

    async def open_root(self, capsule_id: str) -> int:
        """An O_PATH descriptor of the capsule's merged view; the caller closes it."""
        _result, fds = await self._round_trip("open_root", {"capsule_id": capsule_id})
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise CcwError("INTERNAL", f"open_root reply carried {len(fds)} descriptors, not 1")
        return fds[0]

    def usable(self) -> bool:
        """False once the embedded helper this client started has exited or is exiting
        (kill -9, crash): its socket will never answer again, so the caller should spawn
        a new one."""
        return self.process is None or not self.process.ending()

    async def hello(self) -> dict[str, Any]:
        """The helper's version, mode, mechanisms in force and op list."""
        return await self.request("hello", {"version": PROTOCOL_VERSION})

    async def aclose(self) -> None:
        """Close every idle connection and stop the embedded helper, if we started one."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self.process is not None:
            await self.process.stop()


class EmbeddedHelper:
    """The helper child process of the embedded default."""

    def __init__(self, process: subprocess.Popen[bytes], log_fd: int) -> None:
        self.process = process
        self._pidfd = os.pidfd_open(process.pid)
        # Kept open: ending() re-reads it on every call that needs the helper (~2 us with
        # pread, ~20 us opening the file each time).
        self._stat_fd = os.open(f"/proc/{process.pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._pump = threading.Thread(target=self._copy_log, args=(log_fd,), daemon=True)
        self._pump.start()

    def _copy_log(self, fd: int) -> None:
        # The child's stdout and stderr, line by line, into our log (stderr, never our
        # stdout), so a log level and JSON lines apply to the helper's lines too.
        with open(fd, "rb", closefd=True) as stream:
            for line in stream:
                text = line.decode("utf-8", "replace").rstrip("\n")
                self.tail.append(text)
                HELPER_LOG.info(text)

    def ending(self) -> bool:
        """Whether the child has exited or has begun to (PF_EXITING).

        A killed helper takes a while to become a zombie: its exit unmounts its mount
        namespace, capsule disks included, and ext4 writes their journals back first.
        Meanwhile its socket refuses connections, so "not yet reaped" is not "usable".
        """
        if self.process.poll() is not None or self._stat_fd < 0:
            return True
        try:
            fields = os.pread(self._stat_fd, 1024, 0).rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return True
        return fields[0] in (b"Z", b"X") or int(fields[6]) & PF_EXITING != 0

    def describe_death(self) -> str:
        """A sentence on how the child ended, with its last log lines, or '' if it runs."""
        status = self.process.poll()
        if status is None:
            return ""
        self._pump.join(timeout=1.0)
        how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        tail = "\n".join(self.tail) or "(no output)"
        return f"; the embedded helper ended ({how}); its last output:\n{tail}"

    async def wait(self) -> int:
        """Wait for the child to exit (a pidfd turns readable), cancellably; its status."""
        while (status := self.process.poll()) is None:
            await trio.lowlevel.wait_readable(self._pidfd)
        return status

    async def stop(self) -> None:
        """SIGTERM (the helper finishes in-flight requests), then SIGKILL after a grace period."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(STOP_TIMEOUT_S):
                await self.wait()
            if self.process.poll() is None:
                log.warning("embedded helper ignored SIGTERM; killing it")
                self.process.kill()
                await self.wait()
        await trio.to_thread.run_sync(self._pump.join, 1.0)
        for fd in (self._pidfd, self._stat_fd):
            if fd >= 0:
                os.close(fd)
        self._pidfd = self._stat_fd = -1


async def spawn_embedded(state_dir: str, timeout_s: float = READY_TIMEOUT_S) -> HelperClient:
    """Start ``python -m sandbox`` under ``state_dir``/helper and wait until it listens."""
    helper_dir = Path(state_dir) / "helper"
    helper_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    socket_path = str(helper_dir / "helper.sock")
    ready_r, ready_w = os.pipe()
    log_r, log_w = os.pipe()
    command = [
        sys.executable, "-m", "sandbox",
        "--socket", socket_path, "--state-dir", str(helper_dir),
        "--ready-fd", str(ready_w), "--die-with-parent",
    ]  # fmt: skip
    try:
        # Forked from this (trio's) thread on purpose: --die-with-parent uses PDEATHSIG,
        # which fires when the *thread* that forked exits, and trio's open_process forks
        # from a worker thread that exits when idle.
        process = subprocess.Popen(  # noqa: ASYNC220
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_w,
            stderr=log_w,
            pass_fds=(ready_w,),
            start_new_session=True,  # a ^C meant for ccw-mcp reaches the helper via our aclose
        )
    except OSError as exc:
        for fd in (ready_r, ready_w, log_r, log_w):
            os.close(fd)
        raise CcwError("UNAVAILABLE", f"cannot start the embedded helper {command}: {exc}") from exc
    os.close(ready_w)
    os.close(log_w)
    embedded = EmbeddedHelper(process, log_r)
    try:
        try:
            with trio.move_on_after(timeout_s) as scope:
                await trio.lowlevel.wait_readable(ready_r)
            ready = b"" if scope.cancelled_caught else os.read(ready_r, 1)
        finally:
            os.close(ready_r)
        if ready != b"1":
            if not scope.cancelled_caught:  # it closed the pipe: give it a moment to exit
                with trio.move_on_after(5):
                    await embedded.wait()
            death = embedded.describe_death()
            why = f"did not become ready within {timeout_s:g} s" if scope.cancelled_caught else "failed to start"
            raise CcwError("UNAVAILABLE", f"the embedded helper {why}" + death)
    except BaseException:
        # Never leave a half-started helper behind, also when we are cancelled.
        with trio.CancelScope(shield=True):
            await embedded.stop()
        raise
    return HelperClient(socket_path, embedded)


async def _try_connect(socket_path: str) -> HelperClient | None:
    client = HelperClient(socket_path)
    try:
        await client.hello()
    except CcwError as exc:
        await client.aclose()
        if exc.code != "UNAVAILABLE":
            raise
        return None
    return client


async def connect_or_spawn(config: Config) -> HelperClient:
    """Connect to CCW_HELPER_SOCKET when it answers; else use or start the embedded helper."""
    if config.helper_socket:
        client = await _try_connect(config.helper_socket)
        if client is not None:
            return client
        log.warning("helper socket %s does not answer; starting an embedded helper", config.helper_socket)
    if not config.state_dir:
        raise CcwError("INVALID_ARGUMENT", "no state dir configured; set CCW_STATE_DIR")
    existing = Path(config.state_dir) / "helper" / "helper.sock"
    if existing.is_socket():
        client = await _try_connect(str(existing))
        if client is not None:
            return client
    return await spawn_embedded(config.state_dir)
