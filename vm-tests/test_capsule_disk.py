"""Capsule disks on the real kernel: a size limit on all a capsule writes, and no leaks.

Each capsule's upper dir, work dir, /tmp and $HOME live on its own ext4 image on a
loop device (sandbox/disk.py).  These tests fill that disk from inside the jail and
check what the agent is told, that the host's filesystem only grew by what the disk
holds, that the capsule stays usable, and that no loop device or mount outlives its
capsule or the pool.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import disk, mountinfo
from sandbox.errors import CcwError
from sandbox.manager import CapsuleManager
from sandbox.ops import ExecRequest
from sandbox.replies import DiskUse, ExecReply
from sandbox.spec import CapsuleSpec

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MB = 64


def loop_backing_files() -> list[str]:
    """The backing file of every bound loop device."""
    found = []
    for name in os.listdir("/sys/block"):
        path = Path("/sys/block", name, "loop", "backing_file")
        try:
            found.append(path.read_text().strip())
        except OSError:
            continue
    return found


def ours(state: Path) -> list[str]:
    return [f for f in loop_backing_files() if f.startswith(str(state))]


def wait_for_no_loops(state: Path) -> list[str]:
    # Autoclear unbinds a loop device when its last user goes, from a workqueue: poll.
    for _ in range(500):
        left = ours(state)
        if not left:
            return []
        time.sleep(0.02)
    return ours(state)


@pytest.fixture
def env(root_required: None, tmp_path: Path) -> Iterator[tuple[CapsuleManager, Path, Path]]:
    state, ws = tmp_path / "state", tmp_path / "ws"
    state.mkdir()
    ws.mkdir()
    (ws / "README").write_text("disk fill target\n")
    manager = CapsuleManager(str(state), rootless=False, disk_mb=LIMIT_MB)
    manager.recover()
    yield manager, state, ws
    for item in reversed(manager.list(0).capsules):
        manager.destroy(item.capsule_id, 0)
    assert mountinfo.mounts_under(str(state)) == []
    assert manager.disks is not None
    manager.disks.close()
    assert wait_for_no_loops(state) == [], "a loop device outlived its capsule or the pool"


def run(manager: CapsuleManager, capsule_id: str, script: str) -> ExecReply:
    return manager.exec(ExecRequest.from_args({"capsule_id": capsule_id, "argv": ["sh", "-c", script]}), 0, 0)


def image_kb(state: Path, capsule_id: str) -> int:
    """What the host's filesystem gives a capsule's disk: the image's allocated blocks."""
    return os.stat(state / "capsules" / capsule_id / "disk.img").st_blocks // 2


def test_filling_the_workspace_stops_at_the_limit_and_is_reported(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, state, ws = env
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)}))
    assert capsule.isolation["filesystem"]["disk_limit_mb"] == LIMIT_MB
    out = run(manager, capsule.capsule_id, "dd if=/dev/zero of=fill bs=1M count=1000; echo dd=$?")
    os.sync()  # the loop device writes the image back like any dirty file
    grown = image_kb(state, capsule.capsule_id)
    assert b"dd=1" in out.stdout and b"No space left on device" in out.stderr, out
    report = out.disk
    assert isinstance(report, DiskUse)
    assert report.full is True and report.limit_mb == LIMIT_MB
    assert report.used_kb > (LIMIT_MB - 16) * 1024 and report.free_kb < 4096
    # The host gave the capsule at most its disk's size (plus metadata slack), not 1000 MiB.
    assert (LIMIT_MB - 16) * 1024 < grown <= LIMIT_MB * 1024, f"the disk image holds {grown} KiB"
    assert not (ws / "fill").exists()
    # Still usable: freeing space frees it, and the next exec is not reported full.
    again = run(manager, capsule.capsule_id, "rm fill && echo freed > note && cat note")
    assert again.stdout == b"freed\n" and isinstance(again.disk, DiskUse) and again.disk.full is False


def test_tmp_and_home_count_against_the_same_disk(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    capsule_id = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    out = run(manager, capsule_id, "dd if=/dev/zero of=/tmp/t bs=1M count=40 2>/dev/null; "
                                   "dd if=/dev/zero of=$HOME/h bs=1M count=40 2>/dev/null; echo dd=$?")
    assert b"dd=1" in out.stdout, out  # the second write ran out: /tmp and $HOME share the limit
    assert isinstance(out.disk, DiskUse) and out.disk.full is True


def test_one_full_capsule_leaves_another_untouched(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    full = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    other = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    run(manager, full, "dd if=/dev/zero of=fill bs=1M count=1000 2>/dev/null; true")
    out = run(manager, other, "dd if=/dev/zero of=ok bs=1M count=16 2>/dev/null && echo wrote")
    assert out.stdout == b"wrote\n"
    assert isinstance(out.disk, DiskUse) and out.disk.full is False


def test_a_fork_has_its_own_disk_and_sees_its_parent(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    parent = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    run(manager, parent, "dd if=/dev/zero of=half bs=1M count=30 2>/dev/null")
    child = manager.fork(parent, 0, 0).capsule_id
    out = run(manager, child,
              "ls -s --block-size=M half; dd if=/dev/zero of=more bs=1M count=40 2>/dev/null; echo dd=$?")
    # The parent's 30 MiB are a lower layer of the fork: the fork's own disk takes its 40.
    assert b"30M half" in out.stdout and b"dd=0" in out.stdout, out
    manager.destroy(child, 0)


def test_sizes_are_checked_and_per_capsule(env: tuple[CapsuleManager, Path, Path]) -> None:
    manager, _state, ws = env
    for bad in (0, 16, disk.MAX_MB + 1, "64", True):
        with pytest.raises(CcwError) as err:
            manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws), "limits": {"disk_mb": bad}}))  # type: ignore[dict-item]
        assert err.value.code == "INVALID_ARGUMENT"
    bigger = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws), "limits": {"disk_mb": 128}}))
    assert bigger.isolation["filesystem"]["disk_limit_mb"] == 128
    out = run(manager, bigger.capsule_id, "dd if=/dev/zero of=f bs=1M count=100 2>/dev/null; echo dd=$?")
    assert b"dd=0" in out.stdout and isinstance(out.disk, DiskUse) and out.disk.limit_mb == 128


def test_without_disks_a_disk_limit_is_refused_with_the_reason(root_required: None, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    manager = CapsuleManager(str(tmp_path / "state"), rootless=False, disk_mb=0)
    manager.recover()
    with pytest.raises(CcwError) as err:
        manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(tmp_path / "ws"), "limits": {"disk_mb": 64}}))
    assert err.value.code == "UNSUPPORTED" and "CCW_CAPSULE_DISK_MB=0" in err.value.message
    plain = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(tmp_path / "ws")}))
    filesystem = plain.isolation["filesystem"]
    assert filesystem["disk_limit_mb"] is None and "turned off" in filesystem["disk_limit_unavailable"]
    manager.destroy(plain.capsule_id, 0)


KILL_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from sandbox.ops import ExecRequest
from sandbox.manager import CapsuleManager
from sandbox.spec import CapsuleSpec
m = CapsuleManager({state!r}, rootless=False, disk_mb={limit})
m.recover()
c = m.create(0, 0, CapsuleSpec({ws!r}))
m.exec(ExecRequest(c.capsule_id, ("sh", "-c", "echo kept > kept.txt; echo tmp > /tmp/t; sync")), 0, 0)
print(c.capsule_id, flush=True)
time.sleep(600)
"""


def test_a_killed_helper_loses_nothing_on_the_disk_and_leaks_no_pool(root_required: None, tmp_path: Path) -> None:
    state, ws = tmp_path / "state", tmp_path / "ws"
    ws.mkdir()
    script = KILL_SCRIPT.format(root=str(ROOT), state=str(state), ws=str(ws), limit=LIMIT_MB)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            capsule_id = proc.stdout.readline().strip()
        finally:
            proc.kill()
            proc.wait()
    # The dead process's pool disks were detached mounts: gone with it.  Its capsule's
    # disk stays mounted (this test runs in the host's mount namespace) until recovery.
    assert [Path(f).name for f in ours(state) if "/disks/pool/" in f] == []
    manager = CapsuleManager(str(state), rootless=False, disk_mb=LIMIT_MB)
    assert manager.recover()["capsules"] == [capsule_id]
    assert mountinfo.mounts_under(str(state)) == []
    assert [c.path for c in manager.changes(capsule_id, 0).changes] == ["kept.txt"]
    out = run(manager, capsule_id, "cat kept.txt /tmp/t")
    assert out.stdout == b"kept\ntmp\n"
    manager.destroy(capsule_id, 0)
    assert manager.disks is not None
    manager.disks.close()
    assert wait_for_no_loops(state) == []
