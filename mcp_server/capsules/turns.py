"""Per-capsule turns: calls that must not overlap on one capsule wait in arrival order.

A capsule runs one command at a time (the helper refuses a second exec with CONFLICT,
and stays the backstop for clients of other front ends).  Agents send tool calls in
parallel, so the front end queues ``capsule_exec``, ``capsule_fork``, ``capsule_destroy``,
``capsule_witness``, ``capsule_promote`` and the reading of a capsule's change by
``capsule_deltamin`` per capsule, first come first served.  Read-only tools (diff, file reads, list) take no turn: they answer while
a command runs, and see its writes as far as they have got.

Why not ``trio.Lock``: it is fair (``release`` hands the lock straight to the longest
waiter), but it cannot say who holds it or how many wait ahead, which a queued call's
progress reports name.  The line here is a plain list per capsule whose head holds the
turn; every change to it wakes the waiters of that capsule, and each looks at its own
place again.  A waiter that is cancelled (MCP ``notifications/cancelled``, a closed
connection) leaves the line at once and never runs.  All of it runs on the trio thread,
so no lock guards the lists.

Arrival order is the order the transport read the requests, not the order their
handlers happen to start: the SDK spawns a task per request, and trio runs the tasks of
one batch in either order.  So the NDJSON transports take a call's place when they read
it (``reserve``, keyed by connection and request id in ``ARRIVALS``), and the handler
claims that place (``turn`` with ``ticket``); a call that ends without claiming it (bad
arguments, cancelled before it started) gives it back when it is answered or dropped.
Calls that arrive otherwise (HTTP, the CLI) take their place when the handler asks.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

WAIT_REPORT_S = 1.0  # a queued call repeats its "queued" report this often
LABEL_CHARS = 60  # of a command, in the "queued behind" reports
# The tools that take a capsule's turn, and what they are called in the reports.
TURN_TOOLS = {"capsule_exec": "exec", "capsule_fork": "fork", "capsule_destroy": "destroy",
              "capsule_deltamin": "deltamin (reading the change)", "capsule_promote": "promote",
              "capsule_witness": "witness"}
# Places taken by the transport when it read a request, by (request id key, capsule id):
# set per connection for the tasks that serve it.
ARRIVALS: contextvars.ContextVar[dict[tuple[Any, str], Ticket] | None] = contextvars.ContextVar(
    "ccw_arrivals", default=None)


def turn_label(tool: str, args: Mapping[str, Any] | None = None) -> str:
    """How a call of ``tool`` is named in "queued behind" reports: "exec `make -j2`"."""
    cmd = (args or {}).get("cmd")
    if tool == "capsule_exec" and isinstance(cmd, list) and all(isinstance(a, str) for a in cmd):
        return exec_label(cmd)
    return TURN_TOOLS.get(tool, tool)


def exec_label(argv: list[str]) -> str:
    """The turn label of an exec of ``argv``, its command shortened to ``LABEL_CHARS``."""
    text = shlex.join(argv)
    return f"{TURN_TOOLS['capsule_exec']} `{text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + '…'}`"


@dataclass(eq=False)
class Ticket:
    """One call's place in a capsule's line."""

    number: int  # arrival number on this server, for "queued behind #N"
    label: str  # what the call does: "exec `pytest -q`", "destroy"
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None  # when it got the turn
    waited: bool = False  # whether another call held the turn when its handler asked

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

    def reserve(self, capsule_id: str, label: str) -> Ticket:
        """Take the last place in the capsule's line now; ``turn`` claims it later."""
        ticket = Ticket(next(self._numbers), label)
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

    def _observe(self, what: str, capsule_id: str, ticket: Ticket) -> None:
        if self.observer is not None and ticket.label.startswith(TURN_TOOLS["capsule_exec"] + " "):
            self.observer(what, capsule_id, ticket)

    @contextlib.asynccontextmanager
    async def turn(self, capsule_id: str, label: str, on_wait: WaitReport | None = None,
                   ticket: Ticket | None = None) -> AsyncIterator[Ticket]:
        """Wait for the capsule's turn, hold it for the block, then pass it on.

        ``ticket``: a place taken with ``reserve`` when the call arrived (if it is still
        in the line).  ``on_wait(ticket, ahead, holder)`` is awaited when the call has to
        wait, again whenever its place changes and every ``WAIT_REPORT_S`` meanwhile.
        """
        if ticket is None or ticket not in self._lines.get(capsule_id, ()):
            ticket = self.reserve(capsule_id, label)
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
            yield ticket
        finally:
            self.release(capsule_id, ticket)
