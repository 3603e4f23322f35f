"""``ccw``: the command for people.

    ccw doctor                      which kernel features work here, and the fix for each missing one
    ccw serve [--endpoint ...]      run the MCP server (ccw-mcp), flags mapped onto its env vars
    ccw capsule VERB ...            create exec diff promote witness replay list destroy deltamin
    ccw helper start|stop|status    the state dir's detached helper (see helperctl.py)
    ccw client-config CLIENT        register ccw-mcp with claude, codex, cursor or vscode (--http: a
                                    running `ccw serve --http`, with its bearer token)
    ccw http token rotate           replace that generated bearer token (see tokens.py)
    ccw net presets [NAME]          the network presets a capsule's rules name as preset:NAME (net.py)
    ccw net pending / approve ID [--always] / deny ID --reason TEXT
                                    connections waiting for a person's answer (net.py)
    ccw witness keys|trust|untrust  whose witnesses replay here without --allow-untrusted (witness.py)
    ccw secret set|list|rm          credentials capsules use without seeing them, bound to hosts (secret.py)
    ccw cluster up                  a local REAPI cluster (BuildGrid) for deltamin and replays (issue 17)

Every command takes ``--json`` (the whole structured result on stdout; a ``CcwError`` as
``{"error": {code, message, details}}``, besides its line on stderr) and the global
``--state-dir`` / ``--helper-socket`` (the same as ``CCW_STATE_DIR`` /
``CCW_HELPER_SOCKET``).  Exit status: the command's own (``capsule exec``), 0 on
success, 1 when the operation failed or refused (a policy, a replay mismatch, a
``CcwError``), 2 for a usage error or bad configuration.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from mcp_server.cli.toolwords import in_cli_words
from sandbox.errors import CcwError


def _common(top: bool) -> argparse.ArgumentParser:
    """Options accepted before the command and after it (``ccw --json doctor``, ``ccw doctor --json``).

    Two instances, because argparse shares action objects with the parsers that use a
    parent: the top level's carries the real defaults; the subcommands' default to
    SUPPRESS, so that they never overwrite a value given before the command.
    """
    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=default(False), help="print JSON")
    common.add_argument("--no-color", action="store_true", default=default(False), help="never colour")
    common.add_argument("--state-dir", default=default(None), help="state dir (CCW_STATE_DIR)")
    common.add_argument("--helper-socket", default=default(None), help="helper socket (CCW_HELPER_SOCKET)")
    common.add_argument("--no-autostart", action="store_true", default=default(False),
                        help="fail instead of starting a detached helper")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    from mcp_server import __version__, logs
    from mcp_server.cli import capsule, clients
    from mcp_server.cli.clients import CLIENTS

    common = _common(top=False)
    parser = argparse.ArgumentParser(prog="ccw", parents=[_common(top=True)],
                                     description="ccw: counterfactual capsule workspaces for coding agents")
    parser.add_argument("--version", action="version", version=f"ccw {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser("doctor", parents=[common], help="which kernel features work here, with fixes")

    serve = sub.add_parser("serve", parents=[common], help="run the MCP server (ccw-mcp)")
    serve.add_argument("--endpoint", choices=("stdio", "socket", "http"), help="MCP_ENDPOINT")
    serve.add_argument("--socket", help="MCP_SOCKET_PATH (implies --endpoint socket)")
    serve.add_argument("--http", metavar="HOST:PORT", help="CCW_HTTP_ADDR (implies --endpoint http)")
    serve.add_argument("--ready-file", help="MCP_READY_FILE")
    serve.add_argument("--tokens-file", help="CCW_TOKENS_FILE (unset: HTTP needs the token it generates in the "
                       "state dir; ccw client-config CLIENT --http HOST:PORT prints it)")
    serve.add_argument("--toolsets", help="CCW_TOOLSETS (comma-separated families, or a profile such as agent)")
    serve.add_argument("--reapi", metavar="URL",
                       help="CCW_REAPI_URL (deltamin's trials and replays on a REAPI cluster)")
    serve.add_argument("--log-level", choices=logs.LEVELS, help="CCW_LOG_LEVEL")
    serve.add_argument("--log-format", choices=logs.FORMATS, help="CCW_LOG_FORMAT")

    cluster = sub.add_parser("cluster", parents=[common], help="a local REAPI cluster (BuildGrid) on loopback")
    cluster.add_argument("action", choices=("up",), help="up: start it, print CCW_REAPI_URL, stop on Ctrl-C")
    cluster.add_argument("--bots", type=int, default=0, help="ccw-bots to start beside it (each with its own helper)")
    cluster.add_argument("--capacity", type=int, default=1, help="leases at once per bot")
    cluster.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                         help="a platform property the bots advertise and jobs may ask for (repeat)")
    cluster.add_argument("--cluster-dir", dest="cluster_state",
                         help="its PostgreSQL and logs (default: a fresh /tmp dir)")

    capsule.add_parsers(sub.add_parser("capsule", parents=[common], help="capsule commands"), common)
    for module in _own_commands():
        module.add_parser(sub, common)

    helper = sub.add_parser("helper", parents=[common], help="the state dir's detached helper")
    helper.add_argument("action", choices=("start", "stop", "status"))
    helper.add_argument("--force", action="store_true",
                        help="stop even while the front end runs services (they end)")

    client = sub.add_parser(
        "client-config", parents=[common], help="config snippet for an MCP client",
        description="Print the snippet that registers ccw-mcp with an MCP client.",
        epilog=clients.TOOLSETS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    client.add_argument("client", choices=CLIENTS)
    client.add_argument("--toolsets", help="CCW_TOOLSETS for the client's ccw-mcp: families and profiles, "
                        "comma-separated (default: all tools); see below")
    client.add_argument("--http", metavar="HOST:PORT", help="call a running `ccw serve --http HOST:PORT` instead "
                        "of starting ccw-mcp: its URL and an Authorization: Bearer header with its token (the "
                        "one generated in the state dir, or CCW_TOKENS_FILE's)")
    client.add_argument("--token-name", help="with --http and CCW_TOKENS_FILE: the entry whose token to use")
    return parser


def _own_commands() -> list[Any]:
    """The top-level commands whose parsers and runs live in their own modules."""
    from mcp_server.cli import net, secret, tokens, ui, watch, witness

    return [watch, ui, tokens, net, witness, secret]


def serve_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment ``ccw serve`` gives ccw-mcp: its flags mapped onto the env vars."""
    env: dict[str, str] = {}
    endpoint = args.endpoint
    if args.socket:
        env["MCP_SOCKET_PATH"] = os.path.abspath(args.socket)
        endpoint = endpoint or "socket"
    if args.http:
        env["CCW_HTTP_ADDR"] = args.http
        endpoint = endpoint or "http"
    if endpoint:
        env["MCP_ENDPOINT"] = endpoint
    for flag, name in (("ready_file", "MCP_READY_FILE"), ("tokens_file", "CCW_TOKENS_FILE"),
                       ("toolsets", "CCW_TOOLSETS"), ("log_level", "CCW_LOG_LEVEL"),
                       ("log_format", "CCW_LOG_FORMAT"), ("reapi", "CCW_REAPI_URL")):
        value = getattr(args, flag)
        if value:
            env[name] = value
    return env


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; everything after the first ``--`` is the command of exec/deltamin.

    Split by hand because argparse's REMAINDER would also swallow options given between
    the capsule id and ``--`` (``exec CAP --timeout-ms 500 -- make``).
    """
    argv = list(argv)
    command: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    if command is not None:
        if not hasattr(args, "cmd"):
            build_parser().error("'--' is only for capsule exec, capsule deltamin and capsule race")
        args.cmd = [*args.cmd, *command]
    return args


def named_values(items: list[str] | None) -> dict[str, str] | None:
    """The variables of repeated ``--env NAME=VALUE`` options (None: none given); a bad one exits 2."""
    if not items:
        return None
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (name, sep, _) in zip(items, pairs, strict=True) if not sep or not name]
    if bad:
        raise SystemExit(f"ccw: --env takes NAME=VALUE, not {bad[0]!r}")
    return {name: value for name, _, value in pairs}


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``ccw``."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.state_dir:
        os.environ["CCW_STATE_DIR"] = os.path.abspath(args.state_dir)
    if args.helper_socket:
        os.environ["CCW_HELPER_SOCKET"] = args.helper_socket
    try:
        return _dispatch(args)
    except CcwError as exc:
        _print_error(exc, bool(getattr(args, "json", False)))
        return 2 if exc.code == "INVALID_ARGUMENT" and args.command == "serve" else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``ccw capsule diff | head``): what it wanted was printed.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe ended


def _print_error(exc: CcwError, as_json: bool) -> None:
    """``output.print_error``; with ``--json``, the whole error on stdout instead of the
    details' lines, as the tool answers it (``{"error": {code, message, details}}``)."""
    from mcp_server.cli.output import print_error, print_json

    print_error(exc, details=not as_json)
    if as_json:
        print_json({"error": exc.to_dict()})


def _dispatch(args: argparse.Namespace) -> int:
    from mcp_server import logs
    from mcp_server.cli.output import print_json, use_color
    from mcp_server.config import Config

    if args.command == "serve":
        os.environ.update(serve_env(args))
        from mcp_server.__main__ import main as serve_main

        return serve_main([])
    if args.command == "cluster":
        from mcp_server.devcluster import cluster

        where = ["--state-dir", args.cluster_state] if args.cluster_state else []
        properties = [arg for item in args.property for arg in ("--property", item)]
        return cluster.main([args.action, "--bots", str(args.bots), "--capacity", str(args.capacity), *where,
                             *properties])  # fmt: skip
    config = Config.from_env()
    logs.configure(config.log_level, config.log_format)
    if args.command == "doctor":
        from mcp_server import doctor

        report = doctor.run(config.state_dir, config.helper_socket or None)
        if args.json:
            print_json(report)
        else:
            sys.stdout.write(doctor.render(report, use_color(sys.stdout, args.no_color)))
        return 0 if report["can_run"] else 1
    if args.command == "client-config":
        from mcp_server.cli import clients

        return clients.run(args.client, config, args.json, args.toolsets, args.http, args.token_name)
    if args.command == "helper":
        from mcp_server.cli import helperctl

        result = helperctl.run(args.action, config.state_dir, args.force, config.helper_socket)
        if args.json:
            print_json(result)
        else:
            print("\n".join(helperctl.describe(args.action, result)))
        return 1 if (args.action == "status" and not result["running"]) or result.get("left_running") else 0
    for module in _own_commands():
        if args.command in module.COMMANDS:
            return int(module.run(args, config))
    if args.command == "capsule":
        from mcp_server.cli import capsule
        from mcp_server.cli.frontclient import CallError

        try:
            return capsule.run(args, config)
        except CallError as exc:
            print(f"ccw: {in_cli_words(exc.message)}", file=sys.stderr)
            return 2
    raise AssertionError(args.command)
