"""mcp_server/fs/gitignore.py as root over a checkout another uid owns (a user's, promoted by root).

Root's git refuses such a repository ("detected dubious ownership") unless the caller's
config trusts it (``safe.directory``).  That is a host tool refusing the caller, whose
message says how to proceed: promotion scope must report it as PERMISSION_DENIED with
git's words, never as INTERNAL (an error of ccw's own).  A merge asks it too (two attempts'
own caches are no conflict when git ignores them) and has no switch to skip it, so its
refusal says what a merge can do instead.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mcp_server.fs.gitignore import ignored
from sandbox.errors import CcwError

OTHER = 47_314  # no account needed: chown takes the number


def test_roots_git_refusing_another_uids_checkout_is_permission_denied(
        root_required: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / ".gitignore").write_text("build/\n")
    for path in (ws, *ws.rglob("*")):
        os.lchown(path, OTHER, OTHER)
    home = tmp_path / "home"  # a caller whose git config trusts nothing
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    with pytest.raises(CcwError) as caught:
        ignored(str(ws), ["build/x.o"])
    assert caught.value.code == "PERMISSION_DENIED", caught.value
    assert "detected dubious ownership" in caught.value.message
    assert "safe.directory" in caught.value.message  # git's own way forward, kept
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {ws}\n")
    assert ignored(str(ws), ["build/x.o", "src/a.py"]) == {"build/x.o"}


def test_a_merge_refused_so_says_what_a_merge_can_do(tools: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / ".gitignore").write_text("build/\n")
    for path in (ws, *ws.rglob("*")):
        os.lchown(path, OTHER, OTHER)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))

    async def scenario(t: Any) -> CcwError:
        base = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        forks = (await t.call("capsule_fork", {"capsule_id": base, "count": 2}))["capsule_ids"]
        for i, fork in enumerate(forks):  # each its own build output, and its own file
            await t.call("capsule_exec", {"capsule_id": fork, "cmd": [
                "sh", "-c", f"mkdir -p build && echo {i} > build/out && echo {i} > f{i}.txt"]})
        with pytest.raises(CcwError) as caught:
            await t.call("capsule_merge", {"capsule_ids": forks})
        return caught.value

    refused = tools.run(scenario)
    assert refused.code == "PERMISSION_DENIED" and "detected dubious ownership" in refused.message, refused
    assert "capsule_merge has no such switch: promote each attempt by itself" in refused.message
