"""The tracer's overhead: a process reading 20,000 small files of a capsule.

The workload is the same in every variant: ``unshare -m`` (its own mount namespace, as
in the jail) binds the overlay's merged view elsewhere, then one Python process opens
and reads every file through that bind.  The process sits in an exec cgroup in every
variant (the cgroup's cost is not the tracer's).  Variants, interleaved round by round
so drift on these 2-core VMs hits all alike:

- untraced: the workload alone;
- ccw: ``Tracer.prepare`` + ``enter`` + the workload + ``collect`` + ``teardown``
  (the whole cost an exec pays for touched files);
- strace: the workload under ``strace -f --seccomp-bpf -e trace=open,openat -o /dev/null``
  (the workload runs as strace's child inside the namespace).

Needs root (overlay, fanotify, cgroups).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bench.common import Row, median_ms

if TYPE_CHECKING:
    from sandbox.fanotify import Group

FILES = 20_000
READER = (
    "import os\n"
    "d = 'many'\n"
    "for n in os.listdir(d):\n"
    "    with open(d + '/' + n, 'rb') as f:\n"
    "        f.read()\n"
)


def _workload(base: str, strace: bool) -> list[str]:
    inner = [sys.executable, "-c", READER]
    if strace:
        inner = ["strace", "-f", "--seccomp-bpf", "-e", "trace=open,openat", "-o", "/dev/null", *inner]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in inner)
    script = f"read go; mount --bind {base}/merged {base}/jail && cd {base}/jail && exec {quoted}"
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]


@contextlib.contextmanager
def _overlay_tree(files: int) -> Iterator[str]:
    """A base dir whose ``merged`` is an overlay over ``files`` small files in ``lower/many``."""
    from sandbox import syscalls

    base = tempfile.mkdtemp(prefix="ccw-bench-trace-")
    mounted = False
    try:
        for name in ("lower", "upper", "work", "merged", "jail", "lower/many"):
            os.mkdir(os.path.join(base, name))
        for i in range(files):
            with open(os.path.join(base, "lower", "many", f"f{i:05d}"), "wb") as f:
                f.write(b"x" * 64)
        opts = f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work"
        syscalls.mount("overlay", f"{base}/merged", "overlay", 0, opts)
        mounted = True
        yield base
    finally:
        if mounted:
            syscalls.umount2(f"{base}/merged", syscalls.MNT_DETACH)
        shutil.rmtree(base, ignore_errors=True)


class _Runs:
    """One workload run in an exec cgroup: untraced, recorded by the overlay's fanotify group
    (the Tracer of the rows' names), or under strace."""

    def __init__(self, base: str) -> None:
        from sandbox.cgroups import detect_layout

        self.base = base
        self.layout = detect_layout()
        self.counts: list[int] = []  # files the Tracer recorded, per traced run
        self.overflow = False
        self.group: Group | None = None  # the overlay's fanotify group, kept across runs as a capsule's is

    def run(self, strace: bool = False, trace: bool = False) -> float:
        from sandbox.exec_cgroup import ExecCgroup, Limits
        from sandbox.fanotify import Group

        cg = ExecCgroup.prepare(self.layout, f"bench-trace-{os.getpid()}", Limits())
        try:
            start = time.perf_counter()
            if trace and self.group is None:
                self.group = Group.open(f"{self.base}/merged")
            recording = self.group.record(cg) if self.group is not None and trace else None
            proc = subprocess.Popen(_workload(self.base, strace), stdin=subprocess.PIPE)
            cg.enter(proc.pid)
            proc.communicate(b"go\n")
            if recording is not None:
                touched = recording.collect()
                recording.close()
                self.counts.append(len(touched.read or []))
                self.overflow = self.overflow or touched.overflow
            elapsed = time.perf_counter() - start
            if proc.returncode != 0:
                raise RuntimeError(f"workload failed with {proc.returncode}")
            return elapsed
        finally:
            cg.teardown()


def measure(repeat: int, files: int = FILES) -> list[Row]:
    """Median ms of reading ``files`` files untraced, with the Tracer, and under strace."""
    has_strace = shutil.which("strace") is not None
    with _overlay_tree(files) as base:
        runs = _Runs(base)
        variants = {"untraced": {}, "traced": {"trace": True}}
        if has_strace:
            variants["straced"] = {"strace": True}
        for kwargs in variants.values():  # warm the page and dentry caches
            runs.run(**kwargs)
        times: dict[str, list[float]] = {name: [] for name in variants}
        try:
            for _ in range(repeat):
                for name, kwargs in variants.items():
                    times[name].append(runs.run(**kwargs))
        finally:
            if runs.group is not None:
                runs.group.close()
    base_ms = median_ms(times["untraced"])
    rows = [
        Row(f"read {files:,} files: untraced", base_ms),
        Row(f"read {files:,} files: ccw Tracer (incl. collect)", median_ms(times["traced"]), "untraced", base_ms,
            "<= 1.3x", {"files recorded (min over runs)": min(runs.counts), "overflow": runs.overflow}),
    ]
    if has_strace:
        rows.append(Row(f"read {files:,} files: strace -f --seccomp-bpf", median_ms(times["straced"]), "untraced",
                        base_ms))
        rows.append(Row("ccw Tracer vs strace", median_ms(times["traced"]), "strace", median_ms(times["straced"])))
    return rows
