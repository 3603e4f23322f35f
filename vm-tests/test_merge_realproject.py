"""capsule_merge on a real project (issue 39, "Shown by"), as root.

idna 3.10 from PyPI (tests/support/realprojects.py) with its own unittest suite: three
forks made by one ``capsule_fork`` with ``count: 3`` get a fix in idna/intranges.py, a
new test in tests/test_intranges.py, and an edit of the fix's line.  The merge of the
fix and the edit is refused whole, naming the file, both hunks and the base, with the
tree untouched; the merge of the fix and the new test into a new capsule passes the
suite there, its witness replays, and promoted gives exactly both changes in the host's
``git diff``.  Then
the same through ``ccw capsule merge``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support import realprojects
from tests.support.cli_process import ccw

REPLACE = ("import sys; p, old, new = sys.argv[1:]; t = open(p).read(); assert old in t, old; "
           "open(p, 'w').write(t.replace(old, new, 1))")
APPEND = "import sys; open(sys.argv[1], 'a').write(sys.argv[2])"
LINE = "    return (start << 32) | end"
FIX = "    return (start << 32) | (end & 0xFFFFFFFF)"
BREAKS = "    return (start << 31) | end"
NEW_TEST = ("\n\nclass EncodeRangeTests(unittest.TestCase):\n    def test_start_in_the_high_bits(self):\n"
            "        self.assertEqual(_encode_range(7, 9) >> 32, 7)\n"
            "        self.assertEqual(_encode_range(7, 9) & 0xFFFF, 9)\n")


def _git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **realprojects.GIT_ENV}).stdout


def _idna(require: Any, tmp_path: Path) -> tuple[realprojects.Project, Path]:
    require(os.path.exists(realprojects.SYSTEM_PYTHON) and shutil.which("git") is not None,
            f"needs {realprojects.SYSTEM_PYTHON} and git")
    project = realprojects.PROJECTS["idna"]
    return project, realprojects.pristine(project, tmp_path / "ws")


async def _three_forks(t: Any, ws: Path) -> tuple[str, str, str]:
    parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    fix, new_test, conflict = (await t.call("capsule_fork", {"capsule_id": parent, "count": 3}))["capsule_ids"]
    python = realprojects.SYSTEM_PYTHON
    for capsule_id, argv in {fix: [python, "-c", REPLACE, "idna/intranges.py", LINE, FIX],
                             new_test: [python, "-c", APPEND, "tests/test_intranges.py", NEW_TEST],
                             conflict: [python, "-c", REPLACE, "idna/intranges.py", LINE, BREAKS]}.items():
        edited = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": argv})
        assert edited["exit_code"] == 0, edited["stderr"]
    return fix, new_test, conflict


def test_merge_refuses_a_conflict_whole_then_merges_tests_and_promotes(tools: Any, require: Any,
                                                                       tmp_path: Path) -> None:
    project, ws = _idna(require, tmp_path)
    before = {p: (ws / p).read_bytes() for p in ("idna/intranges.py", "tests/test_intranges.py")}

    async def scenario(t: Any) -> dict[str, Any]:
        fix, new_test, conflict = await _three_forks(t, ws)
        refused = await t.call("capsule_merge", {"capsule_ids": [fix, conflict], "into": "live"})
        untouched = ({p: (ws / p).read_bytes() for p in before}, _git(ws, "status", "--porcelain"))
        listed = {c["capsule_id"] for c in (await t.call("capsule_list", {}))["capsules"]}
        merged = await t.call("capsule_merge", {"capsule_ids": [fix, new_test], "into": "new"})
        suite = await t.call("capsule_exec", {"capsule_id": merged["capsule_id"], "cmd": list(project.test_cmd)})
        witness = await t.call("capsule_witness", {"capsule_id": merged["capsule_id"]})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        promoted = await t.call("capsule_promote", {"capsule_id": merged["capsule_id"]})
        return {"ids": (fix, new_test, conflict), "refused": refused, "untouched": untouched, "listed": listed,
                "merged": merged, "suite": suite, "replayed": replayed, "promoted": promoted}

    out = tools.run(scenario)
    fix, new_test, conflict = out["ids"]
    refused = out["refused"]
    assert refused["merged"] is False and refused["written"] is False and "promote" not in refused
    [clash] = refused["conflicts"]
    assert clash["path"] == "idna/intranges.py" and clash["capsules"] == [fix, conflict], clash
    [hunk] = clash["hunks"]
    assert (hunk["base"], hunk["ours"], hunk["theirs"]) == (LINE + "\n", FIX + "\n", BREAKS + "\n"), hunk
    assert hunk["line"] == before["idna/intranges.py"].decode().splitlines().index(LINE) + 1
    assert refused["pairs"] == [{"capsules": [fix, conflict], "verdict": "conflict", "shared": 1,
                                 "conflicts": ["idna/intranges.py"]}]
    assert out["untouched"] == (before, "")
    assert len(out["listed"]) == 4  # the parent and its three forks: no capsule was made for the refused merge
    merged = out["merged"]
    assert merged["merged"] is True and merged["written"] is True and merged["conflicts"] == []
    assert {f["path"]: f["capsules"] for f in merged["files"]} == {"idna/intranges.py": [fix],
                                                                   "tests/test_intranges.py": [new_test]}
    assert merged["pairs"][0]["verdict"] == "commute" and "capsule_id" in merged["base"]
    assert out["suite"]["exit_code"] == 0, out["suite"]["stderr"][-2000:]
    # The merge is journaled as file writes: a witness of the merged capsule replays them, then the suite.
    assert out["replayed"]["replay_ok"] is True, out["replayed"].get("mismatches")
    assert out["promoted"]["promoted"] is True, out["promoted"]
    assert _git(ws, "diff", "--name-only").split() == ["idna/intranges.py", "tests/test_intranges.py"]
    diff = _git(ws, "diff")
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert removed == [LINE] and added[0] == FIX and "\n".join(added[1:]) == NEW_TEST.rstrip("\n"), diff


def test_the_command_prints_the_merge_and_the_refusal(cli_state: Path, require: Any, tmp_path: Path) -> None:
    _project, ws = _idna(require, tmp_path)
    parent = ccw(cli_state, "capsule", "create", str(ws)).stdout.strip()
    fix, conflict, new_test = ccw(cli_state, "capsule", "fork", parent, "-n", "3").stdout.split()
    python = realprojects.SYSTEM_PYTHON
    ccw(cli_state, "capsule", "exec", fix, "--", python, "-c", REPLACE, "idna/intranges.py", LINE, FIX)
    ccw(cli_state, "capsule", "exec", conflict, "--", python, "-c", REPLACE, "idna/intranges.py", LINE, BREAKS)
    ccw(cli_state, "capsule", "exec", new_test, "--", python, "-c", APPEND, "tests/test_intranges.py", NEW_TEST)
    refused = ccw(cli_state, "capsule", "merge", fix, conflict, "--into", "live", check=False)
    assert refused.returncode == 1, refused.stderr
    text = refused.stdout
    assert "CONFLICT idna/intranges.py: conflict: overlapping lines changed on both sides" in text, text
    assert f"        {LINE}" in text and f"        {FIX}" in text and f"        {BREAKS}" in text, text
    assert f"pair {fix} + {conflict}: conflict at idna/intranges.py" in text
    assert "refused: 1 conflict(s); nothing was made or written" in text
    dry = ccw(cli_state, "capsule", "merge", fix, new_test, "--into", "live", "--dry-run")
    assert "would promote: 2 path(s)" in dry.stdout and _git(ws, "status", "--porcelain") == "", dry.stdout
    done = ccw(cli_state, "capsule", "merge", fix, new_test, "--into", "live")
    assert done.stdout.splitlines()[-1].startswith("promoted: 2 path(s)"), done.stdout
    assert _git(ws, "diff", "--name-only").split() == ["idna/intranges.py", "tests/test_intranges.py"]
