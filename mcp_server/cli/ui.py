"""``ccw ui``: the state dir's local web dashboard (issue 26; being built)."""

from __future__ import annotations

import argparse
from typing import Any

from mcp_server.config import Config
from sandbox.errors import CcwError

COMMANDS = ("ui",)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw ui``."""
    ui = sub.add_parser("ui", parents=[common], help="a local web dashboard of the state dir's capsules")
    ui.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                    help="loopback address to serve on (default: a free port on 127.0.0.1)")
    ui.add_argument("--no-open", action="store_true", help="only print the URL (with its token)")


def run(args: argparse.Namespace, config: Config) -> int:
    """Serve the dashboard until Ctrl-C."""
    raise CcwError("UNSUPPORTED", "ccw ui is not built yet")
