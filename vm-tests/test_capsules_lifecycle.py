"""Capsules on the real kernel: overlay mounts, changes, fork, destroy, crash recovery, owners."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox import mountinfo, overlay
from sandbox.errors import CcwError
from sandbox.manager import CapsuleManager
from sandbox.ops import ExecRequest
from sandbox.replies import DestroyReply, ListReply
from sandbox.spec import CapsuleSpec

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under root: type, mode and content (or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = f"link {os.readlink(path)}"
            elif path.is_dir():
                out[rel] = f"dir {st.st_mode:o}"
            else:
                out[rel] = f"file {st.st_mode:o} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return out


def populate(ws: Path) -> None:
    for rel, text in {
        "keep.txt": "keep", "mod.txt": "old", "chmod.txt": "bits", "gone.txt": "bye",
        "gonedir/inner.txt": "x", "gonedir/sub/deeper.txt": "y", "opq/old.txt": "o",
        "f2d": "file", "f2s": "file", "moved/a.txt": "a", "nested/a/b/c.txt": "c",
    }.items():
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    os.symlink("keep.txt", ws / "link")


@pytest.fixture
def env(root_required: None, tmp_path: Path) -> Iterator[tuple[CapsuleManager, Path, Path]]:
    state, ws = tmp_path / "state", tmp_path / "ws"
    state.mkdir()
    ws.mkdir()
    populate(ws)
    manager = CapsuleManager(str(state), rootless=False)
    manager.recover()
    yield manager, state, ws
    for owner in (0, NOBODY):  # forks sort after their parents: destroy newest first
        for item in reversed(manager.list(owner).capsules):
            manager.destroy(item.capsule_id, owner)
    assert mountinfo.mounts_under(str(state)) == []


def sh(cwd: str, script: str) -> None:
    subprocess.run(["/bin/sh", "-ec", script], cwd=cwd, check=True)


def test_writes_land_in_the_capsule_not_the_host(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    before = tree_digest(ws)
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)}))
    assert capsule.capsule_id.startswith("cap_") and capsule.workspace == str(ws)
    merged = capsule.mount
    sh(merged, "echo new > added.txt; echo changed > mod.txt; rm gone.txt; rm -rf gonedir; mkdir -p x/y")
    assert (Path(merged) / "added.txt").read_text() == "new\n"
    assert not (Path(merged) / "gone.txt").exists()
    assert tree_digest(ws) == before
    paths = [c.path for c in manager.changes(capsule.capsule_id, 0).changes]
    assert paths == ["added.txt", "gone.txt", "gonedir", "mod.txt", "x", "x/y"]


def test_every_kind_of_change_is_reported_exactly(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)}))
    sh(capsule.mount, textwrap.dedent("""
        echo new > added.txt
        echo changed > mod.txt
        chmod 600 chmod.txt
        rm gone.txt
        rm -rf gonedir
        rm -rf opq; mkdir opq; echo fresh > opq/fresh.txt
        rm f2d; mkdir f2d
        rm f2s; ln -s ../target f2s
        ln -sfn mod.txt link
        echo n > nested/a/b/new.txt
        cat keep.txt > /dev/null; touch keep.txt
        mv moved renamed
    """))
    found = {c.path: c for c in manager.changes(capsule.capsule_id, 0).changes}
    assert list(found) == sorted(found, key=os.fsencode)
    expected = {
        "added.txt": ("added", "file"), "chmod.txt": ("mode_changed", "file"),
        "f2d": ("type_changed", "dir"), "f2s": ("type_changed", "symlink"),
        "gone.txt": ("deleted", "file"), "gonedir": ("deleted", "dir"), "link": ("modified", "symlink"),
        "mod.txt": ("modified", "file"), "moved": ("deleted", "dir"), "nested/a/b/new.txt": ("added", "file"),
        "opq": ("opaque", "dir"), "opq/fresh.txt": ("added", "file"),
        "renamed": ("added", "dir"), "renamed/a.txt": ("added", "file"),
    }
    assert {p: (c.kind, c.type) for p, c in found.items()} == expected
    assert found["chmod.txt"].mode == 0o600
    assert found["f2s"].target == "../target" and found["link"].target == "mod.txt"
    assert found["mod.txt"].size == len("changed\n")


def test_fork_sees_parent_and_does_not_leak_into_it(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    parent = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)}))
    pid = parent.capsule_id
    sh(parent.mount, "echo parent > p.txt; rm gone.txt")
    child = manager.fork(pid, 0, 0)
    assert child.parent == pid
    cm = Path(child.mount)
    assert (cm / "p.txt").read_text() == "parent\n" and not (cm / "gone.txt").exists()
    sh(str(cm), "echo child > c.txt; echo overwritten > p.txt")
    assert not (Path(parent.mount) / "c.txt").exists()
    assert (Path(parent.mount) / "p.txt").read_text() == "parent\n"
    # the parent is frozen by the kernel while the fork exists
    with pytest.raises(OSError) as err:
        (Path(parent.mount) / "late.txt").write_text("x")
    assert err.value.errno == 30  # EROFS
    with pytest.raises(CcwError) as cerr:
        manager.exec(ExecRequest.from_args({"capsule_id": pid, "argv": ["/bin/true"]}), 0, 0)
    assert cerr.value.code == "CONFLICT"
    with pytest.raises(CcwError) as cerr:
        manager.destroy(pid, 0)
    assert cerr.value.code == "CONFLICT"
    child_changes = {c.path: c.kind for c in manager.changes(child.capsule_id, 0).changes}
    assert child_changes == {"c.txt": "added", "gone.txt": "deleted", "p.txt": "added"}
    assert [c.path for c in manager.changes(pid, 0).changes] == ["gone.txt", "p.txt"]
    grandchild = manager.fork(child.capsule_id, 0, 0)
    assert (Path(grandchild.mount) / "c.txt").read_text() == "child\n"
    manager.destroy(grandchild.capsule_id, 0)
    manager.destroy(child.capsule_id, 0)
    (Path(parent.mount) / "late.txt").write_text("thawed")


def test_destroy_leaves_nothing(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, state, ws = env
    ids = [manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id for _ in range(3)]
    fork = manager.fork(ids[0], 0, 0).capsule_id
    sh(str(state / "capsules" / fork / "merged"), "echo x > y")
    mounts = mountinfo.mounts_under(str(state))
    assert sorted(os.path.basename(p) for p in mounts) == ["disk"] * 4 + ["merged"] * 4  # each its own disk
    for capsule_id in [fork, *ids]:
        assert manager.destroy(capsule_id, 0) == DestroyReply(capsule_id, destroyed=True)
    assert mountinfo.mounts_under(str(state)) == []
    assert os.listdir(state / "capsules") == []
    assert manager.list(0) == ListReply(())


def test_weird_workspace_paths_and_the_mount2_fallback(env: tuple[CapsuleManager, Path, Path], tmp_path: Path) -> None:
    manager, _state, _ws = env
    weird = tmp_path / "we,ird:name with space"
    weird.mkdir()
    (weird / "f").write_text("f")
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(weird)}))
    assert (Path(capsule.mount) / "f").read_text() == "f"
    upper, work, merged = tmp_path / "u", tmp_path / "w", tmp_path / "m,x"
    for d in (upper, work, merged):
        d.mkdir()
    overlay._mount_legacy([str(weird)], str(upper), str(work), str(merged), False)
    try:
        assert (merged / "f").read_text() == "f"
    finally:
        overlay.teardown(str(merged))
    assert mountinfo.mounts_under(str(merged)) == []


def test_open_root_gives_the_merged_view(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)}))
    fd = manager.open_root(capsule.capsule_id, 0)
    try:
        file_fd = os.open("keep.txt", os.O_RDONLY, dir_fd=fd)
        assert os.read(file_fd, 100) == b"keep"
        os.close(file_fd)
        assert os.fstat(fd).st_dev != os.stat(ws).st_dev
    finally:
        os.close(fd)


RECOVER_SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
from sandbox.manager import CapsuleManager
from sandbox.spec import CapsuleSpec
m = CapsuleManager({state!r}, rootless=False)
m.recover()
c = m.create(0, 0, CapsuleSpec({ws!r}))
open(os.path.join(c.mount, "precious.txt"), "w").write("keep me")
f = m.fork(c.capsule_id, 0, 0)
open(os.path.join(f.mount, "forked.txt"), "w").write("mine")
print(c.capsule_id, f.capsule_id, flush=True)
time.sleep(600)
"""


@pytest.fixture
def restarted(env: tuple[CapsuleManager, Path, Path]) -> Iterator[Callable[[], CapsuleManager]]:
    """Make a manager over ``env``'s state dir, as a restarted helper would.  After the test,
    pass or fail, its capsules are destroyed and any mount still under the state dir (a
    killed helper's, when the test failed before recovering them) detached, overlays before
    the disks holding their upper dirs: else they outlive the run under pytest's base dir."""
    _manager, state, _ws = env
    made: list[CapsuleManager] = []

    def make() -> CapsuleManager:
        made.append(CapsuleManager(str(state), rootless=False))
        return made[-1]

    yield make
    for manager in made:
        for owner in (0, NOBODY):
            for item in reversed(manager.list(owner).capsules):  # forks first
                with contextlib.suppress(CcwError):  # its mounts go below
                    manager.destroy(item.capsule_id, owner)
    for point in sorted(mountinfo.mounts_under(str(state)), key=lambda point: point.endswith("/disk")):
        overlay.teardown(point)


@contextlib.contextmanager
def _mounts_copied() -> Iterator[None]:
    """A process in a mount namespace made now, holding a copy of every mount there is, as
    another helper starting on the machine makes one (sandbox/__main__.py), for the block."""
    with subprocess.Popen(["unshare", "--mount", "sh", "-c", "echo held; exec sleep 600"],
                          stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            yield
        finally:
            holder.kill()


@pytest.mark.parametrize("copied", [False, True], ids=["alone", "copied"])
def test_kill_9_loses_no_capsule_data(env: tuple[CapsuleManager, Path, Path], restarted: Callable[[], CapsuleManager],
                                      require: Callable[[bool, str], None], copied: bool) -> None:
    """``copied``: another mount namespace keeps copies of the dead helper's mounts, so its
    disks' filesystems live on, their dirty pages unwritten, while recover mounts the same
    images again through new loop devices (registry.recover writes them back first)."""
    require(not copied or shutil.which("unshare") is not None, "needs unshare(1)")
    _manager, state, ws = env
    script = RECOVER_SCRIPT.format(root=str(ROOT), state=str(state), ws=str(ws))
    with contextlib.ExitStack() as held:
        with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
            try:
                assert proc.stdout is not None
                parent_id, fork_id = proc.stdout.readline().split()
                if copied:
                    held.enter_context(_mounts_copied())
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        assert len(mountinfo.mounts_under(str(state))) == 4  # overlays and disks left by the dead helper
        (state / "capsules" / ".new-cap_0000000000001_00000000").mkdir()  # half-created
        broken = state / "capsules" / "cap_0000000000002_00000000"
        broken.mkdir()
        (broken / "meta.json").write_text("{not json")
        manager = restarted()
        report = manager.recover()
        assert report["capsules"] == [parent_id, fork_id]
        assert sorted(report["removed"]) == [".new-cap_0000000000001_00000000", "cap_0000000000002_00000000"]
        assert mountinfo.mounts_under(str(state)) == []  # stale mounts detached, remounted on demand
        assert sorted(os.listdir(state / "capsules")) == [parent_id, fork_id]
        assert [c.path for c in manager.changes(fork_id, 0).changes] == ["forked.txt", "precious.txt"]
        fd = manager.open_root(fork_id, 0)
        try:
            with open(f"/proc/self/fd/{fd}/precious.txt") as f:
                assert f.read() == "keep me"
        finally:
            os.close(fd)
        parent_fd = manager.open_root(parent_id, 0)  # remounted: still frozen for its fork
        try:
            with pytest.raises(OSError):
                open(f"/proc/self/fd/{parent_fd}/new.txt", "w").close()
        finally:
            os.close(parent_fd)
    manager.destroy(fork_id, 0)
    manager.destroy(parent_id, 0)
    assert mountinfo.mounts_under(str(state)) == [] and os.listdir(state / "capsules") == []


def test_capsules_belong_to_their_creator(env: tuple[CapsuleManager, Path, Path], nobody_dir: Path,
                                          require: Callable[[bool, str], None]) -> None:
    manager, _state, ws = env
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)}))
    cid = capsule.capsule_id
    for op in (manager.changes, manager.open_root, manager.destroy):
        with pytest.raises(CcwError) as err:
            op(cid, NOBODY)
        assert err.value.code == "PERMISSION_DENIED"
    with pytest.raises(CcwError) as err:
        manager.fork(cid, NOBODY, NOBODY)
    assert err.value.code == "PERMISSION_DENIED"
    with pytest.raises(CcwError) as err:
        manager.exec(ExecRequest.from_args({"capsule_id": cid, "argv": ["/bin/true"]}), NOBODY, NOBODY)
    assert err.value.code == "PERMISSION_DENIED"
    assert manager.list(NOBODY) == ListReply(())

    root_owned = nobody_dir / "root-owned"
    root_owned.mkdir(mode=0o755)
    hidden = nobody_dir / "private"
    hidden.mkdir(mode=0o700)
    open_inside = hidden / "open"
    open_inside.mkdir()
    open_inside.chmod(0o777)  # writable, but nobody can reach it through private/
    own = nobody_dir / "own"
    own.mkdir()
    os.chown(own, NOBODY, NOBODY)
    for denied in (root_owned, open_inside):
        with pytest.raises(CcwError) as err:
            manager.create(NOBODY, NOBODY, CapsuleSpec.from_json({"workspace": str(denied)}))
        assert err.value.code == "PERMISSION_DENIED", denied
    with pytest.raises(CcwError) as err:
        manager.create(NOBODY, NOBODY, CapsuleSpec.from_json({"workspace": str(own), "base": str(hidden)}))
    assert err.value.code == "PERMISSION_DENIED"
    theirs = manager.create(NOBODY, NOBODY, CapsuleSpec.from_json({"workspace": str(own)}))
    root_st = os.stat(theirs.mount)
    assert (root_st.st_uid, root_st.st_mode & 0o777) == (NOBODY, 0o755)  # the merged root mirrors the workspace
    assert [c.capsule_id for c in manager.list(NOBODY).capsules] == [theirs.capsule_id]
    with pytest.raises(CcwError) as err:
        manager.changes(theirs.capsule_id, 0)
    assert err.value.code == "PERMISSION_DENIED"
    manager.destroy(theirs.capsule_id, NOBODY)


def test_base_is_a_frozen_lower(env: tuple[CapsuleManager, Path, Path], tmp_path: Path) -> None:
    manager, _state, ws = env
    base = tmp_path / "snapshot"
    base.mkdir()
    (base / "from-base.txt").write_text("b")
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws), "base": str(base)}))
    merged = Path(capsule.mount)
    assert sorted(os.listdir(merged)) == ["from-base.txt"]
    assert capsule.isolation["filesystem"]["frozen_base"] is True
