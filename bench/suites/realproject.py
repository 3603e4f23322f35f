"""``python bench/run.py realproject``: a real project's own test suite, in a capsule and on the host.

The project is more-itertools 10.5.0 from PyPI with its own ``.venv/`` (pytest) inside
the workspace, prepared once and cached under ``.cache/realprojects/`` (see
``tests/support/realprojects.py``); each measurement works on a fresh copy under /tmp.

- The whole suite (``pytest -q tests``, ~660 tests) through ``capsule_exec`` against the
  same command in the same tree on the host (same environment: PATH, LANG, HOME),
  alternating which goes first, so drift on these 2-core VMs falls on both.
- ``capsule_deltamin`` against textbook ddmin (``bench/suites/deltamin.py``) on the
  same real changes: the scenario's (two harmless edits and one breaking edit, through
  ``edit_text_file``) and a wider one (twelve more harmless edits across the package),
  each in the agent's loop: the tests pass, the edits, the tests fail, then deltamin
  (which takes both ends from the journal, and the failure's traceback as evidence).
  Textbook ddmin searches the hunks of the whole change flat, with real trials (each a
  fresh capsule, the subset written, the tests run), as ccw's trials are.
- ``capsule_replay`` of the scenario's witness (the runs of the loop) against the wall
  time of the original runs.

``--smoke`` runs every row once with a one-line check of ``chunked(strict=True)`` (the
function the breaking edit breaks) in place of both pytest commands: pytest's start
alone is seconds, and a smoke run makes some twenty runs.

Needs root (the helper runs privileged) and the registries once, to fill the cache.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import InProcess, Report, Row, in_process_tools, median_ms
from bench.suites.deltamin import _textbook
from tests.support import agent_loop, realprojects

PROJECT = realprojects.MORE_ITERTOOLS
SMOKE_CHECK = (".venv/bin/python", "-B", "-c",
               "from more_itertools import chunked; assert list(chunked(range(4), 2, strict=True)) == [[0, 1], [2, 3]]")
HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
WIDER_EVERY = 8  # the wider change marks every 8th top-level def of more.py and recipes.py


def _wider_edits(ws: Path) -> list[realprojects.Edit]:
    """Harmless edits: a comment after every ``WIDER_EVERY``-th one-line ``def`` of the package."""
    edits = []
    for rel in ("more_itertools/more.py", "more_itertools/recipes.py"):
        lines = (ws / rel).read_text().split("\n")
        defs = [line for line in lines if line.startswith("def ") and line.endswith("):") and lines.count(line) == 1]
        edits += [realprojects.Edit(rel, line, f"{line}  # reviewed") for line in defs[WIDER_EVERY // 2::WIDER_EVERY]]
    return edits


async def _full_suite(tools: InProcess, project: realprojects.Project, ws: Path, rounds: int) -> dict[str, list[float]]:
    import trio

    cap = (await tools.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    home = tempfile.mkdtemp(prefix="ccw-bench-home-")
    times: dict[str, list[float]] = {"capsule": [], "host": [], "in_jail": []}

    async def in_capsule() -> None:
        ran = await agent_loop.run_tests(tools.call, cap, project.full_cmd)
        assert ran["exit_code"] == 0, ran["stdout"][-2000:]
        times["in_jail"].append(ran["duration_ms"] / 1000)

    async def on_host() -> None:
        done = await trio.run_process(list(project.full_cmd), cwd=str(ws), env={**HOST_ENV, "HOME": home},
                                      capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 0, done.stdout[-2000:]

    try:
        await in_capsule()  # warm both: page cache, the helper's pools
        await on_host()
        for round_ in range(rounds):
            sides = [("capsule", in_capsule), ("host", on_host)]
            for name, side in sides[::-1] if round_ % 2 else sides:
                start = time.perf_counter()
                await side()
                times[name].append(time.perf_counter() - start)
    finally:
        await tools.call("capsule_destroy", {"capsule_id": cap})
        shutil.rmtree(home, ignore_errors=True)
    return times


async def _deltamin(tools: InProcess, project: realprojects.Project, ws: Path,
                    edits: list[realprojects.Edit]) -> dict[str, Any]:
    from mcp_server.capsules import trials as counterfactual
    from mcp_server.capsules.executors import LocalExecutor
    from mcp_server.fs import changeset
    from mcp_server.fs.view import RootView

    cap = (await tools.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    # The agent's loop (issue 13): the tests pass, edits, the tests fail, then deltamin.
    passing = await agent_loop.run_tests(tools.call, cap, project.test_cmd)
    assert passing["exit_code"] == 0, passing
    for item in edits:
        await agent_loop.edit(tools.call, cap, ws, item.path, item.old, item.new)
    failing = await agent_loop.run_tests(tools.call, cap, project.test_cmd)
    assert failing["exit_code"] not in (0, None), failing
    argv = list(project.test_cmd)
    start = time.perf_counter()
    ours = await tools.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": argv})
    ours_s = time.perf_counter() - start
    expected = [f"-{project.breaking.old}", f"+{project.breaking.new}"]
    assert agent_loop.changed_lines(ours["minimal_patch"]) == expected, ours["minimal_patch"]

    helper = await tools.ctx.helper()
    changes = await tools.ctx.capsules.changes(cap)
    root_fd = await helper.open_root(cap)
    with RootView.from_fd(root_fd) as capsule, RootView.open(str(ws)) as base:
        files = counterfactual.units_from(changeset.expand(changes, base, capsule), base, capsule)
        hunks = counterfactual.split_hunks(files, range(len(files.units)), base)
    record = tools.ctx.capsules.live_record(cap)
    trials = counterfactual.Trials(tools.ctx.capsules, record, hunks, argv, counterfactual.predicate("exit_code"),
                                    600_000, LocalExecutor())
    start = time.perf_counter()
    found, textbook_trials = await _textbook(trials, tuple(range(len(hunks.units))))
    textbook_s = time.perf_counter() - start
    assert [hunks.units[i].path for i in found] == [project.breaking.path], found
    # ddmin's count depends on where the culprit sits: here in the first half at every
    # level (chunked() is near the top of more.py), its best case.  The same search with
    # the hunks in reverse order shows the other end.
    _, reversed_trials = await _textbook(trials, tuple(reversed(range(len(hunks.units)))))
    await tools.call("capsule_destroy", {"capsule_id": cap})
    return {"ours_trials": ours["trials"], "ours_s": ours_s, "textbook_trials": textbook_trials,
            "textbook_s": textbook_s, "hunks": len(hunks.units), "cache_hits": ours["cache_hits"],
            "reversed_trials": reversed_trials}


async def _replay(tools: InProcess, project: realprojects.Project, ws: Path, scratch: Path,
                  repeat: int) -> dict[str, Any]:
    """The scenario's runs (pass, fail, pass after the fix), then its witness replayed ``repeat`` times."""
    cap = (await tools.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    original = []
    for step in ("pass", "break", "fail", "fix", "pass"):
        if step == "break":
            for item in (*project.harmless, project.breaking):
                await agent_loop.edit(tools.call, cap, ws, item.path, item.old, item.new)
            continue
        if step == "fix":
            await agent_loop.edit(tools.call, cap, ws, project.breaking.path, project.breaking.new,
                                  project.breaking.old)
            continue
        start = time.perf_counter()
        await agent_loop.run_tests(tools.call, cap, project.test_cmd)
        original.append(time.perf_counter() - start)
    witness = await tools.call("capsule_witness", {"capsule_id": cap})
    await tools.call("capsule_destroy", {"capsule_id": cap})
    times, results = [], []
    for i in range(repeat):
        async with in_process_tools(scratch / f"fresh-{i}") as fresh:
            start = time.perf_counter()
            # A fresh state dir has its own key and trusts none: the witness is "unknown key" there,
            # replayed as its maker's.
            results.append(await fresh.call("capsule_replay", {"path": witness["path"], "allow_untrusted": True}))
            times.append(time.perf_counter() - start)
    return {"original_s": sum(original), "replay_s": times, "replay_ok": [r["replay_ok"] for r in results],
            "output_identical": [r.get("output_identical") for r in results], "execs": results[-1].get("execs")}


async def _measure(root: Path, project: realprojects.Project, quick: bool, smoke: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with in_process_tools(root / "state") as tools:
        ws = realprojects.pristine(project, root / "suite")
        out["suite"] = await _full_suite(tools, project, ws, 1 if smoke else 2 if quick else 7)
        scenario = [*project.harmless, project.breaking]
        out["deltamin"] = [("scenario: 3 edits in 2 files",
                            await _deltamin(tools, project, realprojects.pristine(project, root / "d1"), scenario))]
        if not quick:
            ws = realprojects.pristine(project, root / "d2")
            wider = [*_wider_edits(ws), *scenario]
            label = f"wider: {len(wider)} edits in {len({e.path for e in wider})} files"
            out["deltamin"].append((label, await _deltamin(tools, project, ws, wider)))
        os.mkdir(root / "scratch")
        out["replay"] = await _replay(tools, project, realprojects.pristine(project, root / "r"), root / "scratch",
                                      1 if smoke else 2 if quick else 5)
    return out


def run(quick: bool = False, smoke: bool = False) -> Report:
    """Measure the suite, deltamin and replay on more-itertools; one copy of the project each."""
    import trio

    realprojects.prepared(PROJECT)  # the registries, once; not timed
    project = dataclasses.replace(PROJECT, test_cmd=SMOKE_CHECK, full_cmd=SMOKE_CHECK) if smoke else PROJECT
    root = Path(tempfile.mkdtemp(prefix="ccw-bench-realproject-"))
    try:
        out = trio.run(_measure, root, project, quick, smoke)
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    report = Report("realproject")
    suite = out["suite"]
    command = "smoke check of chunked" if smoke else "pytest -q tests"
    report.add(Row(
        f"{PROJECT.key} full suite ({command})", median_ms(suite["capsule"]), "same command on the host",
        median_ms(suite["host"]), "<= 1.05x",
        {"runs per side": len(suite["host"]),
         "the exec's own duration_ms (median)": f"{median_ms(suite['in_jail'][1:]):.0f} ms"},
    ))
    for label, found in out["deltamin"]:
        report.add(Row(
            f"deltamin, {label}: wall time", found["ours_s"] * 1000, "textbook ddmin", found["textbook_s"] * 1000,
            "", {"trials (ccw / textbook)": f"{found['ours_trials']} / {found['textbook_trials']} = "
                                            f"{found['ours_trials'] / found['textbook_trials']:.2f}x (target <= 0.6x)",
                 "textbook trials, hunks in reverse order": found["reversed_trials"],
                 "hunks in the change": found["hunks"], "cache hits": found["cache_hits"]},
        ))
    replay = out["replay"]
    report.add(Row(
        f"capsule_replay of the loop's witness ({replay['execs']} execs)", median_ms(replay["replay_s"]),
        "the original runs", replay["original_s"] * 1000, "",
        {"replay_ok": replay["replay_ok"], "output_identical": replay["output_identical"]},
    ))
    report.notes.append("the suite's sides alternate which goes first, round by round; deltamin runs once per side "
                        "(each is dozens of real capsule runs); each replay is on a fresh state dir")
    return report
