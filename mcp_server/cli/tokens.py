"""``ccw http token rotate``: a fresh bearer token for ``ccw serve --http``.

Without ``CCW_TOKENS_FILE`` an HTTP server accepts the one token it generated in its state
dir (``mcp_server.auth``).  Rotating replaces that file with a fresh token
(``auth.rotate_generated``: made private and renamed into place in one step, never through
a symlink); it only writes the file, so it works whether a server runs or not.  A running
server looks at the file before every request and every second, and from then on refuses
the old token (401) and ends everything opened with it: its sessions, its streams, its
requests in flight (transports/http.py, Revocation).  Runs stay the token name's, so a
client that comes back with the new token fetches them.

With ``CCW_TOKENS_FILE`` the tokens are the operator's: ccw never rewrites that file, and
rotate says to edit it instead (a running server reads it again the same way, and ends what
a token removed from it held).

There is no ``ccw http token show``: ``ccw client-config CLIENT --http HOST:PORT`` already
prints the token where it is needed, in the client's config, and a bare secret on a
terminal is one more copy in a scrollback or a log.  Rotate does not print the new token
for the same reason; it says where it is and what to run next.
"""

from __future__ import annotations

import argparse
from typing import Any

from mcp_server.auth import rotate_generated
from mcp_server.cli.output import print_json
from mcp_server.config import Config
from sandbox.errors import CcwError

COMMANDS = ("http",)
NEXT = "ccw client-config CLIENT --http HOST:PORT"  # what gives a client the new token


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw http token rotate``."""
    http = sub.add_parser("http", parents=[common], help="the bearer token of ccw serve --http",
                          description="Replace the bearer token a `ccw serve --http` generated in the state dir.")
    http.add_argument("subject", choices=("token",), help="token: the generated bearer token")
    http.add_argument("action", choices=("rotate",),
                      help="rotate: a new token; a running server refuses the old one and ends its sessions")


def run(args: argparse.Namespace, config: Config) -> int:
    """Rotate the state dir's generated token, and say what a user does next."""
    if config.tokens_file:
        raise CcwError("CONFLICT", f"CCW_TOKENS_FILE={config.tokens_file} holds this server's tokens, and they are "
                       "the operator's: ccw does not rewrite them.  Edit that file instead (change an entry's "
                       "token, or remove the entry); a running server reads it again within a second, refuses "
                       "the tokens no longer in it and ends their sessions")
    rotation = rotate_generated(config.state_dir)
    if args.json:
        print_json({"path": rotation.path, "replaced": rotation.replaced, "unsafe": rotation.unsafe, "next": NEXT})
        return 0
    print(f"ccw: a new bearer token is in {rotation.path} (mode 0600)"
          + (", in place of the old one: a running ccw serve --http refuses the old one (401) from its next "
             "request, within a second, and ends the sessions opened with it" if rotation.replaced else ""))
    if rotation.unsafe:
        print(f"ccw: what it replaced was {rotation.unsafe}, which a server would have refused: someone else "
              f"may be able to write {config.state_dir}; check who owns it")
    print(f"ccw: give each HTTP client the new token: {NEXT}")
    return 0
