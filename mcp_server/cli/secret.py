"""``ccw secret set|list|rm``: the credentials a capsule may use without ever holding them (issue 38).

- ``ccw secret set NAME --host [https://]HOST[:PORT]... [--header NAME] [--format FORMAT]`` with the
  value from a prompt (the default on a terminal, without echo), ``--stdin``, ``--file
  PATH`` (read now), or ``--command CMD`` (run each time the value is needed, ``--timeout``
  seconds at most).  It prints what was bound, never the value.
- ``ccw secret list``: names, hosts, header and format, and where each value comes from.
- ``ccw secret rm NAME``.

Only a person runs these: no MCP tool sets a secret or binds one to a host, so an agent
cannot send a credential somewhere new (fs/secretstore.py keeps them, core/secretbind.py
says what a binding is).  They work on the state dir's file directly, with no front end
or helper running.
"""

from __future__ import annotations

import argparse
import getpass
import os
import stat
import sys
from typing import Any

from mcp_server.cli.output import print_json
from mcp_server.config import Config
from mcp_server.core.secretbind import FORMAT_HELP, check_name, make_binding
from mcp_server.fs.secretstore import DEFAULT_TIMEOUT, MAX_VALUE, SecretStore, StoredSecret
from sandbox.errors import CcwError, wrap_oserror

COMMANDS = ("secret",)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw secret set|list|rm``."""
    secret = sub.add_parser("secret", parents=[common], help="credentials capsules use without seeing them",
                            description="Secrets kept in the state dir, each bound to the hosts it belongs to.")
    verbs = secret.add_subparsers(dest="verb", metavar="VERB", required=True)
    put = verbs.add_parser("set", parents=[common], help="set a secret (value from a prompt, stdin, a file or "
                           "a command)")
    put.add_argument("name", help="the secret's name: the capsule's variable that holds its placeholder")
    put.add_argument("--host", action="append", default=[], required=True, metavar="[https://]HOST[:PORT]",
                     help="a host the value may be sent to (port 443 unless given; repeat for more); "
                     "https:// keeps it inside TLS on any port, as on 443")
    put.add_argument("--header", help="the header that carries it (default Authorization)")
    put.add_argument("--format", dest="fmt", metavar="FORMAT", help=f"where the value goes: {FORMAT_HELP} "
                     "(default 'Bearer {}' in Authorization, '{}' in another header)")
    source = put.add_mutually_exclusive_group()
    source.add_argument("--stdin", action="store_true", help="read the value from stdin (one trailing newline off)")
    source.add_argument("--file", help="read the value from this file now")
    source.add_argument("--command", dest="value_command", metavar="CMD",
                        help="a shell command printing the value, run each time it is needed")
    put.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds --command may take")
    verbs.add_parser("list", parents=[common], help="names, hosts and formats (never values)")
    remove = verbs.add_parser("rm", parents=[common], help="forget a secret")
    remove.add_argument("name")


def _read_file(path: str) -> bytes:
    with wrap_oserror("read the value file", path, "give a readable file holding only the value"):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CcwError("INVALID_ARGUMENT", f"{path} is not a regular file: give a file holding the value, "
                               "or pipe it to --stdin", {"path": path})
            return os.read(fd, MAX_VALUE + 3)
        finally:
            os.close(fd)


def _value(args: argparse.Namespace) -> tuple[str, bytes | None]:
    """Where the value comes from, and the value (None for a command, which runs when needed)."""
    if args.value_command is not None:
        return "command", None
    if args.stdin:
        return "stdin", sys.stdin.buffer.read(MAX_VALUE + 3)
    if args.file is not None:
        return "file", _read_file(args.file)
    if not sys.stdin.isatty():
        raise CcwError("INVALID_ARGUMENT", "stdin is not a terminal, so ccw cannot prompt for the value: give "
                       "--stdin (and pipe it), --file PATH or --command CMD")
    return "prompt", getpass.getpass(f"value of {args.name} (not shown): ").encode()


def _describe(secret: dict[str, Any]) -> str:
    where = f"query parameter {secret['format'][6:]}" if secret["header"] is None else \
        f"{secret['header']}: {secret['format']}"
    source = f"command {secret['command']!r}" if secret.get("command") else secret["source"]
    return f"{secret['name']}  {', '.join(secret['hosts'])}  {where}  (from {source})"


def run(args: argparse.Namespace, config: Config) -> int:
    """Run one ``ccw secret`` verb on the state dir's store."""
    store = SecretStore(config.state_dir)
    if args.verb == "list":
        listed = [secret.listing() for secret in store.secrets()]
        if args.json:
            print_json({"secrets": listed})
        else:
            for secret in listed:
                print(_describe(secret))
            if not listed:
                print("ccw: no secrets; ccw secret set NAME --host HOST sets one")
        return 0
    check_name(args.name)
    if args.verb == "rm":
        return _report(store.remove(args.name), "removed", args.json)
    binding = make_binding(args.name, args.host, args.header, args.fmt)  # checked before asking for the value
    source, value = _value(args)
    return _report(store.put(binding, source, value, args.value_command, args.timeout), "set", args.json)


def _report(secret: StoredSecret, done: str, as_json: bool) -> int:
    listing = secret.listing()
    if as_json:
        print_json({done: listing})
    else:
        print(f"ccw: {done} {_describe(listing)}")
    return 0
