"""The helper's unix socket server: peer credentials, one thread per connection, dispatch.

Some facts about unix sockets that this module follows from:

- ``SO_PEERCRED`` gives the pid/uid/gid of the process that called ``connect()``, as
  seen from the helper's user namespace, fixed at connect time.  It is the only source
  of the caller's identity; requests never carry one.  In a rootless helper (its own
  user namespace mapping one uid to 0) every other uid shows up as the overflow uid
  65534, so a rootless helper serves only callers that map to its own uid.
- A socket file's mode is checked on ``connect()``: 0600 keeps the embedded helper to
  its own user; the service uses 0660 and a group.  ``bind()`` applies the umask, so
  the umask is tightened around it and the mode set right after, before ``listen()``.
- A socket file outlives a crashed helper.  A stale one refuses connections
  (ECONNREFUSED) and is unlinked; a live one means another helper serves there, and
  starting a second is refused rather than stealing its path.  Anything that is not a
  socket is never unlinked.
- ``sun_path`` holds 107 bytes.  Longer paths are reached through
  ``/proc/self/fd/N/<name>`` with N an O_PATH descriptor of the directory.
- ``shutdown(SHUT_RD)`` on a connection wakes a thread blocked in ``recv()`` with EOF
  once the data already queued has been read, and still lets it send: graceful stop
  is "shut every connection for reading, let each thread answer what it holds, join".
- Descriptors sent with SCM_RIGHTS travel with the first byte of the message, in the
  order given (``net_open``'s three); the helper closes its own copies once sent.  A
  request may carry them too (an exec on a terminal: its pty slave), so connections are
  read with ``recvmsg``: what arrives is handed, with ownership, to the next request
  decoded (``ops.attach_descriptors`` refuses and closes any a request did not ask for),
  and at most ``MAX_REQUEST_FDS`` fit one read (the kernel closes the rest: MSG_CTRUNC).
  A plain ``recv`` would have the kernel close them: nothing could leak either way.

Requests on one connection are answered in order; a client that wants concurrency opens
more connections (``sandbox/client.py`` does).  Nothing but a second exec waits for
an exec: ``changes``, ``open_root`` and ``list`` on a busy capsule answer at once (each
connection has its own thread, and the manager's lock guards bookkeeping only, never a
running command), so a diff or a file read sees a running command's writes so far.  A frame that cannot be decoded is
answered with an error reply (id null) and the connection is closed; the server keeps
serving everyone else.  Every failure inside an op becomes an error reply.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import stat
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox import jail_end, run_sockets
from sandbox.errors import CcwError, ProtocolError, from_oserror
from sandbox.ops import (
    OPS,
    ChangesRequest,
    CreateRequest,
    DestroyRequest,
    ExecRequest,
    ForkRequest,
    FreezeRequest,
    HelloRequest,
    ListRequest,
    NetConnectRequest,
    NetForwardRequest,
    NetOpenRequest,
    OpenRootRequest,
    OpRequest,
    RunReadsRequest,
    SignalRequest,
    attach_descriptors,
    parse_request,
)
from sandbox.opsurface import SURFACE
from sandbox.protocol import (
    PROTOCOL_VERSION,
    FrameDecoder,
    Request,
    descriptors_of,
    encode_error,
    encode_progress,
    encode_reply,
)
from sandbox.replies import (
    ChangesReply,
    CreateReply,
    DestroyReply,
    ExecProgress,
    ExecReply,
    ForkReply,
    FreezeReply,
    HelloReply,
    ListReply,
    NetConnectReply,
    NetForwardReply,
    NetOpenReply,
    OpenRootReply,
    OpReply,
    RunReadsReply,
    SignalReply,
)
from sandbox.syscalls import unix_address

if TYPE_CHECKING:
    from sandbox.manager import CapsuleManager

log = logging.getLogger("ccw.helper")

Progress = Callable[[dict[str, Any]], None]  # sends one progress report to the caller
RECV_CHUNK = 256 * 1024
MAX_REQUEST_FDS = 4  # descriptors taken from one read; an exec on a terminal sends one
MAX_CONNECTIONS = 256  # one thread each; more are told to retry, not queued without bound
OVERFLOW_UID = 65534


@dataclass(frozen=True)
class Peer:
    """The connecting process, as SO_PEERCRED reports it."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> Peer:
    """Read SO_PEERCRED (struct ucred: pid, uid, gid) of a connected unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


_REQUEST_ANCILLARY = socket.CMSG_SPACE(MAX_REQUEST_FDS * 4)


class Dispatcher:
    """Routes each op of the closed set to the CapsuleManager, with the caller from SO_PEERCRED.

    Each request is read into its typed form (``sandbox/ops.py``), which checks every
    argument, before any handler runs; the manager re-checks only what depends on the
    host (paths, ownership), in ``sandbox/access.py``, and answers with the op's typed
    reply, whose ``to_args()`` is what goes on the wire.
    """

    def __init__(
        self,
        manager: CapsuleManager,
        mode: str,
        mechanisms: dict[str, Any],
        allowed_uids: frozenset[int] | None = None,
    ) -> None:
        self.manager = manager
        self.mode = mode
        self.mechanisms = mechanisms
        self.allowed_uids = allowed_uids
        self._handlers: dict[str, Callable[[Any, Peer, Progress | None], tuple[OpReply, list[int]]]] = {
            "hello": self._hello,
            "create": self._create,
            "exec": self._exec,
            "changes": self._changes,
            "fork": self._fork,
            "open_root": self._open_root,
            "net_open": self._net_open,
            "signal": self._signal,
            "freeze": self._freeze,
            "net_connect": self._net_connect,
            "net_forward": self._net_forward,
            "run_reads": self._run_reads,
            "destroy": self._destroy,
            "list": self._list,
        }
        assert set(self._handlers) == set(OPS), "dispatch table and protocol op set differ"

    def handle(self, request: Request, peer: Peer, progress: Progress | None = None,
               received: list[int] | None = None) -> tuple[dict[str, Any], list[int]]:
        """Run one request; returns (its typed reply's ``to_args()``, the fds to pass, in order).  Raises CcwError only.

        ``progress`` sends an interim report to the caller (exec with ``progress_ms``).
        ``received``: the descriptors that came with the request; this call owns them and
        closes them before it returns.
        """
        received = list(received or [])
        try:
            self._check_peer(peer)
            parsed = parse_request(request.op, request.args)
        except BaseException:
            for fd in received:
                os.close(fd)
            raise
        typed = attach_descriptors(parsed, received)  # closes them itself when it refuses
        try:
            return self._run(request, typed, peer, progress)
        finally:
            for fd in typed.descriptors():
                os.close(fd)

    def _check_peer(self, peer: Peer) -> None:
        if peer.uid == OVERFLOW_UID or (
            self.allowed_uids is not None and peer.uid not in self.allowed_uids
        ):
            raise CcwError(
                "PERMISSION_DENIED",
                f"uid {peer.uid} may not use this helper; a rootless helper serves only the "
                "user that started it: start your own (ccw-mcp does so by default)",
            )

    def _run(self, request: Request, typed: OpRequest[Any], peer: Peer,
             progress: Progress | None) -> tuple[dict[str, Any], list[int]]:
        try:
            reply, fds = self._handlers[request.op](typed, peer, progress)
        except CcwError:
            raise
        except OSError as exc:
            raise from_oserror(exc, request.op) from exc
        except Exception as exc:
            log.exception("op %s from pid %d failed", request.op, peer.pid)
            raise CcwError(
                "INTERNAL",
                f"{request.op} failed inside the helper: {type(exc).__name__}: {exc}; "
                "see the helper's log, and report it",
            ) from exc
        if not isinstance(reply, typed.reply):
            for fd in fds:
                os.close(fd)
            raise CcwError("INTERNAL", f"{request.op} returned {type(reply).__name__}, not {typed.reply.__name__}")
        return reply.to_args(), fds

    def _hello(self, request: HelloRequest, peer: Peer, progress: Progress | None) -> tuple[HelloReply, list[int]]:
        if request.version != PROTOCOL_VERSION:
            raise CcwError(
                "UNSUPPORTED",
                f"the front end speaks IPC version {request.version}, this helper "
                f"{PROTOCOL_VERSION}; install matching versions of ccw-mcp and ccw-helper",
            )
        return HelloReply(PROTOCOL_VERSION, self.mode, self.mechanisms, tuple(sorted(OPS)), SURFACE), []

    def _create(self, request: CreateRequest, peer: Peer, progress: Progress | None) -> tuple[CreateReply, list[int]]:
        return self.manager.create(peer.uid, peer.gid, request.spec), []

    def _exec(self, request: ExecRequest, peer: Peer, progress: Progress | None) -> tuple[ExecReply, list[int]]:
        on_progress = None
        if progress is not None and request.progress_ms is not None:
            send = progress

            # Reports go out on the caller's connection while the command runs; if the
            # caller has gone, sending fails and the exec ends with it.
            def on_progress(report: ExecProgress) -> None:
                send(report.to_args())

        return self.manager.exec(request, peer.uid, peer.gid, on_progress=on_progress), []

    def _changes(self, request: ChangesRequest, peer: Peer,
                 progress: Progress | None) -> tuple[ChangesReply, list[int]]:
        return self.manager.changes(request.capsule_id, peer.uid, bool(request.leave_not_utf8),
                                    bool(request.unlisted), bool(request.mtimes)), []

    def _fork(self, request: ForkRequest, peer: Peer, progress: Progress | None) -> tuple[ForkReply, list[int]]:
        return self.manager.fork(request.capsule_id, peer.uid, peer.gid, request.donors), []

    def _open_root(self, request: OpenRootRequest, peer: Peer,
                   progress: Progress | None) -> tuple[OpenRootReply, list[int]]:
        fd = self.manager.open_root(request.capsule_id, peer.uid)
        return OpenRootReply(request.capsule_id), [fd]

    def _net_open(self, request: NetOpenRequest, peer: Peer,
                  progress: Progress | None) -> tuple[NetOpenReply, list[int]]:
        reply, fds = self.manager.net_open(request.capsule_id, peer.uid)
        if not request.runs:
            return reply, fds
        return run_sockets.with_runs(self.manager, request.capsule_id, peer.uid, reply, fds)

    def _signal(self, request: SignalRequest, peer: Peer, progress: Progress | None) -> tuple[SignalReply, list[int]]:
        return self.manager.signal(request.capsule_id, request.service, request.signal, peer.uid), []

    def _freeze(self, request: FreezeRequest, peer: Peer, progress: Progress | None) -> tuple[FreezeReply, list[int]]:
        return self.manager.freeze(request.capsule_id, request.frozen, peer.uid), []

    def _net_connect(self, request: NetConnectRequest, peer: Peer,
                     progress: Progress | None) -> tuple[NetConnectReply, list[int]]:
        return self.manager.net_connect(request.capsule_id, request.port, peer.uid, request.spares, bool(request.v6))

    def _net_forward(self, request: NetForwardRequest, peer: Peer,
                     progress: Progress | None) -> tuple[NetForwardReply, list[int]]:
        return self.manager.net_forward(request, peer.uid, peer.pid), []

    def _run_reads(self, request: RunReadsRequest, peer: Peer,
                   progress: Progress | None) -> tuple[RunReadsReply, list[int]]:
        return self.manager.run_reads(request.capsule_id, request.service, peer.uid), []

    def _destroy(self, request: DestroyRequest, peer: Peer,
                 progress: Progress | None) -> tuple[DestroyReply, list[int]]:
        return self.manager.destroy(request.capsule_id, peer.uid), []

    def _list(self, request: ListRequest, peer: Peer, progress: Progress | None) -> tuple[ListReply, list[int]]:
        return self.manager.list(peer.uid), []


class HelperServer:
    """Listen on a unix socket and answer requests with a Dispatcher until ``shutdown()``."""

    def __init__(
        self, path: str, dispatcher: Dispatcher, mode: int = 0o600, group: int | None = None
    ) -> None:
        self.path = os.path.abspath(path)
        self.dispatcher = dispatcher
        self.mode = mode
        self.group = group
        self._listener: socket.socket | None = None
        self._owns_path = True  # False for a socket systemd made (adopt): it stays for the next start
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._wakes_on_signals = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}

    # --- prepare ----------------------------------------------------------------------

    def listen(self) -> None:
        """Remove a stale socket file, bind with a safe mode, listen."""
        self._remove_stale()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            with unix_address(self.path) as address:
                old_umask = os.umask(0o177)
                try:
                    listener.bind(address)
                finally:
                    os.umask(old_umask)
                if self.group is not None:
                    os.chown(address, -1, self.group)
                os.chmod(address, self.mode)
            listener.listen(64)
        except OSError as exc:
            listener.close()
            raise from_oserror(exc, "bind", self.path, "check that its directory exists and is writable") from exc
        self._listener = listener
        log.info("listening on %s (mode %04o)", self.path, self.mode)

    def adopt(self, listener: socket.socket) -> None:
        """Serve on a socket already listening (systemd socket activation) instead of listen()."""
        listener.set_inheritable(False)  # a jail must never inherit it
        self._listener = listener
        self._owns_path = False
        log.info("serving on the socket passed by systemd (%s)", self.path)

    def _remove_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise CcwError(
                "CONFLICT",
                f"{self.path} exists and is not a socket; remove it or choose another --socket",
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            with unix_address(self.path) as address:
                probe.connect(address)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise from_oserror(exc, "connect (stale socket check)", self.path) from exc
            log.info("removing stale socket %s", self.path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        else:
            raise CcwError(
                "CONFLICT",
                f"another helper is serving on {self.path}; stop it or choose another --socket",
            )
        finally:
            probe.close()

    # --- serve ------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept connections until ``shutdown()``; then finish in-flight requests and unlink."""
        assert self._listener is not None, "call listen() first"
        poller = select.poll()  # not select(): descriptors may exceed FD_SETSIZE
        poller.register(self._listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._stopping.is_set():
                ready = {fd for fd, _ in poller.poll()}
                if self._listener.fileno() not in ready:
                    continue
                try:
                    conn, _ = self._listener.accept()
                except OSError as exc:  # EMFILE, ECONNABORTED: keep serving the others
                    log.warning("accept failed: %s", exc)
                    self._stopping.wait(0.1)  # EMFILE would otherwise spin
                    continue
                with self._lock:
                    full = len(self._connections) >= MAX_CONNECTIONS
                if full:
                    self._refuse(conn)
                    continue
                thread = threading.Thread(target=self._serve_connection, args=(conn,), daemon=True)
                with self._lock:
                    self._connections[conn] = thread
                thread.start()
        finally:
            self._finish()

    def _refuse(self, conn: socket.socket) -> None:
        busy = CcwError(
            "UNAVAILABLE",
            f"the helper is serving {MAX_CONNECTIONS} connections already; close idle ones and retry",
        )
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(encode_error(None, busy))
            # Closing a unix socket with unread data makes the peer's next recv() fail with
            # ECONNRESET instead of reading the refusal: drop what the client already sent
            # (without waiting for more; the accept loop must not block on it).
            for _ in range(16):
                if not conn.recv(1 << 16):
                    break
        conn.close()

    def wake_on_signals(self) -> None:
        """Make every signal Python handles wake ``serve_forever``; call from the main thread.

        A signal sent to the process may land on any of its threads (the disk and
        namespace pools run their own).  CPython runs the Python handler only in the main
        thread, when it next runs bytecode, so a main thread asleep in ``poll()`` never
        notices a SIGTERM that another thread took: ``ccw helper stop`` then waited
        forever.  With the wake pipe as the wakeup fd, the C-level handler writes to it
        from whichever thread, the poll returns, and the handler runs.
        """
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self._wakes_on_signals = True

    def shutdown(self) -> None:
        """Stop accepting and wind down; safe to call from a signal handler or any thread."""
        self._stopping.set()
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _finish(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            if self._owns_path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        with self._lock:
            connections = dict(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RD)
        for thread in connections.values():
            thread.join()
        jail_end.settle(10.0)  # the execs' ends, after their replies: no init or cgroup left behind
        if self._wakes_on_signals:
            signal.set_wakeup_fd(-1)
        os.close(self._wake_r)
        os.close(self._wake_w)
        log.info("stopped")

    def _serve_connection(self, conn: socket.socket) -> None:
        try:
            peer = peer_credentials(conn)
            log.debug("connection from pid %d uid %d", peer.pid, peer.uid)
            decoder = FrameDecoder("request")
            received: list[int] = []  # descriptors that came with bytes not yet decoded
            while True:
                for request in decoder.messages():
                    taken, received = received, []
                    self._answer(conn, request, peer, taken)
                if decoder.buffered == 0 and self._stopping.is_set():
                    break
                data, ancdata, _flags, _addr = conn.recvmsg(RECV_CHUNK, _REQUEST_ANCILLARY, socket.MSG_CMSG_CLOEXEC)
                received += descriptors_of(ancdata)
                if not data:
                    decoder.feed_eof()
                    for request in decoder.messages():
                        taken, received = received, []
                        self._answer(conn, request, peer, taken)
                    break
                decoder.feed(data)
        except ProtocolError as exc:
            log.warning("closing a connection after a malformed frame: %s", exc.message)
            with contextlib.suppress(OSError):
                conn.sendall(encode_error(None, exc))
        except OSError as exc:  # the peer went away mid-reply
            log.info("connection ended: %s", exc)
        finally:
            for fd in received:  # arrived with a frame never completed
                os.close(fd)
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def _answer(self, conn: socket.socket, request: Request, peer: Peer, received: list[int]) -> None:
        fds: list[int] = []
        try:
            try:
                result, fds = self.dispatcher.handle(
                    request, peer, lambda report: conn.sendall(encode_progress(request.id, report)), received
                )
                frame = encode_reply(request.id, result)
            except CcwError as exc:
                for fd in fds:
                    os.close(fd)
                fds = []
                frame = encode_error(request.id, exc)
            if not fds:
                conn.sendall(frame)
            else:
                sent = socket.send_fds(conn, [frame], fds)
                if sent < len(frame):
                    conn.sendall(frame[sent:])
        finally:
            for fd in fds:
                os.close(fd)
