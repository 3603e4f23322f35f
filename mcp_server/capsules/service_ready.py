"""Whether a service is ready: its ``ready`` checked until it holds, it ends, or its deadline passes.

Some facts about readiness checks, and what follows from them:

- **A port that accepts says only that something listens.**  ``net_connect`` (the helper
  connects on the capsule's loopback) cannot tell whose listener answered, and the
  capsule's processes share one network namespace: a second service started on a port
  the first holds fails with EADDRINUSE while its check passes on the first's listener.
  So a start whose ready port already accepts is refused before anything is started
  (``refuse_taken``: CONFLICT, naming the service whose ready port it is when one is).
- **A path that exists may be an earlier run's.**  A pid file or socket that a killed
  server left behind (postgres's ``postmaster.pid`` after a kill -9, a restart after a
  crash) is there before the new run has done anything.  So the path's identity (device,
  inode and change time, to the nanosecond: ``identity``) is read before each run's
  command starts, and the check passes only once the path exists with another one: made
  anew, or written again.  Where it could not be read before (the capsule ran an exec
  then), an existing path passes as before.
- **A check passes after the run may have ended.**  A process that exits at once is
  reported ended when the helper's reply comes, which follows the exit by the time the
  helper takes to collect the run; a path that exists (one a run before left, say) may
  be found in between.  The helper sends a progress report about every ``PROGRESS_MS``
  while the command runs, and once it has ended only the one with its last words, which
  says ``last``; so a path check that passes counts once another report comes after it
  (``_still_running``); if the run's end comes first, the
  start is answered as one that failed is (its status and last lines).  That costs a
  ready answer up to one report's interval (250 ms), so a port check does without it:
  a start holds the capsule's turn, so no other start or exec of the capsule can take
  the port between ``refuse_taken`` and the check, and a listener found then is the
  service's own.  A line of output needs no wait either: only the service printed it.
- **A probe is an exec of the capsule, and is never left behind.**  The helper holds the
  capsule for a path's probe as for any exec, until its command has ended; a probe
  cancelled mid-call (by the start's deadline, or a stop) only closes its connection,
  and a destroy or exec sent right after the start's answer found the capsule still
  running it ("is running a command").  So a probe is shielded from cancellation (a
  ``stat``, under a time limit of its own): a start answers only once its probes have
  ended, and a destroy waits for those a background check (a restart's) has out (``settled``);
  an exec or a fork waits for them too, and no probe starts until it has its answer
  (``held_off``): the helper would refuse it meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from mcp_server.capsules.service_run import ENDED, ServiceRun
from mcp_server.capsules.service_spec import ServiceSpec
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest

READY_POLL_S = 0.1
PROBE_MS = 10_000  # a path probe's time limit in the helper
READY_FIRST_S = 0.01  # the first pause between readiness checks, doubled up to READY_POLL_S
# A port's check is one connect in the helper, so for the first second they come at most this far
# apart: doubled to 100 ms, they came at 70 and 150 ms, and python3 -m http.server, listening
# after about 80 ms, was answered ready at 170 (a path's check is a probe exec: those keep doubling).
PORT_POLL_FIRST_S = 0.02
PORT_POLL_FAST_FOR_S = 1.0
TAIL_LINES = 20  # lines of output a start that did not become ready shows


class Readiness:
    """Readiness checks of one front end's services, through its helper."""

    def __init__(self, helper: Callable[[], Awaitable[HelperClient]], on_ready: Callable[[ServiceRun], None]) -> None:
        self._helper = helper
        self._on_ready = on_ready  # called once a run is listed ready (its event)
        self._probing: dict[str, int] = {}  # capsule id: path probes the helper runs there now
        self._probe_ended = trio.Event()  # set, then renewed, as each probe ends
        self._held: dict[str, int] = {}  # capsule id: calls that need it to themselves now (``held_off``)

    async def refuse_taken(self, spec: ServiceSpec, running: list[ServiceRun]) -> None:
        """CONFLICT if ``spec``'s ready port already accepts in its capsule (``running``: the
        capsule's running services, one of which may be why)."""
        port = spec.ready.port if spec.ready is not None else None
        if port is None or not await self._accepts(spec.capsule_id, port):
            return
        holder = next((run.spec.name for run in running if run.spec.ready is not None and run.spec.ready.port == port),
                      None)
        who = f"service {holder!r} listens there" if holder else "a process of the capsule listens there"
        stop = f"stop {holder!r} (capsule_service_stop)" if holder else "end what listens there"
        raise CcwError("CONFLICT", (
            f"port {port} of capsule {spec.capsule_id} already accepts connections ({who}): service "
            f"{spec.name!r} would fail to bind it while its ready check passed on that listener; {stop}, "
            "or start it on another port"), {"port": port, "service": holder})

    async def wait(self, run: ServiceRun) -> dict[str, Any]:
        """Wait for the run's readiness (or its end, or the deadline); its summary, with ``ready``."""
        ready = run.spec.ready
        if ready is None:
            with trio.move_on_after(0.2):  # a command that cannot start fails at once: say so now
                await run.finished.wait()
            return {**run.summary(), "ready": run.state not in ENDED, **_tail_if_ended(run)}
        with trio.move_on_after(ready.timeout_ms / 1000) as waited:
            await run.checkable.wait()  # a path's identity before the run is read first (the essay)
            pause, started = READY_FIRST_S, trio.current_time()
            while run.state not in ENDED:  # polled: a port or a path gives no event to wait for
                if await self._passes(run) and (ready.path is None or await _still_running(run)):
                    break
                await trio.sleep(pause)
                fast = ready.port is not None and trio.current_time() - started < PORT_POLL_FAST_FOR_S
                pause = min(pause * 2, PORT_POLL_FIRST_S if fast else READY_POLL_S)
        if run.state not in ENDED and not waited.cancelled_caught:
            run.set_state("ready")
            self._on_ready(run)
            return {**run.summary(), "ready": True}
        why = (f"not ready after {ready.timeout_ms} ms ({ready.describe()}); it keeps running: read its logs, "
               "or stop it") if run.state not in ENDED else f"it {run.state} before it was ready"
        return {**run.summary(), "ready": False, "why": why, "log_tail": run.log.read(tail=TAIL_LINES).text}

    async def _passes(self, run: ServiceRun) -> bool:
        ready = run.spec.ready
        assert ready is not None
        if ready.line is not None:
            with trio.move_on_after(READY_POLL_S):
                await run.line_seen.wait()
            return run.line_seen.is_set()
        if ready.port is not None:
            return await self._accepts(run.spec.capsule_id, ready.port)
        now = await self.identity(run)
        return now is not None and now != run.path_before

    async def identity(self, run: ServiceRun) -> str | None:
        """The identity of the run's ready path in the jail, ``device:inode:ctime`` (the essay); None
        where it does not exist, or cannot be read now (a probe while the capsule runs an exec)."""
        ready = run.spec.ready
        assert ready is not None and ready.path is not None
        helper = await self._helper()
        capsule_id = run.spec.capsule_id
        if self._held.get(capsule_id):
            return None  # an exec or a fork has the capsule: the helper would refuse the probe
        probe = ExecRequest(capsule_id, ("stat", "-L", "-c", "%d:%i:%.9Z", "--", ready.path), timeout_ms=PROBE_MS)
        self._probing[capsule_id] = self._probing.get(capsule_id, 0) + 1
        try:
            with trio.CancelScope(shield=True):  # never left running in the helper (the essay)
                reply = await helper.call(probe)
        except CcwError as exc:
            if exc.code == "CONFLICT":
                return None
            raise
        finally:
            self._probing[capsule_id] -= 1
            if not self._probing[capsule_id]:
                del self._probing[capsule_id]
            self._probe_ended.set()
            self._probe_ended = trio.Event()
        return reply.stdout.decode(errors="replace").strip() if reply.exit_code == 0 else None

    async def settled(self, capsule_id: str) -> None:
        """Return once the helper runs no path probe of the capsule (before its destroy: the essay)."""
        while self._probing.get(capsule_id):
            await self._probe_ended.wait()

    @contextlib.asynccontextmanager
    async def held_off(self, capsule_id: str) -> AsyncIterator[None]:
        """No path probe of the capsule while the block runs, nor any still out when it begins.

        For an exec or a fork, which the helper refuses while it runs another exec of the
        capsule ("is running a command"), and a probe is one: a background check (a
        restart's) runs outside the capsule's turn.  It waits for the block instead,
        counting the path as not known meanwhile, as it does a probe the helper refused."""
        self._held[capsule_id] = self._held.get(capsule_id, 0) + 1
        try:
            await self.settled(capsule_id)
            yield
        finally:
            self._held[capsule_id] -= 1
            if not self._held[capsule_id]:
                del self._held[capsule_id]

    async def _accepts(self, capsule_id: str, port: int) -> bool:
        helper = await self._helper()
        try:
            (await helper.net_connect(capsule_id, port)).close()
        except CcwError as exc:
            if exc.code == "CONFLICT":  # nothing listens there
                return False
            raise
        return True


async def _still_running(run: ServiceRun) -> bool:
    """Whether the run still runs after a check that passed: news of it (``ServiceRun.reported``)
    that comes after the check is a progress report before its end (the essay).  One that ended
    while the check's probe ran has no news left to give."""
    if run.state not in ENDED:
        await run.reported.wait()
    return run.state not in ENDED


def _tail_if_ended(run: ServiceRun) -> dict[str, Any]:
    return {"log_tail": run.log.read(tail=TAIL_LINES).text} if run.state in ENDED else {}
