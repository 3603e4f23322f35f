"""Before against after: ``python bench/against.py SUITE REV [--after REV2] [--rounds N] [--quick]``.

Runs one suite on two trees in the same run: REV (checked out with ``git worktree add``
into a scratch directory) and the current tree (or ``--after``'s revision, checked out
the same way, so edits made meanwhile do not count), alternating which goes first round by
round, so drift on these 2-core VMs falls on both.  Both trees run the *current*
``bench/`` (copied over REV's), so what differs is ccw's code and nothing that measures
it.  Each side is ``bench/run.py SUITE --json`` in its own process with ``PYTHONPATH``
set to its tree, so the in-process front end, the helper it starts (``python -m
sandbox``) and every tool come from that tree and not from the editable install.

For each row present on both sides it prints the median of ccw's figure over the
rounds, before and after, and after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _tree_at(rev: str, scratch: Path, side: str) -> Path:
    """A worktree of ``rev`` with the current bench/ and the shared .cache/ (prepared projects)."""
    tree = scratch / side
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev], check=True)
    shutil.rmtree(tree / "bench")
    shutil.copytree(ROOT / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    if (ROOT / ".cache").is_dir():
        (tree / ".cache").symlink_to(ROOT / ".cache")
    return tree


def _run_suite(tree: Path, suite: str, quick: bool) -> dict[str, float]:
    """One run of ``suite`` on ``tree``: each row's ccw figure by name."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, str(tree / "bench" / "run.py"), suite, "--json"] + (["--quick"] if quick else [])
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{suite} failed on {tree}:\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return {row["name"]: row["ccw_ms"] for row in report["rows"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite")
    parser.add_argument("rev", help="the 'before' revision (a commit, tag or branch)")
    parser.add_argument("--after", help="the 'after' revision (default: the current tree as it is)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of the suite per side (default 3)")
    parser.add_argument("--quick", action="store_true", help="pass --quick to the suite")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ccw-bench-against-"))
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    try:
        trees = {"before": _tree_at(args.rev, scratch, "before"),
                 "after": _tree_at(args.after, scratch, "after") if args.after else ROOT}
        for i in range(args.rounds):
            for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[side].append(_run_suite(trees[side], args.suite, args.quick))
                print(f"round {i + 1}/{args.rounds}: {side} done", file=sys.stderr)
    finally:
        for side in ("before", "after"):
            if (scratch / side).exists():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / side)],
                               check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    after = args.after or "the current tree"
    print(f"suite {args.suite}: {args.rev} (before) against {after} (after), {args.rounds} runs each\n")
    header = f"{'measure':60} {'before (median)':>16} {'after (median)':>16} {'after/before':>13}"
    print(header)
    print("-" * len(header))
    for name in runs["after"][0]:
        if not all(name in run for run in runs["before"] + runs["after"]):
            continue
        before = statistics.median(run[name] for run in runs["before"])
        after = statistics.median(run[name] for run in runs["after"])
        print(f"{name[:60]:60} {before:16.1f} {after:16.1f} {after / before:12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
