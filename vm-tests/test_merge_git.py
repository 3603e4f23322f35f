"""capsule_merge of two attempts that each committed in the workspace's git (capsules/merge_git.py), as root.

Agents commit as they work.  Two forks each edit a different file and commit it (each
changes ``.git/index``, ``refs/heads/main`` and ``logs/HEAD``); a third only stages its
edit.  Merged into a new capsule, the first input keeps its git directory whole and the
others' files come along uncommitted; promoted into the live tree, the host's history
holds the first's commit, its work tree both edits, and the index passes promotion's
check (capsules/gitindex.py), with no hazard.  A merge with a conflict in the work tree
still refuses, git directory or not.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mcp_server.capsules.merge_git import GIT_KEPT
from tests.support.realprojects import git as _git

IDENTITY = "git -c user.name=agent -c user.email=agent@example.invalid"
COMMIT_A = f"echo fixed >> a.txt && {IDENTITY} commit -q -am 'fix a'"
COMMIT_B = f"echo tested >> b.txt && {IDENTITY} commit -q -am 'test b'"
STAGE_C = "echo staged >> c.txt && git add c.txt"


def _workspace(require: Any, tmp_path: Path) -> Path:
    require(shutil.which("git") is not None, "needs git")
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a", "b", "c"):
        (ws / f"{name}.txt").write_text(f"{name}\n")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "-m", "base")
    return ws


def test_attempts_that_each_committed_merge_with_the_first_ones_history(tools: Any, require: Any,
                                                                        tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        one, two, three = (await t.call("capsule_fork", {"capsule_id": parent, "count": 3}))["capsule_ids"]
        for capsule_id, script in ((one, COMMIT_A), (two, COMMIT_B), (three, STAGE_C)):
            done = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]})
            assert done["exit_code"] == 0, done["stderr"]
        dry = await t.call("capsule_merge", {"capsule_ids": [two, one, three], "dry_run": True})
        made = await t.call("capsule_merge", {"capsule_ids": [one, two, three], "into": "new"})
        look = await t.call("capsule_exec", {"capsule_id": made["capsule_id"], "cmd": [
            "sh", "-c", "git log --format=%s && git status --porcelain && cat a.txt b.txt c.txt"]})
        live = await t.call("capsule_merge", {"capsule_ids": [one, two, three], "into": "live"})
        return {"dry": dry, "made": made, "look": look, "live": live, "ids": [one, two, three]}

    out = tools.run(scenario)
    made = out["made"]
    assert made["merged"] is True and made["conflicts"] == [], made["conflicts"]
    kept = [f for f in made["files"] if f["how"] == GIT_KEPT]
    assert {f["path"] for f in kept} >= {".git/index", ".git/refs/heads/main", ".git/logs/HEAD"}
    one, two, _three = out["ids"]
    assert {tuple(f["capsules"]) for f in kept} == {(one,)}
    assert all(pair["verdict"] == "commute" for pair in made["pairs"]), made["pairs"]
    # named in another order, the first named that changed the git dir keeps it: two's commit
    assert {tuple(f["capsules"]) for f in out["dry"]["files"] if f["how"] == GIT_KEPT} == {(two,)}
    look = out["look"]["stdout"]
    assert look.startswith("fix a\nbase\n"), look  # the first input's commit, on the base
    assert " M b.txt" in look and " M c.txt" in look, look  # the others' work, not committed
    assert look.endswith("a\nfixed\nb\ntested\nc\nstaged\n"), look
    live = out["live"]
    assert live["written"] is True and live["promote"]["promoted"] is True, live["promote"]["policy_report"]
    assert live["promote"]["policy_report"]["hazards"] == []
    assert _git(ws, "log", "--format=%s") == "fix a\nbase\n"
    assert sorted(_git(ws, "status", "--porcelain").splitlines()) == [" M b.txt", " M c.txt"]
    assert (ws / "a.txt").read_text() == "a\nfixed\n" and (ws / "c.txt").read_text() == "c\nstaged\n"
    assert _git(ws, "fsck", "--strict", "--no-dangling") == ""


def test_a_work_tree_conflict_still_refuses_a_merge_of_committing_attempts(tools: Any, require: Any,
                                                                         tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        one, two = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
        for capsule_id, text in ((one, "ours"), (two, "theirs")):
            script = f"echo {text} > a.txt && {IDENTITY} commit -q -am {text}"
            done = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]})
            assert done["exit_code"] == 0, done["stderr"]
        return await t.call("capsule_merge", {"capsule_ids": [one, two], "into": "live"})

    refused = tools.run(scenario)
    assert refused["merged"] is False and [c["path"] for c in refused["conflicts"]] == ["a.txt"]
    assert refused.get("written") is False
    assert _git(ws, "log", "--format=%s") == "base\n" and _git(ws, "status", "--porcelain") == ""
