"""Resource abuse through capsule_exec: each contained, reported, and the helper keeps serving.

Every test runs one abuse in a capsule with limits, then checks what the agent is told
(signal, timeout, truncation, OOM), that nothing of the abuse outlives the exec (no
process whose command line carries the test's token), that the helper holds no more
descriptors than before, and that an exec in *another* capsule still succeeds.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

TOKEN = f"ccw-abuse-{uuid.uuid4().hex[:10]}"


def _leftovers() -> list[str]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if TOKEN in cmdline:
            found.append(f"{process.pid} {cmdline}")
    return found


def _fd_count(pid: int) -> int:
    """The helper's descriptors, less its pool of ready capsule disks.

    The pool (sandbox/disk.py) refills in the background after each create, holding one
    detached mount per disk, up to a fixed few; such a descriptor reads as "/".
    """
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}") != "/":
                count += 1
    return count


def _abuse(tools: Any, workspace: Path, limits: dict[str, int] | None,
           body: Callable[[Any, str], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Run ``body(t, capsule_id)`` in a capsule with ``limits`` while another capsule keeps executing."""

    async def scenario(t: Any) -> dict[str, Any]:
        helper = await t.runtime.helper()
        helper_pid = helper.process.process.pid
        args: dict[str, Any] = {"workspace": str(workspace)}
        if limits:
            args["limits"] = limits
        victim = (await t.call("capsule_create", args))["capsule_id"]
        bystander = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        async with trio.open_nursery() as warm:  # two connections, as during the abuse: fds the helper keeps
            for capsule in (victim, bystander):
                warm.start_soon(t.call, "capsule_exec", {"capsule_id": capsule, "cmd": ["true"]})
        fds_before = _fd_count(helper_pid)
        outcome: dict[str, Any] = {}
        during: list[dict[str, Any]] = []

        done = trio.Event()

        async def abuse() -> None:
            try:
                outcome.update(await body(t, victim))
            finally:
                done.set()

        async def serve_meanwhile() -> None:
            # Another client's execs on another capsule, while the abuse runs (never
            # cancelled mid-call: the helper would still be running it).
            while not done.is_set():
                during.append(await t.call("capsule_exec", {"capsule_id": bystander, "cmd": ["echo", "ok"]}))
                with trio.move_on_after(0.05):
                    await done.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(abuse)
            nursery.start_soon(serve_meanwhile)
        after = await t.call("capsule_exec", {"capsule_id": bystander, "cmd": ["sh", "-c", "echo still serving"]})
        again = await t.call("capsule_exec", {"capsule_id": victim, "cmd": ["echo", "victim usable"]})
        # Fanotify groups are closed on a background thread (their close waits for an
        # RCU grace period): give it a moment; a real leak stays.
        fds_after = _fd_count(helper_pid)
        for _ in range(200):
            if fds_after <= fds_before:
                break
            await trio.sleep(0.05)
            fds_after = _fd_count(helper_pid)
        for capsule in (victim, bystander):
            await t.call("capsule_destroy", {"capsule_id": capsule})
        return {"outcome": outcome, "bystander": after, "again": again, "fds": (fds_before, fds_after),
                "during": during}

    out: dict[str, Any] = tools.run(scenario)
    assert out["bystander"]["exit_code"] == 0 and out["bystander"]["stdout"] == "still serving\n"
    assert out["during"], "no exec of the other capsule completed while the abuse ran"
    assert all(r["exit_code"] == 0 and r["stdout"] == "ok\n" for r in out["during"])
    assert out["again"]["stdout"] == "victim usable\n"
    assert out["fds"][1] <= out["fds"][0], "the helper holds descriptors the abuse left behind"
    assert _leftovers() == [], "processes of the abuse outlived its exec"
    return dict(out["outcome"])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README").write_text("abuse target\n")
    (ws / "hog.py").write_text("a = []\nwhile True:\n    a.append(bytearray(1 << 20))\n")
    (ws / "openfiles.py").write_text(
        "import os, resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "fds = []\n"
        "try:\n"
        "    for i in range(10_000):\n"
        "        fds.append(os.open('README', os.O_RDONLY))\n"
        "except OSError as exc:\n"
        "    print('stopped', exc.strerror)\n"
        "print('opened', len(fds), 'limit', soft)\n"
    )
    return ws


async def _exec(t: Any, capsule: str, script: str, timeout_ms: int = 30_000) -> dict[str, Any]:
    result: dict[str, Any] = await t.call("capsule_exec", {"capsule_id": capsule, "timeout_ms": timeout_ms,
                                                           "cmd": ["sh", "-c", script, TOKEN]})
    return result


def test_fork_bomb_is_held_by_the_pids_limit(tools: Any, workspace: Path,
                                             record_property: Callable[[str, object], None]) -> None:
    record_property("abuses_tried", 1)
    # $0 is the token, so every process of the bomb carries it in its command line.  The
    # parent (python3, started before the bomb) forks the bomb once and then forks nothing,
    # so the pids limit cannot fail it, and waits by sleeping: a busy wait would share the
    # CPU with the bomb's 63 spinning processes and, on a loaded machine, take longer than
    # the exec's timeout (it once did, as a dash loop).
    parent = ("import subprocess, sys, time\n"
              "subprocess.Popen(['sh', '-c', 'f() { f | f & }; f', sys.argv[1]])\n"
              "time.sleep(3)\n"
              "print('parent-alive', flush=True)\n")
    bomb = f"python3 -c \"{parent}\" \"$0\""

    async def body(t: Any, capsule: str) -> dict[str, Any]:
        return await _exec(t, capsule, bomb)

    out = _abuse(tools, workspace, {"pids_max": 64}, body)
    assert out["timed_out"] is False
    assert "parent-alive" in out["stdout"], (out["exit_code"], out["stderr"][-600:])
    assert ("fork" in out["stderr"].lower()
            or "resource temporarily unavailable" in out["stderr"].lower()), out["stderr"][:500]


def test_memory_bomb_is_killed_and_reported(tools: Any, workspace: Path,
                                            record_property: Callable[[str, object], None]) -> None:
    record_property("abuses_tried", 1)
    hog = 'python3 hog.py "$0"'

    async def body(t: Any, capsule: str) -> dict[str, Any]:
        return await _exec(t, capsule, f"{hog}; echo exit=$?")

    out = _abuse(tools, workspace, {"memory_mb": 64}, body)
    assert out["timed_out"] is False
    # The kernel's OOM killer ends python (SIGKILL: the shell sees 137); the cgroup counts it.
    assert "exit=137" in out["stdout"], out
    assert out["oom_killed"] is True
    assert out["usage"]["rss_max_kb"] is None or out["usage"]["rss_max_kb"] <= 80 * 1024


def test_unbounded_output_is_capped_and_counted(tools: Any, workspace: Path,
                                                record_property: Callable[[str, object], None]) -> None:
    record_property("abuses_tried", 1)

    async def body(t: Any, capsule: str) -> dict[str, Any]:
        return await _exec(t, capsule, "timeout 3 yes; yes err | head -c 3000000 >&2; exit 0")

    out = _abuse(tools, workspace, None, body)
    assert out["exit_code"] == 0 and out["timed_out"] is False
    assert out["truncated"] == {"stdout": True, "stderr": True}
    assert out["stdout_bytes"] > len(out["stdout"]) > 0 and out["stderr_bytes"] == 3_000_000
    assert set(out["stdout"]) <= {"y", "\n"}


def test_ten_thousand_open_files(tools: Any, workspace: Path, record_property: Callable[[str, object], None]) -> None:
    record_property("abuses_tried", 1)

    async def body(t: Any, capsule: str) -> dict[str, Any]:
        return await _exec(t, capsule, 'python3 openfiles.py "$0"')

    out = _abuse(tools, workspace, None, body)
    assert out["exit_code"] == 0, out["stderr"]
    words = out["stdout"].split()
    opened, limit = int(words[words.index("opened") + 1]), int(words[words.index("limit") + 1])
    # Either all 10,000 (the inherited RLIMIT_NOFILE allows it) or stopped at the limit: EMFILE.
    assert opened == 10_000 or ("stopped" in out["stdout"] and opened >= limit - 16)


def test_a_command_that_ignores_sigterm_is_killed_on_timeout(tools: Any, workspace: Path,
                                                             record_property: Callable[[str, object], None]) -> None:
    record_property("abuses_tried", 1)
    stubborn = "trap '' TERM INT HUP; (trap '' TERM; while :; do sleep 1; done) & while :; do sleep 1; done"

    async def body(t: Any, capsule: str) -> dict[str, Any]:
        return await _exec(t, capsule, stubborn, timeout_ms=1500)

    out = _abuse(tools, workspace, None, body)
    assert out["timed_out"] is True and out["signal"] == "SIGKILL" and out["exit_code"] is None


def test_cpu_spinner_is_stopped_by_its_cpu_budget_or_timeout(tools: Any, workspace: Path,
                                                              record_property: Callable[[str, object], None]) -> None:
    record_property("abuses_tried", 1)

    async def body(t: Any, capsule: str) -> dict[str, Any]:
        return await _exec(t, capsule, "while :; do :; done & while :; do :; done", timeout_ms=2000)

    out = _abuse(tools, workspace, None, body)
    assert out["timed_out"] is True and out["signal"] == "SIGKILL"


def test_disk_fill_stops_at_the_capsule_disk_and_spares_the_host(tools: Any, workspace: Path,
                                                                record_property: Callable[[str, object], None]) -> None:
    record_property("abuses_tried", 1)
    fill = ("dd if=/dev/zero of=fill bs=1M count=4096 status=none; echo dd=$?; "
            "dd if=/dev/zero of=/tmp/more bs=1M count=64; echo tmp=$?")
    host = os.statvfs(workspace)
    before_kb = (host.f_blocks - host.f_bfree) * host.f_frsize // 1024

    async def body(t: Any, capsule: str) -> dict[str, Any]:
        return await _exec(t, capsule, fill)

    out = _abuse(tools, workspace, {"disk_mb": 64}, body)
    host = os.statvfs(workspace)
    grown_kb = (host.f_blocks - host.f_bfree) * host.f_frsize // 1024 - before_kb
    assert "dd=1" in out["stdout"] and "tmp=1" in out["stdout"], out
    assert "No space left on device" in out["stderr"]
    assert out["disk_full"] is True and out["disk"]["limit_mb"] == 64 and out["disk"]["free_kb"] < 4096
    assert grown_kb < 128 * 1024, f"the host's filesystem grew by {grown_kb} KiB for a 64 MiB disk"
