"""``python bench/run.py scaleout``: deltamin on a REAPI cluster of 1, 2 and 4 ccw-bots (issue 17).

Brings up the local cluster (PostgreSQL + BuildGrid, mcp_server.devcluster.cluster) and
ccw-bot processes (each with its own embedded helper, capacity 1) on this machine, and
measures:

- **deltamin wall time with 1, 2 and 4 bots** (parallelism = bots) for changes whose
  target command is dominated by waiting (it sleeps ``SLEEP_S``), so bots on one
  2-core machine can overlap.  Every changed file is imported by the check (no
  evidence shortcut); the check fails when all of a case's culprits are changed.  Two
  cases, both run on the same bots at each count: a **narrow** one (16 files, two
  culprits: about 7 bits to learn, so few rounds at any width) and a **wide** one (an
  interaction bug: 32 files, four culprits, one in each quarter).  Each (case, bot
  count) gets a workspace of its own (a different check.py), so no run is answered
  from an earlier run's action cache.  The time includes deltamin's final check, which
  runs locally and answers the search's last question (core/deltamin.py ``decisive``).
  Beside each row: the pure search's rounds, and ddmin's (the algorithm deltamin used
  before group testing: 1.4x at most with 4 bots on these changes).
- **throughput**: ``TOGETHER`` deltamins at once (separate capsules, one trial at a
  time each) on 1 bot and on 4: what a cluster gains when CI minimises or replays
  many changes.
- **per-trial overhead**: one trivial trial (``true``) through the cluster (a fresh
  Execute: no cache lookup, nothing cached) against the same trial in a local scratch
  capsule, medians; the difference is what the remote path adds.
- **the repeated run's cache hit rate**: the 4-bot deltamin again on the same capsule;
  every trial should be an action-cache hit.
- **a lease's input root**: a project-sized tree (``ROOT_DIRS`` directories of
  ``ROOT_FILES`` files, one file different in each lease, as trials differ) made ready
  from a root a bot kept (inputs.InputRoots) against laid out afresh from the host's
  cache (every file a link), from the cluster's CAS, medians.

``--smoke`` runs every row on a 4-file change whose check does not sleep, with bots not
given time to start (Execute queues until one attaches) and a 20-file input root: the
cluster's own start (PostgreSQL, BuildGrid) is most of its time.

Needs root (the helpers run privileged), PostgreSQL (installed from Debian if absent)
and a Python >= 3.13 for BuildGrid (see mcp_server/devcluster/cluster.py).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import InProcess, Report, Row, in_process_tools

SLEEP_S = 1.0
BOT_COUNTS = (1, 2, 4)
OVERHEAD_REPEAT = 15
BOT_START_S = 4.0
TOGETHER = 4  # deltamins at once (CI minimising or replaying many changes)
ROOT_DIRS, ROOT_FILES, ROOT_LEASES = 250, 10, 15  # a lease's input root: about a real project with its .venv


@dataclass(frozen=True)
class Case:
    """A change of ``files`` one-line files whose check fails when every one of ``culprits`` is changed."""

    name: str
    label: str
    files: int
    culprits: tuple[int, ...]

    def check(self, tag: str, sleep_s: float) -> str:
        """check.py: import every file, wait, fail when the culprits are all changed."""
        imports = ", ".join(f"m{i:02}" for i in range(self.files))
        bad = " and ".join(f"m{i:02}.VALUE == 1" for i in self.culprits)
        return f"# {tag}\nimport time, {imports}\ntime.sleep({sleep_s})\nraise SystemExit(1 if {bad} else 0)\n"

    def workspace(self, ws: Path, tag: str, sleep_s: float) -> None:
        """The base: every file at 0, and the check."""
        ws.mkdir()
        for i in range(self.files):
            (ws / f"m{i:02}.py").write_text("VALUE = 0\n")
        (ws / "check.py").write_text(self.check(tag, sleep_s))

    @property
    def answer(self) -> list[str]:
        """The units deltamin must keep."""
        return [f"m{i:02}.py" for i in self.culprits]


NARROW = Case("narrow", "narrow: 2 culprits of 16 files", 16, (3, 11))
WIDE = Case("wide", "wide: interaction of 4 culprits of 32 files, one per quarter", 32, (3, 11, 19, 27))
CASES = (NARROW, WIDE)
SMOKE_NARROW = Case("narrow", "narrow (smoke): 1 culprit of 4 files", 4, (1,))


@dataclass(frozen=True)
class Scale:
    """What a run does: the full run's, ``--quick``'s or ``--smoke``'s sizes."""

    cases: tuple[Case, ...]  # the first is the narrow one, the other figures' change
    counts: tuple[int, ...]
    together: int
    sleep_s: float = SLEEP_S
    bot_start_s: float = BOT_START_S
    overhead_repeat: int = OVERHEAD_REPEAT
    root: tuple[int, int, int] = (ROOT_DIRS, ROOT_FILES, ROOT_LEASES)  # dirs, files a dir, leases

    @property
    def narrow(self) -> Case:
        """The change of the throughput, overhead and repeated-run figures."""
        return self.cases[0]


FULL = Scale(CASES, BOT_COUNTS, TOGETHER)
QUICK = Scale((NARROW,), BOT_COUNTS[:2], 2)  # the wide case took over a minute, 4 deltamins at once on 1 bot 45 s
SMOKE = Scale((SMOKE_NARROW,), BOT_COUNTS[:2], 2, sleep_s=0, bot_start_s=0, overhead_repeat=1, root=(10, 2, 2))


CMD = ["/usr/bin/python3", "-B", "check.py"]
CHANGE = "for f in m*.py; do echo 'VALUE = 1' > $f; done"


class Bench:
    """One state dir's tools (bench.common.in_process_tools), one cluster, bots started and stopped per measurement."""

    def __init__(self, root: Path, cluster: Any, tools: InProcess, scale: Scale) -> None:
        self.root = root
        self.cluster = cluster
        self.call = tools.call
        self.ctx = tools.ctx
        self.scale = scale

    async def capsule(self, tag: str, case: Case | None = None) -> str:
        """A capsule whose journal saw the check pass on the base and fail on the change (no confirmation runs)."""
        ws = self.root / f"ws-{tag}"
        (case or self.scale.narrow).workspace(ws, tag, self.scale.sleep_s)
        cap = (await self.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        assert (await self.call("capsule_exec", {"capsule_id": cap, "cmd": CMD}))["exit_code"] == 0
        await self.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", CHANGE]})
        assert (await self.call("capsule_exec", {"capsule_id": cap, "cmd": CMD}))["exit_code"] == 1
        return cap

    def bots(self, count: int, tag: str) -> list[Any]:
        """``count`` ccw-bots of capacity 1."""
        from mcp_server.devcluster.cluster import start_bot

        return [start_bot(self.cluster.url, f"{tag}-{i}", self.root / "bots" / f"{tag}-{i}") for i in range(count)]

    async def deltamin(self, cap: str, parallel: int, case: Case | None = None) -> tuple[float, dict[str, Any]]:
        """Seconds and result of a deltamin through the cluster (``parallel`` trials at once)."""
        from mcp_server.capsules.deltamin import Question, deltamin
        from mcp_server.capsules.remote import ReapiExecutor

        executor = ReapiExecutor(self.cluster.url, parallel)
        start = time.perf_counter()
        try:
            result = await deltamin(self.ctx.capsules, Question(cap, CMD), executor)
        finally:
            executor.close()
        assert result["units"] == (case or self.scale.narrow).answer, result["units"]
        return time.perf_counter() - start, result

    async def together(self, bots: int, deltamins: int = TOGETHER) -> float:
        """Seconds for ``deltamins`` deltamins at once, on capsules of their own, one trial at a time each."""
        import trio

        caps = [await self.capsule(f"t{bots}-{i}") for i in range(deltamins)]
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for cap in caps:
                nursery.start_soon(self.deltamin, cap, 1)
        return time.perf_counter() - start

    async def overhead(self) -> tuple[list[float], list[float]]:
        """Seconds per trivial trial: through the cluster (fresh), and in a local scratch capsule."""
        from mcp_server.capsules.exec import exec_request
        from mcp_server.capsules.executors import LocalExecutor
        from mcp_server.capsules.remote import ReapiExecutor
        from mcp_server.capsules.trials import Trial

        cap = (await self.call("capsule_create", {"workspace": str(self.root / "ws-narrow-1")}))["capsule_id"]
        record = self.ctx.capsules.live_record(cap)
        remote, local = ReapiExecutor(self.cluster.url), LocalExecutor()
        times: dict[str, list[float]] = {"remote": [], "local": []}
        try:
            for i in range(self.scale.overhead_repeat + 1):
                for name, executor in (("remote", remote), ("local", local)):
                    trial = Trial(record, {}, exec_request(cap, ["true"], record.workspace, 60_000), fresh=True)
                    start = time.perf_counter()
                    run = await executor.run_trial(self.ctx.capsules, trial)
                    if i:  # the first of each is a warm-up
                        times[name].append(time.perf_counter() - start)
                    assert run.exit_code == 0
        finally:
            remote.close()
        return times["remote"], times["local"]


def _input_roots(url: str, root: Path, size: tuple[int, int, int]) -> tuple[list[float], list[float]]:
    """Seconds to make each lease's input root ready: from a kept root, and laid out afresh (both from the cache);
    ``size``: the tree's directories, files a directory, and leases."""
    from mcp_server.reapi.client import ReapiClient
    from mcp_server.reapi.inputs import BlobCache, InputRoots, fetch_input_root
    from mcp_server.reapi.merkle import Entry, FileEntry, build_tree

    base: dict[str, Entry] = {f"pkg{d // 10:02}/sub{d % 10}/mod{f}.py": FileEntry(data=f"VALUE = {d}{f}\n".encode())
                              for d in range(size[0]) for f in range(size[1])}  # fmt: skip
    trees = [build_tree({**base, f"pkg{i:02}/sub0/mod0.py": FileEntry(data=f"CHANGED = {i}\n".encode())})
             for i in range(size[2])]  # fmt: skip
    cache = BlobCache(root / "cas")
    roots = InputRoots(root / "roots", cache)
    fresh: list[float] = []
    kept: list[float] = []
    with ReapiClient(url) as client:
        for tree in trees:
            client.upload_tree(tree, {})
        for i, tree in enumerate(trees):
            dest = root / f"fresh-{i}"
            dest.mkdir()
            start = time.perf_counter()
            fetch_input_root(client, tree.root, dest, cache)
            fresh.append(time.perf_counter() - start)
            shutil.rmtree(dest)
            start = time.perf_counter()
            with roots.checkout(client, tree.root):
                kept.append(time.perf_counter() - start)
    return kept[1:], fresh[1:]  # the first of each filled the cache, or laid the kept root out


async def _measure(root: Path, cluster: Any, scale: Scale) -> dict[str, Any]:
    """Both cases at each bot count on the same bots (interleaved), then the other figures."""
    import trio

    from mcp_server.devcluster.cluster import stop_bot

    cases = scale.cases
    out: dict[str, Any] = {"walls": {c.name: {} for c in cases}, "trials": {c.name: {} for c in cases},
                           "together_n": scale.together}
    async with in_process_tools(root / "state") as tools:
        bench = Bench(root, cluster, tools, scale)
        out["roots"] = await trio.to_thread.run_sync(_input_roots, cluster.url, root / "input-roots", scale.root)
        counts = scale.counts
        for count in counts:
            caps = {case.name: await bench.capsule(f"{case.name}-{count}", case) for case in cases}
            bots = bench.bots(count, f"b{count}")
            try:
                await trio.sleep(scale.bot_start_s)  # each bot starts its helper and opens its session
                for case in cases:
                    wall, result = await bench.deltamin(caps[case.name], count, case)
                    out["walls"][case.name][count], out["trials"][case.name][count] = wall, result["trials"]
                if count == max(counts):
                    out["repeat_s"], out["repeat"] = await bench.deltamin(caps[scale.narrow.name], count)
                if count == 1:
                    out["overhead"] = await bench.overhead()
                if count in (1, max(counts)):
                    out.setdefault("together", {})[count] = await bench.together(count, out["together_n"])
            finally:
                for bot in bots:
                    stop_bot(bot)
    return out


def search_rounds(case: Case, parallel: int, kind: str = "search") -> tuple[int, int]:
    """Trials and remote rounds (batches) of ``case``'s search at ``parallel``, by the pure search alone.

    A round's trials run at once, so with enough bots wall time follows rounds, not trials:
    trials at 1 over rounds at N is the most N bots can gain on this change.  A lone
    decisive last trial is deltamin's local final check, not a remote round (so not counted).
    """
    from mcp_server.core.deltamin import FAIL, PASS, Ddmin, Search, decisive

    search = (Search(tuple(range(case.files)), parallel) if kind == "search"
              else Ddmin(tuple(range(case.files)), parallel))
    rounds = trials = 0
    while batch := search.next_batch():
        if not (kind == "search" and len(batch) == 1 and decisive(search, batch[0])):
            rounds, trials = rounds + 1, trials + len(batch)
        search.report([FAIL if set(case.culprits) <= set(subset) else PASS for subset in batch])
    return trials, rounds


def _case_rows(report: Report, case: Case, walls: dict[int, float], trials: dict[int, int]) -> None:
    """One row per bot count, against 1 bot, with the pure search's bound (and ddmin's) beside it."""
    sequential = search_rounds(case, 1)[0]
    for count, wall in walls.items():
        rounds = search_rounds(case, count)[1]
        report.add(Row(f"deltamin, {case.label}, {count} bot(s): wall time", wall * 1000, "1 bot",
                       walls[1] * 1000, "<= 0.33x with 4" if count == 4 else "",
                       {"trials (with confirmation and final check)": trials[count],
                        "remote rounds of the search": rounds,
                        "best possible (trials at 1 / rounds)": f"{sequential / rounds:.2f}x faster",
                        "ddmin's rounds instead": search_rounds(case, count, "ddmin")[1]}))


def _bounds_note(counts: list[int]) -> str:
    """What the search allows, case by case, against ddmin."""
    parts = []
    for case in CASES:
        rounds = "/".join(str(search_rounds(case, n)[1]) for n in counts)
        ddmin = "/".join(str(search_rounds(case, n, "ddmin")[1]) for n in counts)
        best = search_rounds(case, 1)[0] / search_rounds(case, max(counts))[1]
        parts.append(f"{case.name}: {rounds} remote rounds at parallelism {'/'.join(map(str, counts))} "
                     f"(ddmin: {ddmin}), so {max(counts)} bots gain at most {best:.2f}x")
    return ("one deltamin is bounded by its search's rounds: group testing asks each round's questions "
            "independently, where ddmin's end at their first failing trial; " + "; ".join(parts))


def run(quick: bool = False, smoke: bool = False) -> Report:
    """One cluster for the suite; every figure from the same run."""
    import trio

    from mcp_server.devcluster.cluster import temporary_cluster

    report = Report("scaleout")
    scale = SMOKE if smoke else QUICK if quick else FULL
    root = Path(tempfile.mkdtemp(prefix="ccw-bench-scaleout-"))
    try:
        with temporary_cluster() as cluster:
            out = trio.run(_measure, root, cluster, scale)
            report.notes.append(f"cluster up in {cluster.timings['ready_s']:.1f} s {cluster.timings}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for case in scale.cases:
        _case_rows(report, case, out["walls"][case.name], out["trials"][case.name])
    together = out["together"]
    report.add(Row(f"{out['together_n']} deltamins at once (narrow), {max(together)} bots",
                   together[max(together)] * 1000, "1 bot", together[1] * 1000, "<= 0.33x",
                   {"each": "parallelism 1, a capsule of its own"}))
    remote, local = out["overhead"]
    added = statistics.median(remote) - statistics.median(local)
    report.add(Row("trivial trial through the cluster", statistics.median(remote) * 1000, "local scratch capsule",
                   statistics.median(local) * 1000, "added <= 300 ms",
                   {"added by the remote path": f"{added * 1000:.0f} ms", "runs": len(remote)}))
    kept, fresh = out["roots"]
    dirs, files, _ = scale.root
    report.add(Row(f"a lease's input root ({dirs} dirs, {dirs * files} files, one changed)",
                   statistics.median(kept) * 1000, "laid out afresh from the host's cache",
                   statistics.median(fresh) * 1000, "",
                   {"how": "a kept root, synced by what differs", "leases": len(kept)}))  # fmt: skip
    walls = out["walls"][scale.narrow.name]
    executor = out["repeat"]["executor"]
    hits, ran = executor["action_cache_hits"], executor["executed"]
    report.add(Row(f"repeated deltamin (narrow, {max(walls)} bots): wall time", out["repeat_s"] * 1000,
                   "first run", walls[max(walls)] * 1000, "every trial a hit",
                   {"action-cache hit rate": f"{hits}/{hits + ran} = {hits / max(hits + ran, 1):.0%}"}))
    report.notes.append(_bounds_note(sorted(walls)))
    report.notes.append(f"target command sleeps {scale.sleep_s} s; "
                        "wall times include deltamin's final local check (one more run)")
    return report
