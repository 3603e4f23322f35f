"""Per-exec cgroups: limits, kill, freeze, teardown; usage read back (exec_usage.py).

Each exec gets one cgroup in every hierarchy that serves it (cgroups.py says which,
and where ccw's parent cgroup goes); ``ExecCgroup`` makes them, writes the limits,
moves the jail's first process in, reads the usage back (exec_usage.py says what each
figure is) and removes them.

Some facts about per-exec cgroups
---------------------------------
- Exec cgroups are named ``<name>@<helper pid>``: after a crash, ``cleanup_stale``
  (spare_cgroups.py, which also makes them ahead) can tell a dead helper's leftovers
  from those of a helper that is still running.
- A migration (moving a process in) takes ``cgroup_threadgroup_rwsem`` for writing when
  a pid goes to ``cgroup.procs`` (v1 or v2) or another thread's id to v1 ``tasks``; it
  waits for an RCU grace period unless another migration ran within the last one: 8-10
  ms on the CI VM (HZ=250), a third of an exec (issue 27's profile).  A thread writing
  "0" (itself) to v1 ``tasks`` moves alone and skips that lock (``cgroup_procs_write_start``:
  ``threadgroup_locked = pid || threadgroup``): four hierarchies in 0.15 ms.  The jail's
  first child has one thread (fork copies only the caller), so it moves itself, first
  thing (contain.py), through files the helper opened (``entry_files``); since 5.16 the
  kernel checks the opener's credentials and cgroup namespace, so passing them grants
  nothing more.  v2 has no such path (``cgroup.threads`` refuses a move between domain
  cgroups), so a controller-less v2 (the CI VM) is not joined where the v1 freezer can
  kill (cgroups.py); a pure v2 host pays the lock, which ``clone3(CLONE_INTO_CGROUP)``
  would spare with a launcher other than Python's fork.  A ``favordynmods`` cgroup mount
  keeps migrations cheap host-wide (and forks dearer): a deployment choice, not relied on.
- v1 memory: ``memory.limit_in_bytes`` must be lowered before ``memory.memsw.limit_in_bytes``
  (memsw may never be below it), and memsw must be set too or a bomb swaps instead of
  dying.  ``memory.oom_control`` counts ``oom_kill`` (4.13+); v2 has ``memory.events``.
- What an exec used is read back from these cgroups by exec_usage.py, whose essay says
  what each figure means and why I/O comes from rusage rather than blkio.
- CPU *share*: without a cpu-controller cgroup every process of a jail competes with
  every host process one by one, so a fork bomb held at 64 processes by pids.max still
  takes 64/65 of a CPU from the helper and from other capsules' commands.  Each exec
  therefore also joins a cgroup of the cpu controller (v2 ``cpu``, else the v1 ``cpu``
  hierarchy, which on hybrid hosts is mounted apart from ``cpuacct``) with the default
  weight: one exec gets one share however many processes it forks, and ``ccw`` as a
  whole one share beside each host process.  The scheduler is work-conserving: an exec
  alone on an idle machine still gets every CPU.  Joining costs one more mkdir and
  migration per exec (~0.1 ms measured).
- CPU time has no v1/v2 "budget" knob (cpu.max is a rate), so ``Limits.cpu_ms`` is
  enforced by a watcher thread that polls the usage counter and kills the cgroup when the
  budget is spent (``Measurement.cpu_limited``).  It sleeps for at most the remaining budget
  divided by the number of CPUs, so it overshoots by at most one poll interval.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from dataclasses import dataclass

from sandbox.cgroups import (
    HINT,
    CgroupLayout,
    ControlFiles,
    Hierarchy,
    make_dir,
    parse_self_cgroup,
    procs,
    read_file,
    remove_dir,
    resources_worth_joining,
    wait_empty,
    write_file,
)
from sandbox.errors import CcwError, from_oserror
from sandbox.exec_usage import ExecDirs, measure, why_none
from sandbox.rusage import BlockCounts, Measurement

PARENT_NAME = "ccw"
V2_WANTED = ("memory", "pids", "cpu", "io")
OWNER_SEP = "@"
FREEZE_WAIT_S = 2.0  # how long ``ExecCgroup.freeze`` waits for the kernel to say FROZEN
# The control files an exec reads and writes, per cgroup version, opened ahead (those that exist).
_READS = {1: ("cpuacct.usage", "memory.max_usage_in_bytes", "memory.oom_control", "pids.events",
              "blkio.throttle.io_service_bytes"),
          2: ("cpu.stat", "memory.peak", "memory.events", "memory.stat", "pids.events", "io.stat")}
_WRITES = {1: ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "pids.max", "freezer.state"),
           2: ("memory.max", "memory.swap.max", "pids.max", "cgroup.kill")}


# --------------------------------------------------------------------- per-exec cgroups
@dataclass(frozen=True)
class Limits:
    """Per-exec limits; None = not limited."""

    memory_bytes: int | None = None
    pids_max: int | None = None
    cpu_ms: int | None = None


class ExecCgroup:
    """One exec's cgroup, one directory per hierarchy that serves a resource."""

    def __init__(self, layout: CgroupLayout, name: str, limits: Limits) -> None:
        self.layout = layout
        self.name = name
        self.limits = limits
        self.dirs: dict[Hierarchy, str] = {}
        self.unavailable: dict[str, str] = {}
        self.cpu_limited = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._torn_down = False
        self.files = ControlFiles()  # limits written and usage read through descriptors kept open
        self.where = ExecDirs(layout, self.dirs, self.files.read)  # the same dict: shrinks at teardown

    # -- prepare
    @classmethod
    def prepare(cls, layout: CgroupLayout, name: str, limits: Limits,
                refused: dict[str, str] | None = None) -> ExecCgroup:
        """mkdir ``ccw/<name>@<pid>`` under our own cgroup in every useful hierarchy; write limits.

        A hierarchy we may not write is skipped (usage from it is null with the reason);
        a *requested* limit that no writable hierarchy can enforce is an UNSUPPORTED error.
        ``refused``: hierarchies known to refuse us (mount point: why), not tried again;
        a new refusal is added to it (spare_cgroups.py keeps it for the helper's life).
        """
        cg = cls.ahead(layout, name, refused, open_files=False)
        try:
            cg.limit(limits)
        except BaseException:
            cg.teardown()
            raise
        return cg

    @classmethod
    def ahead(cls, layout: CgroupLayout, name: str, refused: dict[str, str] | None = None,
              open_files: bool = True) -> ExecCgroup:
        """The directories made, without limits, and (``open_files``) the control files an
        exec writes and reads opened: a spare for a later exec (spare_cgroups.py)."""
        if not name or "/" in name or OWNER_SEP in name or name in (".", ".."):
            raise CcwError("INVALID_ARGUMENT", f"cgroup name {name!r} must be non-empty, without '/' or '@'")
        cg = cls(layout, name, Limits())
        try:
            cg._make_dirs({} if refused is None else refused)
            if open_files:
                for hier, path in cg.dirs.items():
                    cg.files.open_ahead((os.path.join(path, n) for n in _READS[hier.version]),
                                        (os.path.join(path, n) for n in _WRITES[hier.version]))
        except BaseException:
            cg.teardown()
            raise
        return cg

    def limit(self, limits: Limits) -> None:
        """Write ``limits`` into a cgroup no process is in yet (checked: INTERNAL otherwise)."""
        for path in self.dirs.values():
            if procs(path):  # a fresh read: a kept v1 cgroup.procs descriptor shows a cached list
                raise CcwError("INTERNAL", f"exec cgroup {path!r} already holds processes {procs(path)}")
        self.limits = limits
        self._write_limits()

    def _make_dirs(self, refused: dict[str, str]) -> None:
        # Every hierarchy costs a mkdir, a migration and an rmdir per exec, so only those
        # that give something: v1 blkio is left out, since the jail's wait4 rusage
        # measures an exec's I/O where blkio cannot (exec_usage.py's essay).
        wanted = {self.layout.for_resource(r) for r in resources_worth_joining(self.layout)}
        leaf = f"{self.name}{OWNER_SEP}{os.getpid()}"
        for hier in self.layout.hierarchies:
            if hier not in wanted:
                continue
            if hier.mount_point in refused:  # a rootless helper learns this once, not per exec
                self.unavailable[hier.mount_point] = refused[hier.mount_point]
                continue
            parent = os.path.join(hier.base, PARENT_NAME)
            path = os.path.join(parent, leaf)
            for attempt in range(5):  # another helper may rmdir an empty parent meanwhile
                try:
                    if make_dir(parent) and hier.version == 2:
                        self._delegate_v2(hier, parent)
                    if not make_dir(path):
                        raise CcwError("CONFLICT",
                                       f"cgroup {path!r} already exists; another exec uses the name {self.name!r}")
                    self.dirs[hier] = path
                    break
                except FileNotFoundError:
                    if attempt == 4:
                        raise
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                        why = self.unavailable[hier.mount_point] = str(from_oserror(exc, "mkdir", path, HINT))
                        refused[hier.mount_point] = why
                        break
                    raise from_oserror(exc, "mkdir", path, HINT) from exc

    def _delegate_v2(self, hier: Hierarchy, parent: str) -> None:
        # Controllers must be enabled top-down: in our own cgroup for `ccw`, in `ccw` for execs.
        ctrls = " ".join(f"+{c}" for c in sorted(hier.controllers & set(V2_WANTED)))
        if not ctrls:
            return
        for where in (hier.base, parent):
            try:
                write_file(os.path.join(where, "cgroup.subtree_control"), ctrls)
            except CcwError as exc:
                if exc.details.get("errno") == "EBUSY":
                    exc.message += (" (cgroup v2 forbids controllers below a cgroup that holds processes:"
                                    " start the helper in a leaf cgroup of a delegated subtree)")
                raise

    def _write_limits(self) -> None:
        lim, write = self.limits, self.files.write
        if lim.memory_bytes is not None:
            mem = self._require("memory", "limits.memory_mb")
            if self.where.is_v1(mem):
                write(os.path.join(mem, "memory.limit_in_bytes"), str(lim.memory_bytes))
                memsw = os.path.join(mem, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):  # else swap accounting is off: the limit covers RAM only
                    write(memsw, str(lim.memory_bytes))
            else:
                write(os.path.join(mem, "memory.max"), str(lim.memory_bytes))
                with contextlib.suppress(CcwError):  # memory.swap.max exists only with swap accounting
                    write(os.path.join(mem, "memory.swap.max"), "0")
        if lim.pids_max is not None:
            write(os.path.join(self._require("pids", "limits.pids_max"), "pids.max"), str(lim.pids_max))
        if lim.cpu_ms is not None:
            self._require("cpu", "limits.cpu_ms")

    def _require(self, resource: str, what: str) -> str:
        path = self.where.dir_for(resource)
        if path is None:
            why = why_none(self.unavailable)
            raise CcwError("UNSUPPORTED", f"{what} cannot be enforced: no writable {resource} cgroup ({why}); "
                           f"{HINT}, or omit {what}")
        return path

    # -- enter / watch
    def enter(self, pid: int) -> None:
        """Move another process, ``pid``, into every hierarchy (``cgroup.procs``: see the essay
        for its cost); the jail moves itself instead (``entry_files``).  Starts the watcher."""
        for path in self.dirs.values():
            write_file(os.path.join(path, "cgroup.procs"), str(pid), "the process may have exited already")
        self.watch()

    def entry_files(self) -> list[tuple[int, str]]:
        """One descriptor per hierarchy, open for writing, and its path (the caller closes
        them): a single-threaded process writing "0" to each moves itself in (see the essay)."""
        opened: list[tuple[int, str]] = []
        try:
            for hier, path in self.dirs.items():
                path = os.path.join(path, "tasks" if hier.version == 1 else "cgroup.procs")
                try:
                    opened.append((os.open(path, os.O_WRONLY | os.O_CLOEXEC), path))
                except OSError as exc:
                    raise from_oserror(exc, "open", path, HINT) from exc
        except BaseException:
            for fd, _path in opened:
                os.close(fd)
            raise
        return opened

    def watch(self) -> None:
        """Start enforcing ``limits.cpu_ms`` (a watcher thread), once the exec is inside."""
        if self.limits.cpu_ms is not None and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_cpu, name=f"ccw-cpu-{self.name}", daemon=True)
            self._watcher.start()

    def _watch_cpu(self) -> None:
        budget_ns = (self.limits.cpu_ms or 0) * 1_000_000
        ncpu = os.cpu_count() or 1
        while not self._stop.is_set():
            used = self.where.cpu_ns()
            if used is None:
                return
            if used >= budget_ns:
                self.cpu_limited = True
                with contextlib.suppress(CcwError):
                    self.kill()
                return
            # Usage grows at most ncpu seconds per second: sleep no longer than that allows.
            self._stop.wait(min(0.1, max(0.002, (budget_ns - used) / 1e9 / ncpu)))

    def pids(self) -> list[int]:
        """The processes in the exec cgroup (host pids)."""
        for path in self.dirs.values():
            return procs(path)
        return []

    def owns(self, pid: int, text: str | None = None) -> bool | None:
        """Whether ``pid`` is in this exec's cgroup; None when the process is gone or ending.
        ``text``: its /proc/PID/cgroup, if already read (fanotify_record.Batch).

        v2 is asked first: a zombie keeps its v2 cgroup, while v1 shows an exiting task in
        the root, so v1's "elsewhere" holds only for a process not ending (``is_ending``).
        """
        if text is None:
            try:
                text = read_file(f"/proc/{pid}/cgroup")
            except OSError:
                return None
        mine = parse_self_cgroup(text)
        for hier, path in sorted(self.dirs.items(), key=lambda item: -item[0].version):
            rel = "/" + os.path.relpath(path, hier.mount_point)
            key = "" if hier.version == 2 else next(
                (k for k in mine if k and frozenset(k.split(",")) == hier.controllers), None)
            if key is None or key not in mine:
                continue
            if mine[key] == rel or mine[key].startswith(rel + "/"):
                return True
            if hier.version == 1 and is_ending(pid):
                return None
            return False
        return False

    def can_freeze(self) -> bool:
        """Whether ``freeze`` has a freezer to write: a rootless helper's runs have a cgroup
        object holding no hierarchy it could make a directory in."""
        return any((hier.version == 1 and "freezer" in hier.controllers)
                   or (hier.version == 2 and os.path.exists(os.path.join(path, "cgroup.freeze")))
                   for hier, path in self.dirs.items())

    def freeze(self, frozen: bool) -> bool:
        """Freeze (or thaw) every process of the exec: v1 freezer, else v2 ``cgroup.freeze``; False if neither.

        Freezing is asynchronous in both versions: the write only asks, and each task stops at
        its next freezer point (v1 says FREEZING meanwhile, v2's ``cgroup.events`` says
        ``frozen 0``).  A caller that answers "frozen" (a fork, a pause) must mean it, so this
        waits until the kernel says so, for at most ``FREEZE_WAIT_S``: a task in an
        uninterruptible sleep (a dead NFS server) can hold it longer, and the kernel goes on
        trying after we return.
        """
        for hier, path in self.dirs.items():
            if hier.version == 1 and "freezer" in hier.controllers:
                state = os.path.join(path, "freezer.state")
                self.files.write(state, "FROZEN" if frozen else "THAWED")
                if frozen:
                    self._settle(state, "FROZEN")
                return True
            if hier.version == 2 and os.path.exists(os.path.join(path, "cgroup.freeze")):
                self.files.write(os.path.join(path, "cgroup.freeze"), "1" if frozen else "0")
                if frozen:
                    self._settle(os.path.join(path, "cgroup.events"), "frozen 1")
                return True
        return False

    def _settle(self, path: str, line: str) -> bool:
        """Poll the control file until it has ``line``, for at most ``FREEZE_WAIT_S``; whether it came."""
        deadline = time.monotonic() + FREEZE_WAIT_S
        while line not in self.files.read(path).splitlines():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    # -- kill
    def kill(self) -> None:
        """Kill every process in the exec cgroup and wait until it is empty."""
        v2 = self.layout.unified
        v2_dir = self.dirs.get(v2) if v2 is not None else None
        if v2_dir is not None and os.path.exists(os.path.join(v2_dir, "cgroup.kill")):
            self.files.write(os.path.join(v2_dir, "cgroup.kill"), "1")
            if wait_empty(v2_dir, 2.0):
                return
        freezer = next((d for h, d in self.dirs.items() if h.version == 1 and "freezer" in h.controllers), None)
        any_dir = v2_dir or next(iter(self.dirs.values()), None)
        if any_dir is None:
            return
        for _ in range(100):  # freeze so nothing forks while we kill, then thaw to let SIGKILL land
            pids = procs(freezer or any_dir)
            if not pids:
                return
            if freezer:
                with contextlib.suppress(CcwError):
                    self.files.write(os.path.join(freezer, "freezer.state"), "FROZEN")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if freezer:
                with contextlib.suppress(CcwError):
                    self.files.write(os.path.join(freezer, "freezer.state"), "THAWED")
            if wait_empty(freezer or any_dir, 0.05):
                return
        raise CcwError("INTERNAL", f"cgroup {any_dir!r} still has processes after 100 SIGKILL rounds: {procs(any_dir)}")

    # -- collect
    def collect(self, rusage: BlockCounts | None = None) -> Measurement:
        """Usage after the command ended (exec_usage.measure); every null figure has its
        reason in ``unavailable``, every other its mechanism in ``sources``.

        ``rusage`` is the jail's rusage (the init's report, or the helper's ``os.wait4``), when
        the caller has it: its task I/O accounting is the only honest source of
        io_read_kb/io_write_kb on cgroup v1.
        """
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        return measure(self.where, self.unavailable, self.cpu_limited, rusage)

    # -- teardown
    def teardown(self) -> None:
        """Kill leftovers and remove every directory (and the parent when empty); idempotent."""
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        if self._torn_down:
            return
        self.kill()
        for hier, path in list(self.dirs.items()):
            remove_dir(path)
            del self.dirs[hier]
            with contextlib.suppress(OSError):  # busy: another exec or helper still uses it
                os.rmdir(os.path.dirname(path))
        self.files.close()
        self._torn_down = True


def is_ending(pid: int) -> bool:
    """Whether ``pid`` is exiting, a zombie or gone.  ``cgroup_exit`` runs early in
    ``do_exit``, so an exiting task's v1 cgroups read as the root while it still runs
    (state R or D, with PF_EXITING in its flags), before it is a zombie."""
    try:
        fields = read_file(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
        return fields[0] in ("Z", "X") or bool(int(fields[6]) & 0x4)  # PF_EXITING: set atop do_exit()
    except (OSError, IndexError, ValueError):
        return True
