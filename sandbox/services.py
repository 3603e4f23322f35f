"""The runs a capsule has going: at most one exec, and its services beside it.

A service is an exec that the front end keeps open (its ``exec`` request carries a
``service`` name, ``timeout_ms`` 0 and ``stream``): the same jail, cgroup, recording and
reply, so it is journaled and traced as an exec is.  What differs is only what the
registry lets run at once, and what a caller may do to a run while it lives; that is
this module, called by the registry with its lock held.

- **Beside each other.**  Execs of a capsule still run one at a time (the front end's
  turns order them; the helper refuses a second as "running").  Services run beside
  them and each other, each in its own jail: its own pid namespace and cgroup, so an
  exec still ends alone (its own processes reaped, its own usage, its own touched files:
  fanotify_record.py attributes events by cgroup), and an exec cannot signal or trace a
  service.  They share the capsule's network namespace (capsule_nets.py), its files
  (the one overlay), its /tmp and $HOME: a service's unix socket in /tmp is reachable
  from an exec, as its TCP port is.  A pid namespace shared by all would make "the
  exec's processes" a question without an answer, so each run keeps its own.
- **Names.**  A capsule runs at most ``MAX_SERVICES`` services, each name once.
- **Freezing.**  A capsule is frozen through each run's cgroup (the v1 freezer, else v2
  ``cgroup.freeze``) when it is paused (``freeze``) or has forks: a fork's lower layer
  is its parent's upper dir, which must not change under it (capsule_mounts.py), and a
  running service would change it.  A run that starts while its capsule is paused is
  refused; one spawned just as the pause came is frozen as it reports in (``track``).
  A frozen process gets a signal when it thaws; SIGKILL is sent after a thaw, as
  exec_cgroup's kill does, so that it lands.
- **Destroy** kills the capsule's services and waits for their jails to end before the
  overlay goes: nothing of a destroyed capsule runs on.
"""

from __future__ import annotations

import signal as signals
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandbox import fanotify
from sandbox.errors import CcwError, ProtocolError
from sandbox.ops import ExecRequest
from sandbox.protocol import MAX_FRAME, MAX_ID, encode_frame
from sandbox.replies import FreezeReply, RunReadsReply, SignalReply, Touched

if TYPE_CHECKING:
    from sandbox.exec_cgroup import ExecCgroup
    from sandbox.jail_end import Ending
    from sandbox.meta import Capsule
    from sandbox.supervise import Handle

MAX_SERVICES = 16  # services one capsule runs at once
STOP_WAIT_S = 10.0  # how long destroy waits for a killed service's jail to end


@dataclass(eq=False)
class Run:
    """One run of a capsule as the registry tracks it: an exec, or a service by name."""

    capsule: Capsule
    exec_name: str
    service: str | None
    handle: Handle | None = None  # while the jail lives
    cgroup: ExecCgroup | None = None
    ending: Ending | None = None
    frozen: bool = False
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def name(self) -> str:
        return "exec" if self.service is None else self.service

    def track(self, handle: Handle | None, cgroup: ExecCgroup | None) -> None:
        """The jail is spawned (``handle``) or has ended (None); freeze it now if its capsule is frozen."""
        self.handle, self.cgroup = handle, cgroup if handle is not None else None
        if handle is not None and self.capsule.destroying:  # spawned as destroy began: it goes too
            handle.send(signals.SIGKILL)
        elif handle is not None and wanted_frozen(self.capsule):
            _set_frozen(self, True)

    def ended_by(self, ending: Ending) -> None:
        self.ending = ending

    def wait_ended(self, timeout: float) -> None:
        """Wait until the run has returned and its jail's end is done (or ``timeout`` passed)."""
        if self.finished.wait(timeout) and self.ending is not None:
            self.ending.wait(timeout)


def admit(capsule: Capsule, request: ExecRequest) -> None:
    """Refuse a run its capsule cannot take now: frozen by forks, paused, or (an exec) running one."""
    capsule_id = capsule.capsule_id
    if capsule.children:
        forks = sorted(c for c in capsule.children if c)
        raise CcwError("CONFLICT", f"capsule {capsule_id} is frozen while it has forks or merged capsules stacked on "
                       f"it {forks} (its services too); exec in a fork, or destroy the forks first", {"forks": forks})
    if capsule.paused:
        raise CcwError("CONFLICT", f"capsule {capsule_id} is paused; resume it first",
                       {"paused": True, "capsule_id": capsule_id})
    if request.service is None and capsule.busy:  # "running": a caller may wait and retry (ccw capsule shell does)
        raise CcwError("CONFLICT", f"capsule {capsule_id} is already running a command; wait for it",
                       {"running": True})


def begin(capsule: Capsule, request: ExecRequest, exec_name: str) -> Run:
    """Note a run that may start now (the registry checked the capsule's state)."""
    run = Run(capsule, exec_name, request.service)
    if request.service is None:
        capsule.busy = True
        capsule.exec_run = run
        return run
    if request.service in capsule.services:
        raise CcwError("CONFLICT", f"service {request.service!r} already runs in capsule {capsule.capsule_id}; "
                       "stop it first, or give the new one another name", {"service": request.service})
    if len(capsule.services) >= MAX_SERVICES:
        raise CcwError("TOO_LARGE", f"capsule {capsule.capsule_id} already runs {MAX_SERVICES} services; stop one "
                       "first", {"services": sorted(capsule.services)})
    capsule.services[request.service] = run
    return run


def finish(capsule: Capsule, run: Run) -> None:
    """The run has returned (ended, or failed to start)."""
    if run.service is None:
        capsule.busy = False
        capsule.exec_run = None
    elif capsule.services.get(run.service) is run:
        del capsule.services[run.service]
    run.finished.set()


def running(capsule: Capsule) -> list[Run]:
    """The capsule's runs now: its services, and its exec if one runs."""
    return [*capsule.services.values(), *([] if capsule.exec_run is None else [capsule.exec_run])]


def signal(capsule: Capsule, service: str, signame: str) -> SignalReply:
    """Send ``signame`` to a service's command (SIGKILL: end its jail)."""
    run = _service(capsule, service)
    signum = signals.Signals[signame]
    if signum == signals.SIGKILL and run.frozen:
        _set_frozen(run, False)  # a frozen task takes SIGKILL only once thawed
    return SignalReply(service, run.handle is not None and run.handle.send(signum))


def reads(capsule: Capsule, service: str, lock: AbstractContextManager[Any]) -> RunReadsReply:
    """What a running service has touched so far, its recording going on (the ``run_reads`` op).

    Found by the run's cgroup, which is its recording's (fanotify_record.py), looked up under
    the registry's ``lock``; the queue is then read under the group's own lock only.  A reply
    that would not fit one frame says so instead: the caller then knows only that it is large.
    """
    with lock:
        run = _service(capsule, service)
        cgroup = run.cgroup
    if cgroup is None:
        return RunReadsReply(service, None, "the service has not started yet, has ended, or has no cgroup "
                             "that tells its events from the other runs'")
    traced = fanotify.so_far(capsule.path("merged"), cgroup)
    if isinstance(traced, str):
        return RunReadsReply(service, None, traced)
    if traced.overflow:
        return RunReadsReply(service, None, "the fanotify queue overflowed; the read set is incomplete")
    reply = RunReadsReply(service, Touched.carried(tuple(traced.read or ()), tuple(traced.written),
                                                   tuple(traced.listed or ()), tuple(traced.executed or ())))
    try:
        encode_frame({"id": MAX_ID, "ok": True, "result": reply.to_args()})
    except ProtocolError as exc:
        if exc.code != "TOO_LARGE":
            raise
        return RunReadsReply(service, None, f"the service has touched too many paths for one reply "
                             f"({exc.details['size']} bytes, over {MAX_FRAME})")
    return reply


def _service(capsule: Capsule, service: str) -> Run:
    run = capsule.services.get(service)
    if run is None:
        raise CcwError("NOT_FOUND", f"no service named {service!r} runs in capsule {capsule.capsule_id}",
                       {"service": service, "running": sorted(capsule.services)})
    return run


def wanted_frozen(capsule: Capsule) -> bool:
    return capsule.paused or bool(capsule.children)


def check_freezable(capsule: Capsule, doing: str, instead: str) -> None:
    """Refuse ``doing`` (a pause, a fork) when a running run could not be frozen: its cgroup
    object holds no freezer (a rootless helper's runs), and answering "paused" or forking
    under a service that still writes through its open files would be a lie."""
    unfreezable = [run.name for run in running(capsule)
                   if run.handle is not None and (run.cgroup is None or not run.cgroup.can_freeze())]
    if unfreezable:
        raise CcwError("UNSUPPORTED", f"capsule {capsule.capsule_id} cannot be {doing}: its runs {unfreezable} "
                       "have no cgroup to freeze (a rootless helper without a delegated cgroup); "
                       f"{instead}, run the helper as root, or delegate a cgroup v2 subtree to it",
                       {"runs": unfreezable})


def freeze(capsule: Capsule, frozen: bool) -> FreezeReply:
    """Pause (or resume) the capsule: every run's cgroup frozen, and no new run taken."""
    runs = [run for run in running(capsule) if run.handle is not None]
    if frozen:
        check_freezable(capsule, "paused", "stop its services (capsule_service_stop)")
    capsule.paused = frozen
    apply(capsule)
    return FreezeReply(capsule.capsule_id, wanted_frozen(capsule), tuple(run.name for run in runs))


def apply(capsule: Capsule) -> None:
    """Bring every run's freezer to what the capsule wants (paused, or has forks)."""
    want = wanted_frozen(capsule)
    for run in running(capsule):
        if run.handle is not None and run.frozen != want:
            _set_frozen(run, want)


def _set_frozen(run: Run, frozen: bool) -> None:
    if run.cgroup is not None and run.cgroup.freeze(frozen):
        run.frozen = frozen


def check_destroyable(capsule: Capsule) -> None:
    """Refuse to destroy a capsule with forks or a running exec (its services are killed)."""
    problem = None
    if capsule.children:
        forks = sorted(c for c in capsule.children if c)
        problem = CcwError("CONFLICT", f"capsule {capsule.capsule_id} has forks or merged capsules stacked on it "
                           f"{forks}; destroy them first", {"forks": forks})
    elif capsule.busy:
        problem = CcwError("CONFLICT", f"capsule {capsule.capsule_id} is running a command; destroy it when "
                           "that ends", {"running": True})
    if problem is not None:
        capsule.destroying = False
        raise problem


def kill_all(capsule: Capsule) -> list[Run]:
    """Thaw and kill every service of the capsule (destroy); the runs, to wait for."""
    capsule.destroying = True
    runs = list(capsule.services.values())
    for run in runs:
        if run.frozen:
            _set_frozen(run, False)
        if run.handle is not None:
            run.handle.send(signals.SIGKILL)
    return runs
