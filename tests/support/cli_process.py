"""The ``ccw`` command as a subprocess on one state dir: what CLI tests share."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
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
