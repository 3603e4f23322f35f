"""``ccw capsule service start|list|logs|stop``, ``ccw capsule port``, ``pause`` and ``resume``.

Each calls the service tools (mcp_server/tools/services.py) on the state dir's front end,
as the other capsule commands do: a service started here runs in that front end, which
stays up while it holds one (frontdoor.py), and an agent on the same state dir sees it.
Output a service printed is shown with its control characters made visible on a
terminal (``--raw`` prints it as written); ``logs --follow`` polls by cursor until
interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mcp_server.cli import named_values
from mcp_server.cli.output import print_json, visible
from mcp_server.cli.toolwords import in_cli_words
from mcp_server.config import Config

VERBS = ("service", "port", "pause", "resume")
FOLLOW_S = 0.5  # how often logs --follow asks for more


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register the verbs."""
    service = verbs.add_parser("service", parents=[common], help="long-lived processes in a capsule: start, list, "
                               "logs, stop")
    actions = service.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = actions.add_parser("start", parents=[common], help="start a service: ... start CAP NAME -- CMD...")
    start.add_argument("capsule_id")
    start.add_argument("name")
    start.add_argument("cmd", nargs="*", help="the command, after --")  # cli.parse_args splits at "--"
    start.add_argument("--cwd", help="working directory, relative to the workspace")
    start.add_argument("--ready-port", type=int, help="ready once this port of the capsule accepts")
    start.add_argument("--ready-path", help="ready once this path is made (or written again) in the jail")
    start.add_argument("--ready-line", help="ready once a line of its output contains this text")
    start.add_argument("--ready-timeout-ms", type=int,
                       help="how long to wait for --ready-* before answering that it is not ready (default 30000)")
    start.add_argument("--restart", choices=("no", "on-failure", "always"),
                       help="start it again when it exits: never (no, the default), after a failure, or always")
    start.add_argument("--env", action="append", dest="env_values", metavar="NAME=VALUE",
                       help="a variable for the service (repeatable); NAME must be one the capsule was created "
                            "with (capsule create --env NAME), or PATH, HOME, LANG")
    listing = actions.add_parser("list", parents=[common], help="the capsule's services and forwarded ports")
    listing.add_argument("capsule_id")
    logs = actions.add_parser("logs", parents=[common], help="what a service printed")
    logs.add_argument("capsule_id")
    logs.add_argument("name")
    logs.add_argument("--tail", type=int, help="only the last N lines")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing what comes")
    logs.add_argument("--raw", action="store_true", help="print control characters as written")
    stop = actions.add_parser("stop", parents=[common], help="stop a service (SIGTERM, then SIGKILL)")
    stop.add_argument("capsule_id")
    stop.add_argument("name")
    stop.add_argument("--grace-ms", type=int, help="how long SIGTERM has before SIGKILL (default 5000)")
    port = verbs.add_parser("port", parents=[common],
                            help="open a capsule's port on the host's loopback; prints its address")
    port.add_argument("capsule_id")
    port.add_argument("port", type=int)
    port.add_argument("--host-port", type=int, help="the host port (default: any free one)")
    port.add_argument("--close", action="store_true", help="close the forward instead")
    for verb, what in (("pause", "freeze every process of a capsule"), ("resume", "thaw a paused capsule")):
        verbs.add_parser(verb, parents=[common], help=what).add_argument("capsule_id")


def tool_call(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The tool and its arguments for the command line."""
    base = {"capsule_id": args.capsule_id}
    if args.verb in ("pause", "resume"):
        return f"capsule_{args.verb}", base
    if args.verb == "port":
        return "capsule_port", {**base, "port": args.port, **_given(host_port=args.host_port),
                                **({"close": True} if args.close else {})}
    if args.action == "start":
        ready = _given(port=args.ready_port, path=args.ready_path, line=args.ready_line)
        if ready and args.ready_timeout_ms:
            ready["timeout_ms"] = args.ready_timeout_ms
        if not args.cmd:
            raise SystemExit("ccw: give the service's command after --, e.g. ccw capsule service start CAP web "
                             "--ready-port 8000 -- python3 -m http.server 8000")
        return "capsule_service_start", {**base, "name": args.name, "cmd": args.cmd, **_given(
            cwd=args.cwd, restart=args.restart, env=named_values(args.env_values)),
            **({"ready": ready} if ready else {})}
    if args.action == "list":
        return "capsule_service_list", base
    if args.action == "logs":
        return "capsule_service_logs", {**base, "name": args.name, **_given(tail=args.tail)}
    return "capsule_service_stop", {**base, "name": args.name, **_given(grace_ms=args.grace_ms)}


def _given(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def run(args: argparse.Namespace, config: Config) -> int:
    """Call the tool and print its answer; the exit status (1: a start that did not become ready)."""
    import trio

    from mcp_server.cli import frontclient, helperctl

    name, call = tool_call(args)
    helperctl.ensure(config, autostart=not args.no_autostart)
    if name == "capsule_service_logs" and args.follow:
        return trio.run(_follow, config, call, args)
    result = trio.run(frontclient.call_tool, config, name, call)
    if args.json:
        print_json(result)
    else:
        _show(name, result, args)
    return 1 if name == "capsule_service_start" and not result["ready"] else 0


def _show(name: str, result: dict[str, Any], args: argparse.Namespace) -> None:
    terminal = sys.stdout.isatty() and not getattr(args, "raw", False)
    if name == "capsule_port":
        if not result["open"]:
            print(f"closed {result['port']}")
            return
        # Any TCP passes (PostgreSQL's 5432 too): the address is what was opened, the URL a guess.
        print(f"127.0.0.1:{result['host_port']}")
        print(f"ccw: capsule port {result['port']} on 127.0.0.1:{result['host_port']}; if it speaks HTTP: "
              f"{result['url']}", file=sys.stderr)
        if result.get("note"):
            print(f"ccw: {result['note']}", file=sys.stderr)
    elif name in ("capsule_pause", "capsule_resume"):
        print(f"{args.capsule_id}: {'paused' if result['paused'] else 'running'} "
              f"({', '.join(result['runs']) or 'idle'})")
        if result.get("note"):  # a resume of a capsule its forks or a merge hold frozen: by what, and until when
            print(f"ccw: {visible(result['note'])}", file=sys.stderr)
    elif name == "capsule_service_list":
        for one in result["services"]:
            status = "".join(f" {key} {one[key]}" for key in ("exit_code", "signal") if key in one)
            print(f"{one['name']}\t{one['state']}{status}\t{visible(' '.join(one['argv']))}")  # the tabs are ours
            if one.get("reason"):  # what a lost, failed or pending one is waiting for, and how to bring it back
                print(f"  {visible(in_cli_words(one['reason']))}")
        for port in result["ports"]:  # a forward outlives what listened there: say whether anything does now
            now = {True: "listening", False: "nothing listens there now"}.get(port.get("listening"), "not known")
            # Refused: connections from another uid than yours (ccw watch shows whose).
            counts = ", ".join(f"{port[key]} {key}" for key in ("accepted", "refused") if key in port)
            path = f"\t{port['path']}" if "path" in port else ""  # kernel (NAT) or relay: which way your connections go
            counts = f"\t{counts}" if counts else ""
            print(f"port {port['port']}\t127.0.0.1:{port['host_port']}\t{now}{path}{counts}")
    elif name == "capsule_service_logs":
        sys.stdout.write(visible(result["text"], keep_newlines=True) if terminal else result["text"])
    else:
        line = f"{result['name']}: {result['state']}"
        if "why" in result:
            line += f" ({result['why']})"
        print(visible(line))
        if not result.get("ready", True) and result.get("log_tail"):
            sys.stdout.write(visible(result["log_tail"], keep_newlines=True) if terminal else result["log_tail"])


async def _follow(config: Config, call: dict[str, Any], args: argparse.Namespace) -> int:
    import trio

    from mcp_server.cli import frontclient

    since: int | None = None
    terminal = sys.stdout.isatty() and not args.raw
    while True:
        result = await frontclient.call_tool(config, "capsule_service_logs",
                                             {**call, **({"since": since} if since else {})})
        text = result["text"]
        sys.stdout.write(visible(text, keep_newlines=True) if terminal else text)
        sys.stdout.flush()
        since = result["cursor"]
        if result["state"] in ("exited", "failed", "lost", "stopped") and not text:
            return 0
        await trio.sleep(FOLLOW_S)
