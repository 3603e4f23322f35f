"""``ccw capsule log CAP`` and ``ccw capsule show CAP RUN``: what ran in a capsule, from its journal.

Both read the state dir's database and nothing else: no helper, no front end, no turn.
So they answer while an agent's command runs in the capsule, and for a destroyed
capsule too (its runs stay in the journal; what they printed goes with the capsule).

``log`` is one line per run: its number, when it started, the change generation it
started on and the one its writes produced, exit status, duration, and how many files
it read and wrote and connections it tried; a run cut short (cancelled while it ran, its
front end gone, its reply lost) is listed with the status ``cut`` and what is known of it.
``show`` is one run whole: its command, cwd, exit and usage, what it printed (the
journal keeps the first MiB of each stream), the files it wrote and read, and its
connections with their verdicts.

Everything shown came from inside a capsule (argv, paths, hosts, output) and is written
with its control characters made visible on a terminal (``output.visible``); ``show
--raw`` prints the output as the command wrote it, as ``ccw capsule exec`` does.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from mcp_server.cli.output import DIM, GREEN, RED, paint, print_json, use_color, visible
from mcp_server.config import Config
from sandbox.errors import CcwError

VERBS = ("log", "show")
SHOW_READ = 40  # read paths listed by ``show`` before "... and N more" (--all lists them all)


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw capsule log`` and ``ccw capsule show``."""
    log = verbs.add_parser("log", parents=[common], help="the runs of a capsule: argv, exit, duration, counts")
    log.add_argument("capsule_id")
    show = verbs.add_parser("show", parents=[common], help="one run of a capsule: its output and touched files")
    show.add_argument("capsule_id")
    show.add_argument("run", type=int, help="the run's number (ccw capsule log lists them)")
    show.add_argument("--all", action="store_true", help="list every file read (default: the first 40)")
    show.add_argument("--raw", action="store_true", help="print the output as the command wrote it, escape "
                      "sequences and all (default on a terminal: control characters made visible)")


def run(args: argparse.Namespace, config: Config) -> int:
    """Print the log or one run; the exit status."""
    from mcp_server.journal import Journal
    from mcp_server.journal_view import exec_detail, exec_summary
    from mcp_server.state import State

    state = State(config.state_dir)
    try:
        journal = Journal(state)
        if journal.capsule(args.capsule_id) is None:
            raise CcwError("NOT_FOUND", f"no capsule {args.capsule_id} in {config.state_dir}; "
                           "ccw capsule list shows the capsules", {"capsule_id": args.capsule_id})
        if args.verb == "log":
            runs = [exec_summary(entry) for entry in journal.execs(args.capsule_id)]
            if args.json:
                print_json({"capsule_id": args.capsule_id, "runs": runs})
            else:
                sys.stdout.write(render_log(runs, use_color(sys.stdout, args.no_color)))
            return 0
        # The one run, and its output alone: a capsule may hold thousands.
        entry = next(iter(journal.execs(args.capsule_id, before=args.run + 1, limit=1)), None)
        if entry is None or entry["seq"] != args.run:
            raise CcwError("NOT_FOUND", f"capsule {args.capsule_id} has no run {args.run}; ccw capsule log "
                           f"{args.capsule_id} lists its runs", {"capsule_id": args.capsule_id, "run": args.run})
        outputs = journal.outputs(args.capsule_id, args.run)
        detail = exec_detail(entry, {stream: outputs.get((args.run, stream)) for stream in ("stdout", "stderr")})
        if args.json:
            print_json(detail)
        else:
            raw = args.raw or not sys.stdout.isatty()
            sys.stdout.write(render_run(detail, use_color(sys.stdout, args.no_color), raw, args.all))
        return 0
    finally:
        state.close()


def _status(run: dict[str, Any]) -> str:
    if run.get("cut_short"):
        return "cut"
    if run["timed_out"]:
        return "timeout"
    if run["signal"]:
        return str(run["signal"])
    return "oom" if run["oom_killed"] and run["exit_code"] != 0 else str(run["exit_code"])


def _duration(ms: int) -> str:
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _generations(run: dict[str, Any]) -> str:
    start, out = run["generation"], run["generation_out"]
    if start is None:
        return "-"
    return f"{start}" if out is None else f"{start}>{out}"


def render_log(runs: list[dict[str, Any]], color: bool) -> str:
    """The runs as a table; "no runs yet" when there are none."""
    if not runs:
        return "no runs yet\n"
    head = (f"{'RUN':>4}  {'STARTED':<8}  {'GEN':<5}  {'EXIT':>7}  {'TIME':>8}  "
            f"{'READ':>5}  {'WROTE':>5}  {'NET':>3}  COMMAND")
    lines = [paint(head, DIM, color)]
    for run in runs:
        status = _status(run)
        shown = paint(f"{status:>7}", GREEN if status == "0" else RED, color)
        reads, writes = ("-" if run[key] is None else str(run[key]) for key in ("reads", "writes"))
        lines.append(f"{run['run']:>4}  {run['started_at'][11:19]:<8}  {_generations(run):<5}  {shown}  "
                     f"{_duration(run['duration_ms']):>8}  {reads:>5}  {writes:>5}  {run['connections']:>3}  "
                     + (f"[service {visible(run['service'])}] " if run.get("service") else "")
                     + f"{visible(shlex.join(run['argv']))}")
    return "\n".join(lines) + "\n"


def _section(title: str, color: bool) -> str:
    return paint(f"--- {title}", DIM, color)


def render_run(detail: dict[str, Any], color: bool, raw: bool, all_reads: bool) -> str:
    """One run for people: header, output, written and read files, connections."""
    usage = ", ".join(f"{k} {v}" for k, v in sorted(detail["usage"].items()) if v is not None)
    lines = [f"run {detail['run']}: {visible(shlex.join(detail['argv']))}",
             f"  cwd {visible(detail['cwd'] or '-')}, started {detail['started_at']}, generation "
             f"{_generations(detail)}",
             f"  exit {_status(detail)} after {_duration(detail['duration_ms'])}" + (f"; {usage}" if usage else "")]
    if detail.get("cut_short"):
        lines.append(f"  cut short: {detail['cut_short']}; what it wrote and printed is not known")
    for stream in ("stdout", "stderr"):
        text, size = detail["output"][stream], detail["output"][f"{stream}_bytes"]
        lines.append(_section(f"{stream} ({size} B)", color))
        if detail["terminal"]:
            lines.append("  (an interactive session: its output went to the terminal, and is not kept)")
        elif text is None:
            lines.append("  (not kept: the capsule was destroyed, or the run predates the output journal)")
        elif text:
            lines.append((text if raw else visible(text, keep_newlines=True)).rstrip("\n"))
    lines.append(_section(f"written ({len(detail['written'])})", color))
    lines += [f"  {visible(path)}" for path in detail["written"]]
    read = detail["read"]
    if read is None:
        lines.append(_section("read (not traced)", color))
    else:
        lines.append(_section(f"read ({len(read)})", color))
        shown = read if all_reads else read[:SHOW_READ]
        lines += [f"  {visible(path)}" for path in shown]
        if len(shown) < len(read):
            lines.append(f"  ... and {len(read) - len(shown)} more (--all lists them)")
    if detail["network"]:
        lines.append(_section(f"connections ({len(detail['network'])})", color))
        for record in detail["network"]:
            verdict = paint("allowed", GREEN, color) if record.get("allowed") else paint("denied", RED, color)
            why = record.get("rule") if record.get("allowed") else record.get("reason")
            lines.append(f"  {verdict} {visible(str(record.get('host')))}:{record.get('port')} "
                         f"({record.get('protocol')}; {visible(str(why or '-'))}; in {record.get('bytes_in', 0)} B, "
                         f"out {record.get('bytes_out', 0)} B)")
            asked = record.get("asked")
            if isinstance(asked, dict):  # a miss a person was asked about (capsules/misses.py)
                lines.append(f"    asked (question {asked.get('question')}): {visible(str(asked.get('answer')))}"
                             f" by {visible(str(asked.get('who') or 'nobody'))}"
                             + (f": {visible(str(asked['reason']))}" if asked.get("reason") else ""))
    return "\n".join(lines) + "\n"
