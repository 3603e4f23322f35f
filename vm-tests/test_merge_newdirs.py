"""capsule_merge into a new capsule of inputs that add directories (issue 39), as root.

A merge's new capsule starts from the merge base, so a directory one input added is made
there by the merge; its files are journaled as file tools' writes, and a witness of the
merged capsule replays from the journal alone.  One input adds ``new/deep/a.txt``, a
private directory ``private/`` (mode 700) with a file, and an empty ``empty/``, and makes
a file of the base executable (its bytes unchanged: journaled as a chmod), turns a
file of the base into a directory, and a directory of the base into a file and another into
a symlink out of it (journaled deleted first, a replay writing no file over a directory, and
nothing below deleted again: that would reach through the link); the other
edits a file of the base and adds ``new/other/b.txt`` beside the first's.  The merged
capsule's diff names exactly those files, its tree holds the directories with their
modes, and its witness replays ``replay_ok: true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "host",
           "GIT_AUTHOR_EMAIL": "host@example.invalid", "GIT_COMMITTER_NAME": "host",
           "GIT_COMMITTER_EMAIL": "host@example.invalid"}
FIRST = ("mkdir -p new/deep && echo a > new/deep/a.txt && mkdir -m 700 private && echo p > private/p.txt "
         "&& mkdir empty && chmod 755 tool.sh && rm was && mkdir was && echo w > was/in.txt "
         "&& rm -rf gone && echo now-a-file > gone && rm -rf linked && ln -s /etc linked")
SECOND = "sed -i 's/^line 3$/line three/' m.txt && mkdir -p new/other && echo b > new/other/b.txt"
LOOK = ("stat -c '%n %a %F' new new/deep new/other private empty tool.sh was gone linked "
        "&& cat new/deep/a.txt new/other/b.txt private/p.txt && sed -n 3p m.txt")


def _workspace(require: Any, tmp_path: Path) -> Path:
    require(shutil.which("git") is not None, "needs git")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "m.txt").write_text("".join(f"line {i}\n" for i in range(1, 21)))
    (ws / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (ws / "tool.sh").chmod(0o644)
    (ws / "was").write_text("a file in the base\n")
    for name in ("gone", "linked"):
        (ws / name / "sub").mkdir(parents=True)
        (ws / name / "sub" / "in.txt").write_text(f"{name} was a directory\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(ws), *args], env={**os.environ, **GIT_ENV}, capture_output=True, check=True)
    return ws


def test_a_merge_adding_directories_diffs_and_replays(tools: Any, require: Any, tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        one, two = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
        for capsule_id, script in ((one, FIRST), (two, SECOND)):
            done = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]})
            assert done["exit_code"] == 0, done["stderr"]
        merged = await t.call("capsule_merge", {"capsule_ids": [one, two], "into": "new"})
        made = merged["capsule_id"]
        diff = await t.call("capsule_diff", {"capsule_id": made, "format": "json"})
        look = await t.call("capsule_exec", {"capsule_id": made, "cmd": ["sh", "-c", LOOK]})
        witness = await t.call("capsule_witness", {"capsule_id": made})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        return {"merged": merged, "diff": diff, "look": look, "replayed": replayed}

    out = tools.run(scenario)
    assert out["merged"]["merged"] is True and out["merged"]["written"] is True, out["merged"]
    files = {f["path"]: f["status"] for f in out["diff"]["files"]}
    assert files == {"m.txt": "modified", "new/deep/a.txt": "added", "new/other/b.txt": "added",
                     "private/p.txt": "added", "tool.sh": "modified", "was": "deleted",
                     "was/in.txt": "added", "gone": "added", "gone/sub/in.txt": "deleted", "linked": "added",
                     "linked/sub/in.txt": "deleted"}, files
    assert out["look"]["exit_code"] == 0, out["look"]["stderr"]
    assert out["look"]["stdout"].splitlines() == [
        "new 755 directory", "new/deep 755 directory", "new/other 755 directory", "private 700 directory",
        "empty 755 directory", "tool.sh 755 regular file", "was 755 directory",
        "gone 644 regular file", "linked 777 symbolic link",
        "a", "b", "p", "line three"], out["look"]["stdout"]
    assert not (ws / "new").exists() and not (ws / "private").exists()
    assert out["replayed"]["replay_ok"] is True, out["replayed"].get("mismatches")
