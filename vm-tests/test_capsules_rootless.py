"""A rootless CapsuleManager: an unprivileged user in its own user namespace, overlay with userxattr.

The test runs the system python as uid 65534 (the venv lives under root's 0700 home),
which enters a user + mount namespace mapping itself to 0, as ``ccw-helper --rootless``
does, and drives create / write / changes / fork / destroy there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534

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


@pytest.fixture
def nobody_dir(root_required: None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ccw-rootless-test-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_rootless_capsule_with_userxattr(nobody_dir: Path, require: Callable[[bool, str], None]) -> None:
    require(os.path.exists("/usr/bin/python3"), "needs /usr/bin/python3 for the unprivileged user")
    state, ws = nobody_dir / "state", nobody_dir / "ws"
    for d in (state, ws, ws / "dir"):
        d.mkdir()
    (ws / "gone.txt").write_text("bye")
    (ws / "dir" / "old.txt").write_text("o")
    for dirpath, dirnames, filenames in os.walk(nobody_dir):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, NOBODY, NOBODY)
    script = SCRIPT.format(root=str(ROOT), state=str(state), ws=str(ws))
    proc = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True, timeout=60,
                          user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")
    require("Operation not permitted" not in proc.stderr or proc.returncode == 0,
            f"unprivileged user namespaces are not allowed here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(c["path"], c["kind"]) for c in out["changes"]] == [
        ("dir", "opaque"), ("gone.txt", "deleted"), ("new.txt", "added")]
    assert "user.overlay.opaque" in out["xattrs"]
    assert out["child_paths"] == ["child.txt", "dir", "new.txt"]
    assert out["child_changes"] == ["child.txt", "dir", "gone.txt", "new.txt"]
    assert out["mounted"] == 1 and out["after"] == 0
    assert sorted(os.listdir(ws)) == ["dir", "gone.txt"] and os.listdir(state / "capsules") == []
