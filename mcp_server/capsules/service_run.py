"""One service as the front end keeps it: its state, and its output on the way to its ring.

``Services`` (capsules/services.py) holds one ``ServiceRun`` per service and a restart
reuses it; a replay's services (capsules/service_scratch.py) have theirs too.  The
helper streams a service's output in progress reports (every byte since the previous
one, its last report once the output ends: sandbox/replies.py ``ExecProgress``), so the
ring gets all of it, in order, before the line that says the run ended; what the helper
could not carry is counted and said in the ring, never silently missing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import trio

from mcp_server.capsules.service_log import LogRing
from mcp_server.capsules.service_spec import ServiceSpec
from sandbox.replies import ExecProgress, ExecReply

ENDED = ("exited", "failed", "lost", "stopped", "pending")  # not running (pending: a fork's, not started yet)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


@dataclass(eq=False)
class ServiceRun:
    """One service as this process keeps it."""

    spec: ServiceSpec
    log: LogRing
    state: str = "starting"
    since: str = field(default_factory=_now)
    created_at: str = field(default_factory=_now)
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    restarts: int = 0
    seq: int | None = None  # the journal row of its last run that ended
    stopping: bool = False
    path_before: str | None = None  # its ready path's identity as this run started (Readiness.identity)
    awaited: bool = False  # a caller waits for this start's readiness; other starts are watched in the background
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    finished: trio.Event = field(default_factory=trio.Event)  # the serving task has ended
    line_seen: trio.Event = field(default_factory=trio.Event)
    # its ready check may begin: its first run's command is on its way (``starting``), or it ended before
    checkable: trio.Event = field(default_factory=trio.Event)
    # set, then renewed, at each report of a running command (not its last: ExecProgress) and at its end:
    # news that it runs or has ended, never a change such as "starting" that says neither
    reported: trio.Event = field(default_factory=trio.Event)
    _partial: str = ""
    _counts: tuple[int, int] = (0, 0)

    def set_state(self, state: str, reason: str | None = None) -> None:
        self.state, self.since, self.reason = state, _now(), reason
        if state in ENDED:
            self.checkable.set()
            self._news()

    def _news(self) -> None:
        self.reported.set()
        self.reported = trio.Event()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.spec.name, "state": self.state, "since": self.since,
                               "argv": list(self.spec.argv), "restart": self.spec.restart, "restarts": self.restarts}
        for key in ("exit_code", "signal", "reason", "seq"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.spec.ready is not None:
            out["ready_when"] = self.spec.ready.describe()
        return out

    def take_output(self, report: ExecProgress) -> None:
        """A progress report's new output into the ring (noting what the helper could not carry),
        and its lines against the readiness line (plain text: service_spec.Ready says why)."""
        out_seen, err_seen = self._counts
        missed = (report.stdout_bytes - out_seen - len(report.stdout_tail)
                  + report.stderr_bytes - err_seen - len(report.stderr_tail))
        self._counts = (report.stdout_bytes, report.stderr_bytes)
        data = report.stdout_tail + report.stderr_tail
        if missed > 0:
            data = f"[ccw: {missed} bytes of output were not kept]\n".encode() + data
        self.log.append(data)
        if not report.last:
            self._news()
        line = self.spec.ready.line if self.spec.ready is not None else None
        if line is not None and data and not self.line_seen.is_set():
            text = self._partial + data.decode(errors="replace")
            lines = text.split("\n")
            self._partial = lines.pop()[-4096:]
            if any(line in one for one in lines):
                self.line_seen.set()

    def take_end(self, reply: ExecReply) -> None:
        """The run's end into the ring: a note of output its reports did not carry (a helper that
        sends no last report), then the line that says how it ended."""
        missed = reply.stdout_bytes + reply.stderr_bytes - sum(self._counts)
        if missed > 0:
            self.log.append(f"[ccw: {missed} bytes of output were not kept]\n".encode())
        how = (f"killed by {reply.signal}" if reply.signal is not None
               else f"exit {reply.exit_code}" if reply.exit_code is not None else "how, the helper did not say")
        self.log.append(f"[ccw: {self.spec.name} ended: {how}]\n".encode())

    def starting(self) -> None:
        self.set_state("starting")
        self.checkable.set()
        self.log.append(f"[ccw: {self.spec.name} started at {self.since}: {' '.join(self.spec.argv)}]\n".encode())

    def restarted(self) -> None:
        self.restarts += 1
        self.line_seen = trio.Event()
        self._partial, self._counts = "", (0, 0)
