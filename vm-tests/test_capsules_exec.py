"""CapsuleManager.exec end to end: jail + cgroup + fanotify over a real capsule."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sandbox import fanotify, jail_end, mountinfo
from sandbox.errors import CcwError
from sandbox.manager import CapsuleManager
from sandbox.ops import ExecRequest
from sandbox.replies import ExecReply, Touched, Usage
from sandbox.spec import CapsuleSpec

# The helper's own interpreter: the jail binds its prefix read-only (mounts.python_prefix).
PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
DEPS = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py.py")


@pytest.fixture
def manager(root_required: None, tmp_path: Path) -> Iterator[CapsuleManager]:
    state = tmp_path / "state"
    state.mkdir()
    manager = CapsuleManager(str(state), rootless=False)
    manager.recover()
    yield manager
    for item in reversed(manager.list(0).capsules):
        manager.destroy(item.capsule_id, 0)
    assert mountinfo.mounts_under(str(state)) == []


def run(manager: CapsuleManager, capsule_id: str, argv: list[str], **kwargs: object) -> ExecReply:
    return manager.exec(ExecRequest.from_args({"capsule_id": capsule_id, "argv": argv, **kwargs}), 0, 0)  # type: ignore[arg-type]


def make_project(ws: Path) -> None:
    """A tiny project with a tested module, a test, an untouched file, and pytest vendored."""
    (ws / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "untouched.py").write_text("raise SystemExit('nobody imports me')\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    site = Path(__import__("pytest").__file__).resolve().parent.parent
    deps = ws / "_deps"
    deps.mkdir()
    for name in DEPS:
        source = site / name
        if source.is_dir():
            shutil.copytree(source, deps / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, deps / name)


def test_pytest_in_a_capsule_reads_the_tested_files_only(manager: CapsuleManager, tmp_path: Path,
                                                         require: object) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    make_project(ws)
    before = sorted(p.name for p in ws.iterdir())
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws), "env_whitelist": ["PYTHONPATH"]}))
    result = run(manager, capsule.capsule_id,
                 [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_calc.py"],
                 env={"PYTHONPATH": f"{ws}:{ws}/_deps"}, timeout_ms=120_000)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert b"1 passed" in result.stdout
    touched = result.touched
    assert isinstance(touched, Touched)
    read = touched.read
    assert read is not None, result.touched_unavailable
    assert "calc.py" in read and "tests/test_calc.py" in read
    assert "untouched.py" not in read
    assert list(read) == sorted(read, key=os.fsencode)
    # pytest wrote bytecode caches inside the capsule; the host tree is unchanged
    assert any(p.startswith("__pycache__/calc") for p in touched.written)
    assert sorted(p.name for p in ws.iterdir()) == before
    assert not (ws / "__pycache__").exists()


def test_output_changes_and_written_set(manager: CapsuleManager, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("hello\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / "old.txt").write_text("rename me\n")
    cid = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    result = run(manager, cid, ["/bin/sh", "-c",
                                "cat a.txt; echo out > sub/new.txt; rm gone.txt; mv old.txt renamed.txt; "
                                "echo err >&2; exit 3"])
    assert (result.exit_code, result.signal, result.timed_out) == (3, None, False)
    assert result.stdout == b"hello\n" and result.stderr == b"err\n"
    assert result.stdout_bytes == 6 and result.truncated.to_args() == {"stdout": False, "stderr": False}
    touched = result.touched
    assert isinstance(touched, Touched)
    assert touched.to_args()["written"] == ["gone.txt", "old.txt", "renamed.txt", "sub/new.txt"]
    changes = {c.path: c.kind for c in manager.changes(cid, 0).changes}
    assert changes == {"gone.txt": "deleted", "old.txt": "deleted", "renamed.txt": "added", "sub/new.txt": "added"}
    # $HOME and /tmp persist across execs of one capsule
    run(manager, cid, ["/bin/sh", "-c", "echo kept > $HOME/h; echo kept > /tmp/t"])
    again = run(manager, cid, ["/bin/sh", "-c", "cat $HOME/h /tmp/t; echo $HOME $LANG"])
    assert again.stdout == b"kept\nkept\n/home/ccw C.UTF-8\n"


def test_exec_arguments_are_checked_again(manager: CapsuleManager, tmp_path: Path) -> None:
    cid = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(tmp_path)})).capsule_id
    for kwargs in ({"argv": []}, {"argv": ["a\0b"]}, {"argv": ["/bin/true"], "env": {"SECRET": "1"}},
                   {"argv": ["/bin/true"], "timeout_ms": 0}, {"argv": ["/bin/true"], "output_cap": -1},
                   {"argv": ["/bin/true"], "cwd": "../.."}):
        argv = kwargs.pop("argv")
        with pytest.raises(CcwError) as err:
            manager.exec(ExecRequest.from_args({"capsule_id": cid, "argv": argv, **kwargs}), 0, 0)  # type: ignore[arg-type]
        assert err.value.code == "INVALID_ARGUMENT", kwargs
    result = run(manager, cid, ["/bin/sleep", "30"], timeout_ms=300)
    assert result.timed_out is True and result.signal == "SIGKILL"


def test_exec_in_a_fork(manager: CapsuleManager, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "base.txt").write_text("base\n")
    parent = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    run(manager, parent, ["/bin/sh", "-c", "echo parent > p.txt"])
    child = manager.fork(parent, 0, 0).capsule_id
    result = run(manager, child, ["/bin/sh", "-c", "cat p.txt base.txt; echo child > c.txt"])
    assert result.stdout == b"parent\nbase\n"
    assert [c.path for c in manager.changes(parent, 0).changes] == ["p.txt"]
    assert [c.path for c in manager.changes(child, 0).changes] == ["c.txt", "p.txt"]


def test_fork_refused_when_the_state_dir_is_inside_the_workspace(manager: CapsuleManager, tmp_path: Path) -> None:
    # tmp_path holds the state dir
    cid = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(tmp_path)})).capsule_id
    with pytest.raises(CcwError) as err:
        manager.fork(cid, 0, 0)
    assert err.value.code == "UNSUPPORTED" and "state dir" in err.value.message
    # not frozen by the failed fork
    assert manager.exec(ExecRequest.from_args({"capsule_id": cid, "argv": ["/bin/true"]}), 0, 0).exit_code == 0


def test_limits_reach_the_exec_cgroup(manager: CapsuleManager, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cid = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws), "limits": {"memory_mb": 64}})).capsule_id
    # an exec asking for more than the capsule allows still gets the capsule's 64 MiB
    result = run(manager, cid, [PYTHON, "-c", "b = bytearray(256 << 20); print(len(b))"],
                 limits={"memory_mb": 1024}, timeout_ms=60_000)
    assert result.oom_killed is True and result.exit_code != 0
    ok = run(manager, cid, [PYTHON, "-c", "print(len(bytearray(8 << 20)))"], timeout_ms=60_000)
    assert ok.exit_code == 0 and ok.stdout == f"{8 << 20}\n".encode()
    assert isinstance(ok.usage, Usage) and ok.usage.cpu_ms is not None


def test_a_timed_out_exec_still_reports_the_usage_of_its_processes(manager: CapsuleManager, tmp_path: Path) -> None:
    """On timeout the init is asked to end the jail itself, so it reaps and reports: a
    SIGKILLed init has its processes reaped by the kernel, which counts none of them."""
    ws = tmp_path / "ws"
    ws.mkdir()
    capsule = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    grow = f"{PYTHON} -c \"b = b'x' * (64 << 20)\""
    result = run(manager, capsule, ["sh", "-c", f"{grow}; exec sleep 600"], timeout_ms=5000)
    assert result.timed_out is True and result.signal == "SIGKILL"
    usage, sources = result.usage, result.usage_sources
    assert isinstance(usage, Usage) and isinstance(sources, dict)
    assert usage.rss_max_process_kb is not None and usage.rss_max_process_kb >= 64 << 10, result.usage_unavailable
    assert sources["rss_max_process_kb"].startswith("wait4 rusage of the jail's init")


def test_the_reply_comes_before_the_jails_end_and_the_next_exec_after_it(
        manager: CapsuleManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox import cgroups, exec_cgroup, jail_end, supervise

    ws = tmp_path / "ws"
    ws.mkdir()
    capsule_id = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    events: list[str] = []
    reaps = threading.Semaphore(0)  # one permit for each of the janitor's reaps of an init
    reap, limit, teardown = supervise._Running.reap, exec_cgroup.ExecCgroup.limit, exec_cgroup.ExecCgroup.teardown

    def gated_reap(self: supervise._Running) -> None:
        if threading.current_thread().name == "ccw-jail-janitor":
            assert reaps.acquire(timeout=60)
        reap(self)

    def recorded_limit(self: exec_cgroup.ExecCgroup, limits: exec_cgroup.Limits) -> None:
        events.append(f"prepare {self.name}")  # every exec's cgroup, a spare or made at once
        limit(self, limits)

    def recorded_teardown(self: exec_cgroup.ExecCgroup) -> None:
        if not self._torn_down:
            events.append(f"teardown {self.name}")
        teardown(self)

    monkeypatch.setattr(supervise._Running, "reap", gated_reap)
    monkeypatch.setattr(exec_cgroup.ExecCgroup, "limit", recorded_limit)
    monkeypatch.setattr(exec_cgroup.ExecCgroup, "teardown", recorded_teardown)
    assert run(manager, capsule_id, ["/bin/true"]).exit_code == 0
    events.append("reply 1")
    second: list[ExecReply] = []
    thread = threading.Thread(target=lambda: second.append(run(manager, capsule_id, ["/bin/true"])))
    thread.start()
    time.sleep(0.3)  # room for the second exec to set up too early, were it not ordered after the end
    reaps.release()
    thread.join(60)
    events.append("reply 2")
    reaps.release()
    assert jail_end.settle(30.0)
    assert second and second[0].exit_code == 0
    first, then = events[0].split()[1], events[-1].split()[1]
    assert first != then
    assert events == [f"prepare {first}", "reply 1", f"teardown {first}", f"prepare {then}", "reply 2",
                      f"teardown {then}"]
    # Once ended: no zombie init, no exec cgroup left in any hierarchy but an empty spare.
    assert psutil.Process().children(recursive=True) == []
    layout = cgroups.detect_layout()
    left = [os.path.join(parent, name) for parent in cgroups.dirs_named(layout, exec_cgroup.PARENT_NAME)
            for name in os.listdir(parent) if name.endswith(f"@{os.getpid()}")]
    assert [path for path in left if not os.path.basename(path).startswith("spare")] == []
    assert all(cgroups.procs(path) == [] for path in left)


def test_opens_between_execs_are_not_the_next_execs(manager: CapsuleManager, tmp_path: Path) -> None:
    # One fanotify group serves all of a capsule's execs (fanotify.py).  A process outside
    # any exec that opens a file of the capsule between two execs and is gone by then
    # would count if its events reached the next exec's record (a gone pid counts).
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("first.txt", "between.txt", "second.txt"):
        (ws / name).write_text(name)
    capsule_id = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    merged = Path(manager._capsules[capsule_id].path("merged"))
    first = run(manager, capsule_id, ["cat", "first.txt"])
    for _ in range(5):  # short-lived openers, gone before the next exec starts
        subprocess.run(["cat", str(merged / "between.txt")], check=True, stdout=subprocess.DEVNULL)
    second = run(manager, capsule_id, ["cat", "second.txt"])
    assert first.touched is not None and second.touched is not None
    assert first.touched.read == ("first.txt",) and second.touched.read == ("second.txt",)
    assert (first.stdout, second.stdout) == (b"first.txt", b"second.txt")


def _fanotify_fds() -> list[str]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[fanotify]":
                found.append(name)
    return found


def _janitor_idle() -> None:
    """Return once the janitor has run every job queued so far (endings, then spares)."""
    done = threading.Event()
    jail_end.submit(done.set)
    assert done.wait(30)


def test_a_capsules_group_closes_with_the_capsule(manager: CapsuleManager, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    warm = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
    assert run(manager, warm, ["cat", "a.txt"]).exit_code == 0  # the reader and a spare cgroup exist now
    assert jail_end.settle(30.0)
    _janitor_idle()  # the spare cgroup's files, opened by a job queued behind the ending
    live = sum(group._fan_fd is not None for group in fanotify._groups.values())
    deadline = time.monotonic() + 20  # earlier tests' groups are closed on a thread (an SRCU grace period each)
    while len(_fanotify_fds()) != live:
        assert time.monotonic() < deadline, (_fanotify_fds(), live)
        time.sleep(0.05)
    groups, fds = len(_fanotify_fds()), len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        capsule_id = manager.create(0, 0, CapsuleSpec.from_json({"workspace": str(ws)})).capsule_id
        reply = run(manager, capsule_id, ["cat", "a.txt"])
        assert reply.touched is not None and reply.touched.read == ("a.txt",)
        assert len(_fanotify_fds()) == groups + 1  # this capsule's group, and only while it lives
        manager.destroy(capsule_id, 0)
    assert jail_end.settle(30.0)
    _janitor_idle()
    deadline = time.monotonic() + 20
    while len(_fanotify_fds()) != groups or len(os.listdir("/proc/self/fd")) > fds:  # fewer: earlier tests' leftovers
        assert time.monotonic() < deadline, (len(_fanotify_fds()), groups, len(os.listdir("/proc/self/fd")), fds)
        time.sleep(0.05)
