"""Substrate benchmark: snapshot_grep beside ripgrep, snapshot_create beside git.

A generated tree of 10,000 text files, 100 MB (``--quick``, a smoke run: 200 files, 2 MB), in a
committed git repository.  ``snapshot_grep`` (worktree mode: fingerprint, lease, git's
candidate list, binary sniffing, search) looks for a literal planted in 1% of the files,
beside ``rg -F`` on the same tree.  ``snapshot_create`` of the whole tree (fresh blob
store every run, so every blob is compressed and written) runs beside
``git add -A && git write-tree`` in a scratch copy with a fresh repository every run.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from bench.common import Report, Row, in_process_tools, median_ms, sample

NEEDLE = "zq_needle_7f3a"
WORDS = [
    "alpha", "beta", "gamma", "delta", "return", "import", "class", "def", "self", "value",
    "result", "config", "tree", "lease", "snapshot", "for", "in", "if", "else", "while",
]


def _git(repo: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@e", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@e")
    # gc.auto=0: an automatic repack in the background would run into the measurements.
    subprocess.run(["git", "-c", "gc.auto=0", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _generate(root: Path, files: int, total_bytes: int) -> None:
    rng = random.Random(7)
    per_file = total_bytes // files
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(4, 14))) + "\n" for _ in range(4000)]
    for i in range(files):
        d = root / f"pkg{i % 50:02d}" / f"mod{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        chunks: list[str] = []
        size = 0
        while size < per_file:
            line = rng.choice(lines)
            chunks.append(line)
            size += len(line)
        if i % 100 == 0:
            chunks.insert(len(chunks) // 2, f"    found = {NEEDLE}(value)\n")
        (d / f"file{i:05d}.py").write_text("".join(chunks))


async def _seconds(call: Callable[[], Awaitable[Any]], repeat: int, warmup: int = 1) -> list[float]:
    """``sample`` for a coroutine: seconds per run after ``warmup`` unmeasured runs."""
    for _ in range(warmup):
        await call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return times


async def _grep(work: Path, tree: Path, repeat: int) -> tuple[list[float], dict[str, Any]]:
    """snapshot_grep over the tree (the server's workspace: no client roots), its times and one answer."""
    async with in_process_tools(work / "state", {"CCW_WORKSPACE": str(tree), "CCW_TOOLSETS": "snapshot"}) as tools:
        args = {"pattern": NEEDLE, "max_files": 1_000_000}
        found = await tools.call("snapshot_grep", args)
        return await _seconds(lambda: tools.call("snapshot_grep", args), repeat), found


async def _create(state_dir: Path, tree: Path) -> float:
    """Seconds of one snapshot_create of the whole tree into a fresh state dir (every blob written)."""
    async with in_process_tools(state_dir, {"CCW_WORKSPACE": str(tree), "CCW_TOOLSETS": "snapshot"}) as tools:
        start = time.perf_counter()
        await tools.call("snapshot_create", {})
        return time.perf_counter() - start


def run(quick: bool) -> Report:
    """Measure and return the report."""
    files, size, repeat = (200, 2_000_000, 3) if quick else (10_000, 100_000_000, 5)
    report = Report("substrate")
    work = Path(tempfile.mkdtemp(prefix="ccw-bench-substrate-"))
    try:
        tree = work / "tree"
        tree.mkdir()
        _generate(tree, files, size)
        _git(tree, "init", "-q")
        _git(tree, "add", "-A")
        _git(tree, "commit", "-qm", "bench")

        grep_times, found = trio.run(_grep, work, tree, repeat)
        rg = subprocess.run(["rg", "-F", "-c", NEEDLE, str(tree)], capture_output=True, check=True)
        rg_ms = median_ms(sample(
            lambda: subprocess.run(["rg", "-F", NEEDLE, str(tree)], capture_output=True, check=True), repeat))
        report.add(Row(
            "snapshot_grep literal (worktree)", median_ms(grep_times), "rg -F", rg_ms, "<= 3x",
            {"files": files, "bytes": size, "matches": len(found["matches"]),
             "rg files with matches": len(rg.stdout.splitlines())},
        ))

        scratch = work / "scratch"
        shutil.copytree(tree, scratch, ignore=shutil.ignore_patterns(".git"))

        def git_fresh() -> None:
            shutil.rmtree(scratch / ".git", ignore_errors=True)
            _git(scratch, "init", "-q")

        def git_create() -> None:
            _git(scratch, "add", "-A")
            _git(scratch, "write-tree")

        git_times: list[float] = []
        ccw_times: list[float] = []
        for i in range(repeat + 1):
            git_fresh()
            git_times.extend(sample(git_create, 1, warmup=0))
            fresh = work / f"state-{i}"
            ccw_times.append(trio.run(_create, fresh, tree))
            shutil.rmtree(fresh)
        report.add(Row(
            "snapshot_create whole tree (fresh store)", median_ms(ccw_times[1:]),
            "git add -A && git write-tree", median_ms(git_times[1:]), "<= 2x", {"files": files, "bytes": size},
        ))
        report.notes.append("first create/add run discarded as warm-up; grep and rg run on a warm page cache")
        report.notes.append("ccw's tools are called in process through the server's pipeline "
                            "(bench.common.in_process_tools)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report
