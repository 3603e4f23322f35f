"""``ccw witness keys|trust|untrust``: whose witnesses replay here without ``--allow-untrusted``.

    ccw witness keys [--public]            this state dir's public key and the keys it trusts
    ccw witness trust PUBKEY|FILE [--name NAME]
    ccw witness untrust NAME|PUBKEY

A CI runner that should replay a workstation's witnesses runs ``ccw witness keys
--public > ws.pub`` on the workstation and ``ccw witness trust ws.pub --name ws`` on the
runner; its replays then say ``signature: valid (ws)``.  The keys and the list are files
of the state dir (fs/witness_key.py, fs/witness_trust.py), so these commands read and
write them here, without a front end or a helper, and a running server uses the change
from its next replay on.  What trust lets a witness do, and what it does not, is in
fs/witness_key.py and capsules/replay.py: it waives the "not signed here" refusal, never
the replayer's limits on environment, network and files.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp_server.cli.output import print_json, visible
from mcp_server.config import Config
from mcp_server.fs.witness_trust import (
    NAME,
    fingerprint,
    key_argument,
    trust,
    trusted_keys,
    untrust,
)
from mcp_server.statedir import make_state_dir

if TYPE_CHECKING:  # the key's module brings cryptography: imported when ccw witness runs, not for the parser
    from mcp_server.fs.witness_key import WitnessKey

COMMANDS = ("witness",)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw witness keys|trust|untrust``."""
    witness = sub.add_parser("witness", parents=[common],
                             help="witness signing keys: this state dir's, and trusted ones",
                             description="Witness keys: a witness signed by this state dir's key or a trusted one "
                                         "replays here without --allow-untrusted.")
    actions = witness.add_subparsers(dest="witness_action", metavar="ACTION", required=True)
    keys = actions.add_parser("keys", parents=[common], help="this state dir's public key and the trusted ones")
    keys.add_argument("--public", action="store_true",
                      help="print only this state dir's key line, for a file another state dir trusts")
    add = actions.add_parser("trust", parents=[common], help="trust a key: its witnesses replay here")
    add.add_argument("key", metavar="PUBKEY|FILE", help="ccw-ed25519:BASE64, or a file holding it (from keys --public)")
    add.add_argument("--name", help="what replays call the key (default: the file's name for it, or its fingerprint)")
    drop = actions.add_parser("untrust", parents=[common], help="stop trusting a key")
    drop.add_argument("key", metavar="NAME|PUBKEY", help="the name it was trusted under, or the key")


def run(args: argparse.Namespace, config: Config) -> int:
    """Show or change this state dir's witness keys."""
    root = Path(config.state_dir)
    make_state_dir(root)
    from mcp_server.fs.witness_key import WitnessKey

    own = WitnessKey.of_state_dir(root)
    if args.witness_action == "trust":
        raw, comment = key_argument(args.key)
        added = trust(root, raw, args.name or comment, own.public)
        result: dict[str, Any] = {"trusted": added.json()}
        line = f"trusted {added.name}: {added.json()['key']} {added.json()['fingerprint']}"
    elif args.witness_action == "untrust":
        removed = untrust(root, args.key)
        result = {"untrusted": removed.json()}
        line = f"no longer trusted: {removed.name} {removed.json()['fingerprint']}"
    else:
        result = listing(root, own)
        line = render(result, args.public)
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(visible(line, keep_newlines=True).rstrip("\n") + "\n")
    return 0


def listing(root: Path, own: WitnessKey) -> dict[str, Any]:
    """This state dir's key and the trusted ones, as ``keys --json`` prints them."""
    from mcp_server.fs.witness_key import OWN_NAME

    host = socket.gethostname()
    return {"own": {"name": OWN_NAME, "key": own.public_text, "fingerprint": fingerprint(own.public),
                    "suggested_name": host if NAME.fullmatch(host) else None},
            "trusted": [k.json() for k in trusted_keys(root)]}


def render(result: dict[str, Any], public: bool) -> str:
    """``keys`` for a person: with ``public``, the one line another state dir's ``trust`` reads."""
    from mcp_server.fs.witness_key import OWN_NAME

    own = result["own"]
    if public:
        return f"{own['key']} {own['suggested_name'] or ''}".rstrip()
    lines = [f"{OWN_NAME}: {own['key']} {own['fingerprint']}",
             "trusted:" if result["trusted"] else "trusted: none (ccw witness trust PUBKEY|FILE --name NAME)"]
    lines += [f"  {k['name']}: {k['key']} {k['fingerprint']} (since {k['added_at']})" for k in result["trusted"]]
    return "\n".join(lines)
