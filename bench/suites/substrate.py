"""Substrate benchmark: snapshot_grep beside ripgrep, snapshot_create beside git.

A generated tree of 10,000 text files, 100 MB (``--quick``: 1,000 files, 10 MB), in a
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
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from bench.common import Report, Row, median_ms, sample
from mcp_server.config import Config
from mcp_server.state import State
from mcp_server.tools import snapshot

NEEDLE = "zq_needle_7f3a"
WORDS = [
    "alpha", "beta", "gamma", "delta", "return", "import", "class", "def", "self", "value",
    "result", "config", "tree", "lease", "snapshot", "for", "in", "if", "else", "while",
]


class _Ctx:
    def __init__(self, root: Path, state: State) -> None:
        self.config = Config(workspace=str(root), state_dir=str(state.root))
        self.state = state

    async def helper(self) -> Any:
        raise RuntimeError("no helper")

    async def roots(self) -> None:
        return None

    async def progress(self, *args: Any) -> None:
        return None

    def log(self, message: str) -> None:
        return None


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


def _call(ctx: _Ctx, handler: Any, args: dict[str, Any]) -> dict[str, Any]:
    return anyio.run(handler, ctx, args, backend="trio")


def run(quick: bool) -> Report:
    """Measure and return the report."""
    files, size, repeat = (1000, 10_000_000, 3) if quick else (10_000, 100_000_000, 5)
    report = Report("substrate")
    work = Path(tempfile.mkdtemp(prefix="ccw-bench-substrate-"))
    try:
        tree = work / "tree"
        tree.mkdir()
        _generate(tree, files, size)
        _git(tree, "init", "-q")
        _git(tree, "add", "-A")
        _git(tree, "commit", "-qm", "bench")
        state = State(work / "state")
        ctx = _Ctx(tree, state)

        found = _call(ctx, snapshot.snapshot_grep, {"pattern": NEEDLE, "max_files": 1_000_000})
        rg = subprocess.run(["rg", "-F", "-c", NEEDLE, str(tree)], capture_output=True, check=True)
        grep_ms = median_ms(sample(lambda: _call(ctx, snapshot.snapshot_grep, {"pattern": NEEDLE, "max_files": 1_000_000}), repeat))
        rg_ms = median_ms(sample(lambda: subprocess.run(["rg", "-F", NEEDLE, str(tree)], capture_output=True, check=True), repeat))
        report.add(Row(
            "snapshot_grep literal (worktree)", grep_ms, "rg -F", rg_ms, "<= 3x",
            {"files": files, "bytes": size, "matches": len(found["matches"]), "rg files with matches": len(rg.stdout.splitlines())},
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
        for _ in range(repeat + 1):
            git_fresh()
            git_times.extend(sample(git_create, 1, warmup=0))
            shutil.rmtree(state.objects_dir / "sha256", ignore_errors=True)
            fresh = State(work / f"state-{len(ccw_times)}")
            fresh_ctx = _Ctx(tree, fresh)
            ccw_times.extend(sample(partial(_call, fresh_ctx, snapshot.snapshot_create, {}), 1, warmup=0))
            fresh.close()
            shutil.rmtree(work / f"state-{len(ccw_times) - 1}")
        report.add(Row(
            "snapshot_create whole tree (fresh store)", median_ms(ccw_times[1:]),
            "git add -A && git write-tree", median_ms(git_times[1:]), "<= 2x", {"files": files, "bytes": size},
        ))
        state.close()
        report.notes.append("first create/add run discarded as warm-up; grep and rg run on a warm page cache")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report
