"""mcp_server/launcher.py's end_process, which ``ccw helper stop`` and the daemon's stop
(frontdaemon.stop_daemon) share, on real processes: one that ends at SIGTERM, one that
ignores it (killed, or only waited for), one that ends on its own, and none at all; and
spawn_detached, which keeps none of its caller's descriptors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_server.launcher import end_process, spawn_detached

IGNORES_TERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)")


@pytest.fixture
def stubborn() -> Iterator[subprocess.Popen[str]]:
    """A process that ignores SIGTERM (reaped and killed at the end whatever the test did)."""
    with subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        yield process
        process.kill()


def test_a_process_that_ends_at_sigterm_ends_without_sigkill() -> None:
    process = subprocess.Popen(["sleep", "60"])
    assert end_process(process.pid, 10.0) is True
    assert process.wait(5) == -15


def test_a_process_that_ignores_sigterm_is_killed_after_the_wait(stubborn: subprocess.Popen[str]) -> None:
    assert end_process(stubborn.pid, 0.2) is False
    assert stubborn.wait(5) == -9


def test_without_kill_a_process_still_there_after_the_wait_is_left_running(stubborn: subprocess.Popen[str]) -> None:
    assert end_process(stubborn.pid, 0.2, kill=False) is False
    assert stubborn.poll() is None


def test_without_terminate_it_only_waits_for_a_process_ending_on_its_own() -> None:
    process = subprocess.Popen(["sleep", "0.2"])
    assert end_process(process.pid, 10.0, terminate=False, kill=False) is True
    assert process.wait(5) == 0  # it ended by itself, not by a signal


def test_no_such_process_is_none() -> None:
    process = subprocess.Popen(["true"])
    process.wait()
    assert end_process(process.pid, 1.0) is None


def test_a_detached_process_keeps_none_of_its_callers_descriptors(tmp_path: Path) -> None:
    # ``flock /tmp/lock ccw capsule create`` once left the lock held by the helper it started.
    inherited = os.open(tmp_path, os.O_RDONLY)  # open in the caller, inheritable as a shell's would be
    os.set_inheritable(inherited, True)
    ready_r, ready_w = os.pipe()
    report = f"import os, time; os.write({ready_w}, b'%d\\n' % os.getpid()); os.close({ready_w}); time.sleep(30)"
    try:
        spawn_detached([sys.executable, "-c", report], tmp_path / "log", ready_w)
        os.close(ready_w)
        with os.fdopen(ready_r) as ready:
            pid = int(ready.read())  # to its end: the process closed its copy, as it does after writing
        try:
            kept = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
        finally:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(inherited)
    assert kept == {0, 1, 2}, kept  # stdio alone: the ready pipe it closed itself
