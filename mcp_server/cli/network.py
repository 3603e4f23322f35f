"""``ccw capsule net CAP [allow RULE...] [remove RULE...]``: show or change a live capsule's allowlist.

It calls capsule_network (mcp_server/tools/network.py) on the state dir's front end, where
the capsule's egress session lives, so a change reaches the commands and services running
there at once.  Without ``allow``/``remove``/caps it shows the rules in force and every
change made to them, with who made it.
"""

from __future__ import annotations

import argparse
from typing import Any

from mcp_server.cli.output import print_json, visible
from mcp_server.config import Config

VERBS = ("net",)
_WORDS = ("allow", "remove")


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register ``net``."""
    net = verbs.add_parser("net", parents=[common], help="show or change a capsule's allowlist while it lives: "
                           "net CAP [allow RULE...] [remove RULE...]")
    net.add_argument("capsule_id")
    net.add_argument("words", nargs="*", metavar="allow|remove RULE",
                     help="'allow' then rules to add, 'remove' then rules to take out (both may be given)")
    net.add_argument("--max-bytes", type=int, help="per-run cap on bytes through the proxy, from the next run")
    net.add_argument("--max-connections", type=int, help="per-run cap on connections, from the next one")


def tool_args(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_network's arguments for the command line; SystemExit saying the form when it is not one."""
    call: dict[str, Any] = {"capsule_id": args.capsule_id}
    words: list[str] = list(args.words)
    if words and words[0] not in _WORDS:
        raise SystemExit(f"ccw: expected 'allow' or 'remove' before {words[0]!r}: "
                         "ccw capsule net CAP [allow RULE...] [remove RULE...]")
    kind = ""
    for word in words:
        if word in _WORDS:
            kind = word
            call.setdefault(kind, [])
        else:
            call[kind].append(word)
    empty = [kind for kind in _WORDS if kind in call and not call[kind]]
    if empty:
        raise SystemExit(f"ccw: '{empty[0]}' needs at least one rule after it")
    caps = {key: value for key, value in (("max_bytes", args.max_bytes), ("max_connections", args.max_connections))
            if value is not None}
    if caps:
        call["caps"] = caps
    return call


def run(args: argparse.Namespace, config: Config) -> int:
    """Call capsule_network and print the rules (or the JSON)."""
    import trio

    from mcp_server.cli import frontclient, helperctl
    from mcp_server.tools.network import network_text

    call = tool_args(args)
    helperctl.ensure(config, autostart=not args.no_autostart)
    result = trio.run(frontclient.call_tool, config, "capsule_network", call)
    if args.json:
        print_json(result)
    else:
        print(visible(network_text(result), keep_newlines=True))
    return 0
