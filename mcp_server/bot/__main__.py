"""``ccw-bot``: serve a REAPI cluster's leases in capsules until interrupted (issue 17).

The command line, and the loop of Remote Workers API sessions (mcp_server/reapi/worker.py)
that hands each lease to ``runner.CapsuleRunner`` over a capsule service of the bot's
own: its state dir, its helper (``CCW_HELPER_SOCKET``, else an embedded one).  A
cluster that is not up yet, or restarts, ends a session; the next one waits for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import trio

from mcp_server.bot.runner import CACHE_MAX_MB, CapsuleRunner
from mcp_server.config import Config
from mcp_server.context import CallContext, Runtime
from mcp_server.reapi.client import ReapiClient
from mcp_server.reapi.worker import BotConfig, BotSession, parse_properties
from mcp_server.state import State
from sandbox.errors import CcwError

RETRY_S = 1.0  # between bot sessions when the cluster is unavailable


def build_parser() -> argparse.ArgumentParser:
    """ccw-bot's command line."""
    from mcp_server import __version__

    parser = argparse.ArgumentParser(prog="ccw-bot",
                                     description="A REAPI worker that runs each action in a ccw capsule.")
    parser.add_argument("--version", action="version", version=f"ccw-bot {__version__}")
    parser.add_argument("--reapi", default=os.environ.get("CCW_REAPI_URL", ""), metavar="URL",
                        help="the cluster, grpc://host:port[/instance] (default CCW_REAPI_URL)")
    parser.add_argument("--bot-id", default=f"ccw-bot-{socket.gethostname()}-{os.getpid()}")
    parser.add_argument("--capacity", type=int, default=os.cpu_count() or 1, help="leases at once (default: cores)")
    parser.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                        help="a platform property to advertise (repeat); the cluster must match on its name")
    parser.add_argument("--state-dir", help="CCW_STATE_DIR for the bot's capsules and journal")
    parser.add_argument("--cache-max-mb", type=int, default=CACHE_MAX_MB,
                        help="input files kept for later leases, least recently used evicted past it "
                             f"(default {CACHE_MAX_MB}; 0: no limit)")
    return parser


async def _sessions(client: ReapiClient, bot: BotConfig, runner: CapsuleRunner, stop: threading.Event) -> None:
    """Bot sessions one after another: a server that restarts (or is not up yet) ends one, the next waits for it."""
    while not stop.is_set():
        try:
            await trio.to_thread.run_sync(BotSession(client, bot, runner).serve, stop)
        except CcwError as error:
            if error.code != "UNAVAILABLE":
                raise
            print(f"ccw-bot {bot.bot_id}: {error.message}; a new session in {RETRY_S} s", flush=True)
            await trio.sleep(RETRY_S)


async def serve(config: Config, url: str, bot: BotConfig, stop: threading.Event,
                cache_max_mb: int = CACHE_MAX_MB) -> None:
    """Serve leases until ``stop`` is set (or SIGINT/SIGTERM)."""
    state = State(config.state_dir)
    runtime = Runtime(config, state)
    try:
        service = CallContext(runtime).capsules
        await service.helper()  # no helper, no bot: say so before taking a lease
        runner = CapsuleRunner(service, trio.lowlevel.current_trio_token(), Path(state.tmp_dir), bot.bot_id,
                               cache_max_mb, bot.capacity)
        with ReapiClient(url) as client, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                async def on_signal() -> None:
                    async for _ in signals:
                        stop.set()

                nursery.start_soon(on_signal)
                await _sessions(client, bot, runner, stop)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await runtime.aclose()
        state.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``ccw-bot``: serve a REAPI cluster's leases in capsules until interrupted."""
    args = build_parser().parse_args(argv)
    try:
        if not args.reapi:
            raise CcwError("INVALID_ARGUMENT", "no cluster: give --reapi URL or set CCW_REAPI_URL")
        config = Config.from_env()
        if args.state_dir:
            config = dataclasses.replace(config, state_dir=os.path.abspath(args.state_dir))
        bot = BotConfig(args.bot_id, max(1, args.capacity), parse_properties(args.property))
        print(f"ccw-bot {bot.bot_id}: serving {args.reapi} with capacity {bot.capacity}", flush=True)
        trio.run(serve, config, args.reapi, bot, threading.Event(), args.cache_max_mb)
    except CcwError as error:
        print(f"ccw-bot: {error.code}: {error.message}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
