"""What an exec used, read back from its cgroups: CPU time, peak memory, OOM, pids, I/O.

ExecCgroup (exec_cgroup.py) makes an exec's cgroups, limits them and kills what is in
them; once the command ended, ``measure`` reads what it used from the same directories,
through the control files ExecCgroup keeps open.  Every figure comes back with the
mechanism that measured it (``Measurement.sources``) or the reason it is null
(``Measurement.unavailable``): a 0 that means "not measured" is never reported.

Some facts about usage from cgroups
-----------------------------------
- ``cpu_ms`` is the cgroup's CPU time (v1 ``cpuacct.usage``, v2 ``cpu.stat``'s
  ``usage_usec``, which v2 keeps even without the cpu controller): every process of the
  exec, the jail's init included.  The CPU-budget watcher reads the same counter
  (``ExecDirs.cpu_ns``).
- ``rss_max_kb`` is the cgroup's peak memory charge (``memory.max_usage_in_bytes`` /
  ``memory.peak``): resident anonymous memory *plus* page cache the exec brought in.
  Without a memory cgroup it is null: rusage (rusage.py) measures only the largest
  single process, reported apart as ``rss_max_process_kb``, and CPU time, which fills
  ``cpu_ms`` where no cpu counter is readable.  ``Measurement.sources`` names each figure's
  mechanism.
- I/O is the hard one.  v1 blkio charges buffered writes to the kernel flusher at
  writeback, not to the writer, and on some hosts (the CI VM's virtio disk: measured)
  it counts no device I/O at all, so a 0 from it cannot be told from "not measured".
  v2's io.stat charges writeback to the writer's cgroup, but only once it happened.
  The honest source is task I/O accounting, which the kernel sums over every reaped
  descendant into the waiter's rusage: ``ru_inblock`` (reads that went to storage) and
  ``ru_oublock`` (pages dirtied for storage, charged when dirtied).  So ``measure``
  takes the jail's rusage (its init's report, rusage.py) when the caller has it;
  without it, v2 io.stat is used when nothing the exec dirtied is still unwritten, v1
  blkio only when it saw a device, and anything else is null with the reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sandbox.cgroups import (
    HINT,
    CgroupLayout,
    Hierarchy,
    parse_blkio_bytes,
    parse_flat_keyed,
    parse_io_stat,
)
from sandbox.rusage import BlockCounts, Measurement
from sandbox.usage_words import REFUSED


@dataclass(frozen=True)
class ExecDirs:
    """An exec's cgroup directories as usage is read from them, and the reader of their files."""

    layout: CgroupLayout
    dirs: Mapping[Hierarchy, str]  # the ExecCgroup's own: a hierarchy leaves it at teardown
    read: Callable[[str], str]  # ControlFiles.read: through a descriptor opened ahead if there is one

    def dir_for(self, resource: str) -> str | None:
        """The exec's directory in the hierarchy that serves ``resource``; None if it has none."""
        hier = self.layout.for_resource(resource)
        return self.dirs.get(hier) if hier is not None else None

    def is_v1(self, path: str) -> bool:
        """Whether ``path``, one of the exec's directories, is in a cgroup v1 hierarchy."""
        return any(h.version == 1 for h, d in self.dirs.items() if d == path)

    def version(self, resource: str) -> int:
        """The cgroup version of the hierarchy serving ``resource``; 0 when none does."""
        hier = self.layout.for_resource(resource)
        return hier.version if hier is not None else 0

    def cpu_ns(self) -> int | None:
        """CPU time of every process of the exec so far; None when no counter is readable."""
        path = self.dir_for("cpu")
        if path is None:
            return None
        try:
            if self.is_v1(path):
                return int(self.read(os.path.join(path, "cpuacct.usage")))
            return parse_flat_keyed(self.read(os.path.join(path, "cpu.stat")))["usage_usec"] * 1000
        except (OSError, KeyError, ValueError):
            return None


def measure(where: ExecDirs, refused: dict[str, str], cpu_limited: bool,
            rusage: BlockCounts | None = None) -> Measurement:
    """Usage after the command ended, read from ``where``; ``refused``: the hierarchies the
    exec has no directory in, and why (ExecCgroup.unavailable), for the null figures' reasons;
    ``cpu_limited``: whether the CPU-budget watcher killed the exec.  ``rusage``: the jail's
    rusage, when the caller has it (the essay: its I/O figures are the honest ones)."""
    missing = why_none(refused)  # why a hierarchy has no directory, for every null figure
    read_file = where.read
    unavailable: dict[str, str] = {}
    usage = Measurement(None, None, None, None, False, False, unavailable, cpu_limited)

    cpu_ns = where.cpu_ns()
    if cpu_ns is not None:
        usage.cpu_ms = round(cpu_ns / 1_000_000)
        counter = "cpuacct.usage" if where.is_v1(where.dir_for("cpu") or "") else "cpu.stat usage_usec"
        usage.sources["cpu_ms"] = (f"cgroup v{where.version('cpu')} {counter}: CPU time of every process "
                                   "of the exec's cgroup, ccw's init included")
    else:
        unavailable["cpu_ms"] = f"{REFUSED['cpu_ms']}: {missing}"

    mem = where.dir_for("memory")
    if mem is None:
        unavailable["rss_max_kb"] = f"{REFUSED['rss_max_kb']}: {missing}"
        unavailable["oom_killed"] = f"{REFUSED['oom_killed']}: {missing}"
    elif where.is_v1(mem):
        usage.rss_max_kb = int(read_file(os.path.join(mem, "memory.max_usage_in_bytes"))) // 1024
        usage.sources["rss_max_kb"] = ("cgroup v1 memory.max_usage_in_bytes: peak charge of the exec's cgroup, "
                                       "all its processes together, page cache included")
        usage.oom_killed = parse_flat_keyed(read_file(os.path.join(mem, "memory.oom_control"))).get("oom_kill", 0) > 0
    else:
        peak = os.path.join(mem, "memory.peak")
        if os.path.exists(peak):
            usage.rss_max_kb = int(read_file(peak)) // 1024
            usage.sources["rss_max_kb"] = ("cgroup v2 memory.peak: peak charge of the exec's cgroup, "
                                           "all its processes together, page cache included")
        else:
            unavailable["rss_max_kb"] = "this kernel has no memory.peak (added in Linux 5.19)"
        usage.oom_killed = parse_flat_keyed(read_file(os.path.join(mem, "memory.events"))).get("oom_kill", 0) > 0

    pids = where.dir_for("pids")
    if pids is not None:
        usage.pids_limited = parse_flat_keyed(read_file(os.path.join(pids, "pids.events"))).get("max", 0) > 0
    else:
        unavailable["pids_limited"] = f"{REFUSED['pids_limited']}: {missing}"

    _measure_io(where, usage, missing, rusage)
    return usage


def _measure_io(where: ExecDirs, usage: Measurement, missing: str, rusage: BlockCounts | None) -> None:
    read_file = where.read
    if rusage is not None and os.path.exists("/proc/self/io"):
        # Task I/O accounting, summed by the kernel over every reaped descendant: reads
        # that went to storage, and pages dirtied for storage (charged to the writer
        # when dirtied, so unflushed writes count too).
        usage.io_read_kb = rusage.ru_inblock * 512 // 1024
        usage.io_write_kb = rusage.ru_oublock * 512 // 1024
        usage.sources["io_read_kb"] = usage.sources["io_write_kb"] = (
            "wait4 rusage: task I/O accounting summed over every process of the jail")
        return
    io_dir = where.dir_for("io")
    if io_dir is None:
        usage.unavailable["io_read_kb"] = usage.unavailable["io_write_kb"] = f"{REFUSED['io_read_kb']}: {missing}"
        return
    if where.is_v1(io_dir):
        text = read_file(os.path.join(io_dir, "blkio.throttle.io_service_bytes"))
        if any(len(line.split()) == 3 for line in text.splitlines()):
            usage.io_read_kb = parse_blkio_bytes(text)[0] // 1024
            usage.sources["io_read_kb"] = "cgroup v1 blkio.throttle.io_service_bytes of the exec's cgroup"
        else:
            usage.unavailable["io_read_kb"] = (
                "blkio attributed no device I/O to the exec, and on some hosts (virtio, overlay on "
                "a device blkio does not see) it sees none at all, so 0 cannot be told from unmeasured")
        usage.unavailable["io_write_kb"] = (
            "cgroup v1 blkio charges buffered writes to the kernel flusher at writeback, not to the "
            "writing process, so the exec's writes cannot be attributed")
        return
    read, write = parse_io_stat(read_file(os.path.join(io_dir, "io.stat")))
    usage.io_read_kb = read // 1024
    usage.sources["io_read_kb"] = "cgroup v2 io.stat of the exec's cgroup"
    mem = where.dir_for("memory")
    stat = parse_flat_keyed(read_file(os.path.join(mem, "memory.stat"))) if mem and not where.is_v1(mem) else None
    if stat is None:
        usage.unavailable["io_write_kb"] = "without the v2 memory controller, writeback is not charged to the exec"
    elif stat.get("file_dirty", 0) + stat.get("file_writeback", 0) > 0:
        pending = (stat.get("file_dirty", 0) + stat.get("file_writeback", 0)) // 1024
        usage.unavailable["io_write_kb"] = (
            f"{pending} kB written by the exec were still in the page cache, not yet on disk")
    else:
        usage.io_write_kb = write // 1024
        usage.sources["io_write_kb"] = "cgroup v2 io.stat of the exec's cgroup (writeback done)"


def why_none(refused: dict[str, str]) -> str:
    """Why no hierarchy serves a resource: one line when every mkdir failed alike (rootless)."""
    if not refused:
        return "no cgroup hierarchy on this host provides it"
    errnos = {match.group(1) if (match := re.search(r"failed: ([A-Z]+ \([^)]*\))", why)) else why
              for why in refused.values()}
    if len(errnos) == 1 and len(refused) > 1:
        where = ", ".join(os.path.basename(mount) for mount in sorted(refused))
        return f"mkdir of the exec's cgroup failed with {errnos.pop()} in every hierarchy ({where}); {HINT}"
    return "; ".join(refused.values())
