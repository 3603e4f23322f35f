"""A forwarded port: a URL on the host's loopback that reaches a service listening in a
capsule's own network namespace, for the capsule's owner alone.

This process holds the port and everything that needs the front end; a small C program,
``ccw-forward`` (egress/forwarder/ccw_forward.c, whose essay says why C and how it relays),
accepts and relays.  With a privileged helper the owner's own connections skip both, led
into the capsule by NAT (capsules/ports.py asks for it, sandbox/kernel_ports.py makes it):
then what reaches the listener is everyone else's, to be refused.  Per port:

- Where it listens: ``127.0.0.1`` only, on the host port asked for (0: any free one),
  with ``[::1]`` of the same port held unlistened (``_hold_v6``: no other user's program
  there for ``localhost``).  Both are made here, so a port another program holds is a
  CONFLICT at once that says to pick another, and the URL is known before the program starts.  ``SO_REUSEADDR``
  lets a port given up a moment ago be forwarded again while its old connections sit in
  ``TIME_WAIT``; it does not let two listeners share one.
- Who passes: every local user can reach the host's loopback, so each connection is
  judged before a byte is read or sent: the program asks sock_diag for the uid that owns
  the connecting socket (egress/peer.py's essay: the same exact lookup) and closes
  anything but ``owner_uid``'s (another user, or nobody: the client closed before it could
  be asked); this process counts it and tells ``on_refused``.  Opening the port makes one
  lookup of the listener itself here, so a kernel that answers none (no ``tcp_diag``) is
  an UNSUPPORTED at once rather than a port that refuses everyone.
- The capsule's side: spare sockets of the capsule's namespace (the helper makes them
  unconnected: ``spares``), passed to the program, which connects one per connection; a
  socket's ``connect`` acts in its own namespace, so neither process enters it.  With no
  spare, or one refused there, the program asks, and this process calls ``connect``, a
  helper op that connects inside the capsule (v4, then v6) and says what failed, and
  passes the socket on.  The spares are IPv4 until a server turns out to listen on
  ``::1`` alone; then the program asks for IPv6 ones (its essay).  If it fails
  (``on_error`` is told why) or no side comes within ``connect_timeout`` (the service is
  not listening yet), the client is closed; the person may retry.
- Bounds: at most ``MAX_OPEN`` connections at once; past it one that passed is closed and
  counted as an error.  Each relay holds two 64 KiB pipes, no more: a slow reader slows
  its writer.
- Lifetime: the program's control socket is its lifeline; ``aclose`` closes it, the
  program exits, and the kernel ends its connections with it.  A front end that dies
  ends its ports the same way.

Counts (``counts``): ``accepted`` (relayed), ``refused`` and ``errors``, each connection
once, kept by the program and asked for; ``refused`` and ``errors`` are also counted here
as they are told.  Observers run in the trio thread and must not block; one that raises
is logged and the forward goes on.

Figures (issue 36, ``bench/run.py services``; the 2-core VM): per connection the program
makes the owner check, a connect and a splice each way, 190-375 us of its CPU at load 3-4
(65-90 us at load 1.5-2, perf stat), nearly all the kernel's for the second loopback
connection (ccw_forward.c's essay says where the floor is); the front end took 1.3-1.5 ms
of trio's CPU for the same before.  What stayed here per connection was the pool's refill:
with 14 spares a helper call, 7 round trips per 100 fresh connections, some 2 ms of this
process's CPU each (15 ms per 100 connections above the direct run's, about 150 us a
connection, on cores the client and the server need); with a pool of ``POOL_SIZE``
refilled 128 at a time, one per 128, about 2 ms per 100.  Against the same server reached
straight on the capsule's loopback, rates are in bench/suites/services.py's report.
"""

from __future__ import annotations

import array
import contextlib
import errno
import functools
import logging
import os
import socket
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from mcp_server.egress import peer, splice
from mcp_server.egress.relay import CONNECT_TIMEOUT
from sandbox.errors import CcwError, from_oserror
from sandbox.ops import MAX_SPARES

log = logging.getLogger("ccw.egress")

HOST = "127.0.0.1"
BACKLOG = 128
MAX_OPEN = 1024  # connections at once; each holds two sockets and two pipes in ccw-forward
# Spares kept (at most the program's max_spares); it asks for more at half, which is one
# helper call (MAX_SPARES) and one message to the program: a refill costs the front end and
# the helper some milliseconds of CPU whatever its size, so the fewer the better (ccw_forward.c's capsule.c).
POOL_SIZE = 2 * MAX_SPARES
PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ccw-forward")
_STOP_S = 2.0  # for ccw-forward to exit once its control socket is closed, before a kill

Connect = Callable[[], Awaitable[trio.socket.SocketType]]
# that many unconnected sockets of the capsule's namespace (IPv6 ones if true)
Spares = Callable[[int, bool], Awaitable[list[socket.socket]]]


@dataclass(frozen=True)
class Client:
    """The client of one connection to a forwarded port."""

    address: str
    port: int
    uid: int | None  # who owns its socket; None: nobody any more (it closed), or unknown


@dataclass(frozen=True)
class Counts:
    """What a forward's program has done: connections relayed, refused and failed, open now,
    and messages to this process it dropped because this process was not reading."""

    accepted: int
    refused: int
    errors: int
    open: int
    dropped: int


def missing() -> str | None:
    """Why ccw-forward cannot be run (None: it can), with how to recover."""
    if os.access(PROGRAM, os.X_OK):
        return None
    return (f"the port forwarder {PROGRAM} is missing or not executable; reinstall ccw "
            "(pip install --force-reinstall ccw; in a checkout ./dev setup, or python setup.py "
            "launcher to build only the C programs, in place: it needs gcc)")


@functools.cache
def _printed() -> dict[str, dict[str, str]]:
    """What ``ccw-forward --protocol`` prints: its messages' codes and its limits, by name."""
    printed = subprocess.run([PROGRAM, "--protocol"], capture_output=True, text=True, check=True, timeout=10)
    table: dict[str, dict[str, str]] = {"message": {}, "limit": {}}
    for line in printed.stdout.splitlines():
        kind, name, value = line.split(" ")
        table[kind][name] = value
    return table


def protocol() -> dict[str, bytes]:
    """The control messages' codes, by name (ccw_forward.c is their one source)."""
    return {name: code.encode() for name, code in _printed()["message"].items()}


def limit(name: str) -> int:
    """One of the program's limits: ``fds_per_message``, ``max_spares``, ``reserved_fds``, ``fds_per_connection``."""
    return int(_printed()["limit"][name])


def _listen(port: int) -> socket.socket:
    """A listening socket on ``HOST:port``, or the CcwError that says how to choose another."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted sockets inherit TCP_NODELAY, so ccw-forward sets none per connection; set
        # before listening, as a client may connect before the program has started.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((HOST, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CcwError("CONFLICT", f"host port {port} on {HOST} is in use by another program; forward "
                           "to another host port, or to 0 for any free one",
                           {"host_port": port, "errno": "EADDRINUSE"}) from None
        raise from_oserror(exc, f"listening on {HOST}:{port}",
                           hint="forward to another host port, or to 0 for any free one") from exc
    return sock


def _hold_v6(port: int) -> socket.socket | None:
    """``[::1]:port`` bound, never listening, for as long as the forward lives; None on a host
    without IPv6 loopback.  Left free, another local user could listen there, and a browser
    tries ``localhost`` at ::1 first: the ``http://localhost:PORT/`` a dev server prints would
    take the owner's requests (cookies, an OAuth callback's code) to that user's program.
    Held, a connection there is refused and the client goes on to 127.0.0.1.  No
    ``SO_REUSEADDR``: with it on both, a second socket could bind beside one not listening.
    EADDRINUSE is raised (``_listen_both``)."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(("::1", port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise
        return None  # no ::1 here (EADDRNOTAVAIL, EAFNOSUPPORT): nobody can listen there either
    return sock


def _listen_both(port: int) -> tuple[socket.socket, socket.socket | None]:
    """``_listen``'s socket and ``_hold_v6``'s on the same port: for ``port`` 0 the first free
    port whose ::1 is free too; for another, CONFLICT if its ::1 is taken, saying why."""
    for _ in range(16 if port == 0 else 1):
        listener = _listen(port)
        chosen = listener.getsockname()[1]
        try:
            return listener, _hold_v6(chosen)
        except OSError:
            listener.close()
    raise CcwError("CONFLICT", f"[::1]:{chosen} is in use by another program, and a browser's "
                   f"http://localhost:{chosen}/ would reach it before the forward on {HOST}; forward to "
                   "another host port, or to 0 for any free one", {"host_port": chosen, "errno": "EADDRINUSE"})


def _check_lookups(listener: socket.socket) -> None:
    """Ask sock_diag for the listener's own owner: the lookup every connection needs works here."""
    host, port = listener.getsockname()[:2]
    why = None
    try:
        found = peer.socket_uid((host, port), ("0.0.0.0", 0))
    except OSError as exc:
        found, why = None, exc.strerror or str(exc)
    if found is None:
        raise CcwError("UNSUPPORTED", "this kernel does not say who owns a TCP socket (NETLINK_SOCK_DIAG "
                       f"for TCP: {why or 'not found'}), so a forwarded port could not tell the capsule's "
                       "owner from other users; load the tcp_diag module (modprobe tcp_diag) and retry",
                       {"host_port": port})


class PortForward:
    """One forwarded port: ``127.0.0.1:host_port`` on the host to ``capsule_port`` in a
    capsule, for connections whose socket ``owner_uid`` owns.

    Listens from construction (``host_port`` is known at once); ``serve`` in a nursery
    runs ccw-forward and answers it until ``aclose``."""

    def __init__(self, connect: Connect, owner_uid: int, capsule_port: int, host_port: int = 0, *,
                 on_refused: Callable[[Client], None] | None = None,
                 on_error: Callable[[Client, Exception], None] | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, spares: Spares | None = None,
                 ready: list[socket.socket] | None = None, pool_size: int = POOL_SIZE) -> None:
        why = missing()
        if why is not None:
            raise CcwError("UNSUPPORTED", why)
        self.owner_uid = owner_uid
        self.capsule_port = capsule_port
        self.connect_timeout = connect_timeout
        self.refused = 0  # as told: not the owner's, or gone before it could be asked
        self.errors = 0  # as told: the owner's, but no capsule side (or MAX_OPEN were open)
        self._connect = connect
        self._spares = spares
        self._ready = list(ready or [])  # spares to pass at the start
        self._pool_size = pool_size if spares is not None else 0
        self._on_refused = on_refused
        self._on_error = on_error
        self._listener, self._v6 = _listen_both(host_port)
        try:
            _check_lookups(self._listener)
        except CcwError:
            self._listener.close()
            if self._v6 is not None:
                self._v6.close()
            raise
        splice.unpaced(self._listener)
        self.host_port: int = self._listener.getsockname()[1]
        self._control: trio.socket.SocketType | None = None
        self._process: trio.Process | None = None
        self._counted: trio.MemorySendChannel[Counts] | None = None
        self._asking = trio.Lock()
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self._closed = False

    @property
    def program_pid(self) -> int | None:
        """ccw-forward's pid while it runs (diagnostics, and tests that stop it for a moment)."""
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    @property
    def listener_fd(self) -> int:
        """The listening socket's descriptor: the proof, sent to the helper, that this process holds the port."""
        return self._listener.fileno()

    @property
    def url(self) -> str:
        """Where a person's browser goes: ``http://127.0.0.1:PORT/``."""
        return f"http://{HOST}:{self.host_port}/"

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run ccw-forward and answer it until ``aclose`` (or until it ends: then the port is closed)."""
        if self._closed:
            raise RuntimeError("this port forward is closed")
        ours, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            with trio.CancelScope() as self._scope, ours, its:
                self._control = trio.socket.from_stdlib_socket(ours)
                if self._ready:  # queued before the program starts: it takes them before it asks
                    await self._pass_spares(self._ready)
                self._process = await trio.lowlevel.open_process(
                    [PROGRAM, "--listen", str(self._listener.fileno()), "--control", str(its.fileno()),
                     "--owner", str(self.owner_uid), "--port", str(self.capsule_port),
                     "--pool", str(self._pool_size), "--max-open", str(MAX_OPEN),
                     "--connect-timeout-ms", str(max(1, round(self.connect_timeout * 1000)))],
                    pass_fds=(self._listener.fileno(), its.fileno()), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL)
                its.close()
                async with trio.open_nursery() as nursery:
                    task_status.started()
                    await self._answer(nursery)
        finally:
            await self._end_program()
            self._stopped.set()

    async def _answer(self, nursery: trio.Nursery) -> None:
        codes = protocol()
        assert self._control is not None
        while True:
            message = await self._control.recv(512)
            if not message:
                code = self._process.returncode if self._process else None
                log.error("port forward %s: ccw-forward ended (exit %s); the port no longer answers",
                          self.host_port, code)
                self._listener.close()
                return
            kind, fields = message[:1], message[1:].decode("ascii", "replace").split(" ")
            if kind == codes["want"]:
                nursery.start_soon(self._refill, int(fields[0]), fields[1] == "6")
            elif kind == codes["connect"]:
                nursery.start_soon(self._connect_for, fields[0], _client(fields[1], fields[2], self.owner_uid))
            elif kind == codes["refused"]:
                uid = int(fields[0])
                self.refused += 1
                self._tell(self._on_refused, _client(fields[1], fields[2], uid if uid >= 0 else None))
            elif kind == codes["error"]:
                self.errors += 1
                self._tell(self._on_error, _client(fields[1], fields[2], self.owner_uid), self._error(fields[0]))
            elif kind == codes["counts"] and self._counted is not None:
                self._counted.send_nowait(Counts(*(int(field) for field in fields)))

    def _error(self, kind: str) -> CcwError:
        if kind == "timeout":
            return CcwError("TIMEOUT", f"port {self.capsule_port} in the capsule did not answer within "
                            f"{self.connect_timeout:g} s; retry")
        if kind == "full":
            return CcwError("UNAVAILABLE", f"{MAX_OPEN} connections through host port {self.host_port} are "
                            "open; close some and retry")
        return CcwError("UNAVAILABLE", f"the forwarder could not relay a connection ({kind}: out of "
                        "descriptors or memory); close some connections and retry")

    async def _refill(self, count: int, v6: bool) -> None:
        made: list[socket.socket] = []
        try:
            while self._spares is not None and len(made) < count:
                made += await self._spares(min(count - len(made), MAX_SPARES), v6)
        except Exception as exc:  # the helper's: the capsule gone, a helper restarting
            log.warning("port forward %s: no spare sockets from the helper: %s", self.host_port, exc)
        except BaseException:  # cancelled (the forward closing) between two helper calls: close the first's
            for sock in made:
                sock.close()
            raise
        await self._pass_spares(made)  # none at all still tells it to ask again later

    async def _pass_spares(self, spares: list[socket.socket]) -> None:
        try:
            step = limit("fds_per_message")
            for at in range(0, max(len(spares), 1), step):
                batch = spares[at:at + step]
                await self._send(protocol()["spares"], [sock.fileno() for sock in batch])
        finally:
            for sock in spares:
                sock.close()

    async def _connect_for(self, conn_id: str, who: Client) -> None:
        """A capsule socket from ``connect`` for a connection the program has no spare for."""
        try:
            with trio.fail_after(self.connect_timeout):
                capsule = await self._connect()
        except trio.TooSlowError:
            return  # the program's own deadline has passed too: it reports the timeout
        except Exception as exc:  # the caller's: a port not listening, a helper error
            self.errors += 1
            self._tell(self._on_error, who, exc)
            await self._send(protocol()["failed"] + conn_id.encode(), [])
            return
        with capsule:
            await self._send(protocol()["connected"] + conn_id.encode(), [capsule.fileno()])

    async def _send(self, message: bytes, fds: list[int]) -> None:
        if self._control is None:
            return
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        with contextlib.suppress(OSError):  # the program has ended: _answer says so
            await self._control.sendmsg([message], ancillary)

    def _tell(self, observer: Callable[..., None] | None, *args: object) -> None:
        if observer is None:
            return
        try:
            observer(*args)
        except Exception:
            log.exception("port forward %s: an observer failed", self.host_port)

    async def counts(self) -> Counts:
        """The program's counts, asked of it now: exact for every connection it has closed
        (it counts before it answers).  With no program running, what this process was told."""
        if self._control is None:
            return Counts(0, self.refused, self.errors, 0, 0)
        async with self._asking:
            send, receive = trio.open_memory_channel[Counts](1)
            self._counted = send
            try:
                await self._send(protocol()["stats"], [])
                with trio.fail_after(10):
                    return await receive.receive()
            finally:
                self._counted = None

    async def _end_program(self) -> None:
        """Close the lifeline and wait for the program; kill it if it lingers."""
        if self._control is not None:
            self._control.close()
            self._control = None
        process = self._process
        if process is None:
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_STOP_S):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()

    async def aclose(self) -> None:
        """Stop the program (its connections end with it) and close the port."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()
        self._listener.close()
        if self._v6 is not None:
            self._v6.close()
        for sock in self._ready:
            sock.close()


def _client(address: str, port: str, uid: int | None) -> Client:
    return Client(address, int(port), uid)
