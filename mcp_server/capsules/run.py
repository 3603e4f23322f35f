"""Runs that outlive their call: a long exec answers "running" and is fetched later by id.

MCP clients cut a tool call after a fixed time (Codex: ``tool_timeout_sec``, 60 s by
default), while the capsule goes on running and holding its turn.  So a long call is
started as a *run*: its body runs in a trio system task of its own, and the call waits
for it at most ``wait_ms`` (an argument; the default is below the common 60 s limit).
A run that ends within that budget answers exactly what the tool always answered; one
that does not answers ``{"status": "running", "run_id", ...}``, and ``capsule_run``
waits again, fetches, or cancels it.

- **The turn is the run's.**  The body takes the capsule's turn (mcp_server.capsules.turns)
  as the call would have, in the place the call took when it arrived, and holds it
  until the run ends: a call sent after it on that capsule waits behind it.  The places
  the body has not claimed yet (a race's capsules waiting for a core) are kept until the
  run ends too (``on_start``, ``Run.at_end``), not given back with the "running" answer.
- **Why a system task.**  No task of the server lives as long as the process (each
  transport has its own nursery; see capsules/networks.py), and a run must outlive the
  call and its connection.  The task runs in a copy of the call's context (the arrival
  places of its connection are found there).  It never raises but ``Cancelled`` at the
  end of the trio run: what the body raised is kept and raised at the fetch.
- **Cancelled while first waited for.**  If the call that started the run is cancelled
  before it answered (``notifications/cancelled``, a closed connection), the run is
  cancelled too, as an exec always was.  Once it answered "running", only
  ``capsule_run`` with ``cancel`` (or the server's end) stops it; a client that leaves and
  comes back fetches it by id.
- **Progress** goes to whichever call is waiting for the run (none: dropped); the last
  report (elapsed time, byte counts, the latest output lines) is in the "running" answer.
- **Whose run.**  A run belongs to the bearer token whose call started it (its name;
  None over stdio and the unix socket, whose one client is the user): ``get`` finds
  only the caller's own runs, and answers another's as it answers an unknown id, so a
  run id is no key for another token.  ``OwnedRuns`` is the registry as one caller
  sees it (CallContext.runs).
- **Interactive execs.**  An exec started with ``interactive`` (or ``tty``) is a run with a
  console (mcp_server/capsules/console.py): every answer about it, from the call that
  starts it to the last ``capsule_run``, carries the output since the caller's last read
  (``output``) and the ``cursor`` after it, and waits only until output has come and
  paused (or the run ends, or ``wait_ms``: ``CONSOLE_WAIT_MS`` by default).  Its ended
  answer is the tool's result with ``status: "finished"`` and those two.
- **Per process.**  Runs and their results live in this process: a restarted server
  knows none of them (NOT_FOUND), and a second server of the same state dir does not see
  this one's.  Finished runs are kept ``KEEP_S`` seconds, at most ``KEEP_FINISHED`` of them.
"""

from __future__ import annotations

import contextvars
import itertools
import math
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from mcp_server.capsules.console import Console
from mcp_server.core.transcript import Reading
from sandbox.errors import CcwError
from sandbox.replies import ExecProgress

WAIT_MS_DEFAULT = 50_000  # below the 60 s that Codex and other clients allow a tool call
WAIT_MS_MAX = 600_000
KEEP_S = 3600.0  # how long a finished run's result can still be fetched
KEEP_FINISHED = 64  # and how many finished runs are kept at most
STOP_WAIT_S = 40.0  # how long cancel waits for the jail to be ended (the helper's settle is 30 s)
CONSOLE_WAIT_MS = 2000  # an interactive exec's reads return sooner when output comes and pauses

# The wait_ms argument of the tools that answer through runs.
WAIT_MS = {"type": ["integer", "null"], "minimum": 0, "maximum": WAIT_MS_MAX, "description": (
    f"Default {WAIT_MS_DEFAULT}; past it: status running. null: no limit.")}
_RUN_ID = {"type": "string", "description": "Give it to capsule_run to wait again, fetch or cancel."}
# What a call answers about a run that has not finished, or was cancelled; a running one
# says what to do ``next``, in the answer an agent reads (so wait_ms's description need not).
RUN_STATUS = {
    "type": "object",
    "required": ["status", "run_id", "elapsed_ms", "progress"],
    "additionalProperties": False,
    "properties": {
        "status": {"enum": ["running", "cancelled"]},
        "run_id": _RUN_ID,
        "elapsed_ms": {"type": "integer", "minimum": 0},
        "progress": {"type": ["string", "null"],
                     "description": "The last progress report: elapsed time, byte counts, the latest output lines."},
        "next": {"type": "string"},
    },
}
# What an answer about an interactive exec adds, besides the tool's result once it has ended.
CONSOLE_STATUS = {
    "status": {"enum": ["running", "finished", "cancelled"]},
    "run_id": _RUN_ID,
    "elapsed_ms": {"type": "integer", "minimum": 0},
    "output": {"type": "string",
               "description": "Output since your last read (or cursor); a tty's without control codes."},
    "cursor": {"type": "integer", "minimum": 0,
               "description": "Byte offset after output: pass it to read again from there."},
}


def next_step(run_id: str) -> str:
    """What a caller answered "running" does next (an agent that reads only the answer must not
    need ``wait_ms``'s description to find capsule_run)."""
    return (f'capsule_run {{"run_id": "{run_id}"}} waits for the rest (wait_ms: how long, up to {WAIT_MS_MAX}; '
            'null: to the end) and answers the result; with "cancel": true it stops the run')


class Progress(Protocol):
    """Where a run's progress goes: the waiting call's ``progress`` (context.py)."""

    async def __call__(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        """One report; ``output``: a streaming exec's report, for a caller that prints its output."""


class Run:
    """One call's work, running (or ended) in the background."""

    def __init__(self, run_id: str, tool: str, capsule_id: str | None, owner: str | None = None,
                 console: Console | None = None) -> None:
        self.run_id = run_id
        self.tool = tool
        self.capsule_id = capsule_id
        self.owner = owner  # the token name that started it (None: stdio, unix socket)
        self.started = trio.current_time()
        self.ended: float | None = None
        self.done = trio.Event()
        self.scope = trio.CancelScope()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.last_report: str | None = None
        self.console = console  # an interactive exec's stdin and output
        # Told when the body has ended, however: the call's places in capsules' lines are given back (context.py).
        self.at_end: list[Callable[[], None]] = []
        self._listener: Progress | None = None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        """The body's progress: kept, and sent to the call waiting for the run (if any)."""
        if message is not None:
            self.last_report = message
        listener = self._listener
        if listener is None:
            return
        try:
            await listener(progress, total, message, output)
        except Exception:  # the waiting call's connection is gone: the run goes on
            if self._listener is listener:
                self._listener = None

    def summary(self, status: str) -> dict[str, Any]:
        """The answer about a run that has not finished (``running``, with what to do ``next``) or was
        ``cancelled``: every tool that answers through runs (exec, race, deltamin, replay) answers this."""
        end = self.ended if self.ended is not None else trio.current_time()
        answer = {"status": status, "run_id": self.run_id, "elapsed_ms": int((end - self.started) * 1000),
                  "progress": self.last_report}
        if status == "running":
            answer["next"] = next_step(self.run_id)
        return answer

    def outcome(self) -> dict[str, Any]:
        """An ended run's answer: the tool's own result, the ``cancelled`` summary, or what it raised."""
        if self.cancelled:
            return self.summary("cancelled")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def console_answer(self, reading: Reading) -> dict[str, Any]:
        """An answer about an interactive exec: its status (its result, once ended) and ``reading``."""
        if self.done.is_set() and not self.cancelled:
            answer = {**self.outcome(), "status": "finished", "run_id": self.run_id}
        else:
            answer = self.summary("cancelled" if self.done.is_set() else "running")
            del answer["progress"]  # its output says more
            answer.pop("next", None)  # capsule_run's description says how to drive it
        answer.update(output=reading.text, cursor=reading.cursor)
        return answer


Body = Callable[[Run], Awaitable[dict[str, Any]]]


class Runs:
    """The runs of this process, by id."""

    def __init__(self, on_end: Callable[[Run], None] | None = None) -> None:
        self._runs: dict[str, Run] = {}
        self._serial = itertools.count(1)
        self.on_end = on_end  # told of every run that ended (its result or error): the event stream

    def start(self, tool: str, capsule_id: str | None, body: Body, owner: str | None = None,
              console: Console | None = None, on_start: Callable[[Run], None] | None = None) -> Run:
        """Start ``body`` as ``owner``'s run now, in a copy of the calling task's context;
        ``on_start(run)`` is called first (before the call can answer)."""
        self._expire()
        run = Run(f"run_{next(self._serial)}_{secrets.token_hex(6)}", tool, capsule_id, owner, console)
        if on_start is not None:
            on_start(run)
        self._runs[run.run_id] = run
        trio.lowlevel.spawn_system_task(self._serve, run, body, name=f"ccw {tool} {run.run_id}",
                                        context=contextvars.copy_context())
        return run

    async def call(self, tool: str, capsule_id: str | None, body: Body, wait_ms: int | None,
                   progress: Progress, owner: str | None = None, console: Console | None = None,
                   on_start: Callable[[Run], None] | None = None) -> dict[str, Any]:
        """Run ``body`` and answer within ``wait_ms`` (None: wait until it ends, in this task; a run
        with a ``console`` is always one of the background); ``on_start`` as ``start`` takes it."""
        if wait_ms is None and console is None:
            run = Run("", tool, capsule_id, owner)
            if on_start is not None:
                on_start(run)
            run._listener = progress
            try:  # its end is told like a background run's (the ccw command waits this way)
                run.result = await body(run)
            except Exception as exc:
                run.error = exc
                raise
            finally:
                self._ended(run)
            return run.result
        run = self.start(tool, capsule_id, body, owner, console, on_start)
        try:
            return await self.wait(run, wait_ms, progress)
        except trio.Cancelled:
            run.scope.cancel()  # cancelled before it answered: the run goes with it
            raise

    def get(self, run_id: str, owner: str | None = None) -> Run:
        """``owner``'s run of this process by id; NOT_FOUND (saying why it may be gone) if unknown
        or another's (said the same way: whether another token's run exists is not told)."""
        self._expire()
        run = self._runs.get(run_id)
        if run is None or run.owner != owner:
            raise CcwError("NOT_FOUND", (
                f"run {run_id} not found: runs live in the server process that started them and a "
                f"finished run's result is kept {int(KEEP_S)} s (at most {KEEP_FINISHED}); after a server "
                "restart it is gone. Run the command again (capsule_diff shows what the capsule holds now)"),
                {"run_id": run_id})
        return run

    def __contains__(self, run_id: object) -> bool:
        """Whether a run of that id is still kept (anyone's)."""
        return run_id in self._runs

    async def wait(self, run: Run, wait_ms: int | None, progress: Progress | None,
                   cursor: int | None = None) -> dict[str, Any]:
        """The run's answer if it ends within ``wait_ms`` (None: no limit), else its "running" summary;
        an interactive exec's, with its output from ``cursor`` once some has come and paused."""
        wait_s = math.inf if wait_ms is None else wait_ms / 1000
        run._listener = progress
        try:
            if run.console is not None:
                return run.console_answer(await run.console.read(run.done, cursor, wait_s))
            with trio.move_on_after(wait_s):
                await run.done.wait()
        finally:
            if run._listener is progress:
                run._listener = None
        return run.outcome() if run.done.is_set() else run.summary("running")

    async def cancel(self, run: Run) -> dict[str, Any]:
        """Cancel the run (its jail is ended, its turn passed on) and answer how it ended."""
        run.scope.cancel()
        with trio.move_on_after(STOP_WAIT_S):
            await run.done.wait()
        if run.console is not None:
            return run.console_answer(run.console.read_now())
        return run.outcome() if run.done.is_set() else run.summary("running")

    async def aclose(self) -> None:
        """Cancel every run and wait (shielded, bounded) until each has ended."""
        live = [run for run in self._runs.values() if not run.done.is_set()]
        for run in live:
            run.scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_WAIT_S):
            for run in live:
                await run.done.wait()

    async def _serve(self, run: Run, body: Body) -> None:
        try:
            with run.scope:
                run.result = await body(run)
            run.cancelled = run.result is None
        except Exception as exc:  # kept for the fetch; a system task must not raise
            run.error = exc
        finally:
            run.ended = trio.current_time()
            run.done.set()
            self._ended(run)

    def _ended(self, run: Run) -> None:
        for end in run.at_end:
            end()
        if self.on_end is not None:
            self.on_end(run)

    def _expire(self) -> None:
        now = trio.current_time()
        ended = sorted((r for r in self._runs.values() if r.ended is not None), key=lambda r: r.ended or 0.0)
        for index, run in enumerate(ended):
            if now - (run.ended or now) > KEEP_S or index < len(ended) - KEEP_FINISHED:
                del self._runs[run.run_id]


class OwnedRuns:
    """The runs as one caller (a token's name, or None) sees them: what it starts is its own,
    and it finds only its own.  The API the tools use (``ToolContext.runs``)."""

    def __init__(self, runs: Runs, owner: str | None, on_start: Callable[[Run], None] | None = None) -> None:
        self.runs = runs
        self.owner = owner
        self.on_start = on_start  # each run it starts is handed to it first: the call keeps its places for it

    async def call(self, tool: str, capsule_id: str | None, body: Body, wait_ms: int | None,
                   progress: Progress, console: Console | None = None) -> dict[str, Any]:
        """``Runs.call`` as this caller."""
        return await self.runs.call(tool, capsule_id, body, wait_ms, progress, self.owner, console, self.on_start)

    def get(self, run_id: str) -> Run:
        """This caller's run by id (``Runs.get``)."""
        return self.runs.get(run_id, self.owner)

    async def wait(self, run: Run, wait_ms: int | None, progress: Progress | None,
                   cursor: int | None = None) -> dict[str, Any]:
        """``Runs.wait``, for a run ``get`` gave."""
        return await self.runs.wait(run, wait_ms, progress, cursor)

    async def cancel(self, run: Run) -> dict[str, Any]:
        """``Runs.cancel``, for a run ``get`` gave."""
        return await self.runs.cancel(run)
