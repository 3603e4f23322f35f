"""``python bench/run.py many``: several attempts at once (issue 39), in one run.

- **Fork N.**  ``capsule_fork`` with ``count`` N = 1, 10 and 100 of one parent over a
  200-file workspace; each row is the median of the call's time divided by N (the cost
  per fork; N = 1 is ten calls in a row, see ``_fork_round``), and the N = 10 and
  N = 100 rows give their ratio to N = 1's: a fork is O(1), so the cost per fork must
  stay flat.  The sizes take turns in a new order every round; the destroys after each
  round are not timed.
- **Race.**  ``capsule_race`` of 4 forks running a CPU-bound command (~0.3 s of Python)
  against the same 4 done one after another as a caller would without it: for each,
  capsule_exec, capsule_diff and capsule_promote's dry run (the work a race's row
  holds).  On this 2-core VM the race runs 2 at once, so the ideal ratio is about 0.5.
- **Merge.**  ``capsule_merge`` of two capsules of 1,000 changed files each against ``git
  merge`` of the same two branches (bench/parts/merge.py).
Needs root (the helper runs privileged).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Report, Row, in_process_tools, median_ms
from bench.parts import merge
from mcp_server.statedir import make_state_dir

SIZES = (1, 10, 100)
QUICK_SIZES = (1, 10)  # --quick: 100 forks made and destroyed per round took most of 150 s
SMOKE_SIZES = (1, 2)  # --smoke: N = 1 and one N > 1 reach both kinds of row
RACERS = 4
SINGLE_CALLS = 10  # count=1 calls per round
WORK = ["python3", "-c", "sum(i * i for i in range(3_000_000))"]
SMOKE_WORK = ["python3", "-c", "sum(i * i for i in range(30_000))"]  # --smoke: the same command, shorter


def _workspace(base: Path) -> Path:
    ws = base / "ws"
    (ws / "src").mkdir(parents=True)
    for i in range(200):
        (ws / "src" / f"m{i:03}.py").write_text(f"VALUE_{i} = {i}\n")
    return ws


async def _fork_round(call: Any, ws: Path, count: int) -> float:
    """Seconds per fork of capsule_fork making ``count`` of one parent (the destroys after not counted).

    ``count`` 1 is ten calls of one fork each: a single fork costs 2 to 3 ms in the helper,
    with every third or so taking 8 to 10 (kernel work beside it), so the median of single
    calls would compare the common case against the others' average."""
    parent = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    calls = SINGLE_CALLS if count == 1 else 1
    made: list[str] = []
    start = time.perf_counter()
    for _ in range(calls):
        made += (await call("capsule_fork", {"capsule_id": parent, "count": count}))["capsule_ids"]
    elapsed = time.perf_counter() - start
    if len(made) != count * calls:
        raise RuntimeError(f"asked for {count} forks {calls} times, got {made}")
    for child in made:
        await call("capsule_destroy", {"capsule_id": child})
    await call("capsule_destroy", {"capsule_id": parent})
    return elapsed / len(made)


async def _race(call: Any, forks: list[str], work: list[str]) -> float:
    start = time.perf_counter()
    result = await call("capsule_race", {"capsule_ids": forks, "cmd": work, "wait_ms": None})
    elapsed = time.perf_counter() - start
    if [row.get("exit_code") for row in result["rows"]] != [0] * len(forks):
        raise RuntimeError(f"a racer failed: {result['rows']}")
    return elapsed


async def _one_after_another(call: Any, forks: list[str], work: list[str]) -> float:
    start = time.perf_counter()
    for capsule_id in forks:
        ran = await call("capsule_exec", {"capsule_id": capsule_id, "cmd": work, "wait_ms": None})
        await call("capsule_diff", {"capsule_id": capsule_id, "format": "stat"})
        await call("capsule_promote", {"capsule_id": capsule_id, "dry_run": True})
        if ran["exit_code"] != 0:
            raise RuntimeError(f"exec failed: {ran['stderr'][-300:]}")
    return time.perf_counter() - start


async def _measure(base: Path, sizes: tuple[int, ...], fork_rounds: int, race_rounds: int,
                   work: list[str], warmup: bool) -> tuple[dict[int, list[float]], dict[str, list[float]]]:
    ws = _workspace(base)
    async with in_process_tools(base / "state") as tools:
        per_fork: dict[int, list[float]] = {n: [] for n in sizes}
        for n in sizes if warmup else ():  # warm-up
            await _fork_round(tools.call, ws, n)
        order, shuffler = list(sizes), random.Random(0)
        for _ in range(fork_rounds):
            shuffler.shuffle(order)
            for n in order:
                per_fork[n].append(await _fork_round(tools.call, ws, n))
        parent = (await tools.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        forks = (await tools.call("capsule_fork", {"capsule_id": parent, "count": RACERS}))["capsule_ids"]
        runners = {"race": _race, "one after another": _one_after_another}
        races: dict[str, list[float]] = {name: [] for name in runners}
        for runner in runners.values() if warmup else ():  # warm-up
            await runner(tools.call, forks, work)
        names = list(runners)
        for _ in range(race_rounds):
            shuffler.shuffle(names)
            for name in names:
                races[name].append(await runners[name](tools.call, forks, work))
        return per_fork, races


def run(quick: bool = False, smoke: bool = False) -> Report:
    """Measure both parts and collect the rows."""
    import trio

    report = Report("many")
    sizes, fork_rounds, race_rounds = (QUICK_SIZES, 1, 1) if quick else (SIZES, 9, 7)
    work, changed = (SMOKE_WORK, merge.SMOKE_CHANGED) if smoke else (WORK, merge.CHANGED)
    sizes = SMOKE_SIZES if smoke else sizes
    base = Path(tempfile.mkdtemp(prefix="ccw-bench-many-"))
    make_state_dir(base / "state")  # 0700, as ccw makes one: Path.mkdir's 0755 is tightened with a warning
    try:
        per_fork, races = trio.run(_measure, base, sizes, fork_rounds, race_rounds, work, not smoke)
        merges = trio.run(merge.measured, base, race_rounds, changed, not smoke)  # smoke: no warm-ups
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one = median_ms(per_fork[1])
    for n in sizes:
        name = f"capsule_fork count={n}: per fork" + (f" ({SINGLE_CALLS} calls)" if n == 1 else "")
        report.add(Row(name, median_ms(per_fork[n]), baseline="count=1" if n != 1 else "",
                       baseline_ms=one if n != 1 else None, target="<= 1.2x (flat)" if n != 1 else "",
                       extra={"rounds": fork_rounds}))
    report.add(Row(f"capsule_race of {RACERS} (python, ~{0.003 if smoke else 0.3} s each)", median_ms(races["race"]),
                   baseline="one after another", baseline_ms=median_ms(races["one after another"]),
                   target="<= 0.6x on 2 cores", extra={"rounds": race_rounds}))
    for row in merge.rows(merges, race_rounds, changed):
        report.add(row)
    report.notes.append("per-fork cost must stay flat from N=1 to N=100 (issue 39); the race's baseline does "
                        "exec + diff + promote dry run per capsule, the work each row of the race holds")
    return report
