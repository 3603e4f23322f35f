"""An agent squashes its own commits (``git rebase -i``) in a capsule, then promotes: the
squashed commit lands on the host's branch, and the pseudorefs the rebase left (ORIG_HEAD,
naming the commit before it, and git 2.39's REBASE_HEAD) stay behind, listed as skipped,
where each was a git_control refusal of the whole promotion."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

SQUASH = ("echo 2 >> f.txt && git commit -qam two && echo 3 >> f.txt && git commit -qam three && "
          "GIT_SEQUENCE_EDITOR='sed -i 2s/^pick/squash/' GIT_EDITOR=true git rebase -q -i HEAD~2")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_a_squashed_history_is_promoted_and_its_pseudorefs_stay_behind(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(ws)], check=True)
    _git(ws, "config", "user.email", "a@example.org")
    _git(ws, "config", "user.name", "a")
    (ws / "f.txt").write_text("1\n")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-qm", "init")

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        squashed = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", SQUASH]})
        return squashed, await t.call("capsule_promote", {"capsule_id": cap})

    squashed, promoted = tools.run(scenario)
    assert squashed["exit_code"] == 0, squashed["stderr"]
    assert promoted["promoted"] is True, promoted["policy_report"]
    skipped = {one["path"]: one["reason"] for one in promoted["skipped"]}
    assert skipped[".git/ORIG_HEAD"] == "pseudoref" and set(skipped.values()) == {"pseudoref"}
    assert _git(ws, "log", "--format=%s").splitlines() == ["two", "init"]  # the two commits, squashed
    assert (ws / "f.txt").read_text() == "1\n2\n3\n" and _git(ws, "status", "--porcelain") == ""
    assert not (ws / ".git" / "ORIG_HEAD").exists() and not (ws / ".git" / "REBASE_HEAD").exists()
    _git(ws, "fsck", "--strict")
