"""``ccw capsule branch CAP NAME``: the capsule's change as a commit on a new git branch.

It calls capsule_promote with ``as_branch`` (mcp_server/capsules/branch.py says what is
checked and how the commit is made), with promote's policy, hazard and scope options.
It prints the new commit's id on stdout and, on stderr, where the branch starts and the
policies' lines; it exits 0 when the branch was made (or, with --dry-run, would be),
else 1.  The work tree and the index are not touched either way.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mcp_server.cli.output import Progress, paint, print_json, run_with_progress, use_color, visible
from mcp_server.config import Config
from mcp_server.core.hazards import KINDS

VERBS = ("branch",)


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register the verb."""
    made = verbs.add_parser("branch", parents=[common],
                            help="commit the capsule's change onto a new git branch off its base commit "
                                 "(work tree and index untouched): branch CAP NAME")
    made.add_argument("capsule_id")
    made.add_argument("name", help="the new branch (git check-ref-format --branch); an existing one is refused")
    made.add_argument("--policy", action="append", dest="policies", metavar="NAME",
                      help="policy to check first (repeatable; default baseline)")
    made.add_argument("--dry-run", action="store_true", help="check the policies, make no branch")
    made.add_argument("--allow-hazard", action="append", dest="allow_hazards", metavar="KIND", choices=list(KINDS),
                      help="commit this kind of hazard anyway, after reviewing it (repeatable)")
    made.add_argument("--include-ignored", action="store_true", help="commit the files the workspace's git ignores too")
    made.add_argument("--path", action="append", dest="paths", metavar="GLOB",
                      help="commit only what this glob matches")
    made.add_argument("--exclude", action="append", dest="exclude", metavar="GLOB",
                      help="leave out what this glob matches")


def tool_call(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_promote's arguments for ``ccw capsule branch``."""
    return {**promote_call(args), "as_branch": args.name}


def promote_call(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_promote's arguments from the options ``ccw capsule promote`` and ``branch`` share."""
    call: dict[str, Any] = {"capsule_id": args.capsule_id, "dry_run": args.dry_run}
    if args.policies:
        call["policies"] = args.policies
    if args.allow_hazards:
        call["allow_hazards"] = sorted(set(args.allow_hazards))
    if args.include_ignored:
        call["include_ignored"] = True
    for key in ("paths", "exclude"):
        if getattr(args, key):
            call[key] = getattr(args, key)
    return call


def show(result: dict[str, Any], color_err: bool) -> int:
    """The commit on stdout, the rest on stderr; 0 if the branch was made (or would be)."""
    from mcp_server.cli.policy_report import policy_lines

    report, made = result["policy_report"], result.get("branch") or {}
    dry_run = bool(result.get("dry_run"))
    lines = policy_lines(report) + skipped_lines(result.get("skipped") or [], "left out")
    if result["promoted"] or (dry_run and report["passed"]):
        if made.get("commit"):
            print(made["commit"])
        done = "would commit" if dry_run else f"committed {made.get('commit', '')[:12]} on"
        head = f"{done} {made.get('name')} (parent {str(made.get('parent'))[:12]}): {len(result['applied'])} paths"
        print(paint(head, "\x1b[32m", color_err), file=sys.stderr)
        status = 0
    else:
        print(paint(f"no branch made: policy {', '.join(report.get('policies') or ['baseline'])} failed",
                    "\x1b[31m", color_err), file=sys.stderr)
        status = 1
    for line in lines:
        print(f"  {visible(line)}", file=sys.stderr)
    return status


def skipped_lines(skipped: list[dict[str, str]], verb: str = "skipped") -> list[str]:
    """One line per reason the scope gives (a project's caches are hundreds of ignored files): how
    many paths it left behind, the first few, how to take them; any other reason, a line a path."""
    hint = {"ignored": "use --include-ignored", "excluded": "drop --exclude", "not in paths": "widen --path"}
    lines = []
    for reason in hint:
        paths = [s["path"] for s in skipped if s["reason"] == reason]
        if paths:
            shown = ", ".join(paths[:3]) + (", …" if len(paths) > 3 else "")
            noun = f"{reason} files" if reason != "not in paths" else "files not in --path"
            lines.append(f"{verb} {len(paths)} {noun}: {shown} ({hint[reason]})")
    return lines + [f"{verb} ({s['reason']}): {s['path']}" for s in skipped if s["reason"] not in hint]


def run(args: argparse.Namespace, config: Config) -> int:
    """Call capsule_promote with as_branch and print what became of it."""
    import trio

    from mcp_server.cli import frontclient, helperctl

    call = tool_call(args)
    helperctl.ensure(config, autostart=not args.no_autostart)
    progress = Progress("branch")
    result = trio.run(run_with_progress, progress,
                      lambda: frontclient.call_tool(config, "capsule_promote", call, progress))
    if args.json:
        print_json(result)
        return 0 if result["promoted"] else 1
    return show(result, use_color(sys.stderr, getattr(args, "no_color", False)))
