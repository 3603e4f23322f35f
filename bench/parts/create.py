"""Capsule creation against copying the tree: flat in workspace size, or not.

Trees of 1,000 and 100,000 small files are generated under /tmp once per run and
committed to git (for ``git worktree add``).  ccw's figure is the median of
``CapsuleManager.create`` alone (the destroy after each is not timed; the two sizes take
turns, create by create); the baselines are ``cp -a`` of the tree and ``git worktree
add --detach`` of its commit, fewer times for the big tree because each takes seconds
(writing the 100,000 files alone takes a minute on a slow VM disk).  Needs root (mounts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from bench.common import Row, median_ms

SIZES = (1_000, 100_000)
# --quick, a smoke run: cp -a and git worktree add of 10,000 files took 16 and 27 s under load
QUICK_SIZES = (1_000, 3_000)
FILES_PER_DIR = 100


def make_tree(root: str, files: int) -> None:
    """``files`` small files in directories of FILES_PER_DIR, committed to git."""
    os.makedirs(root)
    for index in range(files):
        directory = os.path.join(root, f"d{index // FILES_PER_DIR:04d}")
        if index % FILES_PER_DIR == 0:
            os.mkdir(directory)
        with open(os.path.join(directory, f"f{index:06d}.txt"), "w") as file:
            file.write(f"file {index}\n")
    git = ["git", "-C", root, "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    # No background auto-gc: it would repack .git/objects while cp -a copies them.
    subprocess.run([*git, "config", "gc.auto", "0"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tree"], check=True)


def _time_create(manager: object, workspace: str, repeat: int) -> list[float]:
    from sandbox.manager import CapsuleManager
    from sandbox.spec import CapsuleSpec

    assert isinstance(manager, CapsuleManager)
    spec = CapsuleSpec(workspace)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        capsule = manager.create(0, 0, spec)
        elapsed = time.perf_counter() - start
        manager.destroy(capsule.capsule_id, 0)
        times.append(elapsed)
    return times


def _time_command(make: list[str], cleanup: list[str] | None, target: str, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(make, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
        if cleanup:
            subprocess.run(cleanup, check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(target, ignore_errors=True)
    return times


def measure(repeat: int, quick: bool) -> list[Row]:
    """Rows: create per size beside cp -a and git worktree add, and the 100k/1k ratio."""
    from sandbox.manager import CapsuleManager

    if os.geteuid() != 0:
        return [Row("capsule create", float("nan"), target="needs root", extra={"skipped": "not root"})]
    scratch = tempfile.mkdtemp(prefix="ccw-bench-create-")
    rows: list[Row] = []
    try:
        manager = CapsuleManager(os.path.join(scratch, "state"), rootless=False)
        manager.recover()
        warm = os.path.join(scratch, "warm")
        os.mkdir(warm)
        _time_create(manager, warm, 3)  # imports, the disk template, the pool
        sizes = QUICK_SIZES if quick else SIZES
        trees = {files: os.path.join(scratch, f"tree{files}") for files in sizes}
        for files, tree in trees.items():
            make_tree(tree, files)
        # Write the fresh trees back first: their dirty pages flushing during the timed
        # creates would be measured as create cost (seen: 2 ms instead of 0.5 ms).
        subprocess.run(["sync"], check=True)
        # The sizes take turns, create by create: whatever the machine does meanwhile
        # (writeback, the inode allocator after the big tree's 100,000 creations) falls on
        # both alike, so the ratio compares the workspaces, not the moments (measured one
        # size after the other, the ratio ranged 1.14-3.62x over three runs).
        runs = repeat if quick else max(repeat, 30)
        times: dict[int, list[float]] = {files: [] for files in sizes}
        for _ in range(runs):
            for files, tree in trees.items():
                times[files] += _time_create(manager, tree, 1)
        medians = {files: median_ms(times[files]) for files in sizes}
        for files, tree in trees.items():
            base_repeat = max(1, repeat // (10 if files > 10_000 else 3))
            ccw = medians[files]
            copy = os.path.join(scratch, "copy")
            cp = median_ms(_time_command(["cp", "-a", tree, copy], None, copy, base_repeat))
            worktree = os.path.join(scratch, "worktree")
            git = median_ms(_time_command(
                ["git", "-C", tree, "worktree", "add", "-q", "--detach", worktree, "HEAD"],
                ["git", "-C", tree, "worktree", "remove", "--force", worktree], worktree, base_repeat))
            label = f"{files:,} files"
            rows.append(Row(f"capsule create, {label}", ccw, "cp -a", cp, "<= 5 ms",
                            {"runs": runs, "baseline runs": base_repeat}))
            rows.append(Row(f"capsule create, {label}", ccw, "git worktree add", git, "<= 5 ms"))
        small, big = sizes
        rows.append(Row(f"capsule create {big:,} vs {small:,} files", medians[big],
                        f"create on {small:,}", medians[small], "<= 1.3x"))
    finally:
        for point in reversed(_mounts_under(scratch)):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def _mounts_under(path: str) -> list[str]:
    from sandbox import mountinfo

    return mountinfo.mounts_under(path)
