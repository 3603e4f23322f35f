"""A forwarded port: a URL on the host's loopback that reaches a service listening in a
capsule's own network namespace, for the capsule's owner alone.

- Where it listens: ``127.0.0.1`` only, on the host port asked for (0: any free one).
  A port another program holds is a CONFLICT that says to pick another.  ``SO_REUSEADDR``
  lets a port given up a moment ago be forwarded again while its old connections sit
  in ``TIME_WAIT``; it does not let two listeners share one.
- Who passes: every local user can reach the host's loopback, so each connection is
  judged before a byte is read or sent.  ``peer.py`` reads the uid that owns the
  connecting socket; anything but ``owner_uid`` (another user, or nobody: the client
  closed before it could be asked) is closed at once, counted in ``refused`` and told
  to ``on_refused``.  Opening the port makes one lookup of the forward's own listener,
  so a kernel that answers none (no ``tcp_diag``) is an UNSUPPORTED at once rather than
  a port that refuses everyone.
- The capsule's side: a spare socket of the capsule's namespace from ``pool`` (the
  helper made it ahead, unconnected: ``Pool``), connected here to ``capsule_port``; a
  socket's ``connect`` acts in its own namespace, so the helper's round trip is off the
  connection's path (it refills the pool in the background when half is used).  With no
  spare, or one refused (the pool is IPv4: a server on ``::1`` only), ``connect`` is the
  caller's, a helper op that connects inside the capsule (v4, then v6) and says what
  failed.  Either is called after the check, so a refused client costs nothing.  If it
  fails, or takes over ``connect_timeout`` (the service is not listening yet:
  ``ECONNREFUSED``), the client is closed, counted in ``errors`` and told to
  ``on_error`` (a timeout as a TIMEOUT CcwError); the person may retry.
- The relay, both ways until both sides are done, each side's EOF passed on as a
  half-close, so plain TCP, HTTP and a WebSocket upgrade pass alike; bytes are never
  looked at.  With ``sockmap`` (the helper's socket hashes: it could make them) the
  kernel moves the bytes and this process only waits for the ends
  (``kernel_relay.py``); ``relay_path`` says ``"sockmap"``.  Otherwise, or for a pair
  the kernel would not take (a client that half-closed before it was joined),
  ``splice.tunnel``: spliced in a worker thread while one is free, else the trio relay;
  ``relay_path`` says ``"user space"``.  Either counts bytes against a budget, which here has
  no cap (``NoByteCap``): a person's own traffic to their own service is not an exec's
  egress.  ``tunnel`` is taken since its ``_wait`` wakes for both directions of a socket
  (it did not: a 4 MiB echo and a 16 MiB upload to a slow reader stalled; tests/test_splice.py).
  The connections it accepts are given Reno (``splice.unpaced``): loopback is memory,
  where pacing buys nothing but timers (``splice.py``'s notes).
- Cost: per connection what stays is the owner check, a ``connect`` in the capsule, the
  pair entered in the maps (six syscalls) and the waits for the ends; per request on a
  kept connection, on the kernel path, nothing in this process (figures below).
- Bounds: at most ``MAX_OPEN`` relays at once; past it a connection that passed is
  closed and counted as an error.

Each connection is counted once: ``accepted`` (relayed), ``refused`` or ``errors``.
Observers run in the trio thread and must not block; one that raises is logged and the
forward goes on.

Figures (issue 36), on the project's 2-core VM while other sessions' tests kept its load
average at 10-13, so every path was slower than on a quiet machine and only figures of
one run compare.  The relays alone, on the host (tiny_http's server, the same client,
a forward with a pool, rounds interleaved, medians of 7), as the direct rate over the
forwarded one, and this process's CPU per GET:

    keep-alive GETs   sockmap 0.58x (~0 us)   tunnel 0.29x (110 us)   trio relay 0.22x (240 us)
    fresh connections sockmap 0.39x           tunnel 0.45x            trio relay 0.39x

A fresh connection costs this process some 1.5 ms of CPU under that load whatever moves
the bytes (the owner check, the connect, six map syscalls or a thread, trio's tasks);
``bench/run.py services`` through a capsule, same load: keep-alive 0.37-0.49x (0.24-0.33x
before, quiet), fresh 0.07-0.23x (0.16x before, quiet).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from mcp_server.egress import peer, splice
from mcp_server.egress.kernel_relay import NotJoined, Sockmap
from mcp_server.egress.relay import CONNECT_TIMEOUT, Attempt
from sandbox.errors import CcwError, from_oserror

log = logging.getLogger("ccw.egress")

HOST = "127.0.0.1"
BACKLOG = 128
MAX_OPEN = 1024  # relays at once; each holds two sockets and two trio tasks
_ACCEPT_RETRY = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

Connect = Callable[[], Awaitable[trio.socket.SocketType]]
Spares = Callable[[int], Awaitable[list[socket.socket]]]  # that many unconnected sockets of the capsule's namespace
POOL_SIZE = 8  # spares kept; refilled when half are used


class Pool:
    """Unconnected sockets of the capsule's namespace, made ahead by ``make`` (the helper's
    ``net_connect`` with ``spares``), each connected once by the forward itself.  Refilled
    in the background when half are gone, one refill at a time; a refill that fails is
    logged and tried again at the next take (the connection then asks the helper)."""

    def __init__(self, make: Spares, ready: list[socket.socket] | None = None, size: int = POOL_SIZE) -> None:
        self._make = make
        self._size = size
        self._ready = list(ready or [])
        self._refilling = False
        self._closed = False

    def take(self, nursery: trio.Nursery) -> socket.socket | None:
        """A spare if one is ready (else None), and a refill started if few are left."""
        sock = self._ready.pop() if self._ready else None
        if len(self._ready) <= self._size // 2 and not self._refilling and not self._closed:
            self._refilling = True
            nursery.start_soon(self._refill)
        return sock

    async def _refill(self) -> None:
        made: list[socket.socket] = []
        try:
            made = await self._make(self._size - len(self._ready))
        except Exception as exc:  # the helper's: the capsule gone, a helper restarting
            log.warning("port forward: no spare sockets from the helper: %s", exc)
        finally:
            self._refilling = False
        self._ready.extend(made)
        if self._closed:
            self.close()

    def close(self) -> None:
        """Close the spares; none are made after."""
        self._closed = True
        while self._ready:
            self._ready.pop().close()


@dataclass(frozen=True)
class Client:
    """The client of one connection to a forwarded port."""

    address: str  # "" if it reset before it could be asked
    port: int
    uid: int | None  # who owns its socket; None: nobody any more (it closed), or unknown


class NoByteCap:
    """A relay budget that grants every byte (``relay.Budget``)."""

    def take(self, wanted: int) -> int:
        """All of it."""
        return wanted

    def refund(self, unused: int) -> None:
        """Nothing was held back."""

    def cap_text(self) -> str:
        """Never shown: nothing is cut."""
        return "no byte cap"


def _listen(port: int) -> socket.socket:
    """A listening socket on ``HOST:port``, or the CcwError that says how to choose another."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
    accepts and relays until ``aclose``."""

    def __init__(self, connect: Connect, owner_uid: int, capsule_port: int, host_port: int = 0, *,
                 on_refused: Callable[[Client], None] | None = None,
                 on_error: Callable[[Client, Exception], None] | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, pool: Pool | None = None,
                 sockmap: Sockmap | None = None) -> None:
        self.owner_uid = owner_uid
        self.capsule_port = capsule_port
        self.connect_timeout = connect_timeout
        self.accepted = 0  # relayed to the capsule
        self.refused = 0  # not the owner's, or gone before it could be asked
        self.errors = 0  # the owner's, but connect() failed (or MAX_OPEN were open)
        self._connect = connect
        self._pool = pool
        self._sockmap = sockmap  # owned: closed with the port
        self.relay_path = "sockmap" if sockmap else "user space"  # what relays the bytes (the port's event says)
        self._on_refused = on_refused
        self._on_error = on_error
        listener = _listen(host_port)
        try:
            _check_lookups(listener)
        except CcwError:
            listener.close()
            raise
        self._listener = trio.socket.from_stdlib_socket(listener)
        splice.unpaced(self._listener)
        self.host_port: int = self._listener.getsockname()[1]
        self._open = 0
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self._closed = False

    @property
    def url(self) -> str:
        """Where a person's browser goes: ``http://127.0.0.1:PORT/``."""
        return f"http://{HOST}:{self.host_port}/"

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept and relay until ``aclose`` (which cancels the open relays)."""
        if self._closed:
            raise RuntimeError("this port forward is closed")
        try:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as nursery:
                    task_status.started()
                    await self._accept(nursery)
        finally:
            self._stopped.set()

    async def _accept(self, nursery: trio.Nursery) -> None:
        while True:
            try:
                client, _ = await self._listener.accept()
            except OSError as exc:
                if exc.errno in _ACCEPT_RETRY:
                    log.warning("port forward %s: accept failed (%s); retrying", self.host_port, exc.strerror)
                    await trio.sleep(0.1)
                    continue
                if exc.errno == errno.ECONNABORTED:
                    continue
                log.warning("port forward %s: stopped accepting: %s", self.host_port, exc)
                return
            self._admit(client, nursery)

    def _admit(self, client: trio.socket.SocketType, nursery: trio.Nursery) -> None:
        """Judge a new connection at once, in the accept loop: no byte is read before."""
        who = _identify(client)
        if who.uid != self.owner_uid:
            client.close()
            self.refused += 1
            self._tell_refused(who)
        elif self._open >= MAX_OPEN:
            self._fail(client, who, CcwError("UNAVAILABLE", f"{MAX_OPEN} connections through host port "
                                             f"{self.host_port} are open; close some and retry"))
        else:
            self._open += 1
            spare = self._pool.take(nursery) if self._pool is not None else None
            nursery.start_soon(self._relay, client, who, spare)

    async def _capsule_side(self, spare: socket.socket | None) -> trio.socket.SocketType:
        """A spare connected to the port in the capsule; else (none, or refused there on
        IPv4) the caller's ``connect``, which tries ``::1`` too and says what failed."""
        if spare is not None:
            capsule = trio.socket.from_stdlib_socket(spare)
            try:
                await capsule.connect((HOST, self.capsule_port))
                return capsule
            except OSError:
                capsule.close()
            except BaseException:  # cancelled (the port closing, the connect timing out)
                capsule.close()
                raise
        return await self._connect()

    async def _relay(self, client: trio.socket.SocketType, who: Client, spare: socket.socket | None) -> None:
        try:
            try:
                with trio.fail_after(self.connect_timeout):
                    capsule = await self._capsule_side(spare)
            except trio.TooSlowError:
                self._fail(client, who, CcwError("TIMEOUT", f"port {self.capsule_port} in the capsule did not "
                                                 f"answer within {self.connect_timeout:g} s; retry"))
                return
            except Exception as exc:  # the caller's: a port not listening, a helper error, a bug
                self._fail(client, who, exc)
                return
            self.accepted += 1
            for sock in (client, capsule):
                with contextlib.suppress(OSError):  # the caller's socket may not be TCP
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._sockmap is not None:
                try:
                    await self._sockmap.relay(client, capsule)  # closes both
                    return
                except NotJoined as exc:  # a side half-closed already (EOPNOTSUPP), the maps full
                    log.info("port forward %s: %s; relaying it in user space", self.host_port, exc)
            # The relay counts bytes into an egress record; here it is only that counter.
            record = Attempt(self.accepted, who.address, self.capsule_port, "tcp", True, None, None)
            await splice.tunnel(client, capsule, record, NoByteCap())  # closes both
        except Exception:  # one connection's failure must not end the port
            log.exception("port forward %s: a connection failed", self.host_port)
        finally:
            self._open -= 1
            client.close()

    def _fail(self, client: trio.socket.SocketType, who: Client, error: Exception) -> None:
        client.close()
        self.errors += 1
        if self._on_error is None:
            return
        try:
            self._on_error(who, error)
        except Exception:
            log.exception("port forward %s: on_error failed", self.host_port)

    def _tell_refused(self, who: Client) -> None:
        if self._on_refused is None:
            return
        try:
            self._on_refused(who)
        except Exception:
            log.exception("port forward %s: on_refused failed", self.host_port)

    async def aclose(self) -> None:
        """Stop accepting, end the open relays (their sockets close) and close the port."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()
        self._listener.close()
        if self._pool is not None:
            self._pool.close()
        if self._sockmap is not None:
            self._sockmap.close()


def _identify(client: trio.socket.SocketType) -> Client:
    """Who is at the other end of ``client``; a failed lookup reads as nobody."""
    try:
        address, port = client.getpeername()[:2]
    except OSError:  # ENOTCONN: it reset before it could be asked
        return Client("", 0, None)
    try:
        uid = peer.peer_uid(client)
    except OSError as exc:
        log.warning("port forward: who connected from %s port %s is unknown: %s", address, port, exc)
        uid = None
    return Client(address, port, uid)
