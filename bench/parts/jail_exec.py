"""Exec of /bin/true in the full jail, against bubblewrap and a bare subprocess.

ccw's figure is ``supervise.run`` of ``/bin/true`` (the helper's plan, then ccw-jail, its C
launcher and init, posix_spawned: sandbox/jail_launcher.py) with every step of a real exec (mount,
pid, net, uts, ipc and cgroup namespaces, the tmpfs root with system binds, /proc with
its masks, /sys, /dev, /tmp and $HOME, lo up, privileges dropped) but no cgroup, whose
cost belongs to the cgroup part.  The baselines run in the same process, interleaved
round by round so drift on these 2-core VMs hits all three alike:
``bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc /bin/true`` (Debian's
bubblewrap: fork+exec of bwrap itself, its namespaces and its pid-1) and
``subprocess.run(['/bin/true'])``, in a new (seeded) order each round.  Needs root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable

from bench.common import Row, interleaved, median_ms

BWRAP = "/usr/bin/bwrap"
BWRAP_ARGS = [BWRAP, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "/bin/true"]


def measure(repeat: int) -> list[Row]:
    """Median ms of supervise.run(/bin/true), bwrap and a bare subprocess, with ratios."""
    base = tempfile.mkdtemp(prefix="ccw-bench-jail-")
    try:
        times = interleaved(_runners(base), repeat)
    finally:
        shutil.rmtree(base)
    jail_ms = median_ms(times["jail"])
    rows = []
    if "bwrap" in times:
        rows.append(Row("exec /bin/true in a full jail", jail_ms, baseline="bwrap --unshare-all",
                        baseline_ms=median_ms(times["bwrap"]), target="<= 1.0x",
                        extra={"direct pid namespace (ccw-jail spawned as pid 1)": jail_mode()}))
    else:
        rows.append(Row("exec /bin/true in a full jail", jail_ms, baseline="bwrap (not installed)",
                        target="<= 1.0x"))
    rows.append(Row("exec /bin/true in a full jail", jail_ms, baseline="bare subprocess.run",
                    baseline_ms=median_ms(times["bare"])))
    return rows


def _runners(base: str) -> dict[str, Callable[[], object]]:
    """/bin/true in a jail over dirs under ``base``, bare, and in bwrap where it is installed."""
    from sandbox import contain, supervise

    for name in ("merged", "tmp", "home"):
        os.mkdir(os.path.join(base, name))
    spec = contain.JailSpec(
        merged_dir=os.path.join(base, "merged"), workspace="/srv/bench-workspace",
        tmp_dir=os.path.join(base, "tmp"), home_dir=os.path.join(base, "home"),
        argv=["/bin/true"], cwd="/srv/bench-workspace",
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/bench", "LANG": "C.UTF-8"},
        uid=65534, gid=65534,
    )

    def run_jail() -> None:
        result = supervise.run(spec)
        if result.exit_code != 0:
            raise RuntimeError(f"jail /bin/true failed: {result}")

    runners: dict[str, Callable[[], object]] = {
        "jail": run_jail,
        "bare": lambda: subprocess.run(["/bin/true"], check=True),
    }
    if os.access(BWRAP, os.X_OK):
        runners["bwrap"] = lambda: subprocess.run(BWRAP_ARGS, check=True)
    return runners


def jail_mode() -> bool:
    """Whether the helper spawns the jail's init directly (privileged) or the launcher forks it (rootless)."""
    from sandbox import namespaces

    return namespaces.pid_namespace_restorable()
