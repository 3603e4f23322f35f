"""``python bench/run.py scaleout``: deltamin on a REAPI cluster of 1, 2 and 4 ccw-bots (issue 17).

Brings up the local cluster (PostgreSQL + BuildGrid, mcp_server.reapi.cluster) and
ccw-bot processes (each with its own embedded helper, capacity 1) on this machine, and
measures:

- **deltamin wall time with 1, 2 and 4 bots** (parallelism = bots) for a change whose
  target command is dominated by waiting (it sleeps ``SLEEP_S``), so bots on one
  2-core machine can overlap.  16 files change; the check imports them all (no
  evidence shortcut) and fails when two of them (m03, m11) are both changed; ddmin
  then needs a dozen or more trials.  Each bot count gets a workspace of its own (a
  different check.py), so no run is answered from an earlier run's action cache.
  The time includes deltamin's final check, which runs locally (one more sleep).
- **throughput**: ``TOGETHER`` deltamins at once (separate capsules, one trial at a
  time each) on 1 bot and on 4: what a cluster gains when CI minimises or replays
  many changes.  One ddmin gains less from bots than its trial count suggests: its
  rounds are sequential (each failing trial restarts the split), so trials at
  parallelism 1 over rounds at 4 bounds the gain (reported per row).
- **per-trial overhead**: one trivial trial (``true``) through the cluster (a fresh
  Execute: no cache lookup, nothing cached) against the same trial in a local scratch
  capsule, medians; the difference is what the remote path adds.
- **the repeated run's cache hit rate**: the 4-bot deltamin again on the same capsule;
  every trial should be an action-cache hit.

Needs root (the helpers run privileged), PostgreSQL (installed from Debian if absent)
and a Python >= 3.13 for BuildGrid (see mcp_server/reapi/cluster.py).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import InProcess, Report, Row, in_process_tools

SLEEP_S = 1.0
FILES = 16
CULPRITS = (3, 11)
BOT_COUNTS = (1, 2, 4)
OVERHEAD_REPEAT = 15
BOT_START_S = 4.0
TOGETHER = 4  # deltamins at once (CI minimising or replaying many changes)


def _check(tag: str) -> str:
    imports = ", ".join(f"m{i:02}" for i in range(FILES))
    bad = " and ".join(f"m{i:02}.VALUE == 1" for i in CULPRITS)
    return f"# {tag}\nimport time, {imports}\ntime.sleep({SLEEP_S})\nraise SystemExit(1 if {bad} else 0)\n"


def _workspace(ws: Path, tag: str) -> None:
    ws.mkdir()
    for i in range(FILES):
        (ws / f"m{i:02}.py").write_text("VALUE = 0\n")
    (ws / "check.py").write_text(_check(tag))


CMD = ["/usr/bin/python3", "-B", "check.py"]
CHANGE = "for f in m*.py; do echo 'VALUE = 1' > $f; done"


class Bench:
    """One state dir's tools (bench.common.in_process_tools), one cluster, bots started and stopped per measurement."""

    def __init__(self, root: Path, cluster: Any, tools: InProcess) -> None:
        self.root = root
        self.cluster = cluster
        self.call = tools.call
        self.ctx = tools.ctx

    async def capsule(self, tag: str) -> str:
        """A capsule whose journal saw the check pass on the base and fail on the change (no confirmation runs)."""
        ws = self.root / f"ws-{tag}"
        _workspace(ws, tag)
        cap = (await self.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        assert (await self.call("capsule_exec", {"capsule_id": cap, "cmd": CMD}))["exit_code"] == 0
        await self.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", CHANGE]})
        assert (await self.call("capsule_exec", {"capsule_id": cap, "cmd": CMD}))["exit_code"] == 1
        return cap

    def bots(self, count: int, tag: str) -> list[Any]:
        """``count`` ccw-bots of capacity 1."""
        from mcp_server.reapi.cluster import start_bot

        return [start_bot(self.cluster.url, f"{tag}-{i}", self.root / "bots" / f"{tag}-{i}") for i in range(count)]

    async def deltamin(self, cap: str, parallel: int) -> tuple[float, dict[str, Any]]:
        """Seconds and result of a deltamin through the cluster (``parallel`` trials at once)."""
        from mcp_server.capsules.minimise import Question, deltamin
        from mcp_server.capsules.remote import ReapiExecutor

        executor = ReapiExecutor(self.cluster.url, parallel)
        start = time.perf_counter()
        try:
            result = await deltamin(self.ctx.capsules, Question(cap, CMD), executor)
        finally:
            executor.close()
        assert result["units"] == [f"m{i:02}.py" for i in CULPRITS], result["units"]
        return time.perf_counter() - start, result

    async def together(self, bots: int) -> float:
        """Seconds for ``TOGETHER`` deltamins at once, on capsules of their own, one trial at a time each."""
        import trio

        caps = [await self.capsule(f"t{bots}-{i}") for i in range(TOGETHER)]
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for cap in caps:
                nursery.start_soon(self.deltamin, cap, 1)
        return time.perf_counter() - start

    async def overhead(self) -> tuple[list[float], list[float]]:
        """Seconds per trivial trial: through the cluster (fresh), and in a local scratch capsule."""
        from mcp_server.capsules.executors import LocalExecutor, Trial
        from mcp_server.capsules.remote import ReapiExecutor
        from mcp_server.capsules.runs import Command

        cap = (await self.call("capsule_create", {"workspace": str(self.root / "ws-b1")}))["capsule_id"]
        record = self.ctx.capsules.live_record(cap)
        remote, local = ReapiExecutor(self.cluster.url), LocalExecutor()
        times: dict[str, list[float]] = {"remote": [], "local": []}
        try:
            for i in range(OVERHEAD_REPEAT + 1):
                for name, executor in (("remote", remote), ("local", local)):
                    trial = Trial(record, {}, Command(["true"], record.workspace, 60_000), fresh=True)
                    start = time.perf_counter()
                    run = await executor.run_trial(self.ctx.capsules, trial)
                    if i:  # the first of each is a warm-up
                        times[name].append(time.perf_counter() - start)
                    assert run.exit_code == 0
        finally:
            remote.close()
        return times["remote"], times["local"]


async def _measure(root: Path, cluster: Any, quick: bool) -> dict[str, Any]:
    import trio

    from mcp_server.reapi.cluster import stop_bot

    out: dict[str, Any] = {"walls": {}, "trials": {}}
    async with in_process_tools(root / "state") as tools:
        bench = Bench(root, cluster, tools)
        counts = BOT_COUNTS[:2] if quick else BOT_COUNTS
        for count in counts:
            cap = await bench.capsule(f"b{count}")
            bots = bench.bots(count, f"b{count}")
            try:
                await trio.sleep(BOT_START_S)  # each bot starts its helper and opens its session
                out["walls"][count], result = await bench.deltamin(cap, count)
                out["trials"][count] = result["trials"]
                if count == max(out["walls"]):
                    out["repeat_s"], out["repeat"] = await bench.deltamin(cap, count)
                if count == 1:
                    out["overhead"] = await bench.overhead()
                if count in (1, max(counts)):
                    out.setdefault("together", {})[count] = await bench.together(count)
            finally:
                for bot in bots:
                    stop_bot(bot)
    return out


def search_rounds(parallel: int) -> tuple[int, int]:
    """Trials and rounds (batches) of the bench's ddmin at ``parallel``, by the pure search alone.

    A round's trials run at once, so with enough bots wall time follows rounds, not trials:
    trials at 1 over rounds at N is the most N bots can gain on this change.
    """
    from mcp_server.core.deltamin import FAIL, PASS, Search

    search = Search(tuple(range(FILES)), parallel)
    rounds = 0
    while batch := search.next_batch():
        rounds += 1
        search.report([FAIL if set(CULPRITS) <= set(subset) else PASS for subset in batch])
    return search.trials, rounds


def run(quick: bool = False) -> Report:
    """One cluster for the suite; every figure from the same run."""
    import trio

    from mcp_server.reapi.cluster import temporary_cluster

    report = Report("scaleout")
    root = Path(tempfile.mkdtemp(prefix="ccw-bench-scaleout-"))
    try:
        with temporary_cluster() as cluster:
            out = trio.run(_measure, root, cluster, quick)
            report.notes.append(f"cluster up in {cluster.timings['ready_s']:.1f} s {cluster.timings}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    walls = out["walls"]
    one = walls[1]
    sequential = search_rounds(1)[0]
    for count, wall in walls.items():
        rounds = search_rounds(count)[1]
        report.add(Row(f"deltamin, {count} bot(s): wall time", wall * 1000, "1 bot", one * 1000,
                       "<= 0.33x with 4" if count == 4 else "",
                       {"trials": out["trials"][count], "search rounds": rounds,
                        "best possible (trials at 1 / rounds)": f"{sequential / rounds:.2f}x faster"}))
    together = out["together"]
    report.add(Row(f"{TOGETHER} deltamins at once, {max(together)} bots", together[max(together)] * 1000,
                   "1 bot", together[1] * 1000, "<= 0.33x", {"each": "parallelism 1, a capsule of its own"}))
    remote, local = out["overhead"]
    added = statistics.median(remote) - statistics.median(local)
    report.add(Row("trivial trial through the cluster", statistics.median(remote) * 1000, "local scratch capsule",
                   statistics.median(local) * 1000, "added <= 300 ms",
                   {"added by the remote path": f"{added * 1000:.0f} ms", "runs": len(remote)}))
    executor = out["repeat"]["executor"]
    hits, ran = executor["action_cache_hits"], executor["executed"]
    report.add(Row(f"repeated deltamin ({max(walls)} bots): wall time", out["repeat_s"] * 1000, "first run",
                   walls[max(walls)] * 1000, "every trial a hit",
                   {"action-cache hit rate": f"{hits}/{hits + ran} = {hits / max(hits + ran, 1):.0%}"}))
    report.notes.append(f"target command sleeps {SLEEP_S} s; {FILES} files change, {len(CULPRITS)} culprits; "
                        "wall times include deltamin's final local check (one more run)")
    return report
