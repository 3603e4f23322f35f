"""File tools acting inside a real capsule (capsule_id): reads see the capsule's view,
writes land in the capsule only, are journaled, and show in its diff and witness replay."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import CcwError


def _repo(tmp_path: Path) -> Path:
    ws = tmp_path / "repo"
    ws.mkdir()
    (ws / "app.py").write_text("def greet():\n    return 'hi'\n")
    (ws / "notes.txt").write_text("one\ntwo\nthree\n")
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=ws, env=env, check=True)
    return ws


def test_substrate_and_text_tools_inside_a_capsule(tools: Any, tmp_path: Path) -> None:
    ws = _repo(tmp_path)
    patch = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo made-by-exec > exec.txt"]})
        seen = await t.call("snapshot_file", {"capsule_id": cap, "workspace": str(ws), "path": "exec.txt"})
        wrote = await t.call("workspace_write_file", {"capsule_id": cap, "workspace": str(ws), "path": "new/tool.txt",
                                                      "content": "from a tool\n", "create_dirs": True})
        patched = await t.call("workspace_apply_patch", {"capsule_id": cap, "workspace": str(ws), "mode": "capsule",
                                                         "patch": patch})
        read = await t.call("read_text_file", {"capsule_id": cap, "path": "app.py"})
        anchor = read["lines"][1].split("|")[0] if "lines" in read else read["content"].splitlines()[1].split("|")[0]
        edited = await t.call("edit_text_file", {
            "capsule_id": cap, "path": "app.py", "file_hash": read["file_hash"],
            "ops": [{"op": "replace", "anchor": anchor, "content": "    return 'hello'"}]})
        ran = await t.call("capsule_exec",
                           {"capsule_id": cap, "cmd": ["sh", "-c", "cat new/tool.txt notes.txt app.py"]})
        # Any change to the capsule (here: that exec) makes leases on its view stale.
        with pytest.raises(CcwError) as stale:
            await t.call("workspace_write_file", {"capsule_id": cap, "workspace": str(ws), "path": "late.txt",
                                                  "content": "x", "lease_id": wrote["lease_id"]})
        assert stale.value.code == "STALE_LEASE" and "fingerprint" in stale.value.details
        diff = await t.call("capsule_diff", {"capsule_id": cap, "format": "json"})
        witness = await t.call("capsule_witness", {"capsule_id": cap})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        return {"seen": seen, "wrote": wrote, "patched": patched, "edited": edited, "ran": ran, "diff": diff,
                "replayed": replayed}

    out = tools.run(scenario)
    assert "made-by-exec" in str(out["seen"])
    assert out["ran"]["stdout"] == "from a tool\none\nTWO\nthree\ndef greet():\n    return 'hello'\n"
    changed = sorted(f["path"] for f in out["diff"]["files"])
    assert changed == ["app.py", "exec.txt", "new/tool.txt", "notes.txt"]
    # The real tree is untouched; the replay redoes the tool writes between the execs.
    assert not (ws / "exec.txt").exists() and not (ws / "new").exists()
    assert (ws / "notes.txt").read_text() == "one\ntwo\nthree\n" and "'hi'" in (ws / "app.py").read_text()
    assert out["replayed"]["replay_ok"] is True, out["replayed"]["mismatches"]
