"""Per-capsule turns: calls that must not overlap on one capsule wait in arrival order.

A capsule runs one command at a time (the helper refuses a second exec with CONFLICT,
and stays the backstop for clients of other front ends).  Agents send tool calls in
parallel, so the front end queues ``capsule_exec``, ``capsule_fork``, ``capsule_destroy``
and the reading of a capsule's change by ``capsule_deltamin`` per capsule, first come
first served.  Read-only tools (diff, file reads, list) take no turn: they answer while
a command runs, and see its writes as far as they have got.

Why not ``trio.Lock``: it is fair (``release`` hands the lock straight to the longest
waiter), but it cannot say who holds it or how many wait ahead, which a queued call's
progress reports name.  The line here is a plain list per capsule whose head holds the
turn; every change to it wakes the waiters of that capsule, and each looks at its own
place again.  A waiter that is cancelled (MCP ``notifications/cancelled``, a closed
connection) leaves the line at once and never runs.  All of it runs on the trio thread,
so no lock guards the lists.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import trio

WAIT_REPORT_S = 1.0  # a queued call repeats its "queued" report this often


@dataclass(eq=False)
class Ticket:
    """One call's place in a capsule's line."""

    number: int  # arrival number on this server, for "queued behind #N"
    label: str  # what the call does: "exec `pytest -q`", "destroy"
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None  # when it got the turn

    def describe(self) -> str:
        """``#3 exec `make` (running 4 s)`` or ``#4 destroy (waiting)``."""
        if self.started is None:
            return f"#{self.number} {self.label} (waiting)"
        return f"#{self.number} {self.label} (running {int(time.monotonic() - self.started)} s)"


WaitReport = Callable[[Ticket, int, Ticket], Awaitable[None]]  # (own ticket, calls ahead, holder)


class CapsuleQueue:
    """The lines of every capsule this front end serves."""

    def __init__(self) -> None:
        self._lines: dict[str, list[Ticket]] = {}
        self._lots: dict[str, trio.lowlevel.ParkingLot] = {}
        self._numbers = itertools.count(1)

    def line(self, capsule_id: str) -> list[Ticket]:
        """The capsule's line, holder first (a copy)."""
        return list(self._lines.get(capsule_id, ()))

    @contextlib.asynccontextmanager
    async def turn(self, capsule_id: str, label: str, on_wait: WaitReport | None = None) -> AsyncIterator[Ticket]:
        """Wait for the capsule's turn, hold it for the block, then pass it on.

        ``on_wait(ticket, ahead, holder)`` is awaited when the call has to wait, again
        whenever its place changes and every ``WAIT_REPORT_S`` meanwhile.
        """
        line = self._lines.setdefault(capsule_id, [])
        lot = self._lots.setdefault(capsule_id, trio.lowlevel.ParkingLot())
        ticket = Ticket(next(self._numbers), label)
        line.append(ticket)
        try:
            reported: tuple[int, int] | None = None
            last_report = 0.0
            while line[0] is not ticket:
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
            yield ticket
        finally:
            line.remove(ticket)
            if not line:
                del self._lines[capsule_id]
                del self._lots[capsule_id]
            lot.unpark_all()
