"""sandbox/fanotify.py on a real overlay, the exec in another mount namespace (as in the jail)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox import syscalls
from sandbox.cgroups import detect_layout
from sandbox.exec_cgroup import ExecCgroup, Limits
from sandbox.fanotify import Tracer

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


def test_reads_and_writes_in_another_mount_namespace(overlay: Path, cgroup: ExecCgroup) -> None:
    tracer = Tracer.prepare(str(overlay / "merged"))
    try:
        tracer.enter(cgroup)
        run_in_jail(overlay, cgroup, "cat a.txt src/mod.py >/dev/null && echo hi > new.txt && echo more >> b.txt")
        touched = tracer.collect()
    finally:
        tracer.teardown()
    assert touched.unavailable_reason is None and not touched.overflow
    # opened for writing counts as opened: fanotify does not say the access mode
    assert touched.read == ["a.txt", "b.txt", "new.txt", "src/mod.py"]
    assert touched.written == ["b.txt", "new.txt"]


def test_paths_resolve_after_the_namespace_is_gone(overlay: Path, cgroup: ExecCgroup) -> None:
    # Events read only after the jail exited: the bind mount is detached by then.
    tracer = Tracer.prepare(str(overlay / "merged"))
    try:
        run_in_jail(overlay, cgroup, "cat a.txt src/mod.py >/dev/null")
        tracer.enter(cgroup)
        touched = tracer.collect()
    finally:
        tracer.teardown()
    assert touched.read == ["a.txt", "src/mod.py"]


def test_opens_outside_the_exec_are_excluded(overlay: Path, cgroup: ExecCgroup) -> None:
    tracer = Tracer.prepare(str(overlay / "merged"))
    merged = overlay / "merged"
    # A long-lived process outside the exec (the front end reading through open_root).
    front_end = subprocess.Popen(
        [sys.executable, "-c", f"open({str(merged / 'outside.txt')!r}).read(); print('ok', flush=True); input()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        tracer.enter(cgroup)
        assert front_end.stdout is not None and front_end.stdout.readline() == b"ok\n"
        (merged / "b.txt").read_text()  # the helper itself
        run_in_jail(overlay, cgroup, "cat a.txt >/dev/null")
        touched = tracer.collect()
    finally:
        front_end.communicate(b"\n", timeout=30)
        tracer.teardown()
    assert touched.read == ["a.txt"]
    assert "untouched.txt" not in touched.read and "outside.txt" not in touched.read


def test_without_cgroup_the_mount_namespace_decides(overlay: Path) -> None:
    tracer = Tracer.prepare(str(overlay / "merged"))
    try:
        tracer.enter(None)
        (overlay / "merged" / "b.txt").read_text()  # helper: same mount namespace
        run_in_jail(overlay, None, "cat a.txt >/dev/null; sleep 0.2")
        touched = tracer.collect()
    finally:
        tracer.teardown()
    assert touched.read == ["a.txt"]


def test_exec_counts_as_read(overlay: Path, cgroup: ExecCgroup) -> None:
    shutil.copy("/bin/true", overlay / "merged" / "tool")
    tracer = Tracer.prepare(str(overlay / "merged"))
    try:
        tracer.enter(cgroup)
        run_in_jail(overlay, cgroup, "./tool")
        touched = tracer.collect()
    finally:
        tracer.teardown()
    assert touched.read == ["tool"]
    assert touched.written == []


@pytest.mark.parametrize("overlay", [20_000], indirect=True)
def test_twenty_thousand_opens_lose_nothing(overlay: Path, cgroup: ExecCgroup) -> None:
    names = [f"f{i:05d}" for i in range(20_000)]
    tracer = Tracer.prepare(str(overlay / "merged"))
    try:
        tracer.enter(cgroup)
        code = "import os\nfor n in sorted(os.listdir('many')):\n    open('many/' + n, 'rb').read()\n"
        run_in_jail(overlay, cgroup, f"{sys.executable} -c \"{code}\"")
        touched = tracer.collect()
    finally:
        tracer.teardown()
    assert touched.read is not None
    if not touched.overflow:
        assert touched.read == [f"many/{n}" for n in names]
    assert touched.dropped == 0


def test_collect_and_teardown_are_safe_in_any_order(overlay: Path) -> None:
    tracer = Tracer.prepare(str(overlay / "merged"))
    assert tracer.collect().read == []  # never entered: nothing belongs to an exec
    tracer.teardown()
    tracer.teardown()


def test_rootless_tracer_reports_read_as_unavailable(overlay: Path) -> None:
    # Root inside a user namespace has no CAP_SYS_ADMIN in the initial one: the rootless helper.
    root = Path(__file__).resolve().parent.parent
    code = (f"import sys; sys.path.insert(0, {str(root)!r})\n"
            "from sandbox.fanotify import Tracer\n"
            f"t = Tracer.prepare({str(overlay / 'merged')!r})\n"
            "t.enter(None)\n"
            "print(repr(t.collect()))\n"
            "t.teardown()\n")
    out = subprocess.run(["unshare", "-U", "-r", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "read=None" in out.stdout and "written=[]" in out.stdout
    assert "CAP_SYS_ADMIN" in out.stdout


def test_directories_opened_are_listed_and_executables_named(overlay: Path, cgroup: ExecCgroup) -> None:
    # FAN_ONDIR: a directory open is a FAN_OPEN event whose mask does not say "dir" (fd
    # mode); the tracer tells it by fstat and puts it in `listed`, never in `read`.
    shutil.copy("/bin/true", overlay / "merged" / "tool")
    tracer = Tracer.prepare(str(overlay / "merged"))
    try:
        tracer.enter(cgroup, visible_at=str(overlay / "jail"))
        run_in_jail(overlay, cgroup, "ls >/dev/null && ls src >/dev/null && ./tool && cat a.txt >/dev/null")
        touched = tracer.collect()
    finally:
        tracer.teardown()
    assert touched.listed == [".", "src"]
    assert touched.executed == ["tool"]
    assert touched.read == ["a.txt", "tool"]
