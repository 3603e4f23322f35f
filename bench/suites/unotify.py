"""``python bench/run.py unotify``: what the notifying seccomp filter costs a run (sandbox/unotify.py).

A run that can overlap another (a service, or an exec while a service runs) gets its
seccomp filter in a notifying form, which stops every rename, unlink and rmdir until the
helper has read its path and answered CONTINUE.  Three commands, each timed *inside* the
jail (its own start, and the exec's, not counted), in a capsule running an idle service
(the exec gets the notifying form) against a capsule of the same workspace running none
(the plain filter: vm-tests/test_services_renames.py checks each run has one filter):

- ``rm -rf`` of a tree of 5,000 files in 50 directories, made by the same command first
  (5,050 notifications: ``unlinkat`` per file and per directory);
- a shell loop of 2,000 ``mv`` processes (one ``renameat2`` each, and a fork and exec);
- 20,000 ``os.rename`` calls in one Python process: the cost of one notification, bare.

Halfway the service moves to the other capsule, so whatever differs between the two
capsules falls on both; rounds are interleaved in a new order each time
(bench.common.interleaved's reason).  The idle service's own presence costs an exec
nothing measurable (``bench/run.py services``, "an idle service beside"), so the ratio is
the filter's and the helper's answering.  No target: the issue sets none.  Needs root.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from bench.common import Call, Report, Row, in_process_tools, interleaved_async, median_ms

PYTHON = ["/usr/bin/python3", "-S"]
TREE = """
import os, subprocess, time
for d in range(DIRS):
    os.makedirs(f"tree/d{d}")
    for f in range(FILES):
        open(f"tree/d{d}/f{f}", "w").close()
start = time.perf_counter()
subprocess.run(["rm", "-rf", "tree"], check=True)
print(time.perf_counter() - start)
"""
MVS = """
import subprocess, time
open("a", "w").close()
start = time.perf_counter()
subprocess.run(["sh", "-c", 'i=0; while [ $i -lt MVS ]; do mv a b; mv b a; i=$((i+1)); done'], check=True)
print(time.perf_counter() - start)
"""
RENAMES = """
import os, time
open("a", "w").close()
start = time.perf_counter()
for _ in range(RENAMES):
    os.rename("a", "b")
    os.rename("b", "a")
print(time.perf_counter() - start)
"""
IDLE = ["sh", "-c", "echo up; exec sleep 100000"]
ROUNDS, QUICK_ROUNDS = 8, 1  # per half
# The commands' sizes (each loop's count: mv and rename go there and back); --quick, a smoke
# run, a tenth of each: the full quick run took 395 s on a loaded 2-core machine.
SIZES = {"DIRS": 50, "FILES": 100, "MVS": 1000, "RENAMES": 10000}
QUICK_SIZES = {"DIRS": 10, "FILES": 50, "MVS": 100, "RENAMES": 1000}


def _commands(sizes: dict[str, int]) -> dict[str, str]:
    """The three scripts with their counts written in."""
    commands = {"rm": TREE, "mv": MVS, "rename": RENAMES}
    for name, count in sizes.items():
        commands = {key: script.replace(name, str(count)) for key, script in commands.items()}
    return commands


async def _beside(call: Call, ws: Path, rounds: int, commands: dict[str, str]) -> dict[str, list[float]]:
    """Seconds each command took in its jail, in a capsule with an idle service and in one without."""
    caps = [(await call("capsule_create", {"workspace": str(ws)}))["capsule_id"] for _ in range(2)]

    def exec_in(which: int, script: str) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            ran = await call("capsule_exec", {"capsule_id": caps[which], "cmd": [*PYTHON, "-c", script],
                                              "timeout_ms": 300_000})
            if ran["exit_code"] != 0:
                raise RuntimeError(f"the bench command failed: {ran['stderr'][-300:]}")
            return float(ran["stdout"])
        return run

    times: dict[str, list[float]] = {}
    try:
        for served in (0, 1):  # the service in one capsule, then in the other
            started = await call("capsule_service_start", {"capsule_id": caps[served], "name": "idle", "cmd": IDLE,
                                                           "ready": {"line": "up", "timeout_ms": 30_000}})
            if not started["ready"]:
                raise RuntimeError(f"the idle service was not ready: {started}")
            half = await interleaved_async({
                f"{name} {'filtered' if which == served else 'plain'}": exec_in(which, script)
                for which in (0, 1) for name, script in commands.items()}, rounds, seed=served)
            await call("capsule_service_stop", {"capsule_id": caps[served], "name": "idle", "grace_ms": 2000})
            for name, figures in half.items():
                times.setdefault(name, []).extend(figures)
    finally:
        for cap in caps:
            await call("capsule_destroy", {"capsule_id": cap})
    return times


async def _measure(root: Path, rounds: int, sizes: dict[str, int]) -> dict[str, list[float]]:
    ws = root / "ws"
    ws.mkdir()
    async with in_process_tools(root / "state", {"CCW_TOOLSETS": "capsule"}) as tools:
        return await _beside(tools.call, ws, rounds, _commands(sizes))


def run(quick: bool = False) -> Report:
    """Each command with the notifying filter and without, medians and ratios."""
    if os.geteuid() != 0:
        raise SystemExit("the unotify suite needs root (the helper runs privileged)")
    rounds, sizes = (QUICK_ROUNDS, QUICK_SIZES) if quick else (ROUNDS, SIZES)
    report = Report("unotify")
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ccw-bench-unotify-") as tmp:
        figures = trio.run(_measure, Path(tmp), rounds, sizes)
    took = time.perf_counter() - start
    files, dirs, mvs, renames = sizes["DIRS"] * sizes["FILES"], sizes["DIRS"], 2 * sizes["MVS"], 2 * sizes["RENAMES"]
    for name, what, calls in (("rm", f"rm -rf of {files:,} files in {dirs} dirs", files + dirs),
                              ("mv", f"{mvs:,} mv processes in a shell loop", mvs),
                              ("rename", f"{renames:,} os.rename in one process", renames)):
        filtered, plain = figures[f"{name} filtered"], figures[f"{name} plain"]
        paired = statistics.median(f / p for f, p in zip(filtered, plain, strict=True))
        extra = (statistics.median(filtered) - statistics.median(plain)) / calls * 1e6
        report.add(Row(f"{what}, beside a service", median_ms(filtered), "no service (no filter)",
                       median_ms(plain), "(no target)",
                       {"runs": len(filtered), "median of the rounds' ratios": f"{paired:.3f}x",
                        "added per notified call": f"{extra:.1f} us"}))
    report.notes.append("each figure timed inside the jail by the command itself; the service moved between the "
                        "two capsules halfway")
    report.notes.append(f"took {took:.0f} s; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
                        f"on {os.cpu_count()} CPUs")
    return report
