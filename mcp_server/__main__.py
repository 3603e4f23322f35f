"""``ccw-mcp``: the front end's process entry point.

Order of life (seed 001 §3, §10, §12):

1. ``Config.from_env()``, open the state dir, load the tool registry.
2. Start the transport chosen by ``MCP_ENDPOINT`` (stdio | socket | http).
3. Once it accepts requests: write ``MCP_READY_FILE`` as ``<pid> <ISO8601 UTC>\\n`` and
   log ``mcp:ready mode=… path=… state_dir=… schemas_dir=…`` on stderr (logs.py: every
   diagnostic goes through ``logging``).
4. Serve.  stdio ends when stdin closes.  The first SIGINT/SIGTERM starts a graceful
   drain: no new connections, requests already read finish and are answered, then the
   process exits; a second signal cancels whatever is left.
5. Log ``mcp:shutdown mode=…``, remove the ready file, close the helper client (which
   stops an embedded helper) and the state dir.

Exit status: 0 after a graceful shutdown, 1 when a second signal cut requests short,
2 when configuration or startup fails (the reason is on stderr, with what to change).

Everything is configured by environment variables (``ccw-mcp --help`` lists them); the
command line has only what does not start a server (``--help``, ``--version``,
``--validate``) and the log settings, which win over their variables.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import trio

from mcp_server import __version__, logs
from mcp_server.config import Config
from mcp_server.logs import LIFECYCLE, LOGGER
from mcp_server.server import CcwServer
from sandbox.errors import CcwError


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_ready_file(path: str) -> bool:
    """Atomically write ``<pid> <ISO8601 UTC>\\n`` to ``path``; False (and a warning) if it cannot be.

    Not fatal: the server is ready whether or not the file says so.  The default
    ``/tmp/mcp.ready`` is one path for every user of the machine, and in the sticky ``/tmp``
    a second user cannot replace the first one's file; that user's server must still
    serve (``mcp:ready`` on stderr says it is), and the warning names ``MCP_READY_FILE``."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {_now_iso()}\n")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        LOGGER.warning(f"mcp:ready_file_failed path={path} error={exc.strerror or exc}: set MCP_READY_FILE "
                       "to a path this user may write (another user's server may hold this one)")
        return False
    return True


def remove_ready_file(path: str) -> None:
    """Remove the ready file if it is still ours (best effort)."""
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as handle:
            owner = handle.read().split(" ", 1)[0]
        if owner == str(os.getpid()):
            os.unlink(path)


async def _watch_signals(
    draining: trio.Event, aborted: trio.Event, cancel: trio.CancelScope, mode: str
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if not draining.is_set():
                LIFECYCLE.info(f"mcp:draining mode={mode} signal={signal.Signals(signum).name}")
                draining.set()
            else:
                LIFECYCLE.warning(f"mcp:abort mode={mode}: second signal, cancelling in-flight requests")
                aborted.set()
                cancel.cancel()
                return


async def run(config: Config) -> int:
    """Serve ``config.endpoint`` until it ends or a signal drains it; the exit status.

    The first ``ccw-mcp`` of a state dir owns it and also serves its frontend.sock; a
    stdio one that comes later relays to that owner, a socket or HTTP one exits 2; an
    owner that is only the ccw command's daemon yields to either (mcp_server/frontdoor.py)."""
    from mcp_server import frontdoor

    daemon = (config.endpoint == "socket"
              and config.socket_path == str(frontdoor.FrontendPaths.of(config.state_dir).socket))
    lock = frontdoor.try_lock(config.state_dir)
    if lock is None and not daemon:
        lock = await _take_from_daemon(config)
    if lock is None and config.endpoint != "stdio":
        owner = frontdoor.owner_of(config.state_dir) or {}
        if owner.get("daemon"):  # the ccw command's own front end, kept busy (a service, a forwarded port)
            raise CcwError("CONFLICT", f"state dir {config.state_dir} is served by the ccw command's front end (pid "
                           f"{owner.get('pid', '?')}), busy with commands, services or forwarded ports: "
                           "`ccw helper stop --force` ends it and them, or choose another CCW_STATE_DIR")
        raise CcwError("CONFLICT", f"state dir {config.state_dir} is served by ccw-mcp pid {owner.get('pid', '?')} "
                       f"({owner.get('endpoint', '?')}); stop it or choose another CCW_STATE_DIR "
                       "(a stdio ccw-mcp would attach to it instead)")
    if lock is None:
        from mcp_server.transports import relay

        frontdoor.refuse_unlike(config)
        return await _serve(config, None, relay.serve)
    try:
        lock.record(config.endpoint, daemon, config)
        async with frontdoor.running_app(config) as app:
            return await _serve(config, app, _owner_transport(config, daemon))
    finally:
        lock.release()


def _owner_transport(config: Config, daemon: bool) -> Any:
    """The owner's endpoint, with the state dir's frontend.sock served beside it."""
    from mcp_server import frontdoor
    from mcp_server.transports import http, stdio, unix

    if daemon:  # the CLI's front end: frontend.sock is its endpoint; it ends when idle
        return functools.partial(frontdoor.serve, idle_s=frontdoor.DAEMON_IDLE_S)
    own = {"stdio": stdio.serve, "socket": unix.serve, "http": http.serve}[config.endpoint]

    async def both(app: CcwServer, draining: trio.Event,
                   task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        others = trio.Event()  # the attached clients drain once our own endpoint has ended
        async with trio.open_nursery() as nursery:
            await nursery.start(frontdoor.serve, app, others)
            async with trio.open_nursery() as own_side:
                own_side.start_soon(_drain_with, draining, others)
                await own(app, draining, task_status=task_status)
                own_side.cancel_scope.cancel()
            others.set()

    return both


async def _drain_with(draining: trio.Event, others: trio.Event) -> None:
    await draining.wait()
    others.set()


async def _take_from_daemon(config: Config) -> Any:
    """The lock, once the front end that holds it, if it is only the ccw command's daemon
    and nobody else is connected to it, has drained and left (frontdaemon.ask_to_yield).
    None when the owner serves an agent (not ours to stop), when the daemon is busy (a
    client, or a service or forwarded port it keeps: this server attaches to it, and its
    client is answered now, not when a person's command ends),
    or when somebody else was quicker."""
    from mcp_server import frontdaemon, frontdoor

    owner = frontdoor.owner_of(config.state_dir) or {}
    if not owner.get("daemon"):
        return None
    said = await trio.to_thread.run_sync(frontdaemon.ask_to_yield, config.state_dir)
    if said == "busy":
        LIFECYCLE.info(f"mcp:frontend the ccw command's front end (pid {owner.get('pid')}) has clients, or keeps "
                       "services or forwarded ports: attaching to it")
        return None
    if said == "now":
        LIFECYCLE.info(f"mcp:frontend the ccw command's front end (pid {owner.get('pid')}) yields")
    else:  # it did not answer the question (another ccw version): stopped as before
        LIFECYCLE.info(f"mcp:frontend asking the ccw command's front end (pid {owner.get('pid')}) to stop")
    # returns once it has exited
    await trio.to_thread.run_sync(functools.partial(frontdaemon.stop_daemon, config.state_dir,
                                                    send_signal=said is None))
    return frontdoor.try_lock(config.state_dir)


async def _serve(config: Config, app: CcwServer | None, transport: Any) -> int:
    """Serve one transport (with ``app``; the relay has none) with ready file, signals and logs."""
    draining = trio.Event()
    aborted = trio.Event()
    ready = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, draining, aborted, nursery.cancel_scope, config.endpoint)
            target = config if app is None else app
            path = await nursery.start(_serve_then_stop, transport, target, draining, nursery.cancel_scope)
            write_ready_file(config.ready_file)
            ready = True
            tools = "relayed" if app is None else len(app.tools.registry.tools)
            LIFECYCLE.info(
                f"mcp:ready mode={config.endpoint} path={path} state_dir={config.state_dir} "
                f"schemas_dir={config.schemas_dir or '-'} tools={tools} ts={_now_iso()}"
            )
    finally:
        if ready:
            LIFECYCLE.info(f"mcp:shutdown mode={config.endpoint} ts={_now_iso()}")
        remove_ready_file(config.ready_file)
    return 1 if aborted.is_set() else 0


async def _serve_then_stop(
    transport: Any, app: CcwServer | Config, draining: trio.Event, stop: trio.CancelScope,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    # The transport returning (stdin closed, drain done) ends the process: stop the
    # signal watcher too.
    await transport(app, draining, task_status=task_status)
    stop.cancel()


def tune_malloc() -> None:
    """Keep freed heap for the next large answer instead of returning it to the kernel.

    Reading a 10,000-line file builds strings and buffers of ~1.4 MB several times over.
    With glibc's defaults a block that size is mmapped and unmapped each time, and a
    freed heap top is trimmed at once, so every large answer pays its page faults again;
    most visibly right after an edit freed the previous ones.  Here blocks up to 32 MiB
    come from the heap, and up to 64 MiB of free heap stays mapped.  Not glibc: no-op.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # <malloc.h>
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 64 << 20)
    mallopt(m_top_pad, 16 << 20)


def build_parser() -> argparse.ArgumentParser:
    """``ccw-mcp``'s command line; the settings table is its epilog."""
    settings = "\n".join(f"  {env:<24} {default or '-':<16} {meaning}" for env, default, meaning in Config.describe())
    parser = argparse.ArgumentParser(
        prog="ccw-mcp",
        description="ccw's MCP server: capsule, file and policy tools over stdio, a unix socket or "
        "Streamable HTTP.  With no arguments it serves MCP_ENDPOINT (default stdio).",
        epilog=f"environment (variable, default, meaning):\n{settings}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ccw-mcp {__version__}")
    parser.add_argument("--log-level", choices=logs.LEVELS, help="overrides CCW_LOG_LEVEL (default info)")
    parser.add_argument("--log-format", choices=logs.FORMATS, help="overrides CCW_LOG_FORMAT (default text)")
    parser.add_argument("--validate", metavar="PATH", help="validate one JSON file against its schema and exit")
    parser.add_argument("--schema", metavar="NAME", help="with --validate: the schema to use")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``ccw-mcp``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.validate is not None:  # seed 001 §10: validate one file and exit
        from mcp_server import validate_cli

        return validate_cli.main(argv)
    logs.configure(args.log_level or "info", args.log_format or "text")
    tune_malloc()
    try:
        config = Config.from_env()
    except CcwError as exc:
        LOGGER.error(f"mcp:error {exc.message}")
        return 2
    logs.configure(args.log_level or config.log_level, args.log_format or config.log_format)
    try:
        return trio.run(run, config)
    except BaseException as exc:
        failure = _ccw_error_in(exc)
        if failure is None:
            raise
        LOGGER.error(f"mcp:error {failure.code}: {failure.message}")
        remove_ready_file(config.ready_file)
        return 2


def _ccw_error_in(exc: BaseException) -> CcwError | None:
    """The CcwError behind a startup failure (trio wraps it in exception groups)."""
    if isinstance(exc, CcwError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _ccw_error_in(inner)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main())
