"""One network namespace per capsule, shared by its execs, shells and services.

A capsule is one network world: a service started in it listens on the capsule's
loopback, and an exec run after it reaches ``127.0.0.1:PORT`` there.  So every jail of a
capsule joins the same namespace instead of unsharing its own:

- An "egress" capsule already had one: its kit's jail namespace (egress.py), made at its
  first ``net_open``.  Nothing changes for it.
- A "none" capsule gets an empty namespace with ``lo`` up, made at its first run and
  kept in the helper's memory until destroy, like a kit.  Nothing outside the capsule
  is in it: no interface but ``lo``, no route.  A helper's restart loses it, and with it
  every service the capsule ran (they lived in that helper's jails anyway); the next run
  gets a new one.

Some facts this module follows from:

- ``unshare(CLONE_NEWNET)`` and ``setns`` move only the calling *thread*, and a socket
  belongs for its life to the namespace its creating thread was in (egress.py's essay).
  So a namespace is made, and a socket inside one is opened, on a short-lived thread
  that never goes back: going back needs CAP_SYS_ADMIN over the user namespace that
  owns the helper's own namespace, which a rootless helper lacks.  One path serves
  both modes.  A thread costs about 0.1 ms, the namespace about 0.8 ms, once per
  capsule; the jail's init ``setns``-es into it as it did into a spare (cheaper than
  the 0.6 ms unshare it replaces).
- A socket made inside the capsule's namespace and connected there to 127.0.0.1 reaches
  only what the capsule's own jails listen on; handed to the front end (``net_connect``)
  it is how a ready check and a forwarded port reach a service.  Connecting on
  loopback completes or is refused at once, so the thread never waits on the network.
  A server that listens on ``::1`` only (``localhost`` resolved to IPv6) is tried
  second.
- A socket belongs to its namespace, not to whoever connects it: ``connect`` acts in
  the socket's own namespace.  So ``net_sockets`` hands the front end unconnected
  sockets made here, which it connects itself as connections come (a forwarded port's
  pool), saving the helper's round trip per connection; ``net_connect`` stays for the
  one-off connection; its spares are of one family, IPv4 unless asked for IPv6 (a forwarded
  port asks for those once a server turned out to listen on ``::1`` alone).
- Sharing the namespace across runs is what the issue asks for, and it costs
  isolation between *runs of one capsule* only: an exec can reach a service's ports,
  which is the point, and a lingering TIME_WAIT of an earlier run is still there.
  Capsules stay apart: each has its own namespace.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading

from sandbox import namespaces, syscalls
from sandbox.egress import Kits
from sandbox.errors import CcwError
from sandbox.replies import NetConnectReply
from sandbox.spec import JAIL_HOST_ADDRESS


def _make() -> int:
    """A new network namespace with ``lo`` up: its descriptor."""
    def work() -> int:
        syscalls.unshare(syscalls.CLONE_NEWNET)
        namespaces.loopback_up()
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    return namespaces.on_own_thread(work)


def _connect_inside(netns: int, port: int) -> socket.socket:
    """A TCP socket made in ``netns`` and connected there to the port on loopback (v4, then v6,
    then the jail's hostname's address: a dev server bound to the hostname listens there alone)."""
    def work() -> socket.socket:
        syscalls.setns(netns, syscalls.CLONE_NEWNET)
        refused: OSError | None = None
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"),
                                (socket.AF_INET, JAIL_HOST_ADDRESS)):
            sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.connect((address, port))
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ENETUNREACH):
                    raise
                refused = refused or exc
                continue
            sock.setblocking(False)
            return sock
        assert refused is not None
        raise refused

    return namespaces.on_own_thread(work)


NETLINK_SOCK_DIAG = 4  # <linux/netlink.h>


def _diag_inside(netns: int) -> socket.socket:
    """A NETLINK_SOCK_DIAG socket made in ``netns``: it asks about that namespace's
    sockets from wherever it is used (sandbox/run_sockets.py)."""
    def work() -> socket.socket:
        syscalls.setns(netns, syscalls.CLONE_NEWNET)
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                             NETLINK_SOCK_DIAG)

    return namespaces.on_own_thread(work)


def _sockets_inside(netns: int, count: int, family: int = socket.AF_INET) -> list[socket.socket]:
    """``count`` unconnected TCP sockets of ``family`` made in ``netns`` (non-blocking, close-on-exec)."""
    def work() -> list[socket.socket]:
        syscalls.setns(netns, syscalls.CLONE_NEWNET)
        made: list[socket.socket] = []
        try:
            for _ in range(count):
                made.append(socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK))
        except OSError:
            for sock in made:
                sock.close()
            raise
        return made

    return namespaces.on_own_thread(work)


class Nets:
    """Each capsule's network namespace: an egress capsule's kit's, or one of its own."""

    def __init__(self, kits: Kits) -> None:
        self.kits = kits
        self._own: dict[str, int] = {}
        self._lock = threading.Lock()

    def descriptor(self, capsule_id: str, network: str) -> int:
        """A copy of the capsule's namespace descriptor (the caller closes it), made on first use.

        An egress capsule's is its kit's: UNAVAILABLE (``network_not_open``) without one.
        """
        if network == "egress":
            return self.kits.jail_descriptor(capsule_id)
        with self._lock:
            fd = self._own.get(capsule_id)
            if fd is not None:
                return os.dup(fd)
        made = _make()
        with self._lock:
            fd = self._own.setdefault(capsule_id, made)
            copy = os.dup(fd)
        if fd != made:  # another run of the same capsule made one first
            os.close(made)
        return copy

    def connect(self, capsule_id: str, network: str, port: int) -> socket.socket:
        """A socket connected to ``port`` on the capsule's loopback; CONFLICT when nothing listens."""
        netns = self.descriptor(capsule_id, network)
        try:
            return _connect_inside(netns, port)
        except ConnectionRefusedError as exc:
            raise CcwError("CONFLICT", f"nothing in capsule {capsule_id} listens on port {port} (connection "
                           "refused); start the service, or wait until it is ready",
                           {"capsule_id": capsule_id, "port": port, "reason": "refused"}) from exc
        finally:
            os.close(netns)

    def diag_socket(self, capsule_id: str, network: str) -> socket.socket:
        """A sock_diag socket in the capsule's namespace, to look up whose a socket there is."""
        netns = self.descriptor(capsule_id, network)
        try:
            return _diag_inside(netns)
        finally:
            os.close(netns)

    def passed(self, capsule_id: str, network: str, port: int, spares: int | None,
               v6: bool = False) -> tuple[NetConnectReply, list[int]]:
        """``net_connect``'s reply and descriptors: a socket connected to ``port``; or ``spares``
        unconnected ones (IPv6 ones with ``v6``), for the caller to connect there itself (a
        forwarded port's pool)."""
        if spares is None:
            return NetConnectReply(port), [self.connect(capsule_id, network, port).detach()]
        netns = self.descriptor(capsule_id, network)
        try:
            family = socket.AF_INET6 if v6 else socket.AF_INET
            fds = [sock.detach() for sock in _sockets_inside(netns, spares, family)]
        finally:
            os.close(netns)
        return NetConnectReply(port, spares), fds

    def close(self, capsule_id: str) -> None:
        """Let the capsule's own namespace go (destroy); its kit is closed by ``Kits.close``."""
        with self._lock:
            fd = self._own.pop(capsule_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_all(self) -> None:
        """Let every namespace go (the helper is stopping)."""
        with self._lock:
            fds, self._own = list(self._own.values()), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
