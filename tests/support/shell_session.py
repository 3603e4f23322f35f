"""Drive ``ccw capsule shell`` through a real terminal, as a person would (pexpect's way, by hand).

``ShellSession`` starts ``ccw`` on the slave of a pty it opens, as the session leader
with that slave as its controlling terminal (a small trampoline: setsid, TIOCSCTTY,
exec), and talks to it through the master: ``send`` types, ``expect`` waits for a
pattern in what the terminal shows, ``resize`` changes the outer terminal's size (the
kernel sends SIGWINCH to ccw).  ``scenario`` is the whole session that vm-tests/test_shell.py
checks, as root and (run as a script) as an unprivileged user.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CCW = [sys.executable, "-c", "import sys; from mcp_server.cli import main; sys.exit(main())"]
TRAMPOLINE = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
              "os.execvp(sys.argv[1], sys.argv[1:])")
WAIT_S = 60.0  # the longest any one expected output may take (a loaded machine), never a timing check


def capsule_busy(state: Path, capsule_id: str) -> bool:
    """Whether the helper of ``state`` is running a command in the capsule (its ``list``)."""
    import trio

    from sandbox.client import HelperClient
    from sandbox.ops import ListRequest

    async def ask() -> bool:
        client = HelperClient(str(state / "helper" / "helper.sock"))
        try:
            listed = (await client.call(ListRequest())).capsules
        finally:
            await client.aclose()
        return any(c.capsule_id == capsule_id and c.state == "busy" for c in listed)

    return trio.run(ask)


def ccw_env(state: Path) -> dict[str, str]:
    """Our environment without CCW_*/MCP_* settings, on ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_")) or k == "CCW_MUST_WORK"}
    env["CCW_STATE_DIR"] = str(state)
    env["TERM"] = "xterm"
    return env


class ShellSession:
    """``ccw capsule shell ARGV...`` on a pty of ours."""

    def __init__(self, state: Path, *argv: str, rows: int = 24, cols: int = 80) -> None:
        self.master, slave = os.openpty()
        self.resize(rows, cols, fd=slave)
        self.process = subprocess.Popen([sys.executable, "-c", TRAMPOLINE, *CCW, "capsule", "shell", *argv],
                                        stdin=slave, stdout=slave, stderr=slave, env=ccw_env(state), cwd=ROOT)
        os.close(slave)
        self.shown = b""  # everything the terminal showed
        self._unread = 0  # where the next expect starts looking

    def resize(self, rows: int, cols: int, fd: int | None = None) -> None:
        """Set the outer terminal's window size."""
        fcntl.ioctl(self.master if fd is None else fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def send(self, text: str) -> None:
        """Type ``text``."""
        os.write(self.master, text.encode())

    def _read(self, wait_s: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], wait_s)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: ccw and everything on the terminal have closed it
            chunk = b""
        self.shown += chunk
        return bool(chunk)

    def expect(self, pattern: str, wait_s: float = WAIT_S) -> re.Match[bytes]:
        """The first match of ``pattern`` in what the terminal shows from here on (waits for it)."""
        compiled = re.compile(pattern.encode())
        deadline = time.monotonic() + wait_s
        while True:
            found = compiled.search(self.shown, self._unread)
            if found:
                self._unread = found.end()
                return found
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.5)):
                raise AssertionError(f"{pattern!r} not shown; the terminal showed:\n{self.shown[-3000:]!r}")

    def ask(self, command: str, pattern: str, tries: int = 1) -> re.Match[bytes]:
        """Type ``command`` + Enter until ``pattern`` shows (``tries`` times, for what arrives asynchronously)."""
        for attempt in range(tries):
            self.send(command + "\r")
            try:
                return self.expect(pattern, WAIT_S if attempt == tries - 1 else 5.0)
            except AssertionError:
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    def wait(self) -> int:
        """ccw's exit status, once it ended (the rest of its output read)."""
        while self._read(0.5) or self.process.poll() is None:
            pass
        os.close(self.master)
        return self.process.wait(timeout=WAIT_S)


def scenario(state: Path, capsule_id: str) -> dict[str, Any]:
    """A person's session: output, window size, job control, Ctrl-C, a read of ``seed.txt`` (which
    the workspace must hold), a write, ``exit 7``; what was seen."""
    shell = ShellSession(state, capsule_id)
    seen: dict[str, Any] = {}
    seen["answer"] = shell.ask("echo answer-$((6*7))", r"answer-(\d+)").group(1).decode()
    seen["tty"] = shell.ask("echo name-$(tty)", r"name-(/\S*)\r").group(1).decode()  # the jail names its terminal
    seen["size"] = shell.ask("stty size", r"\r(\d+ \d+)\r\n").group(1).decode()
    shell.resize(40, 100)
    seen["resized"] = shell.ask("stty size", r"\r(40 100)\r\n", tries=10).group(1).decode()
    shell.send("sleep 100 &\r")
    seen["jobs"] = shell.ask("jobs", r"\[1\]\+ +(Running) +sleep 100 &").group(1).decode()
    # "wait %1" answers the job's own status (143: SIGTERM); the "[1]+ Terminated" notice bash
    # prints at some later prompt is its own timing (once, in CI, it never came).
    shell.ask("kill %1; wait %1; echo killed-$?", r"killed-143")
    # The job prints once it is the terminal's foreground (bash's child takes the terminal
    # before it execs sh): a Ctrl-C typed sooner could reach bash while it forks.
    shell.ask("sh -c 'echo sleeping-$((2*3)); exec sleep 100'", r"sleeping-6")
    shell.send("\x03")  # Ctrl-C: the pty's line discipline sends SIGINT to the foreground job
    seen["after_ctrl_c"] = shell.ask("echo status-$?", r"status-(\d+)").group(1).decode()
    # Pushing input into the terminal (TIOCSTI): the jail's seccomp filter says EPERM.
    seen["tiocsti"] = shell.ask("python3 -c 'import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")' "
                                "2>&1 | tail -n 1", r"(\w+Error): \[Errno (\d+)\]").group(2).decode()
    shell.ask("cat seed.txt", r"seed-content")  # the workspace holds it: a read the tracer sees
    shell.ask("echo from-shell > shell.txt; echo written-$((1+1))", r"written-2")
    shell.send("exit 7\r")
    seen["exit_status"] = shell.wait()
    seen["no_job_control"] = b"no job control" in shell.shown or b"cannot set terminal" in shell.shown
    return seen


if __name__ == "__main__":  # as another user: STATE WORKSPACE; prints one JSON object
    sys.path.insert(0, str(ROOT))
    state_dir, workspace = Path(sys.argv[1]), sys.argv[2]
    made = subprocess.run([*CCW, "capsule", "create", workspace], capture_output=True, text=True,
                          env=ccw_env(state_dir), cwd=ROOT, check=True)
    capsule = made.stdout.strip()
    result = scenario(state_dir, capsule)
    from mcp_server.journal import Journal
    from mcp_server.state import State

    execs = Journal(State(str(state_dir))).execs(capsule)
    diff = subprocess.run([*CCW, "capsule", "diff", capsule], capture_output=True, text=True,
                          env=ccw_env(state_dir), cwd=ROOT, check=True).stdout
    mode = json.loads(subprocess.run([*CCW, "helper", "status", "--json"], capture_output=True, text=True,
                                     env=ccw_env(state_dir), cwd=ROOT).stdout or "{}").get("mode")
    subprocess.run([*CCW, "helper", "stop"], capture_output=True, env=ccw_env(state_dir), cwd=ROOT)
    print(json.dumps({**result, "diff": diff, "mode": mode,
                      "journal": [{k: e[k] for k in ("argv", "exit_code", "touched")} for e in execs]}))
