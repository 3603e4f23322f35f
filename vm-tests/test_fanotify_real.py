"""sandbox/fanotify.py and fanotify_record.py on a real overlay, the exec in another mount
namespace (as in the jail); the group is kept across recordings, as a capsule's is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox import syscalls
from sandbox.cgroups import detect_layout
from sandbox.errors import CcwError
from sandbox.exec_cgroup import ExecCgroup, Limits
from sandbox.fanotify import Group
from sandbox.fanotify_record import Recording

Require = Callable[[bool, str], None]


@pytest.fixture
def overlay(tmp_path: Path, root_required: None, require: Require, request: pytest.FixtureRequest) -> Iterator[Path]:
    """An overlay like a capsule's: lower with files (and ``param`` more in many/), merged
    mounted; yields the base dir."""
    require(shutil.which("unshare") is not None, "util-linux unshare is missing")
    for name in ("lower", "upper", "work", "merged", "jail"):
        (tmp_path / name).mkdir()
    (tmp_path / "lower" / "src").mkdir()
    (tmp_path / "lower" / "many").mkdir()
    for i in range(getattr(request, "param", 0)):
        (tmp_path / "lower" / "many" / f"f{i:05d}").write_bytes(b"x")
    for name in ("a.txt", "b.txt", "untouched.txt", "outside.txt", "src/mod.py"):
        (tmp_path / "lower" / name).write_text(name)
    opts = f"lowerdir={tmp_path}/lower,upperdir={tmp_path}/upper,workdir={tmp_path}/work"
    syscalls.mount("overlay", str(tmp_path / "merged"), "overlay", 0, opts)
    try:
        yield tmp_path
    finally:
        syscalls.umount2(str(tmp_path / "merged"), syscalls.MNT_DETACH)


@pytest.fixture
def group(overlay: Path) -> Iterator[Group]:
    opened = Group.open(str(overlay / "merged"))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def cgroup(request: pytest.FixtureRequest) -> Iterator[ExecCgroup]:
    cg = ExecCgroup.prepare(detect_layout(), f"ccwtest-fan-{request.node.name[:40]}", Limits())
    try:
        yield cg
    finally:
        cg.teardown()


def run_in_jail(base: Path, cg: ExecCgroup | None, script: str) -> None:
    """Run sh ``script`` in a new mount namespace with the merged view bound at base/jail
    (the jail's workspace path), in the cgroup; $W is the workspace."""
    gate = "read go; " if cg is not None else ""
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"{gate}mount --bind {base}/merged {base}/jail && cd {base}/jail && W={base}/jail && {script}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    if cg is not None:
        cg.enter(proc.pid)
    out, err = proc.communicate(b"go\n", timeout=120)
    assert proc.returncode == 0, (out, err)


def test_reads_and_writes_in_another_mount_namespace(overlay: Path, group: Group, cgroup: ExecCgroup) -> None:
    recording = group.record(cgroup)
    try:
        run_in_jail(overlay, cgroup, "cat a.txt src/mod.py >/dev/null && echo hi > new.txt && echo more >> b.txt")
        touched = recording.collect()
    finally:
        recording.close()
    assert touched.unavailable_reason is None and not touched.overflow
    # opened for writing counts as opened: fanotify does not say the access mode
    assert touched.read == ["a.txt", "b.txt", "new.txt", "src/mod.py"]
    assert touched.written == ["b.txt", "new.txt"]


def test_paths_resolve_after_the_namespace_is_gone(overlay: Path, group: Group, cgroup: ExecCgroup) -> None:
    # Events read only after the jail exited: the bind mount is detached by then.  The
    # group's lock, held while the jail runs, keeps the reader from reading them earlier.
    recording = group.record(cgroup)
    try:
        with group._lock:
            run_in_jail(overlay, cgroup, "cat a.txt src/mod.py >/dev/null")
        touched = recording.collect()
    finally:
        recording.close()
    assert touched.read == ["a.txt", "src/mod.py"]


def test_opens_outside_the_exec_are_excluded(overlay: Path, group: Group, cgroup: ExecCgroup) -> None:
    merged = overlay / "merged"
    # A long-lived process outside the exec (the front end reading through open_root).
    front_end = subprocess.Popen(
        [sys.executable, "-c", f"open({str(merged / 'outside.txt')!r}).read(); print('ok', flush=True); input()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    recording = group.record(cgroup)
    try:
        assert front_end.stdout is not None and front_end.stdout.readline() == b"ok\n"
        (merged / "b.txt").read_text()  # the helper itself
        run_in_jail(overlay, cgroup, "cat a.txt >/dev/null")
        touched = recording.collect()
    finally:
        front_end.communicate(b"\n", timeout=30)
        recording.close()
    assert touched.read == ["a.txt"]
    assert "untouched.txt" not in touched.read and "outside.txt" not in touched.read


def test_without_cgroup_the_mount_namespace_decides(overlay: Path, group: Group) -> None:
    recording = group.record(None)
    try:
        (overlay / "merged" / "b.txt").read_text()  # helper: same mount namespace
        run_in_jail(overlay, None, "cat a.txt >/dev/null; sleep 0.2")
        touched = recording.collect()
    finally:
        recording.close()
    assert touched.read == ["a.txt"]


def test_exec_counts_as_read(overlay: Path, group: Group, cgroup: ExecCgroup) -> None:
    shutil.copy("/bin/true", overlay / "merged" / "tool")
    recording = group.record(cgroup)
    try:
        run_in_jail(overlay, cgroup, "./tool")
        touched = recording.collect()
    finally:
        recording.close()
    assert touched.read == ["tool"]
    assert touched.written == []


@pytest.mark.parametrize("overlay", [20_000], indirect=True)
def test_twenty_thousand_opens_lose_nothing(overlay: Path, group: Group, cgroup: ExecCgroup) -> None:
    names = [f"f{i:05d}" for i in range(20_000)]
    recording = group.record(cgroup)
    try:
        code = "import os\nfor n in sorted(os.listdir('many')):\n    open('many/' + n, 'rb').read()\n"
        run_in_jail(overlay, cgroup, f"{sys.executable} -c \"{code}\"")
        touched = recording.collect()
    finally:
        recording.close()
    assert touched.read is not None
    if not touched.overflow:
        assert touched.read == [f"many/{n}" for n in names]
    assert touched.dropped == 0


def test_collect_and_close_are_safe_in_any_order(overlay: Path, group: Group) -> None:
    recording = group.record(None)
    assert recording.collect().read == []  # nothing ran: nothing belongs to an exec
    recording.close()
    recording.close()
    assert recording.collect().read == []
    group.close()
    group.close()
    assert group.record(None).collect().read == []  # a closed group records nothing


def test_rootless_tracer_reports_read_as_unavailable(overlay: Path) -> None:
    # Root inside a user namespace has no CAP_SYS_ADMIN in the initial one: the rootless helper.
    root = Path(__file__).resolve().parent.parent
    code = (f"import sys; sys.path.insert(0, {str(root)!r})\n"
            "from sandbox.fanotify import Group\n"
            f"g = Group.open({str(overlay / 'merged')!r})\n"
            "print(repr(g.record(None).collect()))\n"
            f"print(Group.open({str(overlay / 'merged')!r}).unavailable_reason == g.unavailable_reason)\n"
            "g.close()\n")
    out = subprocess.run(["unshare", "-U", "-r", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "read=None" in out.stdout and "written=[]" in out.stdout
    assert "CAP_SYS_ADMIN" in out.stdout and out.stdout.split()[-1] == "True"


def test_directories_opened_are_listed_and_executables_named(overlay: Path, group: Group, cgroup: ExecCgroup) -> None:
    # FAN_ONDIR: a directory open is a FAN_OPEN event whose mask does not say "dir" (fd
    # mode); the tracer tells it by fstat and puts it in `listed`, never in `read`.
    shutil.copy("/bin/true", overlay / "merged" / "tool")
    recording = group.record(cgroup, visible_at=str(overlay / "jail"))
    try:
        run_in_jail(overlay, cgroup, "ls >/dev/null && ls src >/dev/null && ./tool && cat a.txt >/dev/null")
        touched = recording.collect()
    finally:
        recording.close()
    assert touched.listed == [".", "src"]
    assert touched.executed == ["tool"]
    assert touched.read == ["a.txt", "tool"]


def test_events_queued_before_a_recording_are_dropped(overlay: Path, group: Group, cgroup: ExecCgroup) -> None:
    # Opens between two execs, by a process gone since (which the attribution would count),
    # still queued when the next recording starts (the reader held off by the group's lock).
    first = group.record(cgroup)
    run_in_jail(overlay, cgroup, "cat a.txt >/dev/null")
    assert first.collect().read == ["a.txt"]
    first.close()
    with group._lock:
        subprocess.run(["cat", str(overlay / "merged" / "b.txt")], check=True, stdout=subprocess.DEVNULL)
    second: Recording = group.record(cgroup)
    try:
        run_in_jail(overlay, cgroup, "cat src/mod.py >/dev/null")
        assert second.collect().read == ["src/mod.py"]
    finally:
        second.close()


def test_a_group_is_refused_where_no_overlay_is_mounted(overlay: Path) -> None:
    # A filesystem mark on a plain directory would watch the host filesystem it lies on.
    with pytest.raises(CcwError) as refused:
        Group.open(str(overlay / "jail"))
    assert refused.value.code == "INTERNAL" and "not a mounted overlay" in refused.value.message
