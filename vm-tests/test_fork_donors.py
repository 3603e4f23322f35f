"""A fork with donors on the real kernel: a merge's inputs stacked, held, recovered (sandbox/fork_layers.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import mountinfo, overlay
from sandbox.errors import CcwError
from sandbox.manager import CapsuleManager
from sandbox.ops import ExecRequest
from sandbox.spec import CapsuleSpec

ROOT = Path(__file__).resolve().parent.parent
# What A and B did, as the merged capsule shows it and as its changes list it.
VIEW = {"a.txt": "from a\n", "b.txt": "from b\n", "keep.txt": "keep", "p.txt": "from p\n", "x.txt": "a's x\n",
        "d/new": ""}
CHANGES = {"a.txt": "added", "b.txt": "added", "d": "opaque", "d/new": "added", "p.txt": "added", "x.txt": "modified",
           "y.txt": "deleted"}


def populate(ws: Path) -> None:
    for rel, text in {"keep.txt": "keep", "x.txt": "base x", "y.txt": "base y", "d/old.txt": "old"}.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)


def sh(cwd: str, script: str) -> None:
    subprocess.run(["/bin/sh", "-ec", script], cwd=cwd, check=True)


def view(root: str) -> dict[str, str]:
    """Every file under ``root`` and its text."""
    out = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = Path(path).read_text()
    return out


def mounted_view(manager: CapsuleManager, capsule_id: str) -> dict[str, str]:
    """The capsule's view through ``open_root``, which mounts it again after a restart."""
    fd = manager.open_root(capsule_id, 0)
    try:
        return view(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def runs(manager: CapsuleManager, capsule_id: str) -> None:
    reply = manager.exec(ExecRequest.from_args({"capsule_id": capsule_id, "argv": ["/bin/true"]}), 0, 0)
    assert reply.exit_code == 0


def refused(code: str, call: Callable[[], object]) -> CcwError:
    with pytest.raises(CcwError) as info:
        call()
    assert info.value.code == code, info.value.message
    return info.value


@pytest.fixture
def helpers(root_required: None, tmp_path: Path) -> Iterator[tuple[Callable[[], CapsuleManager], Path, Path]]:
    """A maker of managers over one state dir, each a helper (re)started there, recovered; after
    the test the last one's capsules are destroyed, newest first, and nothing stays mounted."""
    state, ws = tmp_path / "state", tmp_path / "ws"
    state.mkdir()
    ws.mkdir()
    populate(ws)
    made: list[CapsuleManager] = []

    def start() -> CapsuleManager:
        made.append(CapsuleManager(str(state), rootless=False))
        made[-1].recover()
        return made[-1]

    yield start, state, ws
    if made:
        for item in reversed(made[-1].list(0).capsules):
            with contextlib.suppress(CcwError):  # what is left goes below
                made[-1].destroy(item.capsule_id, 0)
    for point in sorted(mountinfo.mounts_under(str(state)), key=lambda point: point.endswith("/disk")):
        overlay.teardown(point)


def test_a_fork_with_a_donor_stacks_both_inputs_and_holds_them(
        helpers: tuple[Callable[[], CapsuleManager], Path, Path], tmp_path: Path) -> None:
    start, _state, ws = helpers
    manager = start()
    made = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)}))
    sh(made.mount, "echo 'from p' > p.txt")  # the parent's parent's layer: listed in every change list below
    p = made.capsule_id
    a, b = manager.fork(p, 0, 0), manager.fork(p, 0, 0)
    sh(a.mount, "echo 'from a' > a.txt; echo \"a's x\" > x.txt")
    sh(b.mount, "echo 'from b' > b.txt; rm y.txt; rm -rf d; mkdir d; touch d/new")

    other_ws = tmp_path / "other"
    other_ws.mkdir()
    other = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(other_ws)})).capsule_id
    before = manager.list(0)
    error = refused("UNSUPPORTED", lambda: manager.fork(a.capsule_id, 0, 0, [other]))
    assert str(other_ws) in error.message
    assert manager.list(0) == before  # nothing made, nothing frozen
    runs(manager, a.capsule_id)
    runs(manager, other)
    manager.destroy(other, 0)

    m = manager.fork(a.capsule_id, 0, 0, [b.capsule_id])
    assert view(m.mount) == VIEW
    assert {c.path: c.kind for c in manager.changes(m.capsule_id, 0).changes} == CHANGES
    for held in (a, b):  # both frozen by the kernel, their execs and destruction refused
        with pytest.raises(OSError) as err:
            (Path(held.mount) / "late.txt").write_text("x")
        assert err.value.errno == 30  # EROFS
        refused("CONFLICT", lambda held=held: runs(manager, held.capsule_id))
    error = refused("CONFLICT", lambda: manager.destroy(b.capsule_id, 0))
    assert "merged capsules stacked on it" in error.message and error.details["forks"] == [m.capsule_id]

    manager = start()  # a restart: recovery keeps the child, and B held for it
    assert mounted_view(manager, m.capsule_id) == VIEW
    refused("CONFLICT", lambda: runs(manager, b.capsule_id))
    g = manager.fork(m.capsule_id, 0, 0).capsule_id
    assert mounted_view(manager, g) == VIEW

    manager = start()  # the fork of the merged capsule mounts first: every disk below it comes up
    assert mounted_view(manager, g) == VIEW
    assert {c.path: c.kind for c in manager.changes(g, 0).changes} == CHANGES
    refused("CONFLICT", lambda: manager.destroy(m.capsule_id, 0))
    manager.destroy(g, 0)
    manager.destroy(m.capsule_id, 0)
    for thawed in (a, b):  # mounted again by their exec, writable
        runs(manager, thawed.capsule_id)
        (Path(thawed.mount) / "late.txt").write_text("thawed")
    assert manager.destroy(b.capsule_id, 0).destroyed


ROOTLESS = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    from sandbox import syscalls
    uid, gid = os.getuid(), os.getgid()
    syscalls.unshare(syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNS)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {{uid}} 1"), ("gid_map", f"0 {{gid}} 1")):
        with open(f"/proc/self/{{name}}", "w") as f:
            f.write(text)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    import shutil
    from sandbox import mountinfo
    from sandbox.manager import CapsuleManager
    from sandbox.spec import CapsuleSpec
    m = CapsuleManager({state!r}, rootless=True)
    m.recover()
    p = m.create(0, 0, CapsuleSpec({ws!r})).capsule_id
    a, b = m.fork(p, 0, 0), m.fork(p, 0, 0)
    open(os.path.join(a.mount, "a.txt"), "w").write("from a")
    open(os.path.join(b.mount, "b.txt"), "w").write("from b")
    os.unlink(os.path.join(b.mount, "y.txt"))
    shutil.rmtree(os.path.join(b.mount, "d"))
    os.mkdir(os.path.join(b.mount, "d"))
    merged = m.fork(a.capsule_id, 0, 0, [b.capsule_id])
    out = {{"paths": sorted(os.listdir(merged.mount)), "d": os.listdir(os.path.join(merged.mount, "d")),
            "changes": [[c.path, c.kind] for c in m.changes(merged.capsule_id, 0).changes]}}
    for one in (merged.capsule_id, a.capsule_id, b.capsule_id, p):
        m.destroy(one, 0)
    out["after"] = len(mountinfo.mounts_under({state!r}))
    print(json.dumps(out))
""")


def test_a_rootless_helper_stacks_a_donor(nobody_dir: Path, as_nobody: Callable[[str, Path], dict[str, Any]]) -> None:
    state, ws = nobody_dir / "state", nobody_dir / "ws"
    state.mkdir()
    ws.mkdir()
    populate(ws)
    out = as_nobody(ROOTLESS.format(root=str(ROOT), state=str(state), ws=str(ws)), nobody_dir)
    assert out["paths"] == ["a.txt", "b.txt", "d", "keep.txt", "x.txt"] and out["d"] == []
    assert out["changes"] == [["a.txt", "added"], ["b.txt", "added"], ["d", "opaque"], ["y.txt", "deleted"]]
    assert out["after"] == 0 and os.listdir(state / "capsules") == []
