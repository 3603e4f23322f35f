"""The end of a jail after the exec's reply: the init's exit and the exec cgroup's removal.

``supervise.run`` returns as soon as the jail's init has sent its last report (``R``)
and the command's output is read.  What is left, an ``Ending``, is finished by one
janitor thread per helper, in order: it reaps the init, then removes the exec cgroup
once the caller has read its usage (``Ending.release``).  The manager waits for a
capsule's last ending before it sets anything up over that capsule again (manager.py).

Some facts this relies on
-------------------------
- ``R`` is the init's last act before it exits: the command has been reaped, every
  other process of the pid namespace SIGKILLed and reaped (ccw-jail's init,
  sandbox/jail/ccw_jail.c), and the init closed its copies of the output pipes right
  after the spawn.  So from
  ``R`` on nothing of the command runs or can start: the pid namespace holds only the
  exiting init, which runs no code of anyone else's, and the usage the init reported
  covers every process the jail had.
- The init's exit still takes time after ``R``: ``exit_task_namespaces`` tears the jail's
  mount namespace down (about 20 mounts; ``namespace_unlock`` waits for an expedited RCU
  grace period), and the report pipe hangs up only after that.  When the init was a fork
  of the helper, ``exit_mm`` of its copy of the helper's address space came on top
  (2.5 to 6.5 ms in all, measured on the CI VM, issue 27's profile); ccw-jail is a small
  static program, so now the mounts are most of it.  Replying on ``R`` instead of the
  hang-up took the in-process jail from 1.38x to 1.19x bwrap's time then (medians of 8
  interleaved runs).
- When ``waitpid`` returns the init's status, ``do_exit`` has passed the namespace
  teardown and the task work that drops each mount's last reference: no mount of the
  jail is left, and the task has left its cgroups (``cgroup_exit``), so the exec cgroup
  can be removed.  A rootless helper's child is the init's parent, which waits for the
  init before it exits: reaping it covers both.
- The janitor runs its jobs one after the other; none can block for long: the init is
  already exiting (and PDEATHSIG would end it with the helper), and the caller releases
  its ending in a ``finally``.  An error there (a cgroup that will not go) comes after
  the reply, so it is logged; ``cleanup_stale`` removes such leftovers at the next start.
  Work that only prepares the next exec (a spare cgroup: spare_cgroups.py) is queued
  behind the endings (``submit``), off every reply's path.
  A process that ran jails waits for their ends when it exits (``atexit``): the janitor
  is a daemon thread, and an unreaped init would be left to the host's init as a zombie.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sandbox.exec_cgroup import ExecCgroup

log = logging.getLogger("ccw.jail")

_AT_EXIT_SEC = 10.0  # how long a process that ran jails waits for their ends when it exits
_JOBS: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_state = threading.Condition()  # guards _janitor and _unfinished
_janitor: threading.Thread | None = None
_unfinished: set[Ending] = set()


class Ending:
    """What is left of one jail when ``supervise.run`` returned: the init's exit, then the cgroup's removal."""

    def __init__(self, cgroup: ExecCgroup | None) -> None:
        self._cgroup = cgroup
        self._pending = 2 if cgroup is not None else 1  # the reap, and the caller's release
        self._released = cgroup is None
        self._lock = threading.Lock()
        self._done = threading.Event()

    @classmethod
    def over(cls) -> Ending:
        """An ending with nothing left to do."""
        ending = cls(None)
        ending._done.set()
        return ending

    def finish_after(self, reap: Callable[[], None] | None) -> None:
        """Hand the ending to the janitor: ``reap`` (None: the init was reaped already) first."""
        with _state:
            _unfinished.add(self)
        if reap is None:
            self._step_done()
            return

        def reap_then_go_on() -> None:
            try:
                reap()
            finally:
                self._step_done()
        submit(reap_then_go_on)

    def release(self) -> None:
        """The caller is done with the cgroup (its usage read): it may be removed.  Idempotent."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._step_done()

    def done(self) -> bool:
        """Whether the init is reaped and the cgroup removed."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until ``done()``; False on timeout."""
        return self._done.wait(timeout)

    def _step_done(self) -> None:
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if not last:
            return
        if self._cgroup is None:
            self._finish()
        else:
            submit(self._finish)

    def _finish(self) -> None:
        try:
            if self._cgroup is not None:
                self._cgroup.teardown()
        finally:
            self._done.set()
            with _state:
                _unfinished.discard(self)
                _state.notify_all()


def settle(timeout: float | None = None) -> bool:
    """Wait until every ending handed to the janitor is done (the helper's shutdown, tests)."""
    with _state:
        return _state.wait_for(lambda: not _unfinished, timeout)


def submit(job: Callable[[], None]) -> None:
    """Run ``job`` on the janitor after what it was given before; an error is logged."""
    global _janitor
    with _state:
        if _janitor is None:
            _janitor = threading.Thread(target=_run_jobs, name="ccw-jail-janitor", daemon=True)
            _janitor.start()
            atexit.register(settle, _AT_EXIT_SEC)  # the janitor is a daemon: finish before it goes
    _JOBS.put(job)


def _run_jobs() -> None:
    while True:
        job = _JOBS.get()
        try:
            job()
        except Exception:
            log.exception("finishing a jail's end after its reply failed")


class _Holder(Protocol):
    ending: Ending | None


@contextlib.contextmanager
def after_ending(lock: threading.RLock, *holders: _Holder) -> Iterator[None]:
    """``lock``, taken once each holder's ``ending`` (the end of a capsule's last exec) is done.

    Whatever sets up over a capsule again (an exec, a fork, its removal) is so ordered
    after the last jail's mounts are gone and its cgroup removed.  The wait is outside
    the lock: other capsules go on meanwhile.  A fork with donors sets up over several.
    """
    while True:
        for holder in holders:
            ending = holder.ending
            if ending is not None:
                ending.wait()
        with lock:
            if all(holder.ending is None or holder.ending.done() for holder in holders):
                yield
                return
