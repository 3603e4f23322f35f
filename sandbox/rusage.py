"""Usage without cgroups: what the jail's init learns from reaping every process of the jail.

An exec's ``Measurement`` lives here: the exec cgroup (exec_cgroup.py) fills what its
hierarchies measure, ``fill`` adds what the init's rusage report measured, and the exec
reply carries its ``figures()`` (sandbox.replies.Usage) with the reasons and sources.

Some facts about rusage on Linux (each checked on this project's CI kernel, 6.18)
---------------------------------------------------------------------------------
- ``wait4`` on a child, and ``getrusage(RUSAGE_CHILDREN)`` in its parent afterwards, give
  the child's usage plus that of every descendant the child (and they, in turn) reaped.
  CPU times and block I/O counts are *sums*.  ``ru_maxrss`` is a *maximum*: the largest
  peak resident set of any single process of that tree (the kernel keeps
  ``signal->cmaxrss`` and raises it to ``max(maxrss, cmaxrss)`` of each child it reaps).
  Two processes of 100 and 150 MiB alive at the same time give about 150 MiB, not 250
  (measured).  So rusage can never give the total memory of a jail at one instant, which
  is what a memory cgroup's peak is: that figure stays null without a memory cgroup.
- A process's peak counts the image it had *before* exec: ``exec_mmap`` records the old
  mm's high-water mark in ``signal->maxrss``, and a forked mm starts at its parent's
  resident size.  A child forked (or vforked, as ``posix_spawn`` does) from a 200 MiB
  parent that execs ``/bin/true`` reports 200 MiB (measured).  The jail's init is
  ccw-jail, a small static program (sandbox/jail_launcher.py), so the command it spawns counts
  the init's own peak (its VmHWM, about 1 MiB; where contain.py's Python init serves,
  a fork of the helper, 15 to 30 MiB of the helper's heap).  The init reports that size
  (``inherited_kb``): a figure above it is the true peak of some process of the jail; a
  figure at or below it says only that no process peaked higher than ccw's own image.
- Only reaped processes count.  Every process of a jail descends from its init, and
  orphans are reparented to it (pid 1 of the jail's pid namespace); when the command
  exits the init SIGKILLs what is left and reaps it (contain.py), so RUSAGE_CHILDREN taken
  then covers every process the jail ever had, without the init itself.
- A killed init cannot report, and then nothing else can: the kernel tears its pid
  namespace down by having the dying init reap everything with SIGCHLD *ignored*, and
  children reaped so are not added to anyone's usage.  A 1.5 s busy loop ended that way
  leaves 9 ms in the helper's own ``wait4`` of the init (measured), so that figure is
  no source: the figures are null, with the reason.  On timeout the helper therefore
  first asks the init to end the jail itself (supervise.py, ``END_SIGNAL``), and kills it
  only when it has not ended a second later.
- ``ru_inblock``/``ru_oublock`` are task I/O accounting, in 512-byte units (see exec_cgroup.py).

Why not sample the process tree (psutil, /proc) instead: the figures sampling could add
are no better for any use ccw has.  Summed RSS counts every shared page (libraries, a
forked parent's pages) once per process, so it is not the jail's memory, neither an
upper nor a lower bound of it; and samples miss short peaks and short-lived processes
(a compiler run between two samples).  rusage is exact for what it measures, costs one
read at the end, and needs no access to the jail's processes while they run.
"""

from __future__ import annotations

import resource
import struct
from dataclasses import dataclass, field
from typing import Protocol

from sandbox.replies import Usage
from sandbox.usage_words import NO_REPORT

_REPORT = struct.Struct("!QQQQQ")  # cpu_us, maxrss_kb, inblock, oublock, inherited_kb

INIT_CPU = "wait4 rusage of the jail's init: CPU time (user + system) summed over every process of the jail"
INIT_RSS = "wait4 rusage of the jail's init: peak RSS of the largest single process (not a total)"
_RUSAGE_FIGURES = ("cpu_ms", "rss_max_process_kb", "io_read_kb", "io_write_kb")


@dataclass
class Measurement:
    """What an exec used, as it is being measured; a None figure could not be measured and
    ``unavailable`` says why."""

    cpu_ms: int | None
    rss_max_kb: int | None
    io_read_kb: int | None
    io_write_kb: int | None
    oom_killed: bool
    pids_limited: bool
    unavailable: dict[str, str] = field(default_factory=dict)
    cpu_limited: bool = False  # the cpu_ms budget was spent and the exec was killed
    # The peak RSS of the largest single process (``fill`` sets it; never a total).
    rss_max_process_kb: int | None = None
    sources: dict[str, str] = field(default_factory=dict)  # figure -> the mechanism that measured it

    def figures(self) -> Usage:
        """The figures as the exec reply carries them."""
        return Usage(self.cpu_ms, self.rss_max_kb, self.rss_max_process_kb, self.io_read_kb, self.io_write_kb)


class BlockCounts(Protocol):
    """Task I/O accounting, as ``resource.struct_rusage`` and rusage.InitReport carry it."""

    @property
    def ru_inblock(self) -> int: ...

    @property
    def ru_oublock(self) -> int: ...


@dataclass(frozen=True)
class InitReport:
    """What the jail's init measured of the processes it reaped (itself excluded)."""

    cpu_ms: int
    maxrss_kb: int  # the largest single process's peak
    inblock: int
    oublock: int
    inherited_kb: int  # the init's own peak when it spawned the command (0: nothing was spawned)

    @property
    def ru_inblock(self) -> int:
        """As ``struct_rusage``, for the I/O figures (exec_cgroup.ExecCgroup.collect)."""
        return self.inblock

    @property
    def ru_oublock(self) -> int:
        """As ``struct_rusage``, for the I/O figures (exec_cgroup.ExecCgroup.collect)."""
        return self.oublock


def pack(children: resource.struct_rusage, inherited_kb: int) -> bytes:
    """The init's ``R`` report: its RUSAGE_CHILDREN and the peak the command inherited."""
    cpu_us = round((children.ru_utime + children.ru_stime) * 1_000_000)
    return _REPORT.pack(max(cpu_us, 0), max(children.ru_maxrss, 0), max(children.ru_inblock, 0),
                        max(children.ru_oublock, 0), max(inherited_kb, 0))


def unpack(payload: bytes) -> InitReport | None:
    """Parse an ``R`` report; None when it is malformed (then the helper's wait4 serves)."""
    if len(payload) != _REPORT.size:
        return None
    cpu_us, maxrss_kb, inblock, oublock, inherited_kb = _REPORT.unpack(payload)
    return InitReport(cpu_us // 1000, maxrss_kb, inblock, oublock, inherited_kb)


def fill(usage: Measurement, report: InitReport | None) -> None:
    """Give ``usage`` the figures the init's ``report`` measured where no cgroup did, naming each source.

    A cgroup's CPU figure is kept (the same sum, and it also counts what a kill ended);
    ``rss_max_process_kb`` always comes from here.  Without a report, each figure still
    null gets the reason.
    """
    if report is None:
        for figure in _RUSAGE_FIGURES:
            if getattr(usage, figure) is None:
                why = usage.unavailable.get(figure)
                usage.unavailable[figure] = NO_REPORT if why is None else f"{why}; {NO_REPORT}"
        return
    rss_source = INIT_RSS
    if report.inherited_kb and report.maxrss_kb <= report.inherited_kb:
        rss_source += (f"; no process of the jail peaked above the {report.inherited_kb} kB of ccw's "
                       "init image that the command starts from (a peak counts the image before exec)")
    if usage.cpu_ms is None:
        usage.cpu_ms = report.cpu_ms
        usage.sources["cpu_ms"] = INIT_CPU
        usage.unavailable.pop("cpu_ms", None)
    usage.rss_max_process_kb = report.maxrss_kb
    usage.sources["rss_max_process_kb"] = rss_source
    if usage.rss_max_kb is None and "rss_max_kb" in usage.unavailable:
        usage.unavailable["rss_max_kb"] += (
            "; rusage gives only the largest single process (rss_max_process_kb), never the jail's total")
