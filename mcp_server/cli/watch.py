"""``ccw watch [CAP]``: what the state dir's capsules do, live, one line per event.

It follows the state dir's event stream (mcp_server/events.py) from its database, so it
sees what every process of the state dir does (an agent's MCP server, ``ccw`` commands,
the dashboard) without asking any of them, and costs them nothing.  It starts at the
newest event (``--since 0`` replays the whole stream; ``--since N`` what came after
event N, as a watcher that reconnects would ask) and runs until Ctrl-C, or ``--once``:
print what is there and stop.  ``--json`` prints each event as one JSON line, for tools.

Each line is written from the event's data: paths, argv and hosts came from inside a
capsule and are shown with their control characters made visible.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

from mcp_server.cli.output import (
    CYAN,
    DIM,
    GREEN,
    RED,
    counted,
    json_text,
    paint,
    use_color,
    visible,
)
from mcp_server.config import Config

if TYPE_CHECKING:  # the event log and its state are imported when ccw watch runs, not for the parser
    from mcp_server.events import Event

COMMANDS = ("watch",)
PATHS_SHOWN = 3  # of a run's written files, on its line


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw watch``."""
    watch = sub.add_parser("watch", parents=[common], help="follow what capsules do, live")
    watch.add_argument("capsule_id", nargs="?", help="only this capsule (default: all)")
    watch.add_argument("--since", type=int, metavar="ID",
                       help="start after event ID (0: from the first one; default: from now)")
    watch.add_argument("--once", action="store_true", help="print the events there are and stop")


def run(args: argparse.Namespace, config: Config) -> int:
    """Print events as they come until Ctrl-C (or, with --once, those there are)."""
    import trio

    from mcp_server.events import EventLog
    from mcp_server.state import State

    state = State(config.state_dir)
    log = EventLog(state)
    after = log.last_id() if args.since is None else args.since
    color = use_color(sys.stdout, args.no_color)

    def emit(events: list[Event]) -> None:
        # One write per batch: a busy capsule's watcher should not cost a syscall an event.
        shown = (json_text(event.to_json()) if args.json else line(event, color)
                 for event in events)
        sys.stdout.write("".join(f"{text}\n" for text in shown))
        sys.stdout.flush()

    async def follow() -> None:
        async with contextlib.aclosing(log.follow_batches(after, args.capsule_id)) as batches:
            async for batch in batches:
                emit(batch)

    try:
        if args.once:
            emit(log.since(after, args.capsule_id, limit=1_000_000))
        else:
            trio.run(follow)
    except KeyboardInterrupt:
        pass
    finally:
        state.close()
    return 0


def _argv(data: dict[str, Any]) -> str:
    argv = data.get("argv")
    text = shlex.join(argv) if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else str(argv)
    return visible(text if len(text) <= 80 else text[:79] + "…")


def describe(event: Event, color: bool = False) -> str:
    """What happened, in words (without the time and capsule)."""
    data, kind = event.data, event.kind
    if kind == "run.finished":
        ok = data.get("exit_code") == 0 and not data.get("timed_out")
        status = ("timed out" if data.get("timed_out") else f"killed by signal {data['signal']}" if data.get("signal")
                  else f"exit {data.get('exit_code')}")
        # None: not traced (a rootless helper has no fanotify mount marks), which is not "0 read".
        reads = "reads not traced" if data.get("reads") is None else f"{data.get('reads')} read"
        return (f"run {data.get('seq')} {paint(status, GREEN if ok else RED, color)} in {data.get('duration_ms')} ms: "
                f"{_argv(data)} ({data.get('writes')} written, {reads}, {data.get('connections')} connections)")
    if kind in ("run.queued", "run.started", "run.failed"):
        return _turn(kind, data, color)
    if kind == "files.written":
        paths = [visible(str(p)) for p in data.get("paths", [])[:PATHS_SHOWN]]
        more = data.get("count", 0) - len(paths)
        who = "the running command" if data.get("live") else f"run {data.get('seq')}"
        return f"{who} wrote " + ", ".join(paths) + (f" and {more} more" if more > 0 else "")
    if kind == "files.read":
        dirs = ", ".join(f"{visible(str(d))}/ ({n})" for d, n in data.get("dirs", [])[:PATHS_SHOWN])
        return f"run {data.get('seq')} read {data.get('count')} files, most in {dirs}"
    if kind == "net.connection":
        verdict = paint("allowed", GREEN, color) if data.get("allowed") else paint("denied", RED, color)
        why = data.get("rule") if data.get("allowed") else data.get("reason")
        who = "the running command's" if data.get("live") else f"run {data.get('seq')}"
        return f"{who} connection {verdict}: {visible(str(data.get('host')))}:{data.get('port')} ({visible(str(why))})"
    if kind == "file.changed":
        return f"a tool {data.get('action')} {visible(str(data.get('path')))}"
    if kind == "capsule.created":
        return f"created over {visible(str(data.get('workspace')))}" + (
            f" (fork of {data.get('parent')})" if data.get("parent") else "")
    if kind == "promotion":
        refused = data.get("refused")
        if refused:
            return paint(f"promotion refused: {refused.get('code')}: {visible(str(refused.get('message')))}",
                         RED, color)
        count, made = len(data.get("applied") or []), data.get("branch")
        if made:  # as_branch: a commit, the workspace untouched
            onto = f"branch {visible(str(made.get('name')))}"
            what = f"would commit {count} paths on {onto}" if data.get("dry_run") else \
                f"committed {count} paths on {onto} ({str(made.get('commit'))[:12]})"
            return paint(f"promotion {what}", GREEN, color)
        what = "would apply" if data.get("dry_run") else "applied"
        return paint(f"promotion {what} {count} paths", GREEN, color)
    if kind == "policy.report":
        return f"policy report: {'passed' if data.get('passed') else 'failed'}"
    if kind == "deltamin.trial":
        size = int(data.get("size") or 0)
        what = "trial"
        if data.get("fresh"):  # a confirmation run, before the search, of the whole change or of none
            what = "confirming the whole change" if size else "confirming the empty change"
        return f"deltamin {what}, {counted(size, 'change')}: {data.get('outcome')}"
    rest = " ".join(f"{key}={visible(json.dumps(value))}" for key, value in sorted(data.items()))
    return f"{kind.replace('.', ' ')} {rest}".rstrip()


def _turn(kind: str, data: dict[str, Any], color: bool) -> str:
    """A turn event: a call's place in the capsule's queue, not its run number (the journal
    numbers a run when it ends, and file-tool edits take numbers too)."""
    if kind == "run.failed":
        verb = f"{paint('failed', RED, color)}: {visible(str(data.get('error')))}"
    elif kind == "run.queued":
        verb = "waits for its turn"
    else:
        verb = "started" + (f" after waiting {data.get('waited_ms')} ms" if data.get("waited_ms") else "")
    return f"turn {data.get('ticket')}: {visible(str(data.get('label')))} {verb}"


def line(event: Event, color: bool = False) -> str:
    """One event as ``watch`` prints it: time, capsule, what happened."""
    return (f"{paint(event.at[11:23], DIM, color)} {paint(event.capsule_id or '-', CYAN, color)} "
            f"{describe(event, color)}")
