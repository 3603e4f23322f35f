"""``ccw net presets [NAME]``: the network presets a capsule's rules can name as ``preset:NAME``.

The presets are files (mcp_server/fs/netpresets.py: ccw's own in ``policies/network/``,
the state dir's in ``<state dir>/policies/network/``), so the listing reads them here,
without a front end or a helper: what it prints is what the next ``capsule create
--network preset:NAME`` of this state dir expands.  Without a name it lists every preset
with its rules; with one, each rule with why it is there.  A user file that cannot be
used (bad JSON or field, unsafe owner or mode, a shipped preset's name) is printed on
stderr with what to change, and the exit status is 1, so a person finds out here rather
than at the next create.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mcp_server.cli.output import print_json
from mcp_server.config import Config
from mcp_server.fs.netpresets import PRESET, catalogue

COMMANDS = ("net",)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw net presets [NAME]``."""
    net = sub.add_parser("net", parents=[common], help="a capsule's network: the presets its rules can name",
                         description="Network presets: named rule sets a capsule's allowlist names as preset:NAME.")
    actions = net.add_subparsers(dest="net_action", metavar="ACTION", required=True)
    presets = actions.add_parser("presets", parents=[common], help="list the presets (NAME: its rules and why)")
    presets.add_argument("name", nargs="?", help="one preset: each of its rules and why it is there")


def run(args: argparse.Namespace, config: Config) -> int:
    """Print the presets of ``config``'s state dir; 1 if a user file could not be used."""
    found = catalogue(config.state_dir)
    listing = found.listing()
    if args.name:
        found.rules(args.name.lower())  # NOT_FOUND / CONFLICT / INVALID_ARGUMENT, printed by main
        listing["presets"] = [p for p in listing["presets"] if p["name"] == args.name.lower()]
        listing["problems"] = []
    if args.json:
        print_json(listing)
    else:
        sys.stdout.write(render(listing, detail=bool(args.name)))
    for problem in listing["problems"]:
        print(f"ccw: {problem['code']}: {problem['message']}", file=sys.stderr)
    return 1 if listing["problems"] else 0


def render(listing: dict[str, Any], detail: bool) -> str:
    """The listing as a person reads it: each preset, its rules (and with ``detail``, why)."""
    lines: list[str] = []
    for preset in listing["presets"]:
        lines.append(f"{preset['name']} ({preset['origin']}): {preset['description']}")
        if detail:
            width = max(len(rule["rule"]) for rule in preset["rules"])
            lines += [f"    {rule['rule']:<{width}}  {rule['why']}" for rule in preset["rules"]]
            lines += [f"    see {source}" for source in preset["sources"]]
        else:
            lines.append("    " + ", ".join(rule["rule"] for rule in preset["rules"]))
    lines.append(f"A rule {PRESET}NAME stands for a preset's rules (ccw capsule create DIR --network {PRESET}pypi); "
                 f"your own presets go in {listing['user_dir']}/NAME.json.")
    return "\n".join(lines) + "\n"
