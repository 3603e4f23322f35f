"""The egress sessions of this process's allowlist capsules, served in one background nursery.

A capsule made with an allowlist (``network`` other than "none") gets from the helper,
with ``net_open``, three descriptors: the HTTP proxy's and the SOCKS5 endpoint's
listening sockets in the capsule's private egress namespace, and a sniffer that sees
every direct attempt (mcp_server/egress/session.py says what is done with them).  The
front end serves them for as long as the capsule lives, across calls, so the sessions
belong to the process (``Runtime``), not to a call.

- **Where the sessions run.**  No task of the server lives as long as the process (each
  transport has its own nursery, the CLI and the tests run one call at a time), so the
  first session starts a trio *system task* that holds a nursery, and every session is
  started in it (``Nursery.start`` may be called from any task).  The system task ends
  with the trio run; ``aclose`` ends it sooner.  A session whose serving fails is
  logged and forgotten: the next exec opens a new one, as after a restart.
- **Opened lazily.**  ``open_soon`` at create starts opening it in the background, so
  create costs what a capsule without network costs; but after the front end restarted (CLI: every
  command is a process) there is no session, and ``exec`` opens one first.  ``net_open``
  gives the same namespaces while the helper has them.  After a *helper* restart the
  helper has none: its exec fails ``UNAVAILABLE`` with ``reason: network_not_open``
  before anything runs, and ``exec`` opens a new session and tries once more.
- **One view of the host.**  Every session judges its connections against the host's
  own addresses and resolvers (core/netspace.py); one ``HostSpaceReader`` (one netlink
  subscription) serves them all, made with the first session and closed by ``aclose``.
- **Rules change live.**  ``set_rules`` hands a capsule's new rules to its session (the
  next request is judged by them, connections they no longer allow are cut:
  egress/session.py) and keeps them for a session opened later, by ``open_soon`` in
  flight or after a failure, whatever spec its opener was given (capsules/netlive.py
  stores them; the journal's capsule row has them for the next process).
- **Misses asked of a person.**  A capsule whose rules say ``on_miss: ask`` has its
  session given ``asking`` (capsules/misses.py, set by the Runtime), and ``exec`` tells it
  which exec runs now and which client started it, so that client is the one asked.
- **Counted per run.**  ``begin_exec``/``end_exec`` bracket the helper's exec, so the
  records are the attempts made while the command ran (an exec of a capsule takes its
  turn: two never overlap) that no service of the capsule made: a service's connections
  are its own, told apart by the cgroup id of the socket that made them
  (egress/runs.py, with ``net_open`` asked with ``runs``), and journaled with its run
  (``take_service``).  A helper that cannot say (an older one, or one whose services get
  no cgroup v2 id) leaves every connection to the exec window, as before.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from mcp_server.core.netrules import NetworkSpec
from mcp_server.logs import LOGGER
from sandbox.errors import CcwError

if TYPE_CHECKING:
    from mcp_server.egress.credentials import Credentials
    from mcp_server.egress.hostspace import HostSpaceReader
    from mcp_server.egress.relay import Attempt
    from mcp_server.egress.runs import RunOwners
    from mcp_server.egress.session import Asked, EgressSession
    from sandbox.replies import ExecReply

T = TypeVar("T")
WINDOW_REASON = ("this service's connections are not told apart from the exec's (the helper gave its cgroup "
                 "no id: a rootless helper without a delegated cgroup v2 subtree, or an older helper); they "
                 "are in the records of the execs that ran beside it")

def network_not_open(exc: BaseException) -> bool:
    """Whether ``exc`` is the helper saying it has no namespaces for an egress capsule (yet)."""
    return (isinstance(exc, CcwError) and exc.code == "UNAVAILABLE"
            and (exc.details or {}).get("reason") == "network_not_open")


@dataclass
class Traced:
    """A call's outcome with the connection attempts made while it ran (None: network none)."""

    value: Any
    attempts: list[dict[str, Any]] | None = None  # kept as touched.network
    notes: list[str] = field(default_factory=list)


class AskPerson(Protocol):
    """Who answers a capsule's misses (capsules/misses.py ``Asking``)."""

    execs: dict[str, tuple[Any, Sequence[str]]]  # the exec running in each capsule: its client's asker, argv

    async def __call__(self, capsule_id: str, attempt: Attempt, service: str | None, timeout_s: float) -> Asked:
        """The person's answer about ``attempt``."""
        ...


@dataclass
class _Served:
    session: EgressSession
    scope: trio.CancelScope


class Networks:
    """One EgressSession per allowlist capsule of this process, by capsule id."""

    def __init__(self, space: HostSpaceReader | None = None,
                 observe: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        """``observe(capsule_id, record)``: each attempt once decided, while its exec runs."""
        self._observe = observe
        self._space = space  # made with the first session unless given (tests give a fake resolv.conf)
        self._made_space = False
        self._sessions: dict[str, _Served] = {}
        self._nursery: trio.Nursery | None = None
        self._host_scope: trio.CancelScope | None = None
        self._lock = trio.Lock()
        self._pending: dict[str, trio.CancelScope] = {}  # opens started by open_soon, by capsule
        self._changed: dict[str, NetworkSpec] = {}  # rules set live (set_rules), by capsule
        # Held by a change of rules from its journaling to its session's ``set_rules``, so
        # changes reach the sessions in the order the journal took them.
        self.rules_lock = trio.Lock()
        self.asking: AskPerson | None = None  # set by the Runtime (capsules/misses.py)
        self._credentials: dict[str, Credentials] = {}  # a capsule's secrets (capsules/capsecrets.py), in memory only

    async def open_soon(self, helper: Any, capsule_id: str, spec: NetworkSpec) -> None:
        """Start opening the capsule's session in the background (capsule_create returns first).

        ``net_open`` costs the helper a few milliseconds (namespaces from its spare pool,
        the descriptors' round trip) that the caller of create need not wait for: the
        first exec waits for the open in flight (``open`` takes the same lock), or opens
        the session itself if this one failed (logged).
        """
        nursery = await self._host()
        scope = trio.CancelScope()
        self._pending[capsule_id] = scope
        nursery.start_soon(self._open_quietly, helper, capsule_id, spec, scope)

    async def _open_quietly(self, helper: Any, capsule_id: str, spec: NetworkSpec, scope: trio.CancelScope) -> None:
        with scope:
            try:
                await self.open(helper, capsule_id, spec)
            except Exception as exc:
                LOGGER.warning(f"mcp:egress opening the session of {capsule_id} failed: {exc!r}; its exec will retry")
        if self._pending.get(capsule_id) is scope:
            del self._pending[capsule_id]

    async def open(self, helper: Any, capsule_id: str, spec: NetworkSpec, fresh: bool = False) -> EgressSession:
        """The capsule's session, opened (net_open) if it has none; ``fresh``: a new one anyway."""
        async with self._lock:
            spec = self._changed.get(capsule_id, spec)
            served = self._sessions.get(capsule_id)
            if served is not None and not fresh:
                return served.session
            if served is not None:
                await self._close(capsule_id)
            # Imported here: only allowlist capsules need the proxy.
            from mcp_server.egress.hostspace import HostSpaceReader
            from mcp_server.egress.session import EgressSession

            if self._space is None:
                self._space, self._made_space = HostSpaceReader(), True
            reply, fds = await helper.net_open(capsule_id)
            owners = None
            try:
                owners = await _owners(helper, capsule_id)
                observe = self._observe
                session = EgressSession(spec, fds[0], fds[1], fds[2], tuple(reply.jail_addresses),
                                        space=self._space.current,
                                        observe=None if observe is None else
                                        (lambda attempt: observe(capsule_id, attempt.record())), owners=owners)
                session.set_asking(self._asker_of(capsule_id, session))
                session.credentials = self._credentials.get(capsule_id)
            except BaseException:
                for fd in fds:
                    os.close(fd)
                if owners is not None:
                    owners.close()
                raise
            try:
                nursery = await self._host()
                scope = await nursery.start(self._serve, capsule_id, session)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await session.aclose()
                raise
            self._sessions[capsule_id] = _Served(session, scope)
            # Again: credentials given while this open awaited (a fork's first exec makes its
            # placeholders beside the open create started) found no session to update, and its
            # own placeholders went out unswapped (401 from the index).
            session.credentials = self._credentials.get(capsule_id)
            return session

    async def set_rules(self, capsule_id: str, spec: NetworkSpec, who: str = "") -> list[dict[str, Any]] | None:
        """The capsule's rules from now on (egress/session.py ``set_rules``): the records of the
        connections they cut, or None when it has no session in this process (the next one
        opened here is given them)."""
        async with self._lock:  # after an open in flight: its session gets them too
            self._changed[capsule_id] = spec
            served = self._sessions.get(capsule_id)
            if served is None:
                return None
            return [attempt.record() for attempt in served.session.set_rules(spec, who)]

    def give_credentials(self, capsule_id: str, credentials: Credentials) -> None:
        """The capsule's secrets' placeholders, swapped by its session's proxy from now on."""
        self._credentials[capsule_id] = credentials
        served = self._sessions.get(capsule_id)
        if served is not None:
            served.session.credentials = credentials

    def credentials(self, capsule_id: str) -> Credentials | None:
        """The capsule's secrets as this process knows them (None: none, or not since it started)."""
        return self._credentials.get(capsule_id)

    def _asker_of(self, capsule_id: str, session: EgressSession) -> Callable[[Attempt, str | None],
                                                                              Awaitable[Asked]] | None:
        """The session's way to ask about a miss: ``asking``, with the capsule and the rules' time."""
        asking = self.asking
        if asking is None:
            return None

        async def ask(attempt: Attempt, service: str | None) -> Asked:
            return await asking(capsule_id, attempt, service, session.spec.ask_timeout_ms / 1000)

        return ask

    async def exec(self, helper: Any, capsule_id: str, spec: NetworkSpec | None,
                   call: Callable[[], Awaitable[T]], asker: Any = None, command: Sequence[str] = ()) -> Traced:
        """Run ``call`` (the helper's exec) with the capsule's session counting; its records and notes.
        ``asker``: the client that asked for the exec (capsules/asker.py), asked about its misses;
        ``command``: its argv, shown in the question."""
        if spec is None:
            return Traced(await call())
        if self.asking is None:
            return await self._exec(helper, capsule_id, spec, call)
        self.asking.execs[capsule_id] = (asker, tuple(command))
        try:
            return await self._exec(helper, capsule_id, spec, call)
        finally:
            self.asking.execs.pop(capsule_id, None)

    async def _exec(self, helper: Any, capsule_id: str, spec: NetworkSpec,
                    call: Callable[[], Awaitable[T]]) -> Traced:
        session = await self.open(helper, capsule_id, spec)
        try:
            return await self._counted(session, call)
        except CcwError as exc:
            if not network_not_open(exc):
                raise
        session = await self.open(helper, capsule_id, spec, fresh=True)
        return await self._counted(session, call)

    @staticmethod
    async def _counted(session: EgressSession, call: Callable[[], Awaitable[Any]]) -> Traced:
        session.begin_exec()
        try:
            value = await call()
        except BaseException:
            session.end_exec()
            raise
        return Traced(value, session.end_exec(), session.notes())

    def service_network(self, capsule_id: str, name: str,
                        reply: ExecReply) -> tuple[ExecReply, list[dict[str, Any]] | None]:
        """The connection records of the capsule's service run that ended, and its helper
        ``reply``; if they are not told apart from the exec's (no session, or no cgroup id:
        egress/runs.py), None, and the reply's ``touched_unavailable`` says why."""
        served = self._sessions.get(capsule_id)
        records = None if served is None else served.session.take_service(name)
        if records is not None:
            return reply, records
        why = {**reply.touched_unavailable, "network": WINDOW_REASON}
        return dataclasses.replace(reply, touched_unavailable=why), None

    async def learn_services(self, capsule_id: str) -> None:
        """A service of the capsule has started: its session learns whose its sockets are."""
        served = self._sessions.get(capsule_id)
        if served is not None:
            await served.session.learn_services()

    async def close(self, capsule_id: str) -> None:
        """End the capsule's session, if it has one, and any open of it in flight (destroy)."""
        pending = self._pending.pop(capsule_id, None)
        if pending is not None:
            pending.cancel()
        self._changed.pop(capsule_id, None)
        self._credentials.pop(capsule_id, None)
        async with self._lock:
            await self._close(capsule_id)

    async def _close(self, capsule_id: str) -> None:
        served = self._sessions.pop(capsule_id, None)
        if served is None:
            return
        served.scope.cancel()
        with trio.CancelScope(shield=True):
            await served.session.aclose()

    async def aclose(self) -> None:
        """End every session and the nursery they run in."""
        for capsule_id in list(self._sessions):
            await self.close(capsule_id)
        if self._host_scope is not None:
            self._host_scope.cancel()
        self._drop_space()

    def _drop_space(self) -> None:
        """Close the host-space reader if this object made it (a given one is the giver's)."""
        if self._made_space and self._space is not None:
            self._space.close()
            self._space, self._made_space = None, False

    async def _host(self) -> trio.Nursery:
        """The nursery the sessions run in, started (as a system task) on first use."""
        if self._nursery is not None:
            return self._nursery
        ready = trio.Event()

        async def host() -> None:
            try:
                with trio.CancelScope() as self._host_scope:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        ready.set()
                        await trio.sleep_forever()
            finally:
                # The trio run is ending (or aclose ran): the serving tasks are gone with
                # the nursery; close what is left of their sessions (descriptors).
                self._nursery, self._host_scope = None, None
                left, self._sessions = list(self._sessions.values()), {}
                with trio.CancelScope(shield=True):
                    for served in left:
                        await served.session.aclose()
                self._drop_space()

        trio.lowlevel.spawn_system_task(host, name="ccw egress sessions")
        await ready.wait()
        assert self._nursery is not None
        return self._nursery

    async def _serve(self, capsule_id: str, session: EgressSession,
                     task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve one session until its scope is cancelled.

        A failure before the session is up goes to ``open``'s caller (``Nursery.start``
        raises it there); one after is logged and the session forgotten, never spread to
        the nursery, which serves the other capsules.
        """
        started = False
        with trio.CancelScope() as scope:

            def report(value: object = None) -> None:
                nonlocal started
                started = True
                task_status.started(scope)

            try:
                await session.serve(task_status=_Relay(report))
            except Exception as exc:
                if not started:
                    raise
                LOGGER.warning(f"mcp:egress session of {capsule_id} failed: {exc!r}; the next exec opens a new one")
                served = self._sessions.get(capsule_id)
                if served is not None and served.session is session:
                    del self._sessions[capsule_id]
                with trio.CancelScope(shield=True):
                    await session.aclose()


async def _owners(helper: Any, capsule_id: str) -> RunOwners | None:
    """Whose the capsule's connections are (egress/runs.py); None, logged, if the helper cannot say."""
    from mcp_server.egress.runs import RunOwners

    try:
        return await RunOwners.open(lambda: helper.net_runs(capsule_id))
    except Exception as exc:  # an older helper refuses "runs": every connection is the exec window's
        LOGGER.warning(f"mcp:egress whose {capsule_id}'s connections are is not known ({exc!r}); "
                       "they are counted per exec window")
        return None


@dataclass(frozen=True)
class _Relay:
    """The task_status ``session.serve`` reports to: it hands ``open`` the session's cancel scope."""

    started: Callable[..., None]
