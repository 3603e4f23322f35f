"""``ccw capsule race CAP… -- CMD``: the same command in several capsules, as a ranked table.

It calls capsule_race (mcp_server/capsules/race.py says the order and what each column
is) on the state dir's front end, as the other capsule commands do, waiting for the
whole run, and prints one row per capsule, best first.  It exits 0 when the best row
passed (its command exited 0 in time and its policy verdict is ``passed``), else 1, so
a script can ask "did any attempt make it?".
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mcp_server.cli.exec_report import TIMEOUT_HELP
from mcp_server.cli.output import Progress, print_json, run_with_progress, visible
from mcp_server.cli.toolwords import in_cli_words
from mcp_server.config import Config

VERBS = ("race",)
_HEADER = ("rank", "capsule", "exit", "time", "cpu", "rss", "files", "lines", "policy")


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register the verb."""
    race = verbs.add_parser("race", parents=[common],
                            help="run one command in several capsules at once and rank them: race CAP... -- CMD...")
    race.add_argument("capsule_ids", nargs="+", metavar="CAP")
    race.add_argument("--timeout-ms", type=int, help=f"each capsule's: {TIMEOUT_HELP}")
    race.add_argument("--policy", help="the policy of the dry-run verdict (default baseline)")
    race.add_argument("cmd", nargs="*", help="the command, after --")  # cli.parse_args splits at "--"


def tool_call(args: argparse.Namespace) -> dict[str, Any]:
    """capsule_race's arguments (waiting for the whole run: a command has no client timeout)."""
    if not args.cmd:
        raise SystemExit("ccw: give the command after --, e.g. ccw capsule race CAP1 CAP2 -- pytest -q")
    call: dict[str, Any] = {"capsule_ids": list(args.capsule_ids), "cmd": list(args.cmd), "wait_ms": None}
    for key in ("timeout_ms", "policy"):
        if getattr(args, key) is not None:
            call[key] = getattr(args, key)
    return call


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    if "error" in row:
        return (str(row["rank"]), row["capsule_id"], "-", "-", "-", "-", "-", "-",
                visible(f"{row['error']['code']}: {in_cli_words(row['error']['message'])}"))
    usage = row.get("usage") or {}
    exit_text = "timeout" if row["timed_out"] else str(row["exit_code"])
    cpu = usage.get("cpu_ms")
    rss, largest = usage.get("rss_max_kb"), usage.get("rss_max_process_kb")  # rootless: no cgroup total
    memory = f"{rss // 1024}M" if rss is not None else "-" if largest is None else f"{largest // 1024}M*"
    where = row.get("where", "local")  # a row run on the cluster says so beside its capsule
    return (str(row["rank"]), row["capsule_id"] + ("" if where == "local" else f" @{where}"), exit_text,
            f"{row['duration_ms'] / 1000:.1f}s",
            "-" if cpu is None else f"{cpu / 1000:.1f}s", memory,
            *((str(row["diff"]["files"]), str(row["diff"]["lines"])) if "diff" in row else ("-", "-")),
            row["verdict"] if row["verdict"] != "refused" else
            visible(f"refused: {in_cli_words(row.get('verdict_details') or '')}"))


def table(result: dict[str, Any]) -> str:
    """The race's rows as aligned columns, best first, then the order they are ranked by."""
    rows = [_HEADER, *(_cells(row) for row in result["rows"])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER) - 1)]
    lines = ["  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
             for row in rows]
    if any(row[5].endswith("*") for row in rows):
        lines.append("* the largest process's peak: no memory cgroup measured the run's total")
    lines.append(f"ranked: {result['order']}; policy {result['policy']}; {result['parallel']} at once, "
                 f"{result['executor']}, {result['elapsed_ms'] / 1000:.1f}s"
                 + (f"; {result['race_id']} in ccw ui" if result.get("race_id") else ""))
    return "\n".join(lines) + "\n"


def best_passed(result: dict[str, Any]) -> bool:
    """Whether the first row passed: its command and its policy verdict."""
    rows = result["rows"]
    return bool(rows) and "error" not in rows[0] and rows[0]["exit_code"] == 0 and not rows[0]["timed_out"] \
        and rows[0]["verdict"] == "passed"


def run(args: argparse.Namespace, config: Config) -> int:
    """Call capsule_race and print its table; 0 if the best row passed, else 1."""
    import trio

    from mcp_server.cli import frontclient, helperctl

    call = tool_call(args)
    helperctl.ensure(config, autostart=not args.no_autostart)
    progress = Progress("race")
    result = trio.run(run_with_progress, progress,
                      lambda: frontclient.call_tool(config, "capsule_race", call, progress))
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(table(result))
    return 0 if best_passed(result) else 1
