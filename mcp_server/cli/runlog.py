"""``ccw capsule log CAP`` and ``ccw capsule show CAP RUN`` (issue 26; being built)."""

from __future__ import annotations

import argparse
from typing import Any

from mcp_server.config import Config
from sandbox.errors import CcwError

VERBS = ("log", "show")


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw capsule log`` and ``ccw capsule show``."""
    log = verbs.add_parser("log", parents=[common], help="the runs of a capsule: argv, exit, duration, counts")
    log.add_argument("capsule_id")
    show = verbs.add_parser("show", parents=[common], help="one run of a capsule: its output and touched files")
    show.add_argument("capsule_id")
    show.add_argument("run", type=int, help="the run's number (ccw capsule log lists them)")


def run(args: argparse.Namespace, config: Config) -> int:
    """Print the log or one run."""
    raise CcwError("UNSUPPORTED", "ccw capsule log/show are not built yet")
