"""Crash-safe promotion: every kind of change lands, symlinks cannot redirect writes,
and a process killed at any step leaves, after recovery, all of the change or none."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_server.fs.promote import CRASH_ENV, STEPS, Op, Promoter
from sandbox.errors import CcwError
from tests.support.promotion import change_content, change_ops, workspace


def _tree(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", oct(path.stat().st_mode & 0o777))
            else:
                out[rel] = ("file", path.read_bytes(), oct(path.stat().st_mode & 0o777))
    return out


def test_every_kind_of_change_lands(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    applied = Promoter(tmp_path / "state").promote(str(ws), change_ops(), change_content)
    assert applied == sorted(["dir_to_file", "gone.txt", "link", "run.sh", "src/a.py", "src/new/deep.py", "src/pkg"])
    tree = _tree(ws)
    assert tree["src/a.py"] == ("file", b"new a\n", "0o644")
    assert tree["src/new/deep.py"] == ("file", b"deep\n", "0o600")
    assert tree["dir_to_file"] == ("file", b"now a file\n", "0o644")
    assert tree["link"] == ("link", "src/a.py")
    assert tree["run.sh"][2] == "0o755"  # type: ignore[index]
    assert "gone.txt" not in tree and "src/pkg" not in tree
    assert not any(".ccw-" in name for name in tree)
    assert list((tmp_path / "state" / "promotions").iterdir()) == []


def test_setuid_and_setgid_bits_are_never_written_to_a_file(tmp_path: Path) -> None:
    # The hazard check refuses them first (core/hazards.py); this is the floor beneath it.
    ws = tmp_path / "ws"
    (ws / "shared").mkdir(parents=True)
    (ws / "tool").write_text("#!/bin/sh\n")
    os.chmod(ws / "tool", 0o755)
    ops = [Op("write", "s", 0o6755), Op("chmod", "tool", 0o4755), Op("mkdir", "group", 0o2775),
           Op("chmod", "shared", 0o2770), Op("write", "group/f", 0o2644)]
    Promoter(tmp_path / "state").promote(str(ws), ops, lambda op: b"#!/bin/sh\n")
    modes = {rel: stat.S_IMODE(os.lstat(ws / rel).st_mode) for rel in ("s", "tool", "group", "shared", "group/f")}
    assert modes == {"s": 0o755, "tool": 0o755, "group": 0o2775, "shared": 0o2770, "group/f": 0o644}


def test_a_files_runs_of_zeros_land_as_holes_and_its_bytes_whole(tmp_path: Path) -> None:
    # A capsule's sparse file (truncate -s) costs its disk nothing: written densely, a few
    # would fill the host's disk.
    ws = tmp_path / "ws"
    ws.mkdir()
    content = {"sparse.img": b"head" + bytes(64 << 20) + b"tail", "dense.bin": os.urandom(200_000),
               "zeros": bytes(1 << 20), "small": bytes(100)}
    ops = [Op("write", name, 0o644) for name in content]
    Promoter(tmp_path / "state").promote(str(ws), ops, lambda op: content[op.path])
    for name, data in content.items():
        assert (ws / name).read_bytes() == data, name
    held = {name: os.stat(ws / name).st_blocks * 512 for name in content}
    assert held["sparse.img"] <= 1 << 18 and held["zeros"] <= 1 << 16, held  # the blocks with bytes, no more
    assert held["dense.bin"] >= 200_000, held


def test_a_symlinked_parent_cannot_redirect_a_write(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "src").symlink_to(outside)
    with pytest.raises(CcwError) as info:
        Promoter(tmp_path / "state").promote(str(ws), [Op("write", "src/x", 0o644)], lambda op: b"evil")
    assert info.value.code in ("CONFLICT", "PERMISSION_DENIED")
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in ws.iterdir()) == ["src"]


def test_a_symlink_swapped_in_during_commit_is_refused(tmp_path: Path) -> None:
    # Parents are re-resolved with RESOLVE_NO_SYMLINKS at every step, not just at planning.
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    promoter = Promoter(tmp_path / "state")

    def content(op: Op) -> bytes:
        # While the temp files are being prepared, replace d/ with a link to outside.
        if op.path == "d/b":
            os.rename(ws / "d", tmp_path / "moved")
            (ws / "d").symlink_to(outside)
        return b"data"

    with pytest.raises(CcwError):
        promoter.promote(str(ws), [Op("write", "d/a", 0o644), Op("write", "d/b", 0o644)], content)
    assert list(outside.iterdir()) == []


_CHILD = """
import sys
sys.path.insert(0, {repo!r})
from mcp_server.fs.promote import Promoter
from tests.support.promotion import change_content, change_ops
Promoter(__import__('pathlib').Path({state!r})).promote({ws!r}, change_ops(), change_content)
"""


@pytest.mark.parametrize("step", STEPS)
def test_kill_at_any_step_then_recovery_gives_all_or_nothing(tmp_path: Path, step: str) -> None:
    before_ws = workspace(tmp_path / "before")
    after_ws = workspace(tmp_path / "after")
    Promoter(tmp_path / "state_after").promote(str(after_ws), change_ops(), change_content)
    before, after = _tree(before_ws), _tree(after_ws)

    ws = workspace(tmp_path)
    state = tmp_path / "state"
    code = _CHILD.format(repo=str(Path(__file__).resolve().parents[1]), state=str(state), ws=str(ws))
    env = {**os.environ, CRASH_ENV: step}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=False)
    assert proc.returncode == -9, proc.stderr.decode()
    outcomes = Promoter(state).recover()
    tree = _tree(ws)
    assert tree in (before, after)
    expected = before if step == "prepared" else after
    assert tree == expected
    assert list((state / "promotions").iterdir()) == []
    if step != "done":
        assert len(outcomes) == 1
