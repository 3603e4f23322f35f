"""snapshot_grep's git fast path gives the Python path's answer, byte for byte."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core.grep import Matcher
from mcp_server.fs.view import RootView
from mcp_server.substrate.search import grep
from mcp_server.substrate.views import LiveTarget, live_files

NEEDLE = "nee dle"


def _git(repo: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
               GIT_CONFIG_GLOBAL="/dev/null")
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _tree(root: Path, seed: int) -> None:
    rng = random.Random(seed)
    (root / "sub" / "deep").mkdir(parents=True)
    pieces = [NEEDLE, "x", "é", "\t", " ", "nee", "dle", "ü nee dle", "\r"]
    for i in range(60):
        lines = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(0, 12))]
        body = "\n".join(lines) + ("\n" if rng.random() < 0.7 else "")
        where = rng.choice(["", "sub/", "sub/deep/"])
        (root / f"{where}f{i:02}.txt").write_bytes(body.encode())
    (root / "bin.dat").write_bytes(b"nee dle\0binary")
    (root / "late_nul.txt").write_bytes(b"nee dle\n" + b"x" * 9000 + b"\0")  # NUL after 8000 bytes: text
    (root / "empty.txt").write_bytes(b"")
    (root / "link").symlink_to("f00.txt")
    (root / ".gitignore").write_text("ignored.txt\n")
    (root / "ignored.txt").write_text(NEEDLE)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    (root / "untracked.txt").write_text(f"a {NEEDLE} b {NEEDLE}\n")
    os.unlink(root / "sub" / "f05.txt") if (root / "sub" / "f05.txt").exists() else None


def _python_answer(root: Path, pattern: str, scopes: list[str], max_files: int,
                   max_matches: int) -> tuple[dict[str, Any], list[str]]:
    view = RootView.open(str(root))
    try:
        target = LiveTarget(view, "k", str(root), None)
        candidates = live_files(target, scopes)
        return grep(view.read_regular, candidates, Matcher.build(pattern), max_files, max_matches)
    finally:
        view.close()


@pytest.mark.parametrize(("seed", "scopes", "max_files", "max_matches"), [
    (1, ["."], 10_000, 1000), (2, ["sub"], 10_000, 1000), (3, ["."], 7, 1000), (4, ["."], 10_000, 5),
    (5, ["sub/deep", "f01.txt"], 10_000, 1000),
])
def test_git_path_equals_python_path(tmp_path: Path, direct_ctx: Any, call_tool: Any, seed: int,
                                     scopes: list[str], max_files: int, max_matches: int) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    _tree(root, seed)
    expected, searched = _python_answer(root, NEEDLE, scopes, max_files, max_matches)
    got = call_tool(direct_ctx, "snapshot_grep", {"workspace": str(root), "pattern": NEEDLE, "paths": scopes,
                                                   "max_files": max_files, "max_matches": max_matches})
    for key in ("matches", "files_searched", "truncated", "matches_truncated"):
        assert got[key] == expected[key], key
    assert "bin.dat" not in searched and "ignored.txt" not in searched and "link" not in searched
    if scopes == ["."] and max_files == 10_000:
        assert {"late_nul.txt", "empty.txt", "untracked.txt"} <= set(searched)
