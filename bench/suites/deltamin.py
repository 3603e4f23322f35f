"""``python bench/run.py deltamin``: capsule_deltamin against textbook ddmin, same cases, same run.

The baseline is the algorithm as Zeller & Hildebrandt wrote it: no cache, no evidence,
one trial at a time.  Both sides run every trial for real (a fresh capsule over the
base, the subset written into it, the target command executed), so trial counts and wall
times compare like with like.  ccw's count includes its confirmation runs (the full and
the empty change); its final verification run is not a search trial on either side.

Cases (32 changed files each): the target command reads a handful of files, as a test
reads the modules it imports, and fails when its culprits are all changed; plus one
case where it reads every file, so evidence cannot help (reported, not hidden).
Needs root (the helper runs privileged).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Report, Row, in_process_tools

N = 32
CASES = [
    ("k=1, reads 4", [7], [7, 12, 20, 25]),
    ("k=2, reads 4", [3, 29], [3, 10, 29, 30]),
    ("k=3 together, reads 5", [0, 16, 31], [0, 8, 16, 24, 31]),
    ("k=2, reads all 32", [5, 22], list(range(N))),
]


def _check(culprits: list[int], reads: list[int]) -> list[str]:
    files = " ".join(f"f{i:02}.txt" for i in reads)
    bad = " ".join(f"f{i:02}.txt" for i in culprits)
    return ["sh", "-c", f"cat {files} >/dev/null; for f in {bad}; do grep -q BAD $f || exit 0; done; exit 1"]


async def _textbook(trials: Any, units: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Textbook ddmin (tests/support/textbook_ddmin.py), each trial run for real by ``trials``."""
    from tests.support.textbook_ddmin import TextbookDdmin

    search = TextbookDdmin(units)
    while batch := search.next_batch():
        search.report([await trials.outcome(candidate) for candidate in batch])
    return search.result, search.trials


async def _case(root: Path, name: str, culprits: list[int], reads: list[int]) -> dict[str, Any]:
    from mcp_server.capsules import trials as counterfactual
    from mcp_server.capsules.executors import LocalExecutor
    from mcp_server.fs import changeset
    from mcp_server.fs.view import RootView

    ws = root / "ws"
    ws.mkdir()
    for i in range(N):
        (ws / f"f{i:02}.txt").write_text("ok\n")
    async with in_process_tools(root / "state") as tools:
        call, ctx = tools.call, tools.ctx
        cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        script = "; ".join(f"echo {'BAD' if i in culprits else 'fine'} >> f{i:02}.txt" for i in range(N))
        await call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]})
        argv = _check(culprits, reads)
        await call("capsule_exec", {"capsule_id": cap, "cmd": argv})
        start = time.perf_counter()
        ours = await call("capsule_deltamin", {"capsule_id": cap, "target_cmd": argv})
        ours_s = time.perf_counter() - start
        # The baseline searches the same units with real trials, sequentially.
        helper = await ctx.helper()
        changes = await ctx.capsules.changes(cap)
        root_fd = await helper.open_root(cap)
        with RootView.from_fd(root_fd) as capsule, RootView.open(str(ws)) as base:
            material = counterfactual.units_from(changeset.expand(changes, base, capsule), base, capsule)
        record = ctx.capsules.live_record(cap)
        trials = counterfactual.Trials(ctx.capsules, record, material, argv, counterfactual.predicate("exit_code"),
                                        600_000, LocalExecutor())
        start = time.perf_counter()
        found, textbook_trials = await _textbook(trials, tuple(range(len(material.units))))
        textbook_s = time.perf_counter() - start
    expected = [f"f{i:02}.txt" for i in culprits]
    assert ours["units"] == expected, (ours["units"], expected)
    assert sorted(material.units[i].path for i in found) == expected
    return {
        "name": name, "ours_trials": ours["trials"], "ours_s": ours_s,
        "textbook_trials": textbook_trials, "textbook_s": textbook_s,
        "cache_hits": ours["cache_hits"], "one_minimal": ours["one_minimal"],
    }


def run(quick: bool = False) -> Report:
    """Each case once per side (each is itself dozens of capsule runs)."""
    import trio

    report = Report("deltamin")
    total = {"ours_trials": 0, "textbook_trials": 0, "ours_s": 0.0, "textbook_s": 0.0}
    cases = CASES[:1] if quick else CASES  # quick, a smoke run: k=2's textbook side alone took 27 s
    for name, culprits, reads in cases:
        root = Path(tempfile.mkdtemp(prefix="ccw-bench-deltamin-"))
        try:
            result = trio.run(_case, root, name, culprits, reads)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for key in total:
            total[key] += result[key]
        report.add(Row(
            f"{name}: wall time", result["ours_s"] * 1000, "textbook ddmin", result["textbook_s"] * 1000,
            "<= 0.5x",
            {"trials (ccw / textbook)": f"{result['ours_trials']} / {result['textbook_trials']} = "
                                        f"{result['ours_trials'] / result['textbook_trials']:.2f}x (target <= 0.6x)",
             "cache hits": result["cache_hits"], "1-minimal": result["one_minimal"]},
        ))
    report.add(Row(
        "all cases: wall time", total["ours_s"] * 1000, "textbook ddmin", total["textbook_s"] * 1000, "<= 0.5x",
        {"trials (ccw / textbook)": f"{total['ours_trials']} / {total['textbook_trials']} = "
                                    f"{total['ours_trials'] / total['textbook_trials']:.2f}x (target <= 0.6x)"},
    ))
    report.notes.append("each case runs once per side: every trial is a real capsule create + exec + destroy")
    return report
