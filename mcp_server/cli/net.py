"""``ccw net``: the network presets a capsule's rules can name, and the questions a
capsule's connections wait on.

- ``ccw net presets [NAME]``: the presets are files (mcp_server/fs/netpresets.py: ccw's
  own in ``policies/network/``, the state dir's in ``<state dir>/policies/network/``), so
  the listing reads them here, without a front end or a helper: what it prints is what
  the next ``capsule create --network preset:NAME`` of this state dir expands.  Without a
  name it lists every preset with its rules; with one, each rule with why it is there.
  A user file that cannot be used (bad JSON or field, unsafe owner or mode, a shipped
  preset's name) is printed on stderr with what to change, and the exit status is 1, so
  a person finds out here rather than at the next create.
- ``ccw net pending``, ``ccw net approve ID [--always]``, ``ccw net deny ID --reason
  TEXT``: a connection no rule allows, in a capsule that asks on a miss, waits while a
  person answers (capsules/asks.py).  The questions are rows of the state dir's
  database, answered here directly: the front end holding the connection reads the
  answer (and, for ``--always``, adds the rule to the capsule's live rules, naming who
  answered).  Whoever can run this as the state dir's user is the person; no MCP tool
  answers a question, so an agent cannot approve its own connection.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mcp_server.cli.output import print_json, visible
from mcp_server.config import Config

COMMANDS = ("net",)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw net presets [NAME]``, ``pending``, ``approve`` and ``deny``."""
    net = sub.add_parser("net", parents=[common],
                         help="presets a capsule's rules can name; connections waiting for you",
                         description="Network presets (named rule sets a capsule's allowlist names as preset:NAME), "
                         "and the connections of capsules that ask on a miss, waiting for a person's answer.")
    actions = net.add_subparsers(dest="net_action", metavar="ACTION", required=True)
    presets = actions.add_parser("presets", parents=[common], help="list the presets (NAME: its rules and why)")
    presets.add_argument("name", nargs="?", help="one preset: each of its rules and why it is there")
    actions.add_parser("pending", parents=[common], help="the connections and proposals waiting for a person's answer")
    approve = actions.add_parser("approve", parents=[common],
                                 help="let a waiting connection through, or add a proposal's rules")
    approve.add_argument("id", type=int, help="the question's id (ccw net pending)")
    approve.add_argument("--always", action="store_true", help="add the rule to the capsule's live rules too")
    deny = actions.add_parser("deny", parents=[common], help="refuse a waiting connection or a proposal, telling "
                              "the agent why")
    deny.add_argument("id", type=int, help="the question's id (ccw net pending)")
    deny.add_argument("--reason", required=True, help="what the agent is told")


def run(args: argparse.Namespace, config: Config) -> int:
    """One ``ccw net`` action."""
    import trio

    from mcp_server.capsules import asks
    from mcp_server.cli import frontclient
    from mcp_server.state import State

    if args.net_action == "presets":
        return _presets(args, config)
    state = State(config.state_dir)
    if args.net_action == "pending":
        waiting = [question.to_json() for question in asks.pending(state)]
        if args.json:
            print_json({"pending": waiting})
        else:
            sys.stdout.write(render_pending(waiting))
        return 0
    who = f"uid {os.getuid()} (ccw net)"
    if args.net_action == "approve":
        settled = asks.answer(state, args.id, "capsule" if args.always else "once", who)
    else:
        settled = asks.answer(state, args.id, "denied", who, args.reason)
    if settled.kind == "proposal" and settled.allowed:
        poll = {"capsule_id": settled.capsule_id, "proposal": settled.id}
        trio.run(frontclient.call_tool, config, "capsule_network", poll)
        settled = asks.get(state, settled.id) or settled
    if args.json:
        print_json(settled.to_json())
    elif settled.kind == "proposal":
        told = settled.applied if settled.allowed else settled.reason  # how the rules went in, or why not
        print(visible(f"{settled.id}: {settled.state} (proposal of {settled.proposer} in {settled.capsule_id}: "
                      f"{settled.rule}" + (f"; {told}" if told else "") + ")"))
    else:
        print(visible(f"{settled.id}: {settled.state} ({settled.host}:{settled.port} in {settled.capsule_id})"))
    return 0


def render_pending(waiting: list[dict[str, Any]]) -> str:
    """The pending questions as a person reads them, with the commands that answer them; a
    question's command and reason are an agent's text, its host a jail's: shown as text."""
    if not waiting:
        return "no connection is waiting for an answer\n"
    lines = []
    for question in waiting:
        if question["kind"] == "proposal":
            lines.append(f"{question['id']}: {question['proposer']} proposes for {question['capsule_id']}: "
                         f"{question['rule']} (until {question['expires_at']})")
            lines.append(f"    reason: {question['command']}")
            continue
        lines.append(f"{question['id']}: {question['capsule_id']} asks for {question['protocol']} "
                     f"{question['rule']} ({question['waiters']} waiting, until {question['expires_at']})")
        lines.append(f"    command: {question['command']}")
    lines.append("answer with: ccw net approve ID [--always] | ccw net deny ID --reason TEXT")
    return "\n".join(visible(line) for line in lines) + "\n"


def _presets(args: argparse.Namespace, config: Config) -> int:
    """Print the presets of ``config``'s state dir; 1 if a user file could not be used."""
    from mcp_server.fs.netpresets import catalogue

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
    from mcp_server.fs.netpresets import PRESET

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
