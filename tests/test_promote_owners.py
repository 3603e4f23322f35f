"""Promotion leaves owners as the host's root would: a replaced file keeps its owner, a new one is the promoter's."""

from __future__ import annotations

import os
from pathlib import Path

from mcp_server.fs.promote import Op, Promoter

# Root gives a replaced file back to its owner; anyone else can only keep its own uid.
OTHER = 1234 if os.geteuid() == 0 else os.getuid()


def test_a_replaced_file_keeps_its_owner_and_a_new_one_is_the_promoters(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("old\n")
    (ws / "link").symlink_to("pkg/mod.py")
    for path in (ws, ws / "pkg", ws / "pkg" / "mod.py", ws / "link"):
        os.lchown(path, OTHER, OTHER)
    content = {"pkg/mod.py": b"new\n", "pkg/new.py": b"fresh\n", "link": b"was a link\n", "made/x.py": b"x\n"}
    ops = [Op("write", "pkg/mod.py", 0o6755), Op("write", "pkg/new.py", 0o644), Op("delete", "link"),
           Op("write", "link", 0o644), Op("write", "made/x.py", 0o644)]
    Promoter(tmp_path / "state").promote(str(ws), ops, lambda op: content[op.path])
    mod = (ws / "pkg" / "mod.py").stat()
    assert (ws / "pkg" / "mod.py").read_bytes() == b"new\n" and (mod.st_uid, mod.st_gid) == (OTHER, OTHER)
    assert mod.st_mode & 0o7777 == 0o755  # set-id bits never written, owner kept or not
    me = (os.geteuid(), os.getegid())
    for rel in ("pkg/new.py", "link", "made", "made/x.py"):  # new, or replacing a link: the promoter's
        got = (ws / rel).lstat()
        assert (got.st_uid, got.st_gid) == me, rel
