"""capsule_merge over paths the workspace's git ignores (issue 39), as root.

Two attempts at a Python project that both ran it each hold their own
``__pycache__/*.pyc``, bytes that differ; promotion leaves them behind when the
workspace's git ignores them, so they must not refuse the merge: the first input's is
kept, said as such, and the edits merge.  The same binary at a path git does not
ignore still conflicts, as git's rules say.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from mcp_server.capsules.merge import IGNORED

EDITS = ("sed -i 's/^A = 1$/A = 10/' a.py", "sed -i 's/^B = 2$/B = 20/' b.py")


def _project(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("A = 1\n")
    (ws / "b.py").write_text("B = 2\n")
    (ws / ".gitignore").write_text("__pycache__/\n")
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    return ws


async def _attempts(t: Any, ws: Path, binary: str) -> list[str]:
    parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    ids: list[str] = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
    for n, (capsule_id, edit) in enumerate(zip(ids, EDITS, strict=True)):
        script = f"{edit} && mkdir -p $(dirname {binary}) && printf 'x\\000{n}' > {binary}"
        done = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]})
        assert done["exit_code"] == 0, done
    return ids


def test_pyc_files_the_workspace_ignores_do_not_refuse_the_merge(tools: Any, tmp_path: Path) -> None:
    ws = _project(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        ids = await _attempts(t, ws, "__pycache__/a.cpython-311.pyc")
        merged = await t.call("capsule_merge", {"capsule_ids": ids, "into": "new"})
        look = await t.call("capsule_exec", {"capsule_id": merged["capsule_id"],
                                             "cmd": ["sh", "-c", "cat a.py b.py; od -c __pycache__/*.pyc"]})
        return {"merged": merged, "look": look, "first": ids[0]}

    out = tools.run(scenario)
    merged = out["merged"]
    assert merged["merged"] and not merged["conflicts"], merged
    assert {"path": "__pycache__/a.cpython-311.pyc", "how": IGNORED, "capsules": [out["first"]]} in merged["files"]
    assert out["look"]["stdout"].startswith("A = 10\nB = 20\n") and "\\0   0" in out["look"]["stdout"], out["look"]


def test_the_same_binary_where_git_does_not_ignore_it_still_conflicts(tools: Any, tmp_path: Path) -> None:
    ws = _project(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        ids = await _attempts(t, ws, "data/blob.bin")
        result: dict[str, Any] = await t.call("capsule_merge", {"capsule_ids": ids, "dry_run": True})
        return result

    merged = tools.run(scenario)
    assert not merged["merged"], merged
    assert [(c["path"], c["how"]) for c in merged["conflicts"]] == [
        ("data/blob.bin", "conflict: binary file changed on both sides (git merges no binary content)")]
