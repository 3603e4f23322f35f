"""The ToolContext a handler receives: config, state, the helper, the capsule service, roots, progress.

``Runtime`` is per process: the Config, the State and the one helper connection, which
is opened (or the embedded helper started) on first use, never at startup, so tools
that do not touch capsules work without a helper.  ``CallContext`` is per call: it
binds the runtime to the MCP session the call came in on (if any) for roots and
progress.  Direct methods (seed 001 style) get a CallContext without a session: no
roots, and progress goes nowhere.

Roots: asked of the client with ``roots/list`` only when it declared the ``roots``
capability, once per connection, and asked again after it sends
``notifications/roots/list_changed``.  A 2026-07-28 (stateless) request has no
back-channel for server-initiated requests, so roots are None there.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import mcp_types as types
import trio

from mcp_server.caller import CALLER_OUTPUT, NOTHING_LENT, Caller
from mcp_server.capsules.asker import Asker
from mcp_server.capsules.call_hooks import Unattended
from mcp_server.capsules.exec import output_chunks
from mcp_server.capsules.misses import Asking
from mcp_server.capsules.networks import Networks
from mcp_server.capsules.run import OwnedRuns, Run, Runs
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.services import Services
from mcp_server.capsules.turns import CapsuleQueue, Ticket
from mcp_server.config import Config
from mcp_server.events import MAX_ERROR, EventLog, live_connection, record_outcome
from mcp_server.logs import LOGGER
from mcp_server.state import State
from sandbox.client import HelperClient
from sandbox.replies import ExecProgress

ROOTS_TIMEOUT_S = 10.0  # a client that never answers roots/list must not hold a call forever


class Runtime:
    """What every call shares: config, state, the lazily opened helper client."""

    def __init__(self, config: Config, state: State,
                 run_outcome: Callable[[Run], Sequence[tuple[str, Mapping[str, Any]]]] | None = None) -> None:
        self.config = config
        self.state = state
        # What an ended run tells the event stream: its tool's to say (Registry.run_outcome
        # asks the tool's spec); None: nothing (a runtime that serves no tools: the bot).
        self._run_outcome = run_outcome
        self._helper: HelperClient | None = None
        self._helper_lock = trio.Lock()
        self.events = EventLog(state)
        # execs, forks, destroys: one at a time per capsule; a command's waits and starts are events
        self.capsule_queue = CapsuleQueue(observer=self._turn_event)
        # the egress sessions of allowlist capsules, for the process's life; each attempt an event as it is decided
        self.networks = Networks(observe=self._connection_event)
        self.networks.asking = Asking(state, self.networks)  # misses asked of a person (capsules/misses.py)
        self.runs = Runs(on_end=self._run_ended)  # calls that outlive their answer (capsules/run.py)
        self.services = Services(state, self.helper, self.networks)  # long-lived processes (capsules/services.py)
        # Per-connection roots, keyed by the SDK's Connection object (weakly, so a
        # closed connection takes its cache with it).
        self._roots: weakref.WeakKeyDictionary[Any, list[str] | None] = weakref.WeakKeyDictionary()

    def _turn_event(self, what: str, capsule_id: str, ticket: Ticket) -> None:
        data: dict[str, Any] = {"ticket": ticket.number, "label": ticket.label}
        if what == "started":
            data["waited_ms"] = ticket.waited_ms
        elif what == "failed":
            data["error"] = (ticket.failed or "")[:MAX_ERROR]
        self.events.add(f"run.{what}", capsule_id, data)

    def _connection_event(self, capsule_id: str, record: dict[str, Any]) -> None:
        self.events.add("net.connection", capsule_id, live_connection(record))

    def _run_ended(self, run: Run) -> None:
        # A replay's or deltamin's outcome is an event (an exec's end is one already: run.finished).
        if self._run_outcome is not None:
            record_outcome(self.state, run.capsule_id, self._run_outcome(run))

    async def helper(self) -> HelperClient:
        """The helper client, connected or spawned on first use (mcp_server.launcher).

        An embedded helper that died (kill -9, OOM) is replaced by a fresh one on the next
        call; the new helper's recovery re-registers the capsules and removes the dead
        one's cgroups, so a crash costs the calls in flight, not the session.
        """
        if self._helper is not None and _usable(self._helper):
            return self._helper
        async with self._helper_lock:
            if self._helper is not None and not _usable(self._helper):
                dead, self._helper = self._helper, None
                with trio.CancelScope(shield=True):  # a dying helper is waited for: see helper.ending()
                    await dead.aclose()
                death = dead.process.describe_death() if dead.process is not None else ""  # only an embedded one dies
                LOGGER.warning(f"mcp:helper starting a new embedded helper{death}")
            if self._helper is None:
                # Imported here: only capsule tools need the helper.
                from mcp_server import launcher

                self._helper = await launcher.connect_or_spawn(self.config)
        return self._helper

    async def reopen_kept(self) -> None:
        """At a front end's start: the kept services brought back, the kept forwarded ports reopened
        (capsules/services.py), their work journaled as background work's is."""
        await self.services.reopen_kept(CapsuleService(self.state, self.helper, Unattended(), self.networks,
                                                       self.services))

    async def aclose(self) -> None:
        """End the runs and the egress sessions, and close the helper client (stopping an
        embedded helper) if one was opened."""
        await self.runs.aclose()  # their jails end while the helper is still there
        with trio.CancelScope(shield=True):
            await self.services.aclose()
        with trio.CancelScope(shield=True):
            await self.networks.aclose()
        client, self._helper = self._helper, None
        if client is None:
            return
        closer = getattr(client, "aclose", None) or getattr(client, "close", None)
        if closer is not None:
            outcome = closer()
            if inspect.isawaitable(outcome):
                with trio.CancelScope(shield=True):
                    await outcome

    def forget_roots(self, connection: Any) -> None:
        """Drop a connection's cached roots (the client said they changed)."""
        if connection is not None:
            self._roots.pop(connection, None)

    async def roots_for(self, session: Any) -> list[str] | None:
        """The roots the client on ``session`` declared, as absolute paths, or None."""
        if session is None:
            return None
        connection = getattr(session, "_connection", None)
        if connection is not None and connection in self._roots:
            return self._roots[connection]
        roots = await _ask_roots(session)
        if connection is not None:
            self._roots[connection] = roots
        return roots


def _usable(client: Any) -> bool:
    usable = getattr(client, "usable", None)
    return usable is None or bool(usable())


async def _ask_roots(session: Any) -> list[str] | None:
    import mcp_types as types

    capabilities = session.client_capabilities
    if capabilities is None or capabilities.roots is None or not session.can_send_request:
        return None
    try:
        # session.list_roots() is marked deprecated (roots leave the 2026 era); the
        # request itself is still how 2025-era clients are asked.
        result = await session.send_request(
            types.ListRootsRequest(), types.ListRootsResult, request_read_timeout_seconds=ROOTS_TIMEOUT_S
        )
    except Exception as exc:  # the client may refuse; roots are advisory
        LOGGER.warning(f"mcp:roots unavailable: {exc}")
        return None
    paths = []
    for root in result.roots:
        if not isinstance(root, types.Root):
            continue
        url = urlparse(str(root.uri))
        if url.scheme == "file":
            paths.append(unquote(url.path))
    return sorted(paths)


class CallContext:
    """The ToolContext (mcp_server.tools.registry) for one tool call or resource read."""

    def __init__(self, runtime: Runtime, session: Any = None, owner: str | None = None,
                 caller: Caller = NOTHING_LENT, ticket: Ticket | None = None,
                 config: Config | None = None, request_id: Any = None) -> None:
        self._runtime = runtime
        self._session = session
        self._request_id = request_id  # the tool call's JSON-RPC id: an elicitation names it
        # The server's settings with the tool families of the call's connection (an attached
        # ccw-mcp's own: tools/surface.py ToolList); None: the server's own.
        self._config = config
        # The place in a capsule's line the transport took when it read the call
        # (CcwServer.arrive); the call's first turn on that capsule claims it.
        self._ticket = ticket
        self._owner = owner  # the bearer token's name (HTTP); None over stdio and the unix socket
        # What the call's client lent it, as the server decided (mcp_server/caller.py: ``lending``).
        self._caller = caller

    @property
    def workspace(self) -> str:
        """The file tools' root when the client declares none: the CCW_WORKSPACE of the
        ``ccw-mcp`` the client started (which may be attached to this one), else ours."""
        return self._caller.workspace or self._runtime.config.workspace

    @property
    def caller_env(self) -> Mapping[str, str]:
        """The caller's environment: the one it lent, else this process's (caller.py ``Caller.env``)."""
        return self._caller.env

    @property
    def caller_lent(self) -> bool:
        """Whether ``caller_env`` is one a client lent (the ccw command, an attached ccw-mcp)."""
        return self._caller.lent_env is not None

    @property
    def terminal(self) -> int | None:
        """The pty slave ``ccw capsule shell`` passed with this call (closed by the server when
        the call ends), else None."""
        return self._caller.terminal

    @property
    def config(self) -> Config:
        """The server's configuration, with the tool families this call's connection is served."""
        return self._config if self._config is not None else self._runtime.config

    @property
    def state(self) -> State:
        """The state dir: SQLite database and blob store."""
        return self._runtime.state

    async def helper(self) -> HelperClient:
        """The helper IPC client, connected (or started) on first use."""
        return await self._runtime.helper()

    @property
    def capsules(self) -> CapsuleService:
        """The capsule service, reporting progress and taking turns as this call."""
        return CapsuleService(self._runtime.state, self._runtime.helper, self, self._runtime.networks,
                              self._runtime.services)

    @property
    def runs(self) -> OwnedRuns:
        """The process's background runs (capsules/run.py), as this call's token sees them."""
        return OwnedRuns(self._runtime.runs, self._owner, self._keep_places)

    def _keep_places(self, run: Run) -> None:
        # The places taken on arrival stay the run's until it ends (a race answered "running" has
        # capsules still waiting for a core), not the answered call's (turns.py: CapsuleQueue.keep).
        if self._ticket is not None:
            run.at_end.append(self._runtime.capsule_queue.keep(self._ticket))

    def for_run(self, run: Run) -> CallContext:
        """This call's context for the body of its ``run``: progress goes to the run, the rest is the call's."""
        return _RunContext(self._runtime, self._session, self._take_ticket(), run, self._owner, self._config,
                           self._request_id, self._caller)

    def asker(self) -> Asker | None:
        """The client that made this call, to be asked about its run's misses (capsules/asker.py)."""
        return None if self._session is None else Asker(self._session, self._request_id)

    async def roots(self) -> list[str] | None:
        """Absolute root directories the client declared, or None."""
        return await self._runtime.roots_for(self._session)

    @property
    def wants_output(self) -> bool:
        """Whether the caller asked for an exec's output as it comes (caller.py CALLER_OUTPUT)."""
        return self._caller.output_token is not None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        """Send notifications/progress if the caller sent a progress token; else nothing.  A
        streaming exec's ``output`` goes in its ``_meta`` to a caller that asked for it."""
        if self._session is None:
            return
        token = self._caller.output_token
        chunks = output_chunks(output) if output is not None and token is not None else None
        if not chunks:
            await self._session.report_progress(progress, total, message)
            return
        # The SDK's report_progress sends no _meta: the same notification, built here.
        params = types.ProgressNotificationParams.model_validate({
            "progressToken": token, "progress": progress, "total": total, "message": message,
            "_meta": {CALLER_OUTPUT: chunks}})
        await self._session.send_notification(types.ProgressNotification(params=params),
                                              related_request_id=self._request_id)

    @contextlib.asynccontextmanager
    async def capsule_turn(self, capsule_id: str, label: str) -> AsyncIterator[Ticket]:
        """Hold the capsule's turn (mcp_server.capsules.turns) for the block.

        While the call waits, its progress reports say so: behind whom and how many
        calls ahead; ``progress`` counts the milliseconds waited.
        """

        async def report(ticket: Ticket, ahead: int, holder: Ticket) -> None:
            waited_ms = (time.monotonic() - ticket.arrived) * 1000
            await self.progress(waited_ms, None, f"queued: {ahead} ahead on {capsule_id}, holding it now: "
                                f"{holder.describe()}; this call: #{ticket.number} {ticket.label}")

        # The place taken on arrival in this capsule's line (a race's or merge's call has one in
        # each capsule's), claimed once: a later turn in this call takes a place of its own.
        places = [self._ticket, *self._ticket.more] if self._ticket is not None else []
        reserved = next((one for one in places if one.capsule_id == capsule_id and not one.claimed), None)
        async with self._runtime.capsule_queue.turn(capsule_id, label, report, reserved) as ticket:
            yield ticket

    async def follow(self, through: bool = True) -> None:
        """Wait for the calls this one follows (``TakesTurn.follows``) that arrived before it
        (``through``: and for the calls between; ``CapsuleQueue.follow``)."""
        await self._runtime.capsule_queue.follow(self._take_ticket(), through)

    def _take_ticket(self) -> Ticket | None:
        ticket, self._ticket = self._ticket, None
        return ticket

    def log(self, message: str) -> None:
        """A diagnostic line in the server's log (stderr; stdout carries frames only)."""
        LOGGER.info(f"mcp:tool {message}")


class _RunContext(CallContext):
    """A call's context as its run's body sees it: the run, not the call, hears its progress
    (the call may have answered long ago, its connection may be gone)."""

    def __init__(self, runtime: Runtime, session: Any, ticket: Ticket | None, run: Run, owner: str | None,
                 config: Config | None, request_id: Any = None, caller: Caller = NOTHING_LENT) -> None:
        super().__init__(runtime, session, owner, caller, ticket, config, request_id)
        self._run = run

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        """Kept by the run, and sent to the call waiting for it, if any."""
        await self._run.progress(progress, total, message, output)
