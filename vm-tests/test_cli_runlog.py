"""``ccw capsule log``, ``ccw capsule show`` and ``ccw watch`` as a person runs them, beside
the commands that make the runs (each ``ccw`` its own process, one state dir, as root).

The runs include a hostile one: a file name and output carrying terminal escape
sequences, which must reach the terminal as visible text, never as escapes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli_process import CCW, ROOT, ccw, cli_env

# Output with an OSC title sequence; a file name and the argv itself with a screen clear.
HOSTILE = r'printf "\033]0;pwned\007title\n"; touch "e$(printf "\033[2J")f"' + " # \x1b[2J"


@pytest.fixture
def state(tmp_path: Path, root_required: None) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    assert ccw(state_dir, "helper", "stop", check=False).returncode == 0


@pytest.fixture
def capsule(state: Path, tmp_path: Path) -> str:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello\n")
    return ccw(state, "capsule", "create", str(workspace), "--no-auto-expose").stdout.strip()


def _watcher(state: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CCW, "watch", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(state), cwd=ROOT)


def _lines_until(proc: subprocess.Popen[str], wanted: str, timeout: float = 30) -> list[str]:
    """Lines of a running watcher up to the first that contains ``wanted``."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if wanted in line:
            return lines
    raise AssertionError(f"no line with {wanted!r} within {timeout} s: {lines}")


def test_log_and_show_tell_what_ran(state: Path, capsule: str) -> None:
    ccw(state, "capsule", "exec", capsule, "--", "sh", "-c", "cat a.txt; echo new > b.txt")
    assert ccw(state, "capsule", "exec", capsule, "--", "sh", "-c", "echo oops >&2; exit 4",
               check=False).returncode == 4

    runs = json.loads(ccw(state, "capsule", "log", capsule, "--json").stdout)["runs"]
    assert [(r["run"], r["exit_code"], r["writes"]) for r in runs] == [(1, 0, 1), (2, 4, 0)]
    assert runs[0]["argv"] == ["sh", "-c", "cat a.txt; echo new > b.txt"] and runs[0]["reads"] >= 1
    assert (runs[0]["generation"], runs[0]["generation_out"]) == (0, 1) and runs[1]["generation"] == 1

    table = ccw(state, "capsule", "log", capsule).stdout.splitlines()
    assert table[0].split()[:3] == ["RUN", "STARTED", "GEN"] and len(table) == 3
    assert table[2].split()[0] == "2" and " 4 " in table[2] and "exit 4" in table[2]

    first = json.loads(ccw(state, "capsule", "show", capsule, "1", "--json").stdout)
    assert first["output"]["stdout"] == "hello\n" and first["written"] == ["b.txt"] and "a.txt" in first["read"]
    second = ccw(state, "capsule", "show", capsule, "2").stdout
    assert "exit 4" in second and "oops" in second and "--- written (0)" in second

    missing = ccw(state, "capsule", "show", capsule, "9", check=False)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr and "capsule log" in missing.stderr


def test_what_a_capsule_named_reaches_the_terminal_as_visible_text(state: Path, capsule: str) -> None:
    ccw(state, "capsule", "exec", capsule, "--", "sh", "-c", HOSTILE)
    for argv in (("capsule", "log", capsule), ("watch", "--once", "--since", "0")):
        shown = ccw(state, *argv).stdout
        assert "\x1b" not in shown and "\x07" not in shown, argv
        assert "\\x1b" in shown
    detail = ccw(state, "capsule", "show", capsule, "1", "--raw").stdout  # asked for raw: as written
    assert "\x1b]0;pwned\x07" in detail and "e\\x1b[2Jf" in detail  # the path stays visible text


def test_watch_follows_runs_of_other_processes_live(state: Path, capsule: str) -> None:
    watcher = _watcher(state, capsule)
    try:
        time.sleep(1)  # it starts at the newest event: what comes after
        ccw(state, "capsule", "exec", capsule, "--", "sh", "-c", "echo x > w.txt")
        lines = _lines_until(watcher, "wrote")
        assert any("started" in line for line in lines)
        finished = next(line for line in lines if "run 1 exit 0" in line)
        assert "1 written" in finished and lines[-1].rstrip().endswith("w.txt")
        ccw(state, "capsule", "destroy", capsule)
        assert "destroyed" in _lines_until(watcher, "destroyed")[-1]
    finally:
        watcher.send_signal(signal.SIGINT)
        _, errors = watcher.communicate(timeout=10)  # closes its pipes
    assert watcher.returncode == 0, errors

    every = [json.loads(line) for line in ccw(state, "watch", "--once", "--since", "0", "--json").stdout.splitlines()]
    kinds = [event["kind"] for event in every]
    assert kinds[0] == "capsule.created" and kinds[-1] == "capsule.destroyed"
    assert kinds.count("run.finished") == 1 and "files.written" in kinds
    assert [event["id"] for event in every] == sorted(event["id"] for event in every)


def test_files_written_show_while_the_run_goes(state: Path, capsule: str) -> None:
    """fanotify sees a file closed after writing: the next progress report names it, and a
    watcher has it seconds before the run ends."""
    watcher = _watcher(state, capsule, "--json")
    try:
        time.sleep(1)
        run = subprocess.Popen([*CCW, "capsule", "exec", capsule, "--", "sh", "-c", "echo a > early.txt; sleep 4"],
                               env=cli_env(state), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
        live = [json.loads(line) for line in _lines_until(watcher, '"live": true', timeout=20)]
        assert run.poll() is None, "the run ended before its write was seen"
        written = live[-1]
        assert written["kind"] == "files.written" and written["data"]["paths"] == ["early.txt"]
        assert written["data"]["seq"] is None
        finished = [json.loads(line) for line in _lines_until(watcher, "run.finished")][-1]
        assert finished["id"] > written["id"] and finished["data"]["writes"] == 1
        assert run.wait(timeout=30) == 0, run.communicate()[1]
        if run.stderr is not None:
            run.stderr.close()
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.communicate(timeout=10)
