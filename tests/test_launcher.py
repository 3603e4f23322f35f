"""mcp_server/launcher.py's end_process, which ``ccw helper stop`` and the daemon's stop
(frontdaemon.stop_daemon) share, on real processes: one that ends at SIGTERM, one that
ignores it (killed, or only waited for), one that ends on its own, and none at all."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from mcp_server.launcher import end_process

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
