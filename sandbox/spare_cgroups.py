"""Exec cgroups made ahead, hierarchies that refuse us, and the cgroups a dead helper left.

Some facts about making exec cgroups ahead
------------------------------------------
- Making an exec's cgroup costs a mkdir in each hierarchy it joins (up to five: 0.8 ms
  measured on the CI VM, issue 27's profile), and reading its usage back an open, read
  and close per control file (0.6 ms).  So after an exec's end the jail's janitor
  (jail_end.py) makes the next exec's cgroup, a *spare*, and opens the control files an
  exec writes and reads (``cgroups.ControlFiles``): the next exec only writes its limits,
  and reads its usage with one ``pread`` per file.
- A spare is new, never used: each exec still gets a cgroup no process was ever in, and
  it is removed after that exec's end as before, so one exec's limits and processes
  cannot reach the next.  Before its limits are written, every hierarchy's
  ``cgroup.procs`` is read afresh (a kept v1 descriptor would show a pid list the kernel
  caches for a second): a spare someone moved a process into is torn down (the process
  killed) and the exec makes its own cgroup.
- At most one spare waits (``namespaces.SparePool``): a second exec at the same moment
  makes its own, as before.  Spares are named ``spare<n>@<helper pid>``, so an exec's
  cgroup no longer names its capsule.  The helper removes its spare when it exits
  (``atexit``); one killed outright leaves it, and the next helper's start removes it
  with the rest of a dead helper's cgroups (``cleanup_stale``).
- A hierarchy that refuses us (a rootless helper without a delegated subtree: EACCES in
  every one) refuses again: the refusal is kept for the helper's life, so later execs
  neither try the mkdir again (0.4 ms an exec, rootless) nor make spares, and their
  usage says why it is null with the reason learned at the first exec.  ``hello`` and
  ``doctor`` probe the hierarchies on their own (probe.py), so they say so as before.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import threading

from sandbox.cgroups import CgroupLayout, detect_layout, dirs_named, procs, resources_worth_joining
from sandbox.errors import CcwError
from sandbox.exec_cgroup import OWNER_SEP, PARENT_NAME, ExecCgroup, Limits, is_ending
from sandbox.namespaces import SparePool

_refused: dict[str, str] = {}  # mount point: why the mkdir was refused (see the essay)
_pools: dict[CgroupLayout, SparePool[ExecCgroup]] = {}
_pools_lock = threading.Lock()
_serial = itertools.count(1)


def take(layout: CgroupLayout, name: str, limits: Limits) -> ExecCgroup:
    """The exec's cgroup with ``limits`` written: the spare when one waits, else made now
    (named ``name``).  A limit no writable hierarchy enforces is an UNSUPPORTED error."""
    spare = _pool(layout).take()
    if spare is not None:
        try:
            spare.limit(limits)
            return spare
        except CcwError as exc:
            _discard(spare)
            if exc.code != "INTERNAL":  # a limit that cannot be enforced: the same answer either way
                raise
    return ExecCgroup.prepare(layout, name, limits, _refused)


def _discard(spare: ExecCgroup) -> None:
    # Whatever was moved into a spare dies with it, in every hierarchy: kill() looks only
    # where the exec's own processes are (the freezer or v2), and these may be elsewhere.
    for path in spare.dirs.values():
        for pid in procs(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    spare.teardown()


def refill(layout: CgroupLayout) -> None:
    """Make a spare unless one waits or every hierarchy refuses us (the janitor calls it)."""
    _pool(layout).refill()


def close() -> None:
    """Remove every spare that waits; later refills make none (the helper's exit)."""
    with _pools_lock:
        pools = list(_pools.values())
    for pool in pools:
        pool.close()


def _pool(layout: CgroupLayout) -> SparePool[ExecCgroup]:
    with _pools_lock:
        pool = _pools.get(layout)
        if pool is None:
            if not _pools:
                atexit.register(close)
            pool = _pools[layout] = SparePool(lambda: _make_spare(layout), ExecCgroup.teardown)
        return pool


def _make_spare(layout: CgroupLayout) -> ExecCgroup | None:
    wanted = {layout.for_resource(r) for r in resources_worth_joining(layout)} - {None}
    if all(hier.mount_point in _refused for hier in wanted if hier is not None):
        return None
    spare = ExecCgroup.ahead(layout, f"spare{next(_serial)}", _refused)
    if not spare.dirs:
        spare.teardown()
        return None
    return spare


def cleanup_stale(prefix: str = "", layout: CgroupLayout | None = None) -> list[str]:
    """Kill and remove exec cgroups named ``<prefix>…@<pid>`` whose helper pid is dead.

    Returns the removed directories, sorted.  Cgroups of helpers that are still running
    are left alone, as is anything not named by ccw.
    """
    layout = layout or detect_layout()
    removed = []
    for parent in dirs_named(layout, PARENT_NAME):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            base, sep, owner = name.rpartition(OWNER_SEP)
            path = os.path.join(parent, name)
            if not sep or not base.startswith(prefix) or not owner.isdigit() or not os.path.isdir(path):
                continue
            # A killed helper stays a zombie until its parent reaps it, and the next helper
            # may start before that: a zombie cleans nothing up any more, so it counts as dead
            # (is_ending: gone, a zombie or exiting).
            if not is_ending(int(owner)):
                continue
            hier = next(h for h in layout.hierarchies if path.startswith(h.mount_point + "/"))
            stale = ExecCgroup(CgroupLayout((hier,)), base, Limits())
            stale.dirs[hier] = path
            stale.teardown()
            removed.append(path)
    return sorted(removed)
