"""A rootless CapsuleManager: an unprivileged user in its own user namespace, overlay with userxattr.

The test runs the system python as uid 65534 (the venv lives under root's 0700 home),
which enters a user + mount namespace mapping itself to 0, as ``ccw-helper --rootless``
does, and drives create / write / changes / fork / destroy there.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    from sandbox import syscalls
    uid, gid = os.getuid(), os.getgid()
    syscalls.unshare(syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNS)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {{uid}} 1"), ("gid_map", f"0 {{gid}} 1")):
        with open(f"/proc/self/{{name}}", "w") as f:
            f.write(text)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    from sandbox.manager import CapsuleManager
    from sandbox import mountinfo
    from sandbox.spec import CapsuleSpec
    m = CapsuleManager({state!r}, rootless=True)
    m.recover()
    c = m.create(0, 0, CapsuleSpec({ws!r}))
    merged = c.mount
    open(os.path.join(merged, "new.txt"), "w").write("n")
    os.unlink(os.path.join(merged, "gone.txt"))
    import shutil
    shutil.rmtree(os.path.join(merged, "dir"))
    os.mkdir(os.path.join(merged, "dir"))
    f = m.fork(c.capsule_id, 0, 0)
    open(os.path.join(f.mount, "child.txt"), "w").write("c")
    child_paths = sorted(os.listdir(f.mount))
    child_changes = [ch.path for ch in m.changes(f.capsule_id, 0).changes]
    m.destroy(f.capsule_id, 0)
    out = {{"changes": m.changes(c.capsule_id, 0).to_args()["changes"],
            "child_paths": child_paths, "child_changes": child_changes,
            "xattrs": os.listxattr(os.path.join(merged.replace("merged", "upper"), "dir")),
            "mounted": len(mountinfo.mounts_under({state!r}))}}
    m.destroy(c.capsule_id, 0)
    out["after"] = len(mountinfo.mounts_under({state!r}))
    print(json.dumps(out))
""")


def test_rootless_capsule_with_userxattr(nobody_dir: Path, as_nobody: Callable[[str, Path], dict[str, Any]]) -> None:
    state, ws = nobody_dir / "state", nobody_dir / "ws"
    for d in (state, ws, ws / "dir"):
        d.mkdir()
    (ws / "gone.txt").write_text("bye")
    (ws / "dir" / "old.txt").write_text("o")
    out = as_nobody(SCRIPT.format(root=str(ROOT), state=str(state), ws=str(ws)), nobody_dir)
    assert [(c["path"], c["kind"]) for c in out["changes"]] == [
        ("dir", "opaque"), ("gone.txt", "deleted"), ("new.txt", "added")]
    assert "user.overlay.opaque" in out["xattrs"]
    assert out["child_paths"] == ["child.txt", "dir", "new.txt"]
    assert out["child_changes"] == ["child.txt", "dir", "gone.txt", "new.txt"]
    assert out["mounted"] == 1 and out["after"] == 0
    assert sorted(os.listdir(ws)) == ["dir", "gone.txt"] and os.listdir(state / "capsules") == []
