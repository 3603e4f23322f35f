"""Fork N and race on a real project (issue 39, "Shown by"), as root.

idna 3.10 from PyPI (tests/support/realprojects.py) with its own unittest suite: three
forks made by one ``capsule_fork`` with ``count: 3``, each given a different edit (a fix
in idna/intranges.py, a new test in tests/test_intranges.py, an edit of the fix's line
that breaks the suite), then ``capsule_race`` runs the suite in all three and ranks them:
the two that pass first, the smaller change before the larger, the failing one last.
A race past its wait_ms is a run that capsule_run fetches, and a capsule that cannot run
(the parent, frozen by its forks) is a row with its error, ranked last.  The same through
the ``ccw`` command: ``fork -n`` prints the ids, ``race`` the table.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from tests.support import realprojects
from tests.support.cli_process import ccw

# Replace one line of a file of the capsule's workspace (run in the jail, so journaled).
REPLACE = ("import sys; p, old, new = sys.argv[1:]; t = open(p).read(); assert old in t, old; "
           "open(p, 'w').write(t.replace(old, new, 1))")
APPEND = "import sys; open(sys.argv[1], 'a').write(sys.argv[2])"
LINE = "    return (start << 32) | end"
FIX = "    return (start << 32) | (end & 0xFFFFFFFF)"
BREAKS = "    return (start << 31) | end"
NEW_TEST = ("\n\nclass EncodeRangeTests(unittest.TestCase):\n    def test_start_in_the_high_bits(self):\n"
            "        self.assertEqual(_encode_range(7, 9) >> 32, 7)\n"
            "        self.assertEqual(_encode_range(7, 9) & 0xFFFF, 9)\n")


def _idna(require: Any, tmp_path: Path) -> tuple[realprojects.Project, Path]:
    require(os.path.exists(realprojects.SYSTEM_PYTHON) and shutil.which("git") is not None,
            f"needs {realprojects.SYSTEM_PYTHON} and git")
    project = realprojects.PROJECTS["idna"]
    return project, realprojects.pristine(project, tmp_path / "ws")


def test_three_forks_race_the_suite_and_rank(tools: Any, require: Any, tmp_path: Path) -> None:
    project, ws = _idna(require, tmp_path)
    python = realprojects.SYSTEM_PYTHON

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        made = await t.call("capsule_fork", {"capsule_id": parent, "count": 3})
        fix, new_test, conflict = made["capsule_ids"]
        edits = {fix: [python, "-c", REPLACE, "idna/intranges.py", LINE, FIX],
                 new_test: [python, "-c", APPEND, "tests/test_intranges.py", NEW_TEST],
                 conflict: [python, "-c", REPLACE, "idna/intranges.py", LINE, BREAKS]}
        for capsule_id, argv in edits.items():
            edited = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": argv})
            assert edited["exit_code"] == 0, edited["stderr"]
        raced = await t.call("capsule_race", {"capsule_ids": [conflict, new_test, fix], "cmd": list(project.test_cmd),
                                              "wait_ms": None})
        journaled = {c: await t.call("capsule_diff", {"capsule_id": c, "format": "json"}) for c in edits}
        return {"made": made, "parent": parent, "ids": (fix, new_test, conflict), "raced": raced,
                "diffs": journaled}

    out = tools.run(scenario)
    fix, new_test, conflict = out["ids"]
    assert out["made"]["parent"] == out["parent"] and len(set(out["ids"])) == 3
    rows = out["raced"]["rows"]
    assert [row["capsule_id"] for row in rows] == [fix, new_test, conflict], rows
    assert [row["rank"] for row in rows] == [1, 2, 3]
    assert [row["exit_code"] for row in rows[:2]] == [0, 0] and rows[2]["exit_code"] != 0, rows
    assert [row["verdict"] for row in rows] == ["passed", "passed", "passed"]  # baseline judges files, not tests
    assert rows[0]["diff"] == {"files": 1, "lines": 2} and rows[1]["diff"]["lines"] > 2, rows
    assert all(row["duration_ms"] > 0 and row["usage"]["cpu_ms"] is not None for row in rows)
    assert out["raced"]["executor"] == "local" and out["raced"]["parallel"] == min(os.cpu_count() or 1, 3)
    assert [f["path"] for f in out["diffs"][new_test]["files"]] == ["tests/test_intranges.py"]
    # Nothing was promoted: the workspace is as published.
    assert (ws / "idna" / "intranges.py").read_text().count(LINE) == 1
    assert "EncodeRangeTests" not in (ws / "tests" / "test_intranges.py").read_text()


def test_the_command_forks_n_and_prints_the_race(cli_state: Path, require: Any, tmp_path: Path) -> None:
    project, ws = _idna(require, tmp_path)
    parent = ccw(cli_state, "capsule", "create", str(ws)).stdout.strip()
    forks = ccw(cli_state, "capsule", "fork", parent, "-n", "2").stdout.split()
    assert len(forks) == 2 and all(one.startswith("cap_") for one in forks)
    ccw(cli_state, "capsule", "exec", forks[1], "--", realprojects.SYSTEM_PYTHON, "-c", REPLACE,
        "idna/intranges.py", LINE, BREAKS)
    done = ccw(cli_state, "capsule", "race", *forks, "--", *project.test_cmd, timeout=300)
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["rank", "capsule", "exit"], done.stdout
    assert lines[1].split()[:3] == ["1", forks[0], "0"] and lines[2].split()[:2] == ["2", forks[1]], done.stdout
    assert lines[3].startswith("ranked: passed first"), done.stdout
    refused = ccw(cli_state, "capsule", "fork", parent, "-n", "1000", check=False)
    assert refused.returncode == 1 and "TOO_LARGE" in refused.stderr and "at most 128" in refused.stderr, refused.stderr


def test_a_long_race_is_a_run_and_a_capsule_that_cannot_run_is_a_row(tools: Any, require: Any, tmp_path: Path) -> None:
    """Past wait_ms the race answers "running" and capsule_run fetches its table; the parent,
    frozen while it has forks, is refused its exec and ranked last with the error."""
    project, ws = _idna(require, tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        forks = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
        started = await t.call("capsule_race", {"capsule_ids": [parent, *forks], "cmd": list(project.test_cmd),
                                                "wait_ms": 0})
        fetched = await t.call("capsule_run", {"run_id": started["run_id"], "wait_ms": None})
        return {"parent": parent, "forks": forks, "started": started, "fetched": fetched}

    out = tools.run(scenario)
    assert out["started"]["status"] == "running" and out["started"]["run_id"].startswith("run_")
    rows = out["fetched"]["rows"]
    assert sorted(row["capsule_id"] for row in rows[:2]) == sorted(out["forks"])
    assert all(row["exit_code"] == 0 and row["verdict"] == "passed" for row in rows[:2]), rows
    assert rows[2]["capsule_id"] == out["parent"] and rows[2]["error"]["code"] == "CONFLICT", rows[2]
