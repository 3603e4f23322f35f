"""capsule_diff, a race's diff size and deltamin as an agent sees them on the real kernel
(mcp_server/capsules/carried.py): what promotion would carry, what it leaves behind named,
the workspace moving underneath, a long diff cut at a file's end.

The workspace is a git checkout that ignores ``__pycache__/``; a capsule edits one line
and runs Python, which writes a ``.pyc``, and makes a ``.pytest_cache/`` as pytest does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

PYC = "import sys; sys.path.insert(0, '.'); import recipes"  # writes __pycache__/recipes.cpython-3*.pyc
PYTEST_CACHE = "mkdir -p .pytest_cache/v && printf '*\\n' > .pytest_cache/.gitignore && echo 1 > .pytest_cache/v/x"


def _git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "recipes.py").write_text("".join(f"STEP_{i} = {i}\n" for i in range(40)))
    (ws / "notes.txt").write_text("first\n")
    (ws / ".gitignore").write_text("__pycache__/\n")
    _git(ws, "init", "-q")
    _git(ws, "add", ".")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return ws


async def _edited(t: Any, ws: Path) -> str:
    """A capsule holding a one-line edit of recipes.py, its .pyc and a .pytest_cache."""
    cap = str((await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"])
    script = f"sed -i 's/STEP_3 = 3/STEP_3 = 33/' recipes.py && python3 -c \"{PYC}\" && {PYTEST_CACHE}"
    ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]})
    assert ran["exit_code"] == 0, ran
    return cap


def test_the_diff_shows_what_promotion_carries_and_names_what_it_leaves(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = await _edited(t, workspace)
        return {"unified": await t.call("capsule_diff", {"capsule_id": cap}),
                "json": await t.call("capsule_diff", {"capsule_id": cap, "format": "json"}),
                "all": await t.call("capsule_diff", {"capsule_id": cap, "ignored": True}),
                "promote": await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})}

    out = tools.run(scenario)
    unified = out["unified"]
    assert "GIT binary patch" not in unified["diff"] and "-STEP_3 = 3\n+STEP_3 = 33\n" in unified["diff"]
    assert unified["diff"].count("diff --git") == 1 and unified["summary"] == {"added": 0, "deleted": 0, "modified": 1}
    [ignored] = unified["notes"]  # nothing moved, nothing cut
    assert ignored.startswith("ignored, not shown: 3 files in .pytest_cache/, __pycache__/ ("), ignored
    assert [f["path"] for f in out["json"]["files"]] == ["recipes.py"] == out["promote"]["applied"]
    everything = out["all"]
    assert "GIT binary patch" in everything["diff"] and ".pytest_cache/v/x" in everything["diff"]
    assert "notes" not in everything


def test_a_race_ranks_the_change_promotion_would_carry(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = await _edited(t, workspace)
        return dict(await t.call("capsule_race", {"capsule_ids": [cap], "cmd": ["python3", "-c", PYC],
                                                  "wait_ms": None}))

    row = tools.run(scenario)["rows"][0]
    assert row["diff"] == {"files": 1, "lines": 2}, row


def test_the_diff_says_when_the_workspace_moved_under_a_changed_path(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = await _edited(t, workspace)
        before = await t.call("capsule_diff", {"capsule_id": cap})
        (workspace / "recipes.py").write_text((workspace / "recipes.py").read_text() + "HOST = 1\n")
        (workspace / "notes.txt").write_text("edited on the host, not in the capsule\n")
        return {"before": before, "after": await t.call("capsule_diff", {"capsule_id": cap, "format": "stat"})}

    out = tools.run(scenario)
    assert not any(note.startswith("workspace moved") for note in out["before"]["notes"])
    moved = out["after"]["notes"][-1]
    assert moved.startswith("workspace moved: it changed at 1 path(s) since the capsule changed them (recipes.py)")
    assert "REPO_CHANGED" in moved and "notes.txt" not in moved


def test_a_long_diff_is_cut_at_a_file_end_and_names_the_rest(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        script = "for f in a b c; do seq 1 3000 > big_$f.txt; done"
        assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]}))["exit_code"] == 0
        return {"cut": await t.call("capsule_diff", {"capsule_id": cap, "max_chars": 30_000}),
                "asked": await t.call("capsule_diff", {"capsule_id": cap, "paths": ["big_c.txt"]}),
                "whole": await t.call("capsule_diff", {"capsule_id": cap, "max_chars": None})}

    out = tools.run(scenario)
    cut = out["cut"]
    assert cut["diff"].count("diff --git") == 1 and cut["diff"].endswith("+3000\n")  # big_a.txt whole, about 17 KB
    assert cut["notes"][0].startswith("cut at ") and "2 file(s) not shown (big_b.txt, big_c.txt)" in cut["notes"][0]
    assert out["asked"]["diff"].startswith("diff --git a/big_c.txt") and "notes" not in out["asked"]
    assert out["whole"]["diff"].count("diff --git") == 3 and "notes" not in out["whole"]


def test_deltamin_says_the_workspace_moved(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        script = "echo broken > notes.txt; echo 'STEP_X = 1' >> recipes.py"
        assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]}))["exit_code"] == 0
        (workspace / "recipes.py").write_text((workspace / "recipes.py").read_text() + "HOST = 1\n")
        return dict(await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": ["grep", "-q", "first",
                                                                                         "notes.txt"],
                                                      "wait_ms": None}))

    out = tools.run(scenario)
    assert out["units"] == ["notes.txt"], out
    assert out["notes"][0].startswith("workspace moved: it changed at 1 path(s) since the capsule changed them "
                                      "(recipes.py)"), out


def test_deltamin_leaves_out_what_promotion_leaves_behind(tools: Any, workspace: Path) -> None:
    # A database's data dir the tests' server wrote (git-ignored) and pytest's cache are outputs of
    # the runs, not causes: given to trials a part at a time, a server would start on half a data dir.
    (workspace / ".gitignore").write_text("__pycache__/\n.pgdata/\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        script = ("echo broken > notes.txt && mkdir -p .pgdata/base && for i in 1 2 3 4 5 6; do "
                  f"echo $i > .pgdata/base/$i; done && {PYTEST_CACHE}")
        assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]}))["exit_code"] == 0
        # Fails whenever the data dir is half there: with it in the change, a trial blames it.
        check = "grep -q first notes.txt && { test ! -e .pgdata/base || test -e .pgdata/base/6; }"
        return dict(await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": ["sh", "-c", check],
                                                      "wait_ms": None}))

    out = tools.run(scenario)
    assert out["units"] == ["notes.txt"] and out["minimal_patch"].count("diff --git") == 1, out
    assert out["notes"] == ["left out: 8 files in .pgdata/, .pytest_cache/ (git-ignored, or a cache the capsule "
                            "made, which promotion leaves behind); the trials run without them"], out
