"""Promotion after the live tree was edited and put back, through ``ccw`` on a real capsule.

A live file edited and then restored byte for byte (a new mtime and inode, as an editor's
save leaves) overwrites nothing anyone made, so promotion goes ahead; a same-size edit
whose mtime was set back (``touch -d``) and a mode change are real changes, still
refused with REPO_CHANGED and nothing written.  The check is promote.py's ``_conflicts``,
which compares contents, kind, mode and link target, never stat times.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.cli_process import ccw


def _edit_and_put_back(path: Path, data: bytes) -> None:
    path.write_bytes(b"someone else's edit\n")
    saved = path.with_name(".saved")
    saved.write_bytes(data)
    os.chmod(saved, 0o644)
    os.replace(saved, path)


def test_a_live_edit_put_back_promotes_and_real_changes_are_refused(cli_state: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_bytes(b"hello\n")
    (ws / "b.txt").write_bytes(b"keep\n")
    os.chmod(ws / "a.txt", 0o644)
    os.chmod(ws / "b.txt", 0o644)
    capsule = ccw(cli_state, "capsule", "create", str(ws), "--no-auto-expose").stdout.strip()
    ccw(cli_state, "capsule", "exec", capsule, "--", "sh", "-c", "echo changed > a.txt; echo new > b.txt")
    before = (ws / "a.txt").stat()

    _edit_and_put_back(ws / "a.txt", b"hello\n")
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns + 5_000_000_000))
    assert (ws / "a.txt").stat().st_ino != before.st_ino
    dry = json.loads(ccw(cli_state, "capsule", "promote", capsule, "--dry-run", "--json").stdout)
    assert dry["policy_report"]["passed"] is True and dry["applied"] == ["a.txt", "b.txt"]

    (ws / "a.txt").write_bytes(b"HELLO\n")  # same size, its mtime set back as touch -d would
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.chmod(ws / "b.txt", 0o755)  # the same bytes, executable now
    refused = ccw(cli_state, "capsule", "promote", capsule, check=False)
    assert refused.returncode == 1 and "ccw: REPO_CHANGED" in refused.stderr, refused.stderr
    assert "(a.txt, b.txt)" in refused.stderr
    assert (ws / "a.txt").read_bytes() == b"HELLO\n" and (ws / "b.txt").read_bytes() == b"keep\n"

    _edit_and_put_back(ws / "a.txt", b"hello\n")
    os.chmod(ws / "b.txt", 0o644)
    promoted = json.loads(ccw(cli_state, "capsule", "promote", capsule, "--json").stdout)
    assert promoted["promoted"] is True
    assert (ws / "a.txt").read_bytes() == b"changed\n" and (ws / "b.txt").read_bytes() == b"new\n"
    ccw(cli_state, "capsule", "destroy", capsule)
