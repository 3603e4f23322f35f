"""``ccw capsule …``: the capsule tools for people, called on the state dir's front end.

Each command calls one tool over MCP on the state dir's one front end
(``cli/frontclient.py``; ``mcp_server/frontdoor.py`` says why there is one): the
``ccw-mcp`` an agent runs there, or the front-end daemon the command starts.  So a
capsule made here can be used by an agent through ``ccw-mcp`` on the same state dir and
the other way round, and an exec here waits its turn behind the agent's.  Paths in the
arguments are made absolute here (the front end has its own cwd, and refuses relative
ones), and one whose real name is not UTF-8 is refused here as the front end would.
The helper is found or started by ``helperctl.ensure`` first (see there for why it is
detached).

Output: a short human form on stdout (``create`` prints only the id, so
``CAP=$(ccw capsule create .)`` works), the tool's whole structured result with
``--json``.  ``exec`` prints the command's stdout and stderr to ours and exits with its
exit code (128+N when killed by signal N, 124 on timeout, as timeout(1) does); ``replay``
and ``promote`` exit 1 when the replay mismatched or nothing was (or would be) promoted,
with ``--json`` too.
Failures print ``ccw: CODE: message`` on stderr and exit 1 (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from mcp_server.cli import branch, named_values, replay_report
from mcp_server.cli.exec_report import TIMEOUT_HELP, show_exec
from mcp_server.cli.output import (
    Echo,
    Progress,
    color_diff,
    counted,
    exec_status,
    paint,
    print_json,
    run_with_progress,
    use_color,
    visible,
)
from mcp_server.cli.toolwords import in_cli_words
from mcp_server.config import Config
from mcp_server.core import hostpaths
from mcp_server.core.hazards import KINDS
from sandbox.spec import DEFAULT_TIMEOUT_MS

# What a command runs with is imported when it runs (the front-end client, the helper's
# client, trio, policy reports, diffs): building the parser, for ``ccw --help`` or a usage
# error, imports only this module and the argument definitions of the verbs
# (tests/test_cli_imports.py).

# The tools answering through runs (capsules/run.py), whose ``wait_ms`` a command sets to
# None: it has no client timeout to stay under, and waits for the whole run, which ends
# with it.  Named here rather than read from the tool registry, whose loading imports
# every tool module; tests/test_cli_imports.py checks it against the registry.
RUN_TOOLS = frozenset({"capsule_exec", "capsule_replay", "capsule_deltamin", "capsule_race", "capsule_run"})


async def call_tool(config: Config, name: str, args: dict[str, Any], label: str | None = None,
                    echo: Echo | None = None) -> dict[str, Any]:
    """Run tool ``name`` on the state dir's front end (validated as ccw-mcp does, taking its
    turn with every other client's calls); a progress line if ``label``, an exec's output
    printed as it comes by ``echo`` (output.py)."""
    from mcp_server.cli import frontclient

    if name in RUN_TOOLS:
        args = {"wait_ms": None, **args}
    progress = Progress(label, echo=echo) if label else None
    if progress is None:
        return await frontclient.call_tool(config, name, args)
    return await run_with_progress(progress, lambda: frontclient.call_tool(config, name, args, progress,
                                                                           output=echo is not None))


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw capsule <verb>`` under the ``capsule`` subparser ``sub``."""
    verbs = sub.add_subparsers(dest="verb", metavar="VERB", required=True)

    _add_create_parser(verbs, common)
    exec_ = verbs.add_parser("exec", parents=[common],
                             help="run a command in a capsule: ccw capsule exec CAP -- CMD...")
    exec_.add_argument("capsule_id")
    exec_.add_argument("--cwd", help="working directory, relative to the workspace")
    exec_.add_argument("--timeout-ms", type=int, help=TIMEOUT_HELP)
    exec_.add_argument("--stdin-file", help="file whose text is the command's stdin ('-': ours)")
    exec_.add_argument("--interactive", action="store_true",
                       help="type our stdin into it as it runs (its stdout and stderr come as one stream)")
    exec_.add_argument("--tty", action="store_true", help="interactive, on a pseudo-terminal in the jail")
    exec_.add_argument("cmd", nargs="*", help="the command, after --")

    diff = verbs.add_parser("diff", parents=[common], help="what the capsule changed (coloured on a terminal)")
    diff.add_argument("capsule_id")
    diff.add_argument("--stat", action="store_true", help="a summary per file instead of the diff")
    diff.add_argument("--ignored", action="store_true", help="git-ignored files too (promote leaves them behind)")

    _add_promote_parser(verbs, common)

    witness = verbs.add_parser("witness", parents=[common], help="write the capsule's witness (.tar.zst)")
    witness.add_argument("capsule_id")
    witness.add_argument("--no-blobs", action="store_true", help="do not carry the base files the runs read")
    witness.add_argument("--no-compress", action="store_true", help="plain .tar")
    witness.add_argument("--all", action="store_true",
                         help="carry the whole base (.git aside), not only what the runs used")
    witness.add_argument("--max-base-mb", type=int, help="most MiB of base files to carry (default 1024)")

    _add_replay_parser(verbs, common)

    verbs.add_parser("list", parents=[common], help="the capsules in this state dir")

    destroy = verbs.add_parser("destroy", parents=[common], help="remove a capsule and its changes")
    destroy.add_argument("capsule_id")

    fork = verbs.add_parser("fork", parents=[common],
                            help="a new capsule starting from this one's files "
                                "(before a shell session, to keep a witness)")
    fork.add_argument("capsule_id")
    fork.add_argument("-n", "--count", type=int, help="make N forks at once (all or none); prints their ids")

    deltamin = verbs.add_parser("deltamin", parents=[common],
                                help="the smallest part of the change that still fails: ... CAP -- CMD...")
    deltamin.add_argument("capsule_id")
    deltamin.add_argument("--budget-ms", type=int, help="how long the search may take in all (default 600000)")
    deltamin.add_argument("cmd", nargs="*", help="the failing command, after --")
    for module in _own_verbs():
        module.add_parser(verbs, common)


def _add_create_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """``ccw capsule create``: the workspace, limits, network, volatile globs, exposed dirs."""
    create = verbs.add_parser("create", parents=[common], help="make a capsule over a workspace; prints its id")
    create.add_argument("workspace", nargs="?", default=".", help="project directory (default: .)")
    create.add_argument("--base", help="directory to use as the base instead of the live workspace")
    create.add_argument("--memory-mb", type=int, help="per-exec memory limit (MiB)")
    create.add_argument("--disk-mb", type=int, help="size of the capsule's own disk (MiB): all it may write")
    create.add_argument("--pids-max", type=int, help="per-exec process limit")
    create.add_argument("--cpu-ms", type=int, help="per-exec CPU time budget (ms)")
    create.add_argument("--clock-offset-sec", type=int, help="shift the clock the commands see")
    create.add_argument("--env", action="append", metavar="NAME", help="environment variable to pass (repeatable)")
    create.add_argument("--secret", action="append", metavar="NAME",
                        help="a secret of `ccw secret list`: $NAME holds a placeholder the proxy swaps (repeatable)")
    create.add_argument("--network", action="append", metavar="RULE",
                        help="allow connections to RULE through ccw's proxy: host[:port], *.domain[:port], "
                             "IP or CIDR[:port], [IPv6]:port, or preset:NAME, a named set (ccw net presets) "
                             "(repeatable; default: no network)")
    create.add_argument("--volatile", action="append", metavar="GLOB",
                        help="paths whose names change from run to run (like .nyc_output/*.json): replays of "
                             "this capsule's witnesses leave them out of the comparison (repeatable)")
    create.add_argument("--expose", action="append", metavar="DIR",
                        help="show this host directory read-only in the jail, like a toolchain under your home "
                             "(repeatable; never a key store); besides those found by themselves")
    create.add_argument("--no-auto-expose", action="store_true",
                        help="do not look for the toolchains the workspace needs (its .venv, #! lines, your PATH)")
    create.add_argument("--net-max-bytes", type=int, help="per-exec cap on bytes through the proxy (default 1 GiB)")
    create.add_argument("--net-max-connections", type=int, help="per-exec cap on connections (default 512)")
    create.add_argument("--ask-on-miss", action="store_true",
                        help="hold a connection no rule allows while a person answers (ccw net pending, ccw ui, "
                             "or the agent's MCP client), instead of refusing it at once")
    create.add_argument("--ask-timeout-ms", type=int, help="how long a held connection waits (default 30000)")


def _own_verbs() -> list[Any]:
    """The verbs whose parsers and runs live in their own modules (they call no single tool)."""
    from mcp_server.cli import branch, merge, network, race, runlog, services, shell

    return [runlog, services, shell, network, race, merge, branch]



def _add_promote_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """``ccw capsule promote``: policies, hazards allowed, and the scope (what is written)."""
    promote = verbs.add_parser("promote", parents=[common], help="apply the capsule to the workspace if policies pass")
    promote.add_argument("capsule_id")
    promote.add_argument("--policy", action="append", dest="policies", metavar="NAME",
                         help="policy to check (repeatable; default: baseline)")
    promote.add_argument("--dry-run", action="store_true", help="check the policies, change nothing")
    promote.add_argument("--allow-hazard", action="append", dest="allow_hazards", metavar="KIND", choices=list(KINDS),
                         help="promote this kind of hazard anyway, after reviewing it (repeatable: "
                              + ", ".join(KINDS) + "; setuid/setgid bits are never written)")
    promote.add_argument("--include-ignored", action="store_true",
                         help="promote the files the workspace's git ignores too (.pytest_cache/, build/, ...)")
    promote.add_argument("--path", action="append", dest="paths", metavar="GLOB",
                         help="promote only the paths this glob matches (repeatable; ** spans directories)")
    promote.add_argument("--exclude", action="append", dest="exclude", metavar="GLOB",
                         help="leave behind the paths this glob matches (repeatable)")


def _add_replay_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """``ccw capsule replay``: the witness, and what the replayer lets it have (nothing of this shell's)."""
    replay = verbs.add_parser("replay", parents=[common], help="re-run a witness and compare")
    replay.add_argument("witness", help="a witness id (wit_…) or the path of a witness file")
    replay.add_argument("--env", action="append", dest="env_values", metavar="NAME=VALUE",
                        help="a variable the replayed commands get (repeatable); none come from this shell")
    replay.add_argument("--network", action="append", metavar="RULE",
                        help="allow the replayed commands RULE, as capsule create does (default: no network)")
    replay.add_argument("--net-max-bytes", type=int, help="per-exec cap on bytes through the proxy")
    replay.add_argument("--net-max-connections", type=int, help="per-exec cap on connections")
    replay.add_argument("--workspace", help="for a witness made without blobs: the directory to replay over")
    replay.add_argument("--allow-untrusted", action="store_true",
                        help="replay a witness signed by neither this state dir nor a key it trusts "
                             "(ccw witness trust); only if you trust its maker")
    replay.add_argument("--volatile", action="append", metavar="GLOB",
                        help="also leave the paths this glob matches out of the comparison (repeatable)")
    replay.add_argument("--strict-outputs", action="store_true",
                        help="compare the files the witness's git ignores too (by default listed apart)")


def _command(words: list[str]) -> list[str]:
    if not words:
        raise SystemExit("ccw: give the command after --, e.g. ccw capsule exec CAP -- pytest -q")
    return words


def _network_arg(args: argparse.Namespace) -> dict[str, Any] | None:
    """capsule_create's ``network`` from --network/--net-max-*; None: none (the caps alone are an error)."""
    caps = {k: v for k, v in (("max_bytes", args.net_max_bytes), ("max_connections", args.net_max_connections),
                              ("ask_timeout_ms", getattr(args, "ask_timeout_ms", None))) if v is not None}
    if getattr(args, "ask_on_miss", False):
        caps["on_miss"] = "ask"
    if not args.network:
        if caps:
            raise SystemExit("ccw: --net-max-bytes, --net-max-connections and --ask-on-miss need at least one "
                             "--network RULE")
        return None
    return {"allow": list(args.network), **caps}


def tool_call(args: argparse.Namespace) -> tuple[str, dict[str, Any], str | None]:
    """(tool name, arguments, progress label or None) for a parsed ``ccw capsule`` command."""
    verb = args.verb
    if verb == "create":
        return "capsule_create", _create_call(args), None
    if verb == "exec":
        call: dict[str, Any] = {"capsule_id": args.capsule_id, "cmd": _command(args.cmd)}
        if args.cwd:
            call["cwd"] = args.cwd
        if args.timeout_ms is not None:
            call["timeout_ms"] = args.timeout_ms
        if args.stdin_file:
            if args.stdin_file == "-":
                call["stdin"] = sys.stdin.read()
            else:
                with open(args.stdin_file) as stdin:
                    call["stdin"] = stdin.read()
        return "capsule_exec", call, f"exec {' '.join(call['cmd'])[:40]}"
    if verb == "diff":
        return "capsule_diff", {"capsule_id": args.capsule_id, "format": "stat" if args.stat else "unified",
                                "ignored": args.ignored, "max_chars": None}, None  # the whole patch, for git apply
    if verb == "promote":
        return "capsule_promote", _promote_call(args), "promote"
    if verb == "witness":
        call = {"capsule_id": args.capsule_id, "include_blobs": not args.no_blobs,
                "compress": "none" if args.no_compress else "zstd", "carry": "all" if args.all else "used"}
        if args.max_base_mb is not None:
            call["max_base_mb"] = args.max_base_mb
        return "capsule_witness", call, "witness"
    if verb == "replay":
        return "capsule_replay", _replay_call(args), "replay"
    if verb == "list":
        return "capsule_list", {}, None
    if verb == "destroy":
        return "capsule_destroy", {"capsule_id": args.capsule_id}, None
    if verb == "fork":
        return "capsule_fork", {"capsule_id": args.capsule_id,
                                **({"count": args.count} if args.count is not None else {})}, None
    if verb == "deltamin":
        call = {"capsule_id": args.capsule_id, "target_cmd": _command(args.cmd)}
        if args.budget_ms is not None:
            call["budget_ms"] = args.budget_ms
        return "capsule_deltamin", call, "deltamin"
    raise AssertionError(verb)


def _replay_call(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_replay's arguments: the witness, and what the replayer lets it have."""
    key = args.witness
    call: dict[str, Any] = (
        {"witness_id": key} if key.startswith("wit_") and not os.path.exists(key) else {"path": os.path.abspath(key)})
    if args.env_values:
        call["env"] = named_values(args.env_values)
    network = _network_arg(args)
    if network is not None:
        call["network"] = network
    if args.workspace:
        call["workspace"] = _host_path(args.workspace, "workspace")
    if args.allow_untrusted:
        call["allow_untrusted"] = True
    if args.volatile:
        call["volatile"] = list(args.volatile)
    if args.strict_outputs:
        call["strict_outputs"] = True
    return call


def show(verb: str, result: dict[str, Any], args: argparse.Namespace) -> int:
    """Print ``result`` for people; the exit status."""
    color = (use_color(sys.stdout, args.no_color), use_color(sys.stderr, args.no_color))
    shown = _SHOW.get(verb)
    if shown is None:
        print_json(result)
        return 0
    return shown(result, *color)


def _show_create(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    if "capsule_ids" in result:  # fork -n: one id a line
        print("\n".join(result["capsule_ids"]))
        return 0
    print(result["capsule_id"])
    for shown in result.get("exposed") or ():
        print(visible(f"shown read-only: {shown['path']} ({in_cli_words(shown['reason'])})"), file=sys.stderr)
    git = result.get("git") or {}
    if git.get("gitdir"):
        print(visible(f"git dir shown copy-on-write: {git['gitdir']}"), file=sys.stderr)
    elif git.get("note"):
        print(paint(visible(f"ccw: {in_cli_words(git['note'])}"), "\x1b[33m", color_err), file=sys.stderr)
    return 0


def _show_diff(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    sys.stdout.write(color_diff(shown_diff(result["diff"], sys.stdout.isatty()), color_out))
    summary = result["summary"]
    print(f"{summary['added']} added, {summary['modified']} modified, {summary['deleted']} deleted",
          file=sys.stderr)
    for line in _git_lines(result.get("git") or []):
        print(visible(line), file=sys.stderr)
    for note in result.get("notes") or []:  # what promotion leaves behind, and what it would refuse
        print(visible(in_cli_words(note)), file=sys.stderr)
    return 0


def shown_diff(diff: str, terminal: bool) -> str:
    """The diff as written to a terminal: a person reviews it before promoting, and a file's
    escape sequences could erase or rewrite lines of it (cursor up, carriage return), so
    its control characters are shown, tabs and newlines kept.  Elsewhere (a file, a pipe to
    ``git apply``) it stays the exact patch."""
    return visible(diff, keep_newlines=True) if terminal else diff


def _git_lines(gitdirs: list[dict[str, Any]]) -> list[str]:
    """What changed in each git dir outside the workspace, and which refs promotion moved."""
    lines = []
    for one in gitdirs:
        refs = ", ".join(str(ref) for ref in one.get("refs") or ()) or "no refs"
        lines.append(f"git dir {one.get('gitdir')}: {one.get('count', 0)} changed paths ({refs})")
        for moved in one.get("promoted_refs") or ():
            lines.append(f"  {moved.get('ref')} {str(moved.get('old') or '0')[:12]} -> {str(moved.get('new'))[:12]}")
    return lines


def _host_path(path: str, argument: str) -> str:
    """``path`` made absolute here (the front end has its own cwd), and refused here, with the
    front end's words, when its real name is not UTF-8 (core/hostpaths.py): before a helper
    or a front end is started for a call that cannot succeed."""
    absolute = os.path.abspath(path)
    hostpaths.utf8(os.path.realpath(absolute), argument)
    return absolute


def _create_call(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_create's arguments for ``ccw capsule create``."""
    call: dict[str, Any] = {"workspace": _host_path(args.workspace, "workspace")}
    if args.base:
        call["base"] = _host_path(args.base, "base")
    limits = {k: v for k, v in (("memory_mb", args.memory_mb), ("pids_max", args.pids_max),
                                ("cpu_ms", args.cpu_ms), ("disk_mb", args.disk_mb)) if v is not None}
    if limits:
        call["limits"] = limits
    if args.clock_offset_sec is not None:
        call["clock_offset_sec"] = args.clock_offset_sec
    if args.env:
        call["env_whitelist"] = sorted(set(args.env))
    network = _network_arg(args)
    if network is not None:
        call["network"] = network
    if args.volatile:
        call["volatile"] = list(args.volatile)
    if args.secret:
        call["secrets"] = sorted(set(args.secret))
    if args.expose:
        call["expose"] = [_host_path(path, "expose") for path in args.expose]
    if args.no_auto_expose:
        call["auto_expose"] = False
    return call


def _promote_call(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_promote's arguments for ``ccw capsule promote`` (its options are ``branch``'s too)."""
    return branch.promote_call(args)


def _show_promote(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    from mcp_server.cli.policy_report import policy_lines

    report = result["policy_report"]
    for path in result["applied"]:  # names the capsule made
        print(visible(path))
    dry_run = bool(result.get("dry_run"))
    policies = ", ".join(report.get("policies", [])) or "baseline"
    skipped = branch.skipped_lines(result.get("skipped") or [])
    lines = policy_lines(report) + skipped + _git_lines(result.get("git") or [])
    if result["promoted"] or (dry_run and report["passed"]):
        done = "would promote" if dry_run else "promoted"
        print(paint(f"{done}: {len(result['applied'])} paths (policy {policies} passed)", "\x1b[32m", color_err),
              file=sys.stderr)
        for line in lines:
            print(f"  {visible(line)}", file=sys.stderr)
        return 0
    head = "would not promote" if dry_run else "not promoted, nothing written"
    print(paint(f"{head}: policy {policies} failed", "\x1b[31m", color_err), file=sys.stderr)
    for line in lines:
        print(f"  {visible(line)}", file=sys.stderr)
    return 1


def _show_list(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    for capsule in result["capsules"]:
        parent = f" (fork of {capsule['parent']})" if capsule["parent"] else ""
        merged = f" (merge of {', '.join(capsule['merged_from'])})" if capsule.get("merged_from") else ""
        held = f" (frozen: held by {', '.join(capsule['held_by'])})" if capsule.get("held_by") else ""
        state = f"  {capsule['state']}" if capsule.get("state", "ready") not in ("ready", "frozen") else ""
        print(f"{capsule['capsule_id']}  {capsule['created_at']}  execs={capsule['execs']}  "
              f"generation={capsule['generation']}{state}  {visible(capsule['workspace'])}{parent}{merged}{held}")
    return 0


def _show_deltamin(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    """The smallest failing change as a patch on stdout (``git apply`` takes it), what the
    search did and how far to trust it on stderr."""
    from mcp_server.core.unidiff import hunk_count

    sys.stdout.write(color_diff(shown_diff(result["minimal_patch"], sys.stdout.isatty()), color_out))
    units = result.get("units") or []
    hunks = hunk_count(result["minimal_patch"])
    print(visible(f"deltamin: the smallest change that still fails: {counted(hunks, 'hunk')} in "
                  f"{counted(len(units), 'file')} ({', '.join(units) or 'none'}); {counted(result['trials'], 'trial')} "
                  f"({result['cache_hits']} from cache) in {result['elapsed_ms'] / 1000:.1f} s"), file=sys.stderr)
    if not result["one_minimal"]:
        print(paint("ccw: the budget ran out before the search ended: a smaller failing change may exist "
                    "(a larger --budget-ms)", "\x1b[33m", color_err), file=sys.stderr)
    if not result["replay_ok"]:
        print(paint("ccw: this change did not fail again when run alone once more: the failure may be flaky",
                    "\x1b[33m", color_err), file=sys.stderr)
    return 0


def _show_destroy(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    print(f"destroyed {result['capsule_id']}")
    return 0


# How each verb prints its result for people (result, colour on stdout, on stderr) -> exit status.
_SHOW: dict[str, Callable[[dict[str, Any], bool, bool], int]] = {
    "create": _show_create, "fork": _show_create, "exec": show_exec, "deltamin": _show_deltamin,
    "diff": _show_diff, "promote": _show_promote, "witness": replay_report.show_witness,
    "replay": replay_report.show_replay, "list": _show_list, "destroy": _show_destroy,
}


# With --json, the same exit status as the human form: a script reads the outcome from it too.
_JSON_STATUS: dict[str, Callable[[dict[str, Any]], int]] = {
    "exec": exec_status,
    "replay": lambda result: 0 if result["replay_ok"] else 1,
    "promote": lambda result: 0 if result["promoted"] or (result.get("dry_run") and result["policy_report"]["passed"])
    else 1,
}


def run(args: argparse.Namespace, config: Config) -> int:
    """``ccw capsule VERB``: ensure a helper, call the tool, print; the exit status."""
    import trio

    from mcp_server.cli import helperctl

    for module in _own_verbs():
        if args.verb in module.VERBS:
            return int(module.run(args, config))
    if args.verb == "exec" and (args.interactive or args.tty):
        from mcp_server.cli import interactive

        _command(args.cmd)
        return interactive.run(args, config)
    name, call, label = tool_call(args)
    helperctl.ensure(config, autostart=not args.no_autostart)
    echo = Echo() if args.verb == "exec" and not args.json else None  # --json: the output once, in the result
    result = trio.run(call_tool, config, name, call, label, echo)
    if args.json:
        print_json(result)
        return _JSON_STATUS.get(args.verb, lambda _: 0)(result)
    if echo is not None:
        return show_exec(result, use_color(sys.stdout, args.no_color), use_color(sys.stderr, args.no_color), echo,
                         call.get("timeout_ms") or DEFAULT_TIMEOUT_MS)
    return show(args.verb, result, args)
