"""``ccw capsule exec --interactive [--tty]`` as a person (or a script) runs it (issue 36).

The ``ccw`` command joins its stdin and stdout to an interactive run through the state
dir's front end (mcp_server/cli/interactive.py):

- On pipes: a Python REPL is typed into line by line; its answer is printed while our
  stdin is still open (output as it comes, not at the end); the run's exit code is
  ccw's, and the journal keeps what was typed as the run's stdin.
- The end of our stdin is the run's end of file.
- SIGINT cancels the run: ccw exits 130, and the capsule takes the next command.
- With --tty, on a terminal of the test's own: the jail's command has a terminal, each key
  goes at once (^D too: the jail's terminal makes it end of file), the run is journaled
  as a terminal run with its steps, and its witness replays on a terminal.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from mcp_server.journal import Journal
from mcp_server.state import State
from tests.support.cli_process import CCW, ROOT, ccw, cli_env
from tests.support.interactive import OnATerminal
from tests.support.workspaces import make_workspace

WAIT_S = 60.0  # the longest any one expected output may take (a loaded machine), never a timing check


def _capsule(state: Path, tmp_path: Path) -> str:
    ws = make_workspace(tmp_path / "ws", {"README": "interactive\n"})
    return ccw(state, "capsule", "create", str(ws)).stdout.strip()


def _read_until(proc: subprocess.Popen[bytes], wanted: bytes) -> bytes:
    """What ``proc`` printed on stdout until it holds ``wanted`` (it keeps running meanwhile)."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + WAIT_S
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{wanted!r} not printed; ccw printed {seen!r}"
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"ccw ended before printing {wanted!r}: {seen!r}"
            seen += chunk
    return seen


def _start(state: Path, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CCW, "capsule", "exec", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=cli_env(state), cwd=ROOT)


def test_a_repl_on_pipes_prints_as_it_goes_and_exits_with_the_run(cli_state: Path, tmp_path: Path) -> None:
    cap = _capsule(cli_state, tmp_path)
    proc = _start(cli_state, "--interactive", cap, "--", "python3", "-i", "-q")
    assert proc.stdin is not None
    proc.stdin.write(b"x = 6*7\nprint(x)\n")
    proc.stdin.flush()
    printed = _read_until(proc, b"42\n")  # while our stdin is open: printed as it came
    assert proc.poll() is None
    out, err = proc.communicate("print('é' * 2)\nimport sys; sys.exit(3)\n".encode(), timeout=WAIT_S)
    assert proc.returncode == 3, (printed, out, err)
    assert "éé\n" in (printed + out).decode()
    [row] = Journal(State(cli_state)).execs(cap)
    typed = "x = 6*7\nprint(x)\nprint('é' * 2)\nimport sys; sys.exit(3)\n".encode()
    assert base64.b64decode(row["stdin_b64"]) == typed and row["exit_code"] == 3
    assert json.loads(row["console"])["tty"] is False


def test_the_end_of_our_stdin_is_the_runs_end_of_file(cli_state: Path, tmp_path: Path) -> None:
    cap = _capsule(cli_state, tmp_path)
    done = subprocess.run([*CCW, "capsule", "exec", "--interactive", cap, "--", "sh", "-c", "wc -l; exit 9"],
                          input=b"one\ntwo\nthree\n", capture_output=True, env=cli_env(cli_state), cwd=ROOT,
                          timeout=WAIT_S)
    assert (done.returncode, done.stdout.split()) == (9, [b"3"]), done


def test_sigint_cancels_the_run_and_the_capsule_takes_the_next(cli_state: Path, tmp_path: Path) -> None:
    cap = _capsule(cli_state, tmp_path)
    proc = _start(cli_state, "--interactive", cap, "--", "sh", "-c", "echo started; exec sleep 1000")
    _read_until(proc, b"started\n")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 130 and b"cancelled" in err, err
    after = ccw(cli_state, "capsule", "exec", cap, "--", "echo", "next")
    assert after.stdout == "next\n"


def test_on_a_terminal_keys_go_at_once_and_the_run_replays(cli_state: Path, tmp_path: Path) -> None:
    cap = _capsule(cli_state, tmp_path)
    term = OnATerminal(cli_state, "capsule", "exec", "--tty", cap, "--", "python3", "-q")
    term.expect(r">>> ")
    term.send("import os; print('tty', os.isatty(0))\r")  # raw: our Enter is a carriage return
    term.expect(r"tty True")
    term.expect(r">>> ")
    term.send("\x04")  # ^D, passed as a byte: the jail's terminal makes it end of file
    assert term.wait() == 0, term.shown
    [row] = Journal(State(cli_state)).execs(cap)
    record = json.loads(row["console"])
    # Each key as it came (the line in one read or a few), ^D among them: typed, not an eof call.
    assert record["tty"] is True and record["eof"] is None and len(record["steps"]) >= 2
    assert base64.b64decode(row["stdin_b64"]) == b"import os; print('tty', os.isatty(0))\r\x04"
    witness_path = ccw(cli_state, "capsule", "witness", cap).stderr.splitlines()[-1].split()[0]  # stdout: the id
    replay = json.loads(ccw(cli_state, "capsule", "replay", witness_path, "--json").stdout)
    assert replay["replay_ok"] is True and replay["output_identical"] is True, replay
