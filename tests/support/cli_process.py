"""The ``ccw`` command as a subprocess on one state dir: what CLI tests share (``ccw ui``'s
server among them, ``serve_ui``)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CCW = [sys.executable, "-c", "import sys; from mcp_server.cli import main; sys.exit(main())"]


def cli_env(state: Path) -> dict[str, str]:
    """Our environment without ccw's settings (CCW_MUST_WORK kept), on ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_")) or k == "CCW_MUST_WORK"}
    env["CCW_STATE_DIR"] = str(state)
    return env


def ccw(state: Path, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``ccw ARGV`` to its end; with ``check``, its exit status must be 0."""
    done = subprocess.run([*CCW, *argv], capture_output=True, text=True, env=cli_env(state), timeout=timeout,
                          cwd=ROOT)
    if check:
        assert done.returncode == 0, f"ccw {shlex.join(argv)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@contextlib.contextmanager
def serve_ui(state: Path) -> Iterator[str]:
    """``ccw ui`` on ``state``: the URL it printed; it must end cleanly on SIGTERM, having said
    nothing on stderr but its one line about the token (a web server's INFO lines read as
    errors to the person who started it)."""
    proc = subprocess.Popen([*CCW, "ui", "--no-open"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(state), cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.fullmatch(r"ccw ui: (http://127\.0\.0\.1:\d+/#token=[\w-]+)\n", line)
    try:
        assert found, line
        yield found[1]
    finally:
        proc.terminate()
        _, errors = proc.communicate(timeout=30)
        assert proc.returncode == 0, errors
        assert errors.splitlines()[:1] == ["(the URL carries its access token: share it with no one; Ctrl-C stops)"] \
            and "INFO" not in errors, errors
