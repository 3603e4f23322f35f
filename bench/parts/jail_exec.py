"""Exec of /bin/true in the full jail, against bubblewrap and a bare subprocess.

ccw's figure is ``supervise.run`` of ``/bin/true`` with every step of a real exec (mount,
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
import random
import shutil
import subprocess
import tempfile
import time

from bench.common import Row, median_ms

BWRAP = "/usr/bin/bwrap"
BWRAP_ARGS = [BWRAP, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "/bin/true"]


def measure(repeat: int) -> list[Row]:
    """Median ms of supervise.run(/bin/true), bwrap and a bare subprocess, with ratios."""
    from sandbox import contain, supervise

    base = tempfile.mkdtemp(prefix="ccw-bench-jail-")
    try:
        for name in ("merged", "tmp", "home"):
            os.mkdir(os.path.join(base, name))
        spec = contain.JailSpec(
            merged_dir=os.path.join(base, "merged"), workspace="/srv/bench-workspace",
            tmp_dir=os.path.join(base, "tmp"), home_dir=os.path.join(base, "home"),
            argv=["/bin/true"], cwd="/srv/bench-workspace",
            env={"PATH": "/usr/bin:/bin", "HOME": "/home/bench", "LANG": "C.UTF-8"},
            uid=65534, gid=65534,
        )
        has_bwrap = os.access(BWRAP, os.X_OK)

        def run_jail() -> None:
            result = supervise.run(spec)
            if result.exit_code != 0:
                raise RuntimeError(f"jail /bin/true failed: {result}")

        def run_bwrap() -> None:
            subprocess.run(BWRAP_ARGS, check=True)

        def run_bare() -> None:
            subprocess.run(["/bin/true"], check=True)

        runners = {"jail": run_jail, "bare": run_bare}
        if has_bwrap:
            runners["bwrap"] = run_bwrap
        times: dict[str, list[float]] = {name: [] for name in runners}
        for fn in runners.values():  # warm-up: page cache, first-use costs
            fn()
        # A new order every round: each run leaves kernel work behind (freeing its
        # network namespace, RCU callbacks) to kworkers that share the 2 cores with
        # whatever runs next; a fixed order would always bill it to the same runner.
        shuffler = random.Random(0)
        order = list(runners)
        for _ in range(repeat):
            shuffler.shuffle(order)
            for name in order:
                start = time.perf_counter()
                runners[name]()
                times[name].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(base)

    jail_ms = median_ms(times["jail"])
    bare_ms = median_ms(times["bare"])
    rows = []
    if has_bwrap:
        rows.append(Row("exec /bin/true in a full jail", jail_ms, baseline="bwrap --unshare-all",
                        baseline_ms=median_ms(times["bwrap"]), target="<= 1.5x",
                        extra={"direct pid namespace (one Python fork)": jail_mode()}))
    else:
        rows.append(Row("exec /bin/true in a full jail", jail_ms, baseline="bwrap (not installed)",
                        target="<= 1.5x"))
    rows.append(Row("exec /bin/true in a full jail", jail_ms, baseline="bare subprocess.run",
                    baseline_ms=bare_ms))
    return rows


def jail_mode() -> bool:
    """Whether the jail forks its init directly (privileged) or via a second fork (rootless)."""
    from sandbox import namespaces

    return namespaces.pid_namespace_restorable()
