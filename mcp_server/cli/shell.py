"""``ccw capsule shell CAP [-- CMD]``: an interactive terminal in a capsule's jail.

(Being built for issue 26: a PTY with window size, job control, signals and the exit
status, under the capsule's isolation and limits, journaled and traced like any run.)
"""

from __future__ import annotations

import argparse
from typing import Any

from mcp_server.config import Config
from sandbox.errors import CcwError

VERBS = ("shell",)


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw capsule shell``."""
    shell = verbs.add_parser("shell", parents=[common],
                             help="an interactive terminal in a capsule: ccw capsule shell CAP [-- CMD...]")
    shell.add_argument("capsule_id")
    shell.add_argument("cmd", nargs="*", default=[], help="the program to run (default: the capsule's shell)")
    shell.add_argument("--cwd", help="working directory inside the capsule")


def run(args: argparse.Namespace, config: Config) -> int:
    """Run the terminal; the command's exit status."""
    raise CcwError("UNSUPPORTED", "ccw capsule shell is not built yet")
