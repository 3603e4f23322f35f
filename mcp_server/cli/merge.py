"""``ccw capsule merge CAP CAP… [--into new|live] [--dry-run]``: several attempts merged, as a report.

It calls capsule_merge (mcp_server/capsules/merge.py says the base, the steps and what
``--into`` does) on the state dir's front end, as the other capsule commands do, and
prints what the merge gives: the base, each file and how it merged (a git directory kept
whole from one input as one line: capsules/merge_git.py), each conflict with
the base's lines and both sides', each pair of capsules and whether they commute, then
the new capsule or the promotion.  It exits 0 when the merge is clean and, into live,
was written (or would be, with ``--dry-run``), else 1.

A merge that made a capsule prints its id alone on stdout and the report on stderr, as
``create`` and ``fork`` print theirs, so ``M=$(ccw capsule merge F1 F2)`` holds the id.
Every other merge made no capsule, so the report is what it gives and stays on stdout:
a dry run's and a refused merge's say what would be made or why not, and an into-live
merge's says what was promoted, as ``promote`` prints it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mcp_server.cli.output import print_json, visible
from mcp_server.config import Config
from mcp_server.core.hazards import KINDS

VERBS = ("merge",)


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register the verb."""
    merge = verbs.add_parser("merge", parents=[common],
                             help="three-way merge of several capsules against their common base: merge CAP CAP...")
    merge.add_argument("capsule_ids", nargs="+", metavar="CAP")
    merge.add_argument("--into", choices=("new", "live"), default="new",
                       help="new: a capsule holding the merge (default); live: promote it, all or nothing")
    merge.add_argument("--dry-run", action="store_true", help="report the merge, make and write nothing")
    merge.add_argument("--policy", action="append", dest="policies", metavar="NAME",
                       help="into live: the policies promotion checks (repeatable; default: baseline)")
    merge.add_argument("--allow-hazard", action="append", dest="allow_hazards", metavar="KIND", choices=list(KINDS),
                       help="into live: promote this kind of hazard anyway, after reviewing it (repeatable)")


def tool_call(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_merge's arguments."""
    if len(args.capsule_ids) < 2:
        raise SystemExit("ccw: capsule merge needs at least two capsules, e.g. ccw capsule merge CAP1 CAP2")
    call: dict[str, Any] = {"capsule_ids": list(args.capsule_ids), "into": args.into, "dry_run": bool(args.dry_run)}
    for key in ("policies", "allow_hazards"):
        if getattr(args, key):
            call[key] = list(getattr(args, key))
    return call


def _indented(label: str, text: str) -> list[str]:
    lines = text.splitlines() or ["(nothing)"]
    return [f"      {label}:", *(f"        {visible(line)}" for line in lines)]


def _conflicts(result: dict[str, Any]) -> list[str]:
    out = []
    for one in result["conflicts"]:
        ours, theirs = (*one["capsules"], "", "")[:2]
        out.append(f"  CONFLICT {visible(one['path'])}: {one['how']}")
        out.append(f"    base: {one['base']}; {ours}: {one['ours']}; {theirs}: {one['theirs']}")
        for hunk in one["hunks"]:
            out.append(f"    hunk at base line {hunk['line']}:" if hunk["line"] else "    hunk (no base lines):")
            out += _indented("base", hunk["base"]) + _indented(ours, hunk["ours"]) + _indented(theirs, hunk["theirs"])
    return out


def text(result: dict[str, Any], call: dict[str, Any]) -> str:
    """The report of the merge ``call`` asked for, as lines a person reads."""
    from mcp_server.capsules.merge_git import GIT_KEPT, gitdir_of  # not at import: ``ccw --help`` loads no capsules

    base = result["base"]
    where = f"capsule {base['capsule_id']}" if "capsule_id" in base else f"directory {visible(base['directory'])}"
    lines = [f"merge of {', '.join(call['capsule_ids'])} against {where}"]
    kept: dict[tuple[str, str], int] = {}  # a git directory kept whole: one line, not one a path of it
    for one in result["files"]:
        if one["how"] == GIT_KEPT:
            key = (gitdir_of(one["path"]) or one["path"], ", ".join(one["capsules"]))
            kept[key] = kept.get(key, 0) + 1
        else:
            lines.append(f"  {visible(one['path'])}: {one['how']} ({', '.join(one['capsules'])})")
    lines += [f"  {visible(gitdir)}/ ({count} path(s)): {GIT_KEPT} ({capsules})"
              for (gitdir, capsules), count in kept.items()]
    lines += _conflicts(result)
    for pair in result["pairs"]:
        clash = f" at {', '.join(visible(p) for p in pair['conflicts'])}" if pair["conflicts"] else ""
        lines.append(f"  pair {' + '.join(pair['capsules'])}: {pair['verdict']}{clash} ({pair['shared']} shared)")
    if not result["merged"]:
        lines.append(f"refused: {len(result['conflicts'])} conflict(s); nothing was made or written")
    elif call.get("dry_run") and "promote" not in result:
        lines.append("dry run: clean; nothing was made")
    elif "capsule_id" in result:
        lines.append(f"merged into new capsule {result['capsule_id']}")
    else:
        promoted = result["promote"]
        verdict = ("promoted" if promoted["promoted"]
                   else "would promote" if call.get("dry_run") else "refused by policy")
        lines.append(f"{verdict}: {len(promoted['applied'])} path(s); "
                     f"{promoted['policy_report']['details']}".rstrip("; "))
    return "\n".join(lines) + "\n"


def succeeded(result: dict[str, Any], call: dict[str, Any]) -> bool:
    """Clean, and into live promoted (or, in a dry run, passing)."""
    if not result["merged"]:
        return False
    promoted = result.get("promote")
    return promoted is None or bool(promoted["promoted"]
                                    or (call.get("dry_run") and promoted["policy_report"]["passed"]))


def run(args: argparse.Namespace, config: Config) -> int:
    """Call capsule_merge and print its report; 0 if it succeeded (see ``succeeded``), else 1."""
    import trio

    from mcp_server.cli import frontclient, helperctl

    call = tool_call(args)  # bad arguments start no helper
    helperctl.ensure(config, autostart=not args.no_autostart)
    result = trio.run(frontclient.call_tool, config, "capsule_merge", call)
    if args.json:
        print_json(result)
    elif "capsule_id" in result:
        sys.stderr.write(text(result, call))
        print(result["capsule_id"])
    else:
        sys.stdout.write(text(result, call))
    return 0 if succeeded(result, call) else 1
