"""capsule_merge of two capsules of 1,000 changed files each against ``git merge`` of the same two branches.

A 2,000-file git repository (20 lines a file, in directories of 100); one capsule over
it is forked twice, and each fork edits one line of 1,000 files, the first the first
half of the files and the second the other half (done once, by a shell loop in each
jail, not timed).  The same edits are committed on two branches of a copy of the
repository.  Timed, in turns in a new order every round:

- ``capsule_merge {into: "new"}``: list both capsules' changes (the helper lists one
  capsule after the other) and the base, merge path by path, fork the first capsule with
  the second's layers stacked over it, and journal the 2,000 files (the merged capsule's
  destroy after it is not timed);
- ``capsule_merge {dry_run: true}``: the same without the capsule (the merge alone);
- ``git merge --no-edit`` of the second branch into a fresh branch at the first: the
  tree merge, the 1,000 files written to the work tree, the index and the commit (the
  ``git checkout -B`` that resets the work branch before it is not timed).

The target (issue 39) is ccw's ``into: "new"`` within 1.5 times git's.  git writes the
second side's 1,000 files into the first branch's work tree; ccw writes none of them: the
merged capsule stacks the second capsule's layer over a fork of the first
(capsules/merge.py), and since no file here was changed by both, no file is read or
written (merge_plan.needing_bytes).  The base's 2,000 files it only ``lstat``s, their
digests taken from the base directory's stat cache (fs/statcache.py, as git's index spares
it reading its work tree) once a merge has hashed them (the warm-up's, every round
after), and those digests give the live check its states (merge._lower_recorded).  The
cache keeps no entry for a file changed less than ``RACY_NS`` (3 s) before (git's racy
rule), so the warm-up waits until the tree made for the bench is that old, as a
workspace's files are by the time attempts at a change end; before, the rounds of the
first seconds read all 2,000 base files again.  It
journals all 2,000 as one batch, each file by the capsule that holds it (a witness of the
merged capsule replays them).  The dry run is the merge alone, nothing made.

git's time here is the filesystem's as much as git's own.  ``git merge`` (and the
untimed checkout before it) unlinks each file it rewrites and creates it anew, and ext4
without a journal (``extra["journal"]``: false, as on the VMs ccw's CI runs on) skips,
when it allocates an inode, every inode of the group deleted in the last half minute,
reading each one's inode-table block to see when (``recently_deleted``, called from
``find_inode_bit``): after 1,000 files were unlinked, each of 1,000 creates walks past
the lot.  perf put half of one such ``git merge``'s samples there; it took 250-410 ms,
against 77-115 ms in a copy on a journaled ext4 in the same minutes.  What ccw writes
allocates its inodes in the merged capsule's upper layer, on an ext4 image of its own
(sandbox/disk.py) where nothing was deleted.  So on such a filesystem the ratio
says more about git's unlinks than about ccw; where the row reports no journal, read it
beside one on a filesystem that keeps a journal.

``python bench/parts/merge.py [ROUNDS [CHANGED]]`` runs these rows alone (``bench/run.py
many`` runs them after its fork and race rows), with the same warm-up.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import Report, Row, in_process_tools, median_ms
from mcp_server.fs.statcache import RACY_NS
from mcp_server.statedir import make_state_dir

CHANGED = 1_000  # per capsule; the repository holds twice as many files
SMOKE_CHANGED = 100  # --smoke: one directory a side
PER_DIR = 100
LINES = 20
GIT = ["-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "gc.auto=0"]


def _path(index: int) -> str:
    return f"d{index // PER_DIR:02d}/f{index:05d}.txt"


def _tree(root: Path, files: int) -> None:
    for index in range(files):
        file = root / _path(index)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(f"file {index} line {line}\n" for line in range(1, LINES + 1)))
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *GIT, *args], check=True, capture_output=True)


def _edit_script(side: int, changed: int) -> str:
    """The shell loop that edits one line of this side's ``changed`` files (side 0: the first half)."""
    first = side * changed
    globs = " ".join(f"d{d:02d}/*.txt" for d in range(first // PER_DIR, (first + changed) // PER_DIR))
    return f"sed -i 's/ line 7$/ line seven {side}/' {globs}"


def _branches(ws: Path, repo: Path, changed: int) -> None:
    """A copy of the workspace's repository with the two sides' edits on branches a and b."""
    shutil.copytree(ws, repo, symlinks=True)
    for side, branch in ((0, "a"), (1, "b")):
        _git(repo, "checkout", "-q", "-B", branch, "main")
        subprocess.run(["sh", "-c", _edit_script(side, changed)], cwd=repo, check=True)
        _git(repo, "commit", "-q", "-am", branch)


def _git_merge(repo: Path) -> float:
    _git(repo, "checkout", "-q", "-f", "-B", "work", "a")
    start = time.perf_counter()
    _git(repo, "merge", "-q", "--no-edit", "b")
    return time.perf_counter() - start


async def _ccw_merge(call: Any, ids: list[str], dry_run: bool, changed: int) -> float:
    start = time.perf_counter()
    result = await call("capsule_merge", {"capsule_ids": ids, "into": "new", "dry_run": dry_run})
    elapsed = time.perf_counter() - start
    if not result["merged"] or sum(result["counts"].values()) != 2 * changed:
        raise RuntimeError(f"the merge did not combine the {2 * changed} files: {result['counts']}")
    if not dry_run:
        await call("capsule_destroy", {"capsule_id": result["capsule_id"]})
    return elapsed


async def measure(call: Any, base: Path, rounds: int, changed: int = CHANGED,
                  warmup: bool = True) -> dict[str, list[float]]:
    """Seconds per merge of each kind, over ``rounds`` rounds after one warm-up each (none
    without ``warmup``), with ``changed`` files (a multiple of ``PER_DIR``) changed in each capsule."""
    ws, repo = base / "merge-ws", base / "merge-git"
    _tree(ws, 2 * changed)
    _branches(ws, repo, changed)
    made = time.monotonic()
    parent = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    ids = (await call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
    for side, capsule_id in enumerate(ids):
        done = await call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", _edit_script(side, changed)],
                                           "wait_ms": None})
        if done["exit_code"] != 0:
            raise RuntimeError(f"the edit failed: {done['stderr'][-300:]}")

    async def git_merge() -> float:
        return _git_merge(repo)

    runners = {"into new": lambda: _ccw_merge(call, ids, False, changed),
               "dry run": lambda: _ccw_merge(call, ids, True, changed),
               "git merge": git_merge}
    times: dict[str, list[float]] = {name: [] for name in runners}
    if warmup:  # the base's files as old as a workspace's are when attempts end: see the module's docstring
        await trio.sleep(max(0.0, made + RACY_NS / 1e9 + 0.5 - time.monotonic()))
    for runner in runners.values() if warmup else ():
        await runner()
    order, shuffler = list(runners), random.Random(1)
    for _ in range(rounds):
        shuffler.shuffle(order)
        for name in order:
            times[name].append(await runners[name]())
    for capsule_id in [*ids, parent]:
        await call("capsule_destroy", {"capsule_id": capsule_id})
    return times


async def measured(base: Path, rounds: int, changed: int = CHANGED, warmup: bool = True) -> dict[str, list[float]]:
    """``measure`` over a runtime of its own, its state dir under ``base``."""
    make_state_dir(base / "merge-state")  # 0700, as ccw makes one: Path.mkdir's 0755 is tightened with a warning
    async with in_process_tools(base / "merge-state") as tools:
        return await measure(tools.call, base, rounds, changed, warmup)


def journaled(path: str) -> bool | None:
    """Whether the filesystem holding ``path`` keeps a journal (jbd2 lists each journal it runs under
    /proc/fs/jbd2 as DEVICE-INODE); None where that cannot be told (not ext4 or ext3 on a block device)."""
    st = os.stat(path)
    try:
        name = os.path.basename(os.readlink(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"))
        kind = next(line.split()[2] for line in Path("/proc/self/mounts").read_text().splitlines()
                    if line.split()[0].endswith("/" + name))
    except (OSError, StopIteration):
        return None
    if kind not in ("ext4", "ext3"):
        return None
    return any(one.rpartition("-")[0] == name for one in os.listdir("/proc/fs/jbd2")) \
        if os.path.isdir("/proc/fs/jbd2") else False


def rows(times: dict[str, list[float]], rounds: int, changed: int = CHANGED, where: str | None = None) -> list[Row]:
    """The two rows: the merge into a new capsule, and the dry run, each against git merge (``where``: the
    directory both ran in, whose filesystem's journal the rows report)."""
    git = median_ms(times["git merge"])
    extra = {"rounds": rounds, "files": 2 * changed, "changed_per_capsule": changed, "cpus": os.cpu_count(),
             "journal": journaled(where or tempfile.gettempdir())}
    return [
        Row(f"capsule_merge of 2 x {changed} changed files, into new", median_ms(times["into new"]),
            baseline="git merge of the same branches", baseline_ms=git, target="<= 1.5x", extra=extra),
        Row(f"capsule_merge of 2 x {changed} changed files, dry run", median_ms(times["dry run"]),
            baseline="git merge of the same branches", baseline_ms=git, extra=extra),
    ]


if __name__ == "__main__":
    ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    FILES = int(sys.argv[2]) if len(sys.argv) > 2 else CHANGED
    where = Path(tempfile.mkdtemp(prefix="ccw-bench-merge-"))
    try:
        merged = trio.run(measured, where, ROUNDS, FILES)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    report = Report("merge")
    report.rows.extend(rows(merged, ROUNDS, FILES))
    print(report.to_text())
