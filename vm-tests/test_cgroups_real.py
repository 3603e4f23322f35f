"""sandbox/exec_cgroup.py on the real kernel: limits, usage, kill, teardown, stale cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.cgroups import detect_layout
from sandbox.errors import CcwError
from sandbox.exec_cgroup import ExecCgroup, Limits
from sandbox.spare_cgroups import cleanup_stale

Require = Callable[[bool, str], None]


@pytest.fixture
def layout(require: Require, root_required: None) -> object:
    found = detect_layout()
    require(found.for_resource("memory") is not None, "no memory cgroup on this host")
    require(found.for_resource("pids") is not None, "no pids cgroup on this host")
    require(found.for_resource("cpu") is not None, "no cpu usage cgroup on this host")
    return found


@pytest.fixture
def make(layout: object, request: pytest.FixtureRequest) -> Iterator[Callable[..., ExecCgroup]]:
    made: list[ExecCgroup] = []

    def _make(limits: Limits | None = None) -> ExecCgroup:
        cg = ExecCgroup.prepare(layout, f"ccwtest-{request.node.name[:40]}-{len(made)}", limits or Limits())  # type: ignore[arg-type]
        made.append(cg)
        return cg

    yield _make
    for cg in made:
        cg.teardown()


def start_gated(cg: ExecCgroup, code: str) -> subprocess.Popen[bytes]:
    """Start python ``code`` in the cgroup: it waits on stdin until it has been moved in."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdin.readline()\n{code}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    cg.enter(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    return proc


BUSY = """
import os
ballast = bytearray(16 << 20)  # 16 MiB the memory cgroup must see charged
end = os.times()
while True:
    t = os.times()
    if t.user + t.system - end.user - end.system > 0.6:
        break
t = os.times()
print((t.user + t.system) * 1000)
"""


def test_busy_loop_cpu_ms_matches_its_own_measurement(make: Callable[..., ExecCgroup]) -> None:
    cg = make()
    proc = start_gated(cg, BUSY)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    own_ms = float(out)
    usage = cg.collect()
    assert usage.cpu_ms is not None
    assert abs(usage.cpu_ms - own_ms) <= 0.10 * own_ms, (usage.cpu_ms, own_ms)
    # Shared file pages may be charged to other cgroups, but the ballast is this exec's own.
    assert usage.rss_max_kb is not None and usage.rss_max_kb >= 16 << 10
    assert not usage.oom_killed and not usage.cpu_limited


def test_memory_bomb_is_oom_killed_and_reported(make: Callable[..., ExecCgroup]) -> None:
    cg = make(Limits(memory_bytes=64 << 20))
    proc = start_gated(cg, "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    usage = cg.collect()
    assert usage.oom_killed
    assert usage.rss_max_kb is not None and usage.rss_max_kb <= 64 * 1024


def test_fork_bomb_is_contained_by_pids_max(make: Callable[..., ExecCgroup]) -> None:
    cg = make(Limits(pids_max=16))
    code = """
import os, time
made = failed = 0
for _ in range(200):
    try:
        if os.fork() == 0:
            os.close(1); os.close(2)  # let the parent's reader see EOF
            time.sleep(120)
            os._exit(0)
        made += 1
    except OSError:
        failed += 1
print(made, failed)
"""
    proc = start_gated(cg, code)
    out, err = proc.communicate(timeout=60)
    made, failed = map(int, out.split())
    assert made <= 15 and failed >= 185, (made, failed, err)
    assert len(cg.pids()) == made  # the sleepers, the parent has exited
    usage = cg.collect()
    assert usage.pids_limited
    cg.kill()
    assert cg.pids() == []


def test_kill_reaches_daemonised_grandchildren(make: Callable[..., ExecCgroup]) -> None:
    cg = make()
    proc = start_gated(cg, "import subprocess\n"
                           "subprocess.Popen(['setsid', 'sleep', '300'], start_new_session=True, "
                           "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                           "print('ok', flush=True)\nimport time; time.sleep(300)")
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    assert len(cg.pids()) >= 2
    cg.kill()
    assert cg.pids() == []
    proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def test_cpu_budget_kills_and_says_so(make: Callable[..., ExecCgroup]) -> None:
    cg = make(Limits(cpu_ms=300))
    proc = start_gated(cg, "while True:\n    pass\n")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    usage = cg.collect()
    assert usage.cpu_limited
    assert usage.cpu_ms is not None and usage.cpu_ms >= 300


def test_io_figures_come_from_the_waiters_rusage(make: Callable[..., ExecCgroup], tmp_path: Path) -> None:
    data = tmp_path / "big"
    data.write_bytes(os.urandom(4 << 20))
    fd = os.open(data, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # make the exec's read hit the disk
    os.close(fd)
    cg = make()
    out = tmp_path / "out"
    code = f"open({str(data)!r}, 'rb').read(); open({str(out)!r}, 'wb').write(bytes(3 << 20))"
    proc = start_gated(cg, code)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    usage = cg.collect(rusage)
    assert usage.io_read_kb is not None and usage.io_read_kb >= 4096 * 0.9
    assert usage.io_write_kb is not None and usage.io_write_kb >= 3072 * 0.9


def test_io_without_rusage_is_null_with_a_reason_or_measured(make: Callable[..., ExecCgroup]) -> None:
    cg = make()
    proc = start_gated(cg, "open('/proc/self/status').read()")
    proc.communicate(timeout=60)
    usage = cg.collect()
    for name in ("io_read_kb", "io_write_kb"):
        assert (getattr(usage, name) is None) == (name in usage.unavailable), name


def test_teardown_removes_every_dir_and_is_idempotent(make: Callable[..., ExecCgroup]) -> None:
    cg = make(Limits(memory_bytes=128 << 20, pids_max=50))
    dirs = list(cg.dirs.values())
    assert len(dirs) >= 3 and all(os.path.isdir(d) for d in dirs)
    proc = start_gated(cg, "import time; time.sleep(300)")
    cg.teardown()
    cg.teardown()
    proc.communicate(timeout=10)
    assert not any(os.path.exists(d) for d in dirs)


def test_cleanup_stale_removes_a_crashed_helpers_cgroups(layout: object) -> None:
    # A helper that created an exec cgroup with a process in it and then died (os._exit).
    crash = f"""
import os, subprocess, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from sandbox.cgroups import detect_layout
from sandbox.exec_cgroup import ExecCgroup, Limits
cg = ExecCgroup.prepare(detect_layout(), "ccwtest-stale", Limits(pids_max=10))
sleeper = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
cg.enter(sleeper.pid)
print(sleeper.pid, *cg.dirs.values(), flush=True)
os._exit(0)
"""
    out = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, check=True, timeout=60).stdout
    sleeper, *dirs = out.split()
    assert dirs and all(os.path.isdir(d) for d in dirs)
    assert cleanup_stale("ccwtest-unrelated", layout) == []  # prefix filters
    removed = cleanup_stale("ccwtest-stale", layout)  # type: ignore[arg-type]
    assert removed == sorted(dirs)
    assert not any(os.path.exists(d) for d in dirs)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the sleeper is dead (gone or a zombie of init)
        try:
            state = Path(f"/proc/{sleeper}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":
            break
        time.sleep(0.01)
    else:
        pytest.fail(f"sleeper {sleeper} survived cleanup_stale")


def test_cleanup_stale_leaves_live_helpers_alone(make: Callable[..., ExecCgroup], layout: object) -> None:
    cg = make()
    dirs = list(cg.dirs.values())
    assert cleanup_stale("ccwtest-", layout) == []  # type: ignore[arg-type]
    assert all(os.path.isdir(d) for d in dirs)


def test_owns_tells_members_zombies_and_strangers(make: Callable[..., ExecCgroup]) -> None:
    cg = make()
    proc = start_gated(cg, "print('ok', flush=True); input()")
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    assert cg.owns(proc.pid) is True
    assert cg.owns(os.getpid()) is False
    assert proc.stdin is not None
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not yet reaped
    assert cg.owns(proc.pid) in (True, None)  # v2 keeps a zombie's cgroup; v1 shows the root
    proc.communicate(timeout=10)
    assert cg.owns(proc.pid) is None


def test_unwritable_hierarchy_gives_null_usage_with_the_reason(tmp_path: Path, root_required: None) -> None:
    from sandbox import syscalls
    from sandbox.cgroups import CgroupLayout, Hierarchy

    fake = tmp_path / "cg"
    fake.mkdir()
    syscalls.mount(str(fake), str(fake), None, syscalls.MS_BIND)
    try:
        syscalls.mount("", str(fake), None, syscalls.MS_BIND | syscalls.MS_REMOUNT | syscalls.MS_RDONLY)
        hier = Hierarchy(1, frozenset({"memory"}), str(fake), str(fake))
        cg = ExecCgroup.prepare(CgroupLayout((hier,)), "ro", Limits())
        usage = cg.collect()
        cg.teardown()
        assert usage.rss_max_kb is None
        assert "mkdir" in usage.unavailable["rss_max_kb"] and "EROFS" in usage.unavailable["rss_max_kb"]
        with pytest.raises(CcwError, match=r"limits\.memory_mb cannot be enforced"):
            ExecCgroup.prepare(CgroupLayout((hier,)), "ro", Limits(memory_bytes=1 << 20))
    finally:
        syscalls.umount2(str(fake))
