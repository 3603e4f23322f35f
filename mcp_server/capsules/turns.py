"""Per-capsule turns: calls that must not overlap on one capsule wait in arrival order.

A capsule runs one command at a time (the helper refuses a second exec with CONFLICT,
and stays the backstop for clients of other front ends).  Agents send tool calls in
parallel, so the front end queues ``capsule_exec``, ``capsule_fork``, ``capsule_destroy``,
``capsule_witness``, ``capsule_promote`` and the reading of a capsule's change by
``capsule_deltamin`` per capsule, first come first served.  Read-only tools (diff, file
reads, list) take no turn: they answer while a command runs, and see its writes as far as they have got.
A service's stop and a read of its logs take no turn either (they must not wait behind a
test run) but follow the starts of their service that came before them (``TakesTurn.follows``).

Why not ``trio.Lock``: it is fair (``release`` hands the lock straight to the longest
waiter), but it cannot say who holds it or how many wait ahead, which a queued call's
progress reports name.  The line here is a plain list per capsule whose head holds the
turn; every change to it wakes the waiters of that capsule, and each looks at its own
place again.  A waiter that is cancelled (MCP ``notifications/cancelled``, a closed
connection) leaves the line at once and never runs.  All of it runs on the trio thread,
so no lock guards the lists.

Arrival order is the order the transport read the requests, not the order their
handlers happen to start: the SDK spawns a task per request, and trio runs the tasks of
one batch in either order.  So a tool that takes a turn says so on its spec
(``ToolSpec.turn``: a ``TakesTurn`` naming the argument that names the capsule and the
label), every transport takes the call's place when it reads the request
(``CcwServer.arrive``, which calls ``arrive`` here) and hands the ticket to the call
explicitly (an ``Arrival`` with the request, or the HTTP scope's ``ARRIVAL_KEY``; then on
its CallContext), and the handler claims that place (``turn`` with ``ticket``).  A call that
ends without claiming it (bad arguments, an unknown capsule, cancelled before it started)
has it given back (``give_back``) by the transport once the request is answered or
dropped, unless a run keeps it (``keep``): a call answered "running" (capsules/run.py)
still has places its run has yet to claim (a race's capsules waiting for a free core),
given back when the run ends.  A call that arrived with no ticket (the CLI's in-process
calls, a second turn in one call) takes its place when the handler asks.
"""

from __future__ import annotations

import contextlib
import itertools
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from sandbox.errors import CcwError

WAIT_REPORT_S = 1.0  # a queued call repeats its "queued" report this often
LABEL_CHARS = 60  # of a command, in the "queued behind" reports
MAX_PLACES = 128  # lines one call takes a place in on arrival: capsule_fork's count, above a race's
EXEC_LABEL = "exec"  # a command's label starts so: the event stream hears of commands only


@dataclass(frozen=True)
class TakesTurn:
    """How a tool's call takes a capsule's turn (``ToolSpec.turn``): which argument names
    the capsule, and what the line calls the call in "queued behind" reports."""

    label: str  # "fork", "destroy"
    capsule_arg: str = "capsule_id"
    command_arg: str | None = None  # an argv argument the label shows (exec `make -j2`)
    subject_arg: str | None = None  # an argument naming what of the capsule it acts on (a service's name)
    # A call that holds no turn but waits for the calls so labelled, on its subject, that arrived
    # before it (``CapsuleQueue.follow``): a service's stop, for its start.
    follows: str | None = None
    # Calls so labelled, on any subject, that it waits for too (``follow``): a port's forward, for
    # the service starts sent before it, which make what it leads to.
    follows_any: str | None = None
    # An argument listing several capsules (a race's, a merge's): the call takes a place in each
    # of their lines on arrival, as a call on one capsule does in its line (``CapsuleQueue.arrive``).
    capsules_arg: str | None = None
    # The call also takes a place in its capsules' parents' lines on arrival.  A fork's destroy never
    # claims it: the destroy thaws its parent, so the parent's calls sent after it (its own destroy,
    # refused while it has forks) wait until that destroy has answered.  A merge claims it when the
    # parent is the inputs' common ancestor, whose turn it takes too: taken later instead, behind
    # the place a destroy of an input sent after it took there, the two calls waited on each other.
    parent_too: bool = False

    def capsules_of(self, args: Mapping[str, Any]) -> list[str]:
        """The capsules a call with ``args`` takes a place in the lines of, each once, in order."""
        if self.capsules_arg is None:
            one = self.capsule_of(args)
            return [] if one is None else [one]
        named = args.get(self.capsules_arg)
        if not isinstance(named, list) or len(named) > MAX_PLACES:
            return []  # refused by the schema or the tool before any turn: nothing to keep a place for
        return list(dict.fromkeys(one for one in named if isinstance(one, str)))

    def subject_of(self, args: Mapping[str, Any]) -> str | None:
        """What of the capsule a call with ``args`` acts on, or None."""
        subject = args.get(self.subject_arg) if self.subject_arg is not None else None
        if isinstance(subject, int) and not isinstance(subject, bool):
            return str(subject)  # a forwarded port's number
        return subject if isinstance(subject, str) else None

    def capsule_of(self, args: Mapping[str, Any]) -> str | None:
        """The capsule a call with ``args`` takes the turn of, or None if they name none."""
        capsule_id = args.get(self.capsule_arg)
        return capsule_id if isinstance(capsule_id, str) else None

    def label_of(self, args: Mapping[str, Any] | None = None) -> str:
        """How a call with ``args`` is named in the line: "exec `make -j2`", "destroy"."""
        argv = (args or {}).get(self.command_arg) if self.command_arg is not None else None
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            return command_label(self.label, argv)
        return self.label


def command_label(label: str, argv: Sequence[str]) -> str:
    """``label`` and the command ``argv``, shortened to ``LABEL_CHARS``: "exec `pytest -q`"."""
    text = shlex.join(argv)
    return f"{label} `{text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + '…'}`"


def exec_label(argv: Sequence[str]) -> str:
    """The turn label of an exec of ``argv``."""
    return command_label(EXEC_LABEL, argv)


@dataclass(eq=False)
class Ticket:
    """One call's place in a capsule's line."""

    number: int  # arrival number on this server, for "queued behind #N"
    label: str  # what the call does: "exec `pytest -q`", "destroy"
    capsule_id: str  # whose line it stands in
    claimed: bool = False  # a handler took it up (``turn``): only the handler gives it back now
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None  # when it got the turn
    waited: bool = False  # whether another call held the turn when its handler asked
    kind: str = ""  # its tool's TakesTurn label ("service start"), without the command
    subject: str | None = None  # TakesTurn.subject_of
    follows: str | None = None  # TakesTurn.follows
    follows_any: str | None = None  # TakesTurn.follows_any
    more: list[Ticket] = field(default_factory=list)  # the same call's places in other capsules' lines
    kept: bool = False  # its call's run keeps it past the call's answer (``CapsuleQueue.keep``)
    failed: str | None = None  # "CODE: message" of the error its call ended in while it held the turn

    @property
    def waited_ms(self) -> int:
        """How long the call waited for others (0 if it never had to)."""
        if not self.waited or self.started is None:
            return 0
        return int((self.started - self.arrived) * 1000)

    def describe(self) -> str:
        """``#3 exec `make` (running 4 s)``, or ``#4 destroy (starting)`` before its handler claims the turn."""
        if self.started is None:
            return f"#{self.number} {self.label} (starting)"
        return f"#{self.number} {self.label} (running {int(time.monotonic() - self.started)} s)"


@dataclass(frozen=True)
class Arrival:
    """What an NDJSON transport hands an MCP request's handler with the request (as the
    SDK's ``ServerMessageMetadata.request_context``, which the handler reads as
    ``ctx.request``): the place taken for it when it was read."""

    ticket: Ticket | None


# The ASGI scope key under which the HTTP transport hands the place to the handler
# (there ``ctx.request`` is the SDK's Request over that scope).
ARRIVAL_KEY = "ccw.ticket"


def arrived_ticket(request: Any) -> Ticket | None:
    """The place the transport took for a request when it read it (``ctx.request``: an
    ``Arrival``, or an HTTP Request whose scope holds it), or None."""
    if isinstance(request, Arrival):
        return request.ticket
    scope = getattr(request, "scope", None)
    ticket = scope.get(ARRIVAL_KEY) if isinstance(scope, dict) else None
    return ticket if isinstance(ticket, Ticket) else None


WaitReport = Callable[[Ticket, int, Ticket], Awaitable[None]]  # (own ticket, calls ahead, holder)
# Told when a command's call starts waiting behind another ("queued") and when it gets
# the turn ("started"): the state dir's event stream (mcp_server/events.py).
Observer = Callable[[str, str, Ticket], None]  # (what happened, capsule id, the call's ticket)


class CapsuleQueue:
    """The lines of every capsule this front end serves."""

    def __init__(self, observer: Observer | None = None) -> None:
        self.observer = observer  # told of commands only (labels "exec …"): the others are not runs
        self._lines: dict[str, list[Ticket]] = {}
        self._lots: dict[str, trio.lowlevel.ParkingLot] = {}
        self._numbers = itertools.count(1)

    def line(self, capsule_id: str) -> list[Ticket]:
        """The capsule's line, holder first (a copy)."""
        return list(self._lines.get(capsule_id, ()))

    def reserve(self, capsule_id: str, label: str, takes: TakesTurn | None = None,
                args: Mapping[str, Any] | None = None) -> Ticket:
        """Take the last place in the capsule's line now (for a call of ``takes`` with ``args``);
        ``turn`` claims it later."""
        ticket = Ticket(next(self._numbers), label, capsule_id)
        if takes is not None:
            ticket.kind, ticket.subject, ticket.follows = takes.label, takes.subject_of(args or {}), takes.follows
            ticket.follows_any = takes.follows_any
        self._lines.setdefault(capsule_id, []).append(ticket)
        self._lots.setdefault(capsule_id, trio.lowlevel.ParkingLot())
        return ticket

    def release(self, capsule_id: str, ticket: Ticket) -> None:
        """Leave the line (a no-op if already gone) and wake the others."""
        line = self._lines.get(capsule_id)
        if line is None or ticket not in line:
            return
        line.remove(ticket)
        lot = self._lots[capsule_id]
        if not line:
            del self._lines[capsule_id]
            del self._lots[capsule_id]
        lot.unpark_all()

    def arrive(self, takes: TakesTurn | None, args: Any,
               parents_of: Callable[[str], list[str]] | None = None) -> Ticket | None:
        """The place a call with ``args`` of a tool that ``takes`` turns takes as it is read
        (``reserve``), or None if its tool takes no turn or its arguments name no capsule; a
        call over several capsules takes one in each line, the others in the first's ``more``,
        as do the places in the lines of the capsules its capsule's layers lie on (``parents_of``:
        the live capsule's parent, and the inputs a merged capsule stacks) that a call
        ``takes.parent_too`` holds."""
        if takes is None or not isinstance(args, Mapping):
            return None
        label = takes.label_of(args)
        tickets = [self.reserve(capsule_id, label, takes, args) for capsule_id in takes.capsules_of(args)]
        if not tickets:
            return None
        for child in list(tickets) if takes.parent_too else ():
            for parent in parents_of(child.capsule_id) if parents_of is not None else ():
                if all(one.capsule_id != parent for one in tickets):
                    tickets.append(self.reserve(parent, f"{label} of fork {child.capsule_id}"))
        tickets[0].more = tickets[1:]  # the others travel with the first: claimed, and given back, with it
        return tickets[0]

    async def follow(self, ticket: Ticket | None, through: bool = True) -> None:
        """Wait for the calls ahead of ``ticket`` in its line that its call follows
        (``TakesTurn.follows``, on the same subject) and, ``through``, for every call between the
        first of them and it: a stop pipelined after its service's start and a test run against
        it, queued behind other work, stops the service once that run has ended, not before it
        starts nor under it.  A read of the service's logs waits for the starts alone: a start
        made the log, and a log read must not wait behind the test run; a port's forward waits
        for the opens and closes of that port sent before it, which would otherwise race (two
        forwards made, one never closed), and for the service starts sent before it
        (``follows_any``, whatever their subject), whose server it leads to.  With no such call
        ahead it waits for nothing (a stop must not wait behind a test run against a service
        started earlier).  The
        ticket stays unclaimed: its transport gives it back once the call is answered.  A call
        with no place (the CLI's in-process calls, one at a time) has nothing to wait for."""
        line = self._lines.get(ticket.capsule_id, []) if ticket is not None and ticket.follows else []
        if ticket not in line:
            return
        ahead = line[: line.index(ticket)]
        followed = [n for n, one in enumerate(ahead) if (one.kind == ticket.follows and one.subject == ticket.subject)
                    or (ticket.follows_any is not None and one.kind == ticket.follows_any)]
        waited = [] if not followed else ahead[followed[0]:] if through else [ahead[n] for n in followed]
        while any(one in line for one in waited):  # calls only leave a line, and new ones join behind it
            await self._lots[ticket.capsule_id].park()  # every release wakes the line

    def give_back(self, ticket: Ticket | None) -> None:
        """Give back a place taken on arrival that no handler claimed (the request is
        answered or dropped); a claimed one is its handler's to release, a kept one its run's."""
        for one in [ticket, *ticket.more] if ticket is not None else []:
            if not one.claimed and not one.kept:
                self.release(one.capsule_id, one)

    def keep(self, ticket: Ticket) -> Callable[[], None]:
        """Keep a call's places (``ticket`` and its ``more``) past the call's answer, for its run:
        a race answered "running" after ``wait_ms`` has capsules still waiting for a core, and a
        call sent after it on one of them must not overtake it there.  Returns what gives back
        the places none of the run's turns claimed, for when the run ends (or is cancelled)."""
        places = [ticket, *ticket.more]
        for one in places:
            one.kept = True

        def end() -> None:
            for one in places:
                one.kept = False
            self.give_back(ticket)

        return end

    def _observe(self, what: str, capsule_id: str, ticket: Ticket) -> None:
        if self.observer is not None and ticket.label.startswith(EXEC_LABEL + " "):
            self.observer(what, capsule_id, ticket)

    @contextlib.asynccontextmanager
    async def turn(self, capsule_id: str, label: str, on_wait: WaitReport | None = None,
                   ticket: Ticket | None = None) -> AsyncIterator[Ticket]:
        """Wait for the capsule's turn, hold it for the block, then pass it on.

        ``ticket``: a place taken with ``reserve`` when the call arrived (if it is still
        in this capsule's line and no other block claimed it).  ``on_wait(ticket, ahead, holder)``
        is awaited when the call has to wait, again whenever its place changes and every ``WAIT_REPORT_S`` meanwhile.
        """
        if ticket is None or ticket.claimed or ticket not in self._lines.get(capsule_id, ()):
            ticket = self.reserve(capsule_id, label)
        ticket.claimed = True
        line = self._lines[capsule_id]
        lot = self._lots[capsule_id]
        try:
            reported: tuple[int, int] | None = None
            last_report = 0.0
            while line[0] is not ticket:
                if not ticket.waited:
                    self._observe("queued", capsule_id, ticket)
                ticket.waited = True
                ahead = line.index(ticket)
                place = (ahead, line[0].number)
                now = time.monotonic()
                if on_wait is not None and (place != reported or now - last_report >= WAIT_REPORT_S):
                    reported, last_report = place, now
                    await on_wait(ticket, ahead, line[0])
                    continue  # the line may have moved while the report went out
                with trio.move_on_after(WAIT_REPORT_S):
                    await lot.park()
            ticket.started = time.monotonic()
            self._observe("started", capsule_id, ticket)
            try:
                yield ticket
            except CcwError as exc:  # an exec the helper refused ends in no run: its start needs an end
                ticket.failed = f"{exc.code}: {exc.message}"
                self._observe("failed", capsule_id, ticket)
                raise
        finally:
            self.release(capsule_id, ticket)
