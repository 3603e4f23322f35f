"""A capsule's services: long-lived processes that this front end keeps running, logs and journals.

A service is one helper ``exec`` held open (sandbox/services.py): the same jail, cgroup,
fanotify recording and reply as an exec's, beside the capsule's exec rather than in turn
with it, in the capsule's one network namespace.  This module is the front end's side:

- **Where it runs.**  Each service is a trio task in a system task's nursery, as the
  egress sessions are (capsules/networks.py), because it outlives the call that started
  it; ``aclose`` (the process's end) stops them all.  The helper ends a service whose
  connection closes, so no service outlives the front end that holds it; until that run
  has ended (its next progress report finds the connection gone), the helper refuses
  another of its name, and a start waits for that (``HELD_S``) rather than failing.
- **Start, in the capsule's turn.**  ``capsule_service_start`` takes the capsule's turn
  and answers once the service is ready (its ``ready``: a port that accepts, checked
  through ``net_connect``; a path that exists, checked by a probe exec; a line of output
  that matches: capsules/service_ready.py, which also refuses a start whose port is
  taken) or plainly why not: it exited (with its status and last lines), or the
  deadline passed (it keeps running, and says so).  A call queued behind the start runs
  against a ready service: "start the app, then test it" is two calls.
- **Recorded like an exec.**  Each exec of a service is a journal row (its ``service``
  column names it), with its touched files, its connections (an allowlist capsule's, told
  from the exec's: capsules/networks.py) and usage, appended when it ends; what it
  wrote shows live as ``files.written`` events meanwhile.  An exec's row names the
  services that ran beside it (``beside``).  Its output goes to a bounded ring in the
  state dir (capsules/service_log.py), read by cursor (``logs``).
- **Restarts.**  ``restart``: "no" (an ended service stays listed with its status until
  stopped), "on-failure" (a non-zero exit, a signal, or the helper lost it), "always".
  A service that fails ``QUICK_FAILS`` times in a row within ``QUICK_S`` of starting is
  ``failed``, not restarted again.  One the helper lost did not fail: it is ``lost`` until
  a helper answers again (this process starts an embedded one at once; a detached one
  comes back with the next ``ccw`` command, a system one with its socket's activation),
  then started once, and no failure is counted.  A restart's readiness is watched as a start's
  is, so it is listed ``ready`` again.  Its output ring tells each start.
- **Outliving the process.**  Specs are kept in the state dir (capsules/service_spec.py).
  A front end that finds specs it did not start (after its own restart, a reboot, or the
  helper's) brings back those whose restart is not "no" and lists the others as
  ``lost``, with the reason (``recover``): never silently gone.  It does so as it starts,
  before it serves a call (``reopen_kept``, from ``frontdoor.running_app``): that asks no
  helper (the starts it makes run in the background), so a missing helper delays nothing,
  and ``recover``'s lock keeps any other caller from seeing it half done.
- **Stop.**  SIGTERM through the helper's ``signal`` op, then SIGKILL after ``grace_ms``;
  the service leaves the list and the spec table, its runs stay in the journal.  Its output
  stays readable (``logs``: a person stops a service, then asks why it misbehaved) until its
  capsule is destroyed; a new start of that name continues the same ring.
- **Paused.**  A paused capsule's services (or a capsule's with forks) are frozen by the
  helper, which alone knows it: a frozen server still accepts connections in the kernel
  and never answers them.  So a listing asks the helper, and a live service of a frozen
  capsule is listed ``paused``, its reason saying what it was and what thaws it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from mcp_server import events
from mcp_server.capsules import capsecrets, service_log
from mcp_server.capsules.background import Background
from mcp_server.capsules.exec import FRONT_END_DIED, ExecOutcome, cut_entry
from mcp_server.capsules.networks import Networks, network_not_open
from mcp_server.capsules.ports import Ports
from mcp_server.capsules.service_log import LogRing, Slice
from mcp_server.capsules.service_ready import Readiness
from mcp_server.capsules.service_run import ENDED, ServiceRun
from mcp_server.capsules.service_spec import ServiceSpec, SpecTable
from mcp_server.journal import Journal
from mcp_server.logs import LOGGER
from mcp_server.state import State
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest, ListRequest, SignalRequest
from sandbox.replies import ExecProgress

if TYPE_CHECKING:
    import datetime

    from mcp_server.journal_records import CapsuleRecord


class CapsuleService(Protocol):
    """What services need of the capsule service (capsules/service.py, which holds a ``Services``)."""

    @property
    def journal(self) -> Journal: ...

    def live_record(self, capsule_id: str) -> CapsuleRecord: ...

    def background(self) -> CapsuleService: ...

    async def record_service_run(self, record: CapsuleRecord, request: ExecRequest, outcome: ExecOutcome,
                                 started: datetime.datetime) -> int | None: ...

PROGRESS_MS = 250  # how often a service's output and writes come in
OUTPUT_CAP = 64 * 1024  # what the helper's reply keeps of each stream (the ring has it all)
STOP_GRACE_MS = 5000
KILL_WAIT_S = 15.0
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
QUICK_S, QUICK_FAILS = 10.0, 5
HELPER_POLL_S = 1.0  # how often a service the helper lost asks whether a helper answers again
HELD_S = 30.0  # how long a start waits for the helper to end the run of that name a gone front end left
_FROZEN = {  # a capsule's state in the helper that freezes its services: the reason a listing gives
    "paused": "its capsule is paused: it was {state}, and runs nothing (a connection to it waits) until "
              "capsule_resume",
    "frozen": "its capsule has forks, which freeze it: it was {state}, and runs nothing (a connection to it "
              "waits) until they are destroyed",
}


class Services:
    """The services of this front end's capsules (one per process, in the Runtime)."""

    def __init__(self, state: State, helper: Callable[[], Awaitable[HelperClient]], networks: Networks) -> None:
        self.state = state
        self._helper = helper
        self.networks = networks
        self.ports = Ports(state, helper)  # the capsules' forwarded ports (capsules/ports.py)
        self._runs: dict[tuple[str, str], ServiceRun] = {}
        self._background = Background("ccw services")
        self._recovered = False
        self._recovering = trio.Lock()  # a call waits for the recovery under way: no half-recovered listing
        self._capsules: CapsuleService | None = None  # journals the runs (set at first start)
        self._readiness = Readiness(helper, self._event)

    @property
    def table(self) -> SpecTable:
        return SpecTable(self.state)

    def _log_dir(self, capsule_id: str) -> Path:
        return Path(self.state.root) / "services" / capsule_id

    def _ring(self, spec: ServiceSpec) -> LogRing:
        return LogRing(self._log_dir(spec.capsule_id), spec.name)

    def _event(self, run: ServiceRun, **data: Any) -> None:
        events.add(self.state, "service", run.spec.capsule_id, {"name": run.spec.name, "state": run.state, **data})

    # --- queries -------------------------------------------------------------------

    def get(self, capsule_id: str, name: str) -> ServiceRun:
        run = self._runs.get((capsule_id, name))
        if run is None:
            raise self._not_found(capsule_id, name)
        return run

    def _stopped(self, capsule_id: str) -> list[str]:
        """The capsule's stopped services whose output is kept."""
        return [n for n in service_log.kept(self._log_dir(capsule_id)) if (capsule_id, n) not in self._runs]

    def _not_found(self, capsule_id: str, name: str) -> CcwError:
        known, stopped = sorted(n for c, n in self._runs if c == capsule_id), self._stopped(capsule_id)
        kept = f"; stopped, their logs kept: {stopped}" if stopped else ""
        return CcwError("NOT_FOUND", f"capsule {capsule_id} has no service named {name!r}; its services: "
                        f"{known or 'none'}{kept} (capsule_service_start starts one)",
                        {"capsule_id": capsule_id, "name": name, "services": known, "stopped": stopped})

    def summaries(self, capsule_id: str, frozen: str | None = None) -> list[dict[str, Any]]:
        """The capsule's services and their states, by name; ``frozen``: the capsule's state as the
        helper lists it, whose "paused" and "frozen" (it has forks) show on its live services (the essay)."""
        out = []
        for (cap, _), run in sorted(self._runs.items()):
            if cap == capsule_id:
                summary = run.summary()
                if frozen in _FROZEN and run.state not in ENDED:
                    summary.update(state="paused", reason=_FROZEN[frozen].format(state=run.state))
                out.append(summary)
        return out

    async def capsule_state(self, capsule_id: str) -> str | None:
        """The capsule's state as its helper lists it (paused, frozen, ready...); None if no helper answers."""
        try:
            listed = (await (await self._helper()).call(ListRequest())).capsules
        except CcwError as exc:
            if exc.code != "UNAVAILABLE":
                raise
            return None
        return next((one.state for one in listed if one.capsule_id == capsule_id), None)

    def running(self, capsule_id: str) -> list[ServiceRun]:
        return [run for (cap, _), run in sorted(self._runs.items()) if cap == capsule_id and run.state not in ENDED]

    def beside(self, capsule_id: str) -> list[dict[str, Any]]:
        """The specs (without values) of the services running in the capsule now: an exec's row keeps them."""
        return [run.spec.for_witness() for run in self.running(capsule_id)]

    def holding(self) -> bool:
        """Whether any service runs or port is forwarded (a front end that holds one is not idle)."""
        return bool(self.ports.held() or self.held())

    def held(self) -> list[str]:
        """The running services, each in a few words: what this process's end would end (its forwards
        it would not: the next front end opens them again)."""
        return [f"service {cap}/{name} ({run.state})" for (cap, name), run in sorted(self._runs.items())
                if run.state not in ENDED]

    def logs(self, capsule_id: str, name: str, since: int | None = None,
             tail: int | None = None) -> tuple[str, Slice]:
        """A service's state and its output after ``since`` (or its last ``tail`` lines); a stopped
        one's too, until its capsule is destroyed."""
        run = self._runs.get((capsule_id, name))
        if run is not None:
            return run.state, run.log.read(since, tail)
        if name in self._stopped(capsule_id):
            return "stopped", LogRing(self._log_dir(capsule_id), name).read(since, tail)
        raise self._not_found(capsule_id, name)

    # --- start ---------------------------------------------------------------------

    async def start(self, capsules: CapsuleService, spec: ServiceSpec) -> dict[str, Any]:
        """Start ``spec`` (the caller holds the capsule's turn) and answer once it is ready, or why not."""
        await self.start_pending(capsules, spec.capsule_id, but=spec.name)  # the app may need its kept database
        existing = self._runs.get((spec.capsule_id, spec.name))
        if existing is not None and existing.state not in ENDED:
            raise CcwError("CONFLICT", f"service {spec.name!r} already runs in capsule {spec.capsule_id} "
                           f"({existing.state}); stop it first, or give the new one another name",
                           {"name": spec.name, "state": existing.state})
        await self._readiness.refuse_taken(spec, self.running(spec.capsule_id))
        if existing is not None:  # an ended one of that name: replaced, its log kept going
            self._runs.pop((spec.capsule_id, spec.name))
        run = ServiceRun(spec, self._ring(spec), awaited=True)
        self.table.save(spec, run.created_at)
        await self._launch(run)
        return await self.await_ready(run)

    async def _launch(self, run: ServiceRun) -> None:
        self._runs[(run.spec.capsule_id, run.spec.name)] = run
        nursery = await self._background.nursery()
        nursery.start_soon(self._serve, run, name=f"ccw service {run.spec.capsule_id}/{run.spec.name}")

    async def await_ready(self, run: ServiceRun) -> dict[str, Any]:
        """Wait for the run's readiness (or its end, or the deadline); its summary, with ``ready``."""
        return await self._readiness.wait(run)

    # --- forks ---------------------------------------------------------------------------

    def inherit(self, parent_id: str, child_id: str) -> list[str]:
        """A fork gets the specs of its parent's running services, to start at its first exec
        (``start_pending``); the parent's own are frozen by the helper while it has forks."""
        names = []
        for run in self.running(parent_id):
            spec = run.spec.in_capsule(child_id)
            pending = ServiceRun(spec, self._ring(spec), state="pending")
            pending.reason = f"inherited from {parent_id}; starts at the fork's first exec"
            self._runs[(child_id, spec.name)] = pending
            self.table.save(spec, pending.created_at)
            names.append(spec.name)
        return names

    async def start_pending(self, capsules: CapsuleService, capsule_id: str, but: str | None = None
                            ) -> list[dict[str, Any]]:
        """Start the capsule's inherited and kept services, ``but`` one the caller starts anew (the caller
        holds its turn); each one's answer."""
        await self.recover(capsules)
        answers = []
        for (cap, name), run in sorted(self._runs.items()):
            if cap == capsule_id and run.state == "pending" and name != but:
                run.set_state("starting")
                run.awaited = True
                await self._launch(run)
                answers.append(await self.await_ready(run))
        return answers

    # --- running ---------------------------------------------------------------------

    async def _serve(self, run: ServiceRun) -> None:
        """Run the service until it ends for good: restarted as its policy says."""
        fails = 0
        with run.scope:
            try:
                while True:
                    began = time.monotonic()
                    outcome = await self._run_once(run)
                    if run.stopping or outcome == "refused":
                        break
                    failed = outcome == "lost" or run.exit_code != 0 or run.signal is not None
                    if not (run.spec.restart == "always" or (run.spec.restart == "on-failure" and failed)):
                        break
                    if outcome == "lost":  # the helper went, not the service: no failure of its own
                        fails = 0
                        await self._helper_answers(run)
                    else:
                        fails = fails + 1 if time.monotonic() - began < QUICK_S else 0
                        if fails >= QUICK_FAILS:
                            run.set_state("failed", f"it ended {fails} times within {QUICK_S:g} s of starting; "
                                          "not restarted again: read its logs, fix it, start it again")
                            self._event(run)
                            break
                        await trio.sleep(BACKOFF_S[min(fails, len(BACKOFF_S) - 1)])
                    if run.stopping:
                        break
                    run.restarted()
            except Exception as exc:  # one service's trouble must not end the others
                LOGGER.warning(f"mcp:service {run.spec.capsule_id}/{run.spec.name} failed: {exc!r}")
                run.set_state("failed", f"{type(exc).__name__}: {exc}")
                self._event(run)
        run.finished.set()

    async def _run_once(self, run: ServiceRun) -> str:
        """One run of the service in the helper, journaled when it ends: exited, lost or refused."""
        capsules = self._capsules
        assert capsules is not None
        spec = run.spec
        try:
            record = capsules.live_record(spec.capsule_id)
        except CcwError as exc:
            run.set_state("failed", exc.message)
            return "refused"
        request = await capsecrets.placed(
            self.state.root, self.networks, record.network_spec is not None,
            spec.request(record.spec, PROGRESS_MS, OUTPUT_CAP))  # never the caller's value
        if spec.ready is not None and spec.ready.path is not None:  # an earlier run's path is no sign (service_ready)
            run.path_before = await self._readiness.identity(run)
        run.starting()
        self._event(run, argv=list(spec.argv), restarts=run.restarts)
        if not run.awaited:  # a restart, or a start at recovery: nobody waits for its readiness
            (await self._background.nursery()).start_soon(self._watch_ready, run)
        run.awaited = False
        started = dt.datetime.now(dt.UTC)
        running = capsules.journal.mark_running(spec.capsule_id, cut_entry(request, started, FRONT_END_DIED))
        try:
            reply = await self._call_unheld(record.network_spec, request, run)
        except CcwError as exc:
            lost = exc.code == "UNAVAILABLE"
            if lost:
                capsules.journal.advance(spec.capsule_id, running)  # what it wrote is not known
            else:
                capsules.journal.unmark_running(spec.capsule_id, running)
            run.set_state("lost" if lost else "failed", exc.message)
            run.log.append(f"[ccw: {spec.name} {run.state}: {exc.message}]\n".encode())
            self._event(run)
            return "lost" if lost else "refused"
        except trio.Cancelled:
            run.set_state("stopped")
            capsules.journal.advance(spec.capsule_id, running)  # what it wrote is not known
            raise
        network = None
        if record.network_spec is not None:  # its connections, told from the exec's (capsules/networks.py)
            reply, network = self.networks.service_network(spec.capsule_id, spec.name, reply)
        outcome = ExecOutcome(reply, record.generation, record.generation, 0, network)
        done = await capsules.record_service_run(record, request, outcome, started)
        run.exit_code, run.signal, run.seq = reply.exit_code, reply.signal, done
        run.set_state("stopped" if run.stopping else "exited")
        run.take_end(reply)
        self._event(run, exit_code=reply.exit_code, signal=reply.signal, seq=done)
        return "exited"

    async def _watch_ready(self, run: ServiceRun) -> None:
        """``await_ready`` for a start nobody waits for, so that it is listed ``ready`` once it is."""
        try:
            await self.await_ready(run)
        except Exception as exc:  # the helper went meanwhile, or the capsule: the run itself says so
            LOGGER.info(f"mcp:service {run.spec.capsule_id}/{run.spec.name} readiness not known: {exc!r}")

    async def _helper_answers(self, run: ServiceRun) -> None:
        """Wait until a helper answers again: this process starts an embedded one at once; a detached
        helper comes back with the next ``ccw`` command, a system one with its socket's activation."""
        run.set_state("lost", f"{run.reason}; it starts again once a helper answers")
        while not run.stopping:
            try:
                await (await self._helper()).hello()
                return
            except CcwError as exc:
                if exc.code != "UNAVAILABLE":
                    raise
            await trio.sleep(HELPER_POLL_S)

    async def _call_unheld(self, network: Any, request: ExecRequest, run: ServiceRun) -> Any:
        """``call_helper``, after the helper has ended its run of that name which a front end that
        went left it (it ends one at its next progress report): never two at once, nor a failure."""
        deadline = trio.current_time() + HELD_S
        while True:
            try:
                return await self.call_helper(network, request, run)
            except CcwError as exc:
                held = exc.code == "CONFLICT" and exc.details.get("service") == run.spec.name
                if not held or trio.current_time() >= deadline:
                    raise
            await trio.sleep(min(HELPER_POLL_S, max(deadline - trio.current_time(), 0.0)))

    async def call_helper(self, network: Any, request: ExecRequest, run: ServiceRun) -> Any:
        """The helper's exec for the service, its progress taken in; an egress capsule's session opened first."""
        helper = await self._helper()
        learnt = network is None

        async def progress(raw: dict[str, Any]) -> None:
            nonlocal learnt
            if not learnt:  # it runs: its session learns whose its sockets are (egress/runs.py)
                learnt = True
                await self.networks.learn_services(request.capsule_id)
            report = ExecProgress.from_args(raw)
            if run.state == "starting" and run.spec.ready is None:
                run.set_state("running")
            run.take_output(report)
            if report.written:
                events.add(self.state, "files.written", request.capsule_id,
                           {"seq": None, "live": True, "count": len(report.written), "paths": list(report.written),
                            "service": run.spec.name})

        for attempt in range(2):
            if network is not None:
                await self.networks.open(helper, request.capsule_id, network, fresh=attempt > 0)
            try:
                return await helper.call(request, on_progress=progress)
            except CcwError as exc:
                if attempt or not network_not_open(exc):
                    raise
        raise AssertionError("unreachable")

    # --- stop ------------------------------------------------------------------------

    async def stop(self, capsule_id: str, name: str, grace_ms: int = STOP_GRACE_MS) -> dict[str, Any]:
        """End the service (SIGTERM, then SIGKILL after ``grace_ms``) and forget it but its output; its last
        summary."""
        run = self.get(capsule_id, name)
        run.stopping = True
        if not run.finished.is_set() and run.state != "pending":  # a pending one never started
            await self.end(run, grace_ms)
            if not run.finished.is_set():  # the helper did not answer: closing its connection ends it
                run.scope.cancel()
                await run.finished.wait()
        if run.state not in ("failed", "lost"):
            run.set_state("stopped")
        self._runs.pop((capsule_id, name), None)
        self.table.remove(capsule_id, name)
        self._event(run)
        return run.summary()

    async def end(self, run: ServiceRun, grace_ms: int) -> None:
        """SIGTERM, then SIGKILL after ``grace_ms``, each waiting for the helper's answer that the run
        has ended (``run.finished``), which only comes once its processes are gone and its ports free."""
        await self._signal(run, "SIGTERM")
        with trio.move_on_after(grace_ms / 1000):
            await run.finished.wait()
        if not run.finished.is_set():
            await self._signal(run, "SIGKILL")
            with trio.move_on_after(KILL_WAIT_S):
                await run.finished.wait()

    async def _signal(self, run: ServiceRun, signame: str) -> None:
        helper = await self._helper()
        try:
            await helper.call(SignalRequest(run.spec.capsule_id, run.spec.name, signame))
        except CcwError as exc:
            if exc.code not in ("NOT_FOUND", "UNAVAILABLE"):  # already ended, or the helper is gone
                raise

    def held_off(self, capsule_id: str) -> AbstractAsyncContextManager[None]:
        """No readiness probe of the capsule while an exec or a fork runs there (service_ready.py)."""
        return self._readiness.held_off(capsule_id)

    async def stop_all(self, capsule_id: str) -> None:
        """Stop every service of a capsule and close its forwarded ports (it is being destroyed)."""
        await self.ports.close_all(capsule_id)
        for (cap, name) in list(self._runs):
            if cap == capsule_id:
                await self.stop(cap, name, grace_ms=1000)
        await self._readiness.settled(capsule_id)  # a probe the helper still runs would refuse the destroy
        self.table.remove(capsule_id)
        service_log.forget(self._log_dir(capsule_id))

    # --- recovery, the nursery ---------------------------------------------------------

    async def reopen_kept(self, capsules: CapsuleService) -> None:
        """At a front end's start: bring back the kept services (``recover``: no helper is asked)
        and reopen the kept forwarded ports (in the background: capsules/ports.py)."""
        try:
            await self.recover(capsules)
        except Exception as exc:  # starting goes on; the next call about services tries again
            LOGGER.warning(f"mcp:service could not bring back the kept services: {exc!r}")
        await self.ports.reopen_kept()

    async def recover(self, capsules: CapsuleService) -> None:
        """Once per process: bring back the kept specs this process did not start (see the essay)."""
        self._capsules = self._capsules or capsules.background()
        async with self._recovering:
            if not self._recovered:
                await self._recover()
                self._recovered = True

    async def _recover(self) -> None:
        journal = Journal(self.state)
        for spec, created_at in self.table.all():
            record = journal.capsule(spec.capsule_id)
            if record is None or record.destroyed_at is not None:
                self.table.remove(spec.capsule_id)
                service_log.forget(self._log_dir(spec.capsule_id))
                continue
            if (spec.capsule_id, spec.name) in self._runs:
                continue
            run = ServiceRun(spec, self._ring(spec), created_at=created_at)
            self._runs[(spec.capsule_id, spec.name)] = run
            if spec.restart == "no":
                run.set_state("lost", "the front end or helper that ran it stopped; start it again "
                              "(capsule_service_start), or stop it to forget it")
                said = f"[ccw: {spec.name} lost: the front end or helper that ran it stopped]\n"
                last = run.log.read(tail=1).text
                if last != said:  # each later front end finds it lost again
                    run.log.append(("" if last.endswith("\n") or not last else "\n").encode() + said.encode())
                run.finished.set()
                self._event(run)
                continue
            run.log.append(b"[ccw: brought back after the front end or helper that ran it stopped]\n")
            if spec.restart == "always":  # at once
                await self._launch(run)
            else:  # on-failure: when its capsule is next used (start_pending)
                run.set_state("pending", "its front end or helper stopped; it starts at the capsule's next exec")

    async def aclose(self) -> None:
        """Stop every service (the process is ending): their jails end with their connections."""
        for run in list(self._runs.values()):
            run.stopping = True
            run.scope.cancel()
        self._background.cancel()
        with trio.CancelScope(shield=True):
            await self.ports.aclose()
