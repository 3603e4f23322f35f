"""``ccw watch [CAP]``: the live stream of what the state dir's capsules do (issue 26; being built)."""

from __future__ import annotations

import argparse
from typing import Any

from mcp_server.config import Config
from sandbox.errors import CcwError

COMMANDS = ("watch",)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw watch``."""
    watch = sub.add_parser("watch", parents=[common], help="follow what capsules do, live")
    watch.add_argument("capsule_id", nargs="?", help="only this capsule (default: all)")


def run(args: argparse.Namespace, config: Config) -> int:
    """Print events as they come until Ctrl-C."""
    raise CcwError("UNSUPPORTED", "ccw watch is not built yet")
