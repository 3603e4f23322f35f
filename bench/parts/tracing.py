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

import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.common import Row, median_ms

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


def measure(repeat: int) -> list[Row]:
    """Median ms of reading 20,000 files untraced, with the Tracer, and under strace."""
    from sandbox import syscalls
    from sandbox.cgroups import detect_layout
    from sandbox.exec_cgroup import ExecCgroup, Limits
    from sandbox.fanotify import Tracer

    base = tempfile.mkdtemp(prefix="ccw-bench-trace-")
    mounted = False
    try:
        for name in ("lower", "upper", "work", "merged", "jail", "lower/many"):
            os.mkdir(os.path.join(base, name))
        for i in range(FILES):
            with open(os.path.join(base, "lower", "many", f"f{i:05d}"), "wb") as f:
                f.write(b"x" * 64)
        opts = f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work"
        syscalls.mount("overlay", f"{base}/merged", "overlay", 0, opts)
        mounted = True
        layout = detect_layout()
        has_strace = shutil.which("strace") is not None
        counts: list[int] = []
        overflow = False

        def run(strace: bool = False, trace: bool = False) -> float:
            nonlocal overflow
            cg = ExecCgroup.prepare(layout, f"bench-trace-{os.getpid()}", Limits())
            try:
                start = time.perf_counter()
                tracer = Tracer.prepare(f"{base}/merged") if trace else None
                if tracer is not None:
                    tracer.enter(cg)
                proc = subprocess.Popen(_workload(base, strace), stdin=subprocess.PIPE)
                cg.enter(proc.pid)
                proc.communicate(b"go\n")
                if tracer is not None:
                    touched = tracer.collect()
                    tracer.teardown()
                    counts.append(len(touched.read or []))
                    overflow = overflow or touched.overflow
                elapsed = time.perf_counter() - start
                if proc.returncode != 0:
                    raise RuntimeError(f"workload failed with {proc.returncode}")
                return elapsed
            finally:
                cg.teardown()

        untraced: list[float] = []
        traced: list[float] = []
        straced: list[float] = []
        run(), run(trace=True)  # warm the page and dentry caches
        if has_strace:
            run(strace=True)
        for _ in range(repeat):
            untraced.append(run())
            traced.append(run(trace=True))
            if has_strace:
                straced.append(run(strace=True))
        base_ms = median_ms(untraced)
        rows = [
            Row("read 20k files: untraced", base_ms),
            Row("read 20k files: ccw Tracer (incl. collect)", median_ms(traced), "untraced", base_ms,
                "<= 1.3x", {"files recorded (min over runs)": min(counts), "overflow": overflow}),
        ]
        if has_strace:
            rows.append(Row("read 20k files: strace -f --seccomp-bpf", median_ms(straced), "untraced", base_ms))
            rows.append(Row("ccw Tracer vs strace", median_ms(traced), "strace", median_ms(straced)))
        return rows
    finally:
        if mounted:
            syscalls.umount2(f"{base}/merged", syscalls.MNT_DETACH)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from bench.common import Report

    report = Report("tracing", measure(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
    print(report.to_text())
