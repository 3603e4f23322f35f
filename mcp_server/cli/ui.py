"""``ccw ui``: the state dir's local web dashboard (``mcp_server.ui``).

It serves on loopback only (a non-loopback ``--listen`` is refused) and prints a URL
whose fragment carries a token made for this run: the page sends it on each API call
(``mcp_server/ui/server.py`` says what else guards it).  Promote and destroy go through
the tools (``call_tool``), so the same policies apply as to an agent's calls.
"""

from __future__ import annotations

import argparse
import html
import os
import secrets
import signal
import sys
import webbrowser
from pathlib import Path
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
    # Imported here, not at the top: every ccw command builds this module's parser, and the
    # HTTP transport brings the MCP SDK, a second and a half of CPU at each start.
    import trio

    from mcp_server.transports.http import bind_http, is_loopback, parse_addr

    host, _ = parse_addr(args.listen)
    if not is_loopback(host):
        raise CcwError("PERMISSION_DENIED", f"ccw ui serves loopback only, not {host}: anyone who can reach the "
                       "port could act on your capsules; use --listen 127.0.0.1:PORT (and an SSH tunnel to "
                       "see it from elsewhere)", {"listen": args.listen})
    sock = bind_http(args.listen, has_tokens_file=False)
    trio.run(_serve, args, config, sock)
    return 0


async def _serve(args: argparse.Namespace, config: Config, sock: Any) -> None:
    import trio

    from mcp_server.cli.capsule import call_tool
    from mcp_server.state import State
    from mcp_server.ui.server import Dashboard, serve

    bound, port = sock.getsockname()[:2]
    shown = f"[{bound}]" if ":" in bound else bound
    token = secrets.token_urlsafe(32)
    url = f"http://{shown}:{port}/#token={token}"
    state = State(config.state_dir)
    opener: Path | None = None
    try:
        app = Dashboard(config, state, token, bound, port, call_tool)
        stop = trio.Event()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve, app, sock, stop)
                print(f"ccw ui: {url}", flush=True)
                print("(the URL carries its access token: share it with no one; Ctrl-C stops)", file=sys.stderr,
                      flush=True)
                if not args.no_open:
                    opener = launch_page(state.tmp_dir, port, url)
                    # webbrowser.open may run a launcher and wait for it: not on the server's loop.
                    nursery.start_soon(_open, opener.as_uri())
                async for _ in signals:
                    stop.set()
                    break
    finally:
        if opener is not None:
            opener.unlink(missing_ok=True)
        state.close()


def launch_page(tmp_dir: Path, port: int, url: str) -> Path:
    """A page, readable by this user alone, that sends the browser on to ``url``.

    The browser is started with this file's path, not the URL: a command line is public to
    every local user (``ps``), the token is not to be.
    """
    path = tmp_dir / f"ui-{port}.html"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(url)}">'
                  f'<a href="{html.escape(url)}">ccw ui</a>\n')
    return path


async def _open(url: str) -> None:
    import trio

    try:
        await trio.to_thread.run_sync(webbrowser.open, url)
    except (OSError, ValueError, webbrowser.Error) as exc:  # a bad $BROWSER: the URL above still works
        print(f"ccw ui: could not start a browser ({exc}); open the URL yourself", file=sys.stderr, flush=True)
