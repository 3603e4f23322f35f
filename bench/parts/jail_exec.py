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

The jail runs as uid 65534, and again as a root caller (uid 0), whose jail keeps the four
file capabilities and so is shown the host's trees idmapped (sandbox/idmap.py: an
idmapped root tree from its own spare pool, the helper's interpreter bound idmapped at
each exec).  The "before" of that change runs in the same rounds: the same root jail
with ``idmap.host_trees`` made to answer None for its duration, which is what the helper
does where idmapped mounts cannot be made (the plain root tree, no capability).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import unittest.mock
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
    root_ms, plain_ms = median_ms(times["root"]), median_ms(times["root, host trees as they are"])
    rows = [Row("exec /bin/true in a full jail as a root caller (host trees idmapped)", root_ms,
                baseline="the same, host trees as they are (before issue 35)", baseline_ms=plain_ms)]
    if "bwrap" in times:
        rows.append(Row("exec /bin/true in a full jail as a root caller (host trees idmapped)", root_ms,
                        baseline="bwrap --unshare-all", baseline_ms=median_ms(times["bwrap"]), target="<= 1.0x"))
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
    from sandbox import contain, idmap, supervise

    for name in ("merged", "tmp", "home"):
        os.mkdir(os.path.join(base, name))
    spec = contain.JailSpec(
        merged_dir=os.path.join(base, "merged"), workspace="/srv/bench-workspace",
        tmp_dir=os.path.join(base, "tmp"), home_dir=os.path.join(base, "home"),
        argv=["/bin/true"], cwd="/srv/bench-workspace",
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/bench", "LANG": "C.UTF-8"},
        uid=65534, gid=65534,
    )

    as_root = dataclasses.replace(spec, uid=0, gid=0)
    if idmap.host_trees() is None:
        raise RuntimeError(f"a root caller's jail would keep no capability here: {idmap.why_not()}")

    def run_jail(jail: contain.JailSpec = spec) -> None:
        result = supervise.run(jail)
        if result.exit_code != 0:
            raise RuntimeError(f"jail /bin/true failed: {result}")

    def run_unmapped() -> None:
        with unittest.mock.patch.object(idmap, "host_trees", lambda: None):
            run_jail(as_root)

    runners: dict[str, Callable[[], object]] = {
        "jail": run_jail,
        "root": lambda: run_jail(as_root),
        "root, host trees as they are": run_unmapped,
        "bare": lambda: subprocess.run(["/bin/true"], check=True),
    }
    if os.access(BWRAP, os.X_OK):
        runners["bwrap"] = lambda: subprocess.run(BWRAP_ARGS, check=True)
    return runners


def jail_mode() -> bool:
    """Whether the helper spawns the jail's init directly (privileged) or the launcher forks it (rootless)."""
    from sandbox import namespaces

    return namespaces.pid_namespace_restorable()
