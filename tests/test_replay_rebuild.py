"""Rebuilding a witness's base: modes, mtimes, links as links, and no write outside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_server.capsules.replay import _rebuild_base
from mcp_server.fs.witness import blob_hash
from sandbox.errors import CcwError

DATA = b"print('hi')\n"


def _manifest(*entries: dict[str, object]) -> dict[str, object]:
    return {"base": {"files": list(entries)}}


def test_files_dirs_and_links_come_back_as_they_were(tmp_path: Path) -> None:
    into = tmp_path / "base"
    into.mkdir()
    _rebuild_base(_manifest(
        {"path": "bin", "type": "dir", "mode": 0o755},
        {"path": "bin/python", "type": "symlink", "mode": 0o777, "target": "/usr/bin/python3"},
        {"path": "locked", "type": "dir", "mode": 0o500},
        {"path": "locked/run.py", "type": "file", "mode": 0o755, "blob": blob_hash(DATA),
         "mtime_ns": 1_234_567_890_123_456_789},
    ), {blob_hash(DATA): DATA}, str(into))
    assert os.readlink(into / "bin/python") == "/usr/bin/python3"
    run = into / "locked/run.py"
    assert run.read_bytes() == DATA and run.stat().st_mode & 0o777 == 0o755
    assert run.stat().st_mtime_ns == 1_234_567_890_123_456_789
    assert (into / "locked").stat().st_mode & 0o777 == 0o500  # set last, after its children


@pytest.mark.parametrize("entries", [
    # A link to the outside, then a file "through" it.
    ({"path": "x", "type": "symlink", "mode": 0o777, "target": "{outside}"},
     {"path": "x/evil", "type": "file", "mode": 0o644, "blob": blob_hash(DATA)}),
    ({"path": "../evil", "type": "file", "mode": 0o644, "blob": blob_hash(DATA)},),
    ({"path": "d/../../evil", "type": "file", "mode": 0o644, "blob": blob_hash(DATA)},),
    ({"path": "x", "type": "symlink", "mode": 0o777, "target": "{outside}"},
     {"path": "x/sub", "type": "dir", "mode": 0o755}),
])
def test_a_hostile_witness_writes_nothing_outside(tmp_path: Path, entries: tuple[dict[str, object], ...]) -> None:
    into = tmp_path / "scratch" / "base"
    into.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    fixed = [{k: (str(v).format(outside=outside) if k == "target" else v) for k, v in e.items()} for e in entries]
    with pytest.raises(CcwError):
        _rebuild_base(_manifest(*fixed), {blob_hash(DATA): DATA}, str(into))
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "scratch" / "evil").exists() and not (tmp_path / "evil").exists()
