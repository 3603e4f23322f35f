"""One egress capsule's network, front-end side: its proxy listeners, sniffer and records.

The helper builds the capsule's two network namespaces and hands over three descriptors
(``net_open``): the HTTP proxy's and the SOCKS server's listening sockets, made in the
capsule's private egress namespace, and the sniffer.  A listening socket keeps the
namespace it was made in, so ``accept`` here, in the host's namespace, takes the jail's
connections; the upstream sockets this process opens are the host's, which is why each
one is judged against the host's own space (``core/netspace.py``, read by
``hostspace.py`` at every connection) before it is made.  ``serve`` runs in
a nursery for the capsule's life; an exec is bracketed by ``begin_exec`` (fresh caps)
and ``end_exec`` (the sorted records; ``notes`` then has the denial lines).

Whose a connection is: with ``owners`` (egress/runs.py), each accepted connection is
looked up once, at accept, and a service's goes to that service's own book (its records,
caps and byte budget, for its run's life), taken when its run ends (``take_service``);
everything else (the exec's, a connection whose maker is not known, and every direct
attempt the sniffer sees, which has no socket left to ask about) goes to the exec's
book, whose window ``begin_exec``/``end_exec`` bracket.  Without ``owners`` every
connection is the exec window's, as the services' were before (THREATS.md).

Bounds, so that a jail cannot make the front end grow without limit:
- every attempt through the proxy counts against its run's ``max_connections`` (a
  denied one too); past it, attempts are refused with "connection cap (N) reached" and recorded once
  per (host, port, protocol);
- direct attempts seen by the sniffer are recorded once per (protocol, address, port)
  in an exec (a loop of retries is one record);
- at most ``MAX_CLIENTS`` client connections are open at once (more are closed at
  accept), and each has ``header_timeout`` seconds for its request head or handshake.

Rules change while the session serves (``set_rules``: capsule_network, through
capsules/networks.py).  The next request is judged by the new rules (``admit`` reads
``spec`` each time, and ``open`` checks again what a change made while it resolved and
connected).  When rules are taken away, each open connection is judged again as if it
were new (``netrules.decide``, then ``netspace.refusal`` for the address it reached, so
a wildcard that reached a private address only because an exact-address rule reopened
it loses it with that rule), and one no longer allowed is cut: both its sockets are shut
down, so the relay (a splice thread or trio's) meets the end of both as it would a
closed connection and returns, and its record's ``cut`` says which rules cut it.  Not a
cancel scope per client task: in trio one costs a connection several percent (the
bench's ``CONNECT`` rows), and the shutdown needs nothing from the task serving it.
Every record names the rules it was decided by (``rules``, a ``netrules.rules_id``).
Caps: ``max_connections`` counts from the next request, ``max_bytes`` from the next
run's budget (a run's budget is set as it starts).

A miss may be asked of a person (``on_miss: "ask"`` in the capsule's network, and an
``ask`` given with ``set_asking``: capsules/networks.py gives one, capsules/misses.py
says what it does).  ``admit`` then records the attempt as waiting and tells no one
yet; ``consider`` (async, called by the proxy and SOCKS handlers right after) awaits the
answer while the client's connection is held, and makes the attempt allowed (the rule
the person allowed; ``open`` still judges its address by ``core/netspace.py``) or
denied with the answer's reason.  The wait is bounded by the question's time
(``ask_timeout_ms``), and a capsule's questions by capsules/asks.py.

``observe``, if given, is told of each attempt once its verdict is final (denied by the
rules or a cap, refused when connecting, or connected), while the command still runs: a
person watching sees it live; the exec's records come at its end as before.  It is told
of at most ``MAX_TOLD`` attempts an exec: past the connection cap a jail can still make
new records (a new host, a new address for the sniffer), and each telling is a database
row.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import trio

from mcp_server.core import httprules, netrules, netspace
from mcp_server.egress import sniff, splice
from mcp_server.egress.credentials import Credentials
from mcp_server.egress.hostspace import HostSpaceReader
from mcp_server.egress.proxy import handle_http
from mcp_server.egress.relay import (
    DIRECT_REASON,
    Attempt,
    Protocol_,
    Refused,
    Resolver,
    SpaceReader,
    connect_upstream,
    system_resolver,
)
from mcp_server.egress.runs import RunOwners
from mcp_server.egress.socks import handle_socks

log = logging.getLogger("ccw.egress")

MAX_CLIENTS = 1024
MAX_TOLD = 100  # attempts an exec's observer hears of (as many as a run's connection events)
HEADER_TIMEOUT = 30.0
_ACCEPT_RETRY = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
Handler = Callable[["EgressSession", trio.socket.SocketType], Awaitable[None]]
# The service whose connection the current client task serves (None: the exec's); each
# client is a trio task of its own, with a context of its own.
_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("ccw_egress_run", default=None)
WAITING: dict[str, object] = {"answer": "waiting"}  # a miss's ``asked`` until ``consider`` has its answer


@dataclass(frozen=True)
class Asked:
    """A person's answer to a miss: allowed (under ``rule``) or not (``reason``, saying how
    to allow it), and what the connection's record keeps of it (``asked``)."""

    allowed: bool
    rule: str | None
    reason: str | None
    record: dict[str, object]


# Ask a person about a miss: the attempt, and the service whose connection it is (None:
# the exec's); capsules/misses.py is the one the front end gives.
Ask = Callable[[Attempt, str | None], Awaitable[Asked]]


@dataclass(eq=False)
class _Conn:
    """One client connection being served, and its upstream and record once connected."""

    client: trio.socket.SocketType
    upstream: trio.socket.SocketType | None = None
    attempt: Attempt | None = None

    def cut(self) -> None:
        """End the connection: both sockets shut down (not closed: the serving task, or a
        splice thread, still holds them), so the relay sees the end of both and returns."""
        for sock in (self.client, self.upstream):
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed, or never connected
                    sock.shutdown(socket.SHUT_RDWR)


_CONN: contextvars.ContextVar[_Conn | None] = contextvars.ContextVar("ccw_egress_conn", default=None)


class ExecBudget:
    """The bytes an exec may still move, both directions summed (trio tasks and splice
    threads charge it, hence the lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit
        self._lock = threading.Lock()

    def take(self, wanted: int) -> int:
        """Charge up to ``wanted`` bytes; how many may pass."""
        with self._lock:
            granted = min(wanted, self.left)
            self.left -= granted
        return granted

    def refund(self, unused: int) -> None:
        """Give back bytes taken but not moved."""
        with self._lock:
            self.left += unused

    def cap_text(self) -> str:
        """What a cut record says."""
        return f"byte cap ({self.limit} bytes)"


@dataclass
class _Book:
    """One run's attempts and caps: the exec window's, or a service run's."""

    budget: ExecBudget
    attempts: list[Attempt] = field(default_factory=list)
    connections: int = 0
    told: int = 0
    once: set[tuple[object, ...]] = field(default_factory=set)

    def records(self) -> list[Attempt]:
        """Its attempts, sorted by (host, port, protocol, seq), taken out of it."""
        attempts, self.attempts = sorted(self.attempts, key=Attempt.sort_key), []
        return attempts


def _adopt(fd: int) -> trio.socket.SocketType:
    return trio.socket.from_stdlib_socket(socket.socket(fileno=fd))


class EgressSession:
    """The proxy, SOCKS server and sniffer of one egress capsule, and its exec records."""

    def __init__(self, spec: netrules.NetworkSpec, http_fd: int, socks_fd: int,
                 sniffer_fd: int | None, jail_addresses: Iterable[str], *,
                 resolver: Resolver = system_resolver, space: SpaceReader | None = None,
                 header_timeout: float = HEADER_TIMEOUT, observe: Callable[[Attempt], None] | None = None,
                 owners: RunOwners | None = None) -> None:
        self.spec = spec
        self.rules = netrules.rules_id(spec)
        self._conns: set[_Conn] = set()  # the client tasks being served
        self._observe = observe
        self._owners = owners
        self._ask: Ask | None = None  # set_asking
        self.credentials: Credentials | None = None  # its secrets, swapped by the proxy (egress/credentials.py)
        self.header_timeout = header_timeout
        self.jail_addresses = frozenset(jail_addresses)
        self._exec = _Book(ExecBudget(spec.max_bytes))
        self._services: dict[str, _Book] = {}
        self._resolver = resolver
        self._http = _adopt(http_fd)
        self._socks = _adopt(socks_fd)
        for listener in (self._http, self._socks):
            splice.unpaced(listener)  # the jail's connections: no pacing (splice.py's notes)
        self._sniffer = None if sniffer_fd is None else sniff.Sniffer(sniffer_fd, self._direct)
        self._endpoints = {self._http.getsockname()[:2], self._socks.getsockname()[:2]}
        self._seq = 0
        self._notes: list[str] = []
        self._clients = 0
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self._closed = False
        # The host's addresses and resolvers, read at each connection: the process's
        # reader (capsules/networks.py), or, for a session made alone, its own.
        self._own_space: HostSpaceReader | None = None
        if space is None:
            self._own_space = HostSpaceReader()
            space = self._own_space.current
        self._space = space

    # --- the exec's books ---------------------------------------------------------

    def begin_exec(self) -> None:
        """Fresh caps for the next exec; records made since the last exec stay for it."""
        self._exec = _Book(ExecBudget(self.spec.max_bytes), self._exec.attempts)

    def end_exec(self) -> list[dict[str, object]]:
        """The exec's records, sorted by (host, port, protocol, seq); notes() has the denials
        and the connections a cap cut.  The sniffer's queue is read first (sniff.py's essay)."""
        if self._sniffer is not None and not self._closed:
            self._sniffer.drain()
        attempts = self._exec.records()
        self._notes = [note for note in map(Attempt.note, attempts) if note is not None]
        return [attempt.record() for attempt in attempts]

    def take_service(self, name: str) -> list[dict[str, object]] | None:
        """The records of the service's exec that ended, sorted as an exec's; None when its
        connections could not be told from the exec's (no ``owners``, or no cgroup id for
        it: they are in the exec window's records)."""
        book = self._services.pop(name, None)
        if self._owners is None or not self._owners.tagged(name):
            return None
        self._owners.forget(name)
        return [] if book is None else [attempt.record() for attempt in book.records()]

    async def learn_services(self) -> None:
        """A service of the capsule has started: learn its cgroup id (egress/runs.py)."""
        if self._owners is not None:
            await self._owners.learn()

    @property
    def budget(self) -> ExecBudget:
        """The byte budget of the run whose connection the calling task serves."""
        return self._book().budget

    def _book(self) -> _Book:
        name = _RUN.get()
        if name is None:
            return self._exec
        book = self._services.get(name)
        if book is None:
            book = self._services[name] = _Book(ExecBudget(self.spec.max_bytes))
        return book

    def notes(self) -> list[str]:
        """One line per denied or cut attempt of the last exec ended."""
        return list(self._notes)

    def allowed_text(self) -> str:
        """The rules, for a denial's message."""
        return self.spec.rules_text()

    @property
    def requests(self) -> httprules.RequestRules:
        """The method/path rules in force, by host (egress/ruled.py: the proxy judges each request)."""
        return httprules.of(self.spec)

    def _record(self, attempt: Attempt) -> Attempt:
        self._book().attempts.append(attempt)
        if not attempt.allowed:
            self._tell(attempt)  # denied: final now (an allowed one is told once connected or refused)
        return attempt

    def _tell(self, attempt: Attempt) -> None:
        book = self._book()
        if self._observe is None or book.told >= MAX_TOLD:
            return
        book.told += 1
        try:
            self._observe(attempt)
        except Exception as exc:  # what a watcher sees must never cost the jail its connection
            log.warning("egress: telling of %r port %s failed: %r", attempt.host, attempt.port, exc)  # host: the jail's

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def refuse(self, attempt: Attempt, reason: str) -> None:
        """An admitted attempt refused before or while it is relayed (a placeholder where it may
        not go): its record says why, and the watcher hears of it now."""
        attempt.deny(reason)
        self._tell(attempt)

    def set_asking(self, ask: Ask | None) -> None:
        """Who answers a miss when the rules say ``on_miss: ask`` (None: nobody; a miss is denied)."""
        self._ask = ask

    async def consider(self, attempt: Attempt) -> Attempt:
        """``attempt`` once final: a miss waiting on a person (``admit`` left it so) asked now."""
        if self._ask is None or attempt.asked != WAITING:
            return attempt
        try:
            answer = await self._ask(attempt, _RUN.get())
        except Exception as exc:  # the asking broke (the state dir, a bug): denied, and said why
            log.warning("egress: asking about %r port %s failed: %r", attempt.host, attempt.port, exc)
            answer = Asked(False, None, f"the person could not be asked ({exc})", {"answer": "error"})
        attempt.asked = answer.record
        if answer.allowed:
            attempt.allowed, attempt.rule, attempt.reason, attempt.rules = True, answer.rule, None, self.rules
        else:
            attempt.reason = answer.reason
            self._tell(attempt)
        return attempt

    def admit(self, host: str, port: int, protocol: Protocol_) -> Attempt:
        """Decide one proxy request (rules, then the connection cap) and record it."""
        name, _ = netrules.normalize_host(host)
        shown = name if name is not None else host[:255]
        book = self._book()
        if book.connections >= self.spec.max_connections:
            reason = f"connection cap ({self.spec.max_connections}) reached"
            attempt = Attempt(self._next_seq(), shown, port, protocol, False, None, reason, rules=self.rules)
            key = ("cap", shown, port, protocol)
            if key not in book.once:
                book.once.add(key)
                self._record(attempt)
            return attempt
        book.connections += 1
        decision = netrules.decide(self.spec, host, port)
        # A name no rule can allow (not ASCII, bad syntax) is no question for a person: it is
        # the jail's raw bytes (a SOCKS name), which would reach their terminal and page.
        if not decision.allowed and self.spec.on_miss == "ask" and self._ask is not None and name is not None:
            attempt = Attempt(self._next_seq(), shown, port, protocol, False, None,
                              f"{decision.reason}; waiting for a person's answer", rules=self.rules, asked=WAITING)
            book.attempts.append(attempt)  # told once answered (consider)
            return attempt
        reason = decision.reason if decision.wanted is None else f"{decision.reason} " \
            f"({netrules.allow_hint(decision.wanted)})"
        return self._record(
            Attempt(self._next_seq(), shown, port, protocol, decision.allowed, decision.rule,
                    None if decision.allowed else reason, rules=self.rules)
        )

    async def open(self, attempt: Attempt) -> trio.socket.SocketType:
        """Resolve and connect an admitted attempt; a refusal is written into its record."""
        try:
            upstream = await connect_upstream(attempt, self._resolver, self._spec_for(attempt), self._space)
        except Refused as exc:
            if exc.denied:
                attempt.deny(exc.message)
            else:
                attempt.reason = exc.message
            self._tell(attempt)
            raise
        if attempt.rules != self.rules:  # the rules changed while it resolved and connected
            why = self._disallowed(attempt)
            if why is not None:
                upstream.close()
                attempt.deny(why)
                self._tell(attempt)
                raise Refused(why, denied=True)
        conn = _CONN.get()
        if conn is not None:
            conn.attempt, conn.upstream = attempt, upstream
        self._tell(attempt)
        return upstream

    # --- live rules -----------------------------------------------------------------

    def set_rules(self, spec: netrules.NetworkSpec, who: str = "") -> list[Attempt]:
        """Judge from now on by ``spec``; cut each open connection it no longer allows.
        Returns the cut connections' attempts (their records say ``cut``); ``who``: named in it."""
        removed = set(self.spec.allow) - set(spec.allow)
        self.spec, self.rules = spec, netrules.rules_id(spec)
        if not removed:
            return []  # rules only added (or caps changed): nothing open loses its rule
        cut = []
        for conn in list(self._conns):
            attempt = conn.attempt
            if attempt is None or attempt.cut is not None:
                continue
            why = self._disallowed(attempt)
            if why is not None:
                by = f" by {who}" if who else ""
                attempt.cut = f"rules changed to {self.rules}{by}: {why}"
                conn.cut()
                cut.append(attempt)
        return cut

    def _spec_for(self, attempt: Attempt) -> netrules.NetworkSpec:
        """The rules ``attempt`` is judged by: those in force, and for one a person allowed, the
        rule they allowed too (an exact address they named reaches private space as a rule in
        force would; a name reaches none of it).  For ``capsule`` the rule is in force already
        once the change has reached this session; not waiting for it changes nothing."""
        if attempt.asked is None or attempt.asked.get("answer") not in ("once", "capsule") or attempt.rule is None:
            return self.spec
        return netrules.changed(self.spec, allow=[attempt.rule])

    def _disallowed(self, attempt: Attempt) -> str | None:
        """Why the rules now in force would not let ``attempt``'s connection be made; None if they would.
        A connection a person allowed once stays allowed whatever the rules become."""
        if attempt.asked is not None and attempt.asked.get("answer") == "once":
            return None
        decision = netrules.decide(self.spec, attempt.host, attempt.port)
        if not decision.allowed or decision.rule is None:
            return decision.reason
        if attempt.address is None:
            return None
        try:
            now = self._space()
        except OSError as exc:  # unknown host addresses: as connect_upstream, refuse rather than guess
            return f"cannot read this host's addresses: {exc}"
        return netspace.refusal(self.spec, decision.rule, attempt.host, attempt.port, attempt.address, now)

    def _direct(self, seen: sniff.DirectAttempt) -> None:
        if seen.protocol == "tcp" and (seen.address, seen.port) in self._endpoints:
            return  # the proxy's own listeners: the proxy at work
        if seen.address in self.jail_addresses:
            return  # toward the jail: the egress side's own traffic
        key = ("direct", seen.protocol, seen.address, seen.port)
        if key in self._exec.once:  # the sniffer's task: the exec's book (see the essay)
            return
        self._exec.once.add(key)
        self._record(Attempt(self._next_seq(), seen.address, seen.port, seen.protocol, False, None,
                             DIRECT_REASON, address=seen.address, rules=self.rules))

    # --- serving ------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept on both listeners and read the sniffer until ``aclose``."""
        if self._closed:
            raise RuntimeError("this egress session is closed")
        try:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._accept, self._http, handle_http, nursery)
                    nursery.start_soon(self._accept, self._socks, handle_socks, nursery)
                    if self._sniffer is not None:
                        nursery.start_soon(self._sniffer.serve)
                    task_status.started()
        finally:
            self._stopped.set()

    async def _accept(self, listener: trio.socket.SocketType, handler: Handler,
                      nursery: trio.Nursery) -> None:
        while True:
            try:
                client, _ = await listener.accept()
            except OSError as exc:
                if exc.errno in _ACCEPT_RETRY:
                    log.warning("egress proxy: accept failed (%s); retrying", exc.strerror)
                    await trio.sleep(0.1)
                    continue
                if exc.errno == errno.ECONNABORTED:
                    continue
                # Anything else (the listener gone with its namespace) ends this listener
                # only: the capsule's nursery must not fail for it.
                log.warning("egress proxy: stopped accepting: %s", exc)
                return
            if self._clients >= MAX_CLIENTS:
                client.close()
                continue
            nursery.start_soon(self._client, handler, client)

    async def _client(self, handler: Handler, client: trio.socket.SocketType) -> None:
        self._clients += 1
        conn = _Conn(client)  # set_rules cuts it when the rules no longer allow it
        self._conns.add(conn)
        _CONN.set(conn)  # this task's own context, as _RUN
        try:
            if self._owners is not None:
                _RUN.set(await self._owners.of(client))
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await handler(self, client)
        except Exception:  # one client's bug must not end the capsule's proxy
            log.exception("egress proxy: a client connection failed")
        finally:
            self._conns.discard(conn)
            self._clients -= 1
            client.close()

    async def aclose(self) -> None:
        """Stop serving (open relays are cancelled) and close the descriptors."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()
        for sock in (self._http, self._socks, self._sniffer):
            if sock is not None:
                sock.close()
        if self._own_space is not None:
            self._own_space.close()
        if self._owners is not None:
            self._owners.close()
