"""sandbox/spare_cgroups.py on the real kernel: exec cgroups made ahead, refusals kept, spares removed at exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox import cgroups, spare_cgroups
from sandbox.cgroups import CgroupLayout, detect_layout, dirs_named, procs
from sandbox.exec_cgroup import PARENT_NAME, ExecCgroup, Limits
from tests.support.users import run_script_as

Require = Callable[[bool, str], None]


@pytest.fixture
def layout(require: Require, root_required: None) -> Iterator[CgroupLayout]:
    found = detect_layout()
    require(found.for_resource("pids") is not None, "no pids cgroup on this host")
    require(found.for_resource("memory") is not None, "no memory cgroup on this host")
    fresh_pool()  # an earlier test's spare: the pool is the process's
    yield found
    fresh_pool()


def fresh_pool() -> None:
    spare_cgroups.close()
    spare_cgroups._pools.clear()


def spares_of(pid: int, layout: CgroupLayout) -> list[str]:
    return sorted(os.path.join(parent, name) for parent in dirs_named(layout, PARENT_NAME)
                  for name in os.listdir(parent) if name.startswith("spare") and name.endswith(f"@{pid}"))


def start_in(cg: ExecCgroup, *argv: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cg.enter(proc.pid)
    return proc


def test_a_spare_serves_the_next_exec_with_only_its_own_limits(layout: CgroupLayout) -> None:
    first = spare_cgroups.take(layout, "ccwtest-spare-first", Limits(memory_bytes=64 << 20, pids_max=8))
    sleeper = start_in(first, "sleep", "300")
    pids_dir = first.dirs[layout.for_resource("pids")]  # type: ignore[index]
    assert cgroups.read_file(os.path.join(pids_dir, "pids.max")).strip() == "8"
    spare_cgroups.refill(layout)  # made ahead while the first exec runs
    waiting = spares_of(os.getpid(), layout)
    assert waiting and all(procs(path) == [] for path in waiting)

    second = spare_cgroups.take(layout, "ccwtest-spare-second", Limits())
    try:
        assert second.name.startswith("spare") and set(second.dirs.values()) == set(waiting)
        assert not set(second.dirs.values()) & set(first.dirs.values())
        # Nothing of the first exec: not its limits, not its process.
        assert second.pids() == [] and sleeper.pid in first.pids()
        pids = second.dirs[layout.for_resource("pids")]  # type: ignore[index]
        assert cgroups.read_file(os.path.join(pids, "pids.max")).strip() == "max"
        mem = second.dirs[layout.for_resource("memory")]  # type: ignore[index]
        limit = "memory.limit_in_bytes" if layout.for_resource("memory").version == 1 else "memory.max"  # type: ignore[union-attr]
        assert (cgroups.read_file(os.path.join(mem, limit)).strip()
                not in (str(64 << 20), str((64 << 20) // 4096 * 4096)))
        forks = start_in(second, sys.executable, "-c",
                         "import subprocess; ps = [subprocess.Popen(['sleep', '5']) for _ in range(12)]; "
                         "[p.kill() for p in ps]; print(len(ps))")
        assert forks.wait(60) == 0  # 12 children: no pids.max of 8 from the first exec
        usage = second.collect()
        assert usage.pids_limited is False and usage.cpu_ms is not None
    finally:
        second.teardown()
        first.teardown()
    sleeper.wait(10)
    assert not any(os.path.exists(path) for path in [*first.dirs.values(), *waiting])


def test_a_spare_with_a_process_in_it_is_not_used(layout: CgroupLayout) -> None:
    spare_cgroups.refill(layout)
    [*waiting] = spares_of(os.getpid(), layout)
    assert waiting
    intruder = subprocess.Popen(["sleep", "300"])
    cgroups.write_file(os.path.join(waiting[0], "cgroup.procs"), str(intruder.pid))
    taken = spare_cgroups.take(layout, "ccwtest-spare-fresh", Limits(pids_max=16))
    try:
        assert taken.name == "ccwtest-spare-fresh" and taken.pids() == []
        assert intruder.wait(10) == -signal.SIGKILL  # the spare was torn down, its process killed
        assert not any(os.path.exists(path) for path in waiting)
    finally:
        taken.teardown()


def test_refused_hierarchies_are_not_tried_again(layout: CgroupLayout) -> None:
    # A helper without the right to make cgroups (uid 65534, no capabilities): the first
    # exec learns the refusals, the next ones make no mkdir at all and say the same why.
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from sandbox import spare_cgroups
from sandbox.cgroups import detect_layout
from sandbox.exec_cgroup import Limits
layout = detect_layout()
made = []
real_mkdir = os.mkdir
os.mkdir = lambda path, *a, **k: (made.append(path), real_mkdir(path, *a, **k))
first = spare_cgroups.take(layout, "ccwtest-refused-1", Limits())
tried = len(made)
spare_cgroups.refill(layout)
second = spare_cgroups.take(layout, "ccwtest-refused-2", Limits())
import json
print(json.dumps(dict(tried=tried, again=len(made) - tried, dirs=[len(first.dirs), len(second.dirs)],
                      same=second.unavailable == first.unavailable, refused=len(first.unavailable))))
"""
    out = run_script_as(65534, 65534, [sys.executable, "-c", script], Path("/"))
    assert out["tried"] >= 1 and out["refused"] >= 1 and out["dirs"] == [0, 0], out
    assert out["again"] == 0 and out["same"] is True, out


def test_the_helpers_exit_removes_its_spare(layout: CgroupLayout, tmp_path: Path,
                                             launch_helper: Callable[..., subprocess.Popen[bytes]]) -> None:
    import trio

    from sandbox.client import HelperClient
    from sandbox.ops import CreateRequest, ExecRequest
    from sandbox.spec import CapsuleSpec

    ws = tmp_path / "ws"
    ws.mkdir()
    helper = launch_helper(tmp_path / "helper.sock", tmp_path / "state", tmp_path / "helper.log")
    try:
        async def one_exec() -> None:
            client = HelperClient(str(tmp_path / "helper.sock"))
            made = await client.call(CreateRequest(CapsuleSpec(str(ws))))
            reply = await client.call(ExecRequest(made.capsule_id, ("/bin/true",), cwd=str(ws)))
            assert reply.exit_code == 0
            await client.aclose()

        trio.run(one_exec)
        deadline = time.monotonic() + 30
        while not spares_of(helper.pid, layout):  # made by the janitor after the exec's end
            assert time.monotonic() < deadline, "no spare cgroup was made after the exec"
            time.sleep(0.02)
        waiting = spares_of(helper.pid, layout)
        helper.send_signal(signal.SIGTERM)
        assert helper.wait(60) == 0
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
    assert spares_of(helper.pid, layout) == [] and not any(os.path.exists(path) for path in waiting)
