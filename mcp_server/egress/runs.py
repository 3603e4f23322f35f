"""Which run of an egress capsule made a connection the proxy accepted: the exec, or a
service by name (issue 36: a service is a run whose record is its own).

All the capsule's runs share its one network namespace, so the proxy sees the same jail
address from each; what tells them apart is the cgroup v2 id the kernel keeps on every
socket, the creator's (sandbox/run_sockets.py says why each service of an egress capsule
has one of its own, and an exec may not).  So:

- **One lookup per connection, here.**  The helper sends, with ``net_open`` asked with
  ``runs``, a sock_diag socket made in the jail's namespace and each running service's
  cgroup id.  At accept the session asks the kernel through that socket for the
  connecting socket's id by its 4-tuple (egress/peer.py ``socket_cgroup``): the jail's
  own end is our peer, its other end is us.  No round trip to the helper on the way.
- **An id no service has is the exec's.**  The exec's own cgroup, if it has a v2 one,
  or the helper's (it does not join v2 on a hybrid host), names no service.
- **An id not known yet** (a service started after the last answer) is asked of the
  helper once (``net_open`` with ``runs`` again): the answer names every service now.
  An id still unknown then is the exec's, and is not asked about again: the helper's
  own cgroup's id, where a hybrid host's execs sit, costs one round trip per session.
  A service whose first connection is looked up before the helper has noted its jail
  (``Run.track``, called as the spawn returns, while the jail's init is still setting
  up) would have that connection counted as the exec's, and later ones too (its id is
  then cached as no service's) until the front end learns its start (at its first
  progress report, a quarter second in): a narrow race, not closed.
- **Each service start is learnt**: the front end asks again once a service reports
  running (``learn``; capsules/services.py), so a service is known to have an id, or
  to have none, before it ends.  A service without one (a rootless helper without a
  delegated v2 subtree) cannot be told from the exec: its connections go to the exec's
  window, as before this module, and its record says so (``tagged`` is False for it,
  as for a service that ended before it was ever learnt).
- **The socket gone** before the lookup (a client that sent and closed at once), or the
  lookup failing: counted as the exec's, as before.

Cost, measured on the project's 2-core VM (kernel 6.18), medians of 10 000: the lookup
at accept (``cgroup_of``) 26 to 42 us, 0.44 of what a loopback connect and accept cost
in the same runs (59 to 95 us); the proxy then connects upstream and relays, which costs
more.  Once per service start: the helper's answer (a sock_diag socket made in the
namespace on a thread of its own, 0.22 ms, and a round trip), and the service's move
into its v2 cgroup (sandbox/run_sockets.py).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

import trio

from mcp_server.egress import peer

log = logging.getLogger("ccw.egress")

# The helper's answer: each running service's cgroup v2 id (None: it has none), and a new
# sock_diag socket in the capsule's jail namespace (the caller closes it).
Ask = Callable[[], Awaitable[tuple[dict[str, int | None], socket.socket]]]


class RunOwners:
    """Whose is each connection of one egress capsule: a service's name, or None (the exec's)."""

    def __init__(self, services: dict[str, int | None], diag: socket.socket, ask: Ask) -> None:
        self._diag = diag
        self._ask = ask
        self._names: dict[int, str] = {}  # cgroup id: service
        self._asked: set[int] = set()  # ids asked about and found to be no service's
        self._learn(services)

    @classmethod
    async def open(cls, ask: Ask) -> RunOwners:
        """The owners of a capsule's connections, from the helper's first answer."""
        services, diag = await ask()
        return cls(services, diag, ask)

    def _learn(self, services: dict[str, int | None]) -> None:
        for name, cgroup_id in services.items():
            if cgroup_id is not None:
                self._names[cgroup_id] = name
                self._asked.discard(cgroup_id)

    def cgroup_of(self, client: trio.socket.SocketType) -> int | None:
        """The cgroup v2 id of the jail's socket at the other end of ``client``; None if gone."""
        try:
            ours, theirs = client.getsockname(), client.getpeername()  # ENOTCONN once reset
            return peer.socket_cgroup(self._diag, (theirs[0], theirs[1]), (ours[0], ours[1]))
        except OSError as exc:
            log.warning("egress: whose a connection is not known: %s", exc)
            return None

    async def of(self, client: trio.socket.SocketType) -> str | None:
        """The service that made the connection ``client`` accepted, or None (the exec's)."""
        cgroup_id = self.cgroup_of(client)
        if cgroup_id is None:
            return None
        name = self._names.get(cgroup_id)
        if name is None and cgroup_id not in self._asked:
            await self.learn()
            name = self._names.get(cgroup_id)
            if name is None:
                self._asked.add(cgroup_id)
        return name

    async def learn(self) -> None:
        """Ask the helper for the capsule's services' ids again (a service has started)."""
        try:
            services, diag = await self._ask()
        except Exception as exc:  # the helper gone meanwhile: the connection is the exec's
            log.warning("egress: the capsule's services' cgroup ids not known: %r", exc)
            return
        diag.close()  # the first one serves
        self._learn(services)

    def tagged(self, service: str) -> bool:
        """Whether the service's connections are told apart: the helper gave it an id (False:
        it gave none, or was never asked while the service ran)."""
        return service in self._names.values()

    def forget(self, service: str) -> None:
        """The service's exec has ended: its ids name nobody any more."""
        self._names = {cgroup_id: name for cgroup_id, name in self._names.items() if name != service}

    def close(self) -> None:
        """Close the sock_diag socket."""
        self._diag.close()
