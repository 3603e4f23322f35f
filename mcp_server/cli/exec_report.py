"""What ``ccw capsule exec`` prints of a finished run: the output not printed as it came, then ccw's notes.

The command's output goes to ours as its progress brings it (output.py ``Echo``); what
is left of it comes from the result, stdout then stderr.  Then, on stderr: the lines the
front end found for the agent (denied connections, what to expose), and one line of
what ended the run.  A timeout is told in this command's words (the limit, ``--timeout-ms``),
not in the result's hint, which names capsule_exec's ``timeout_ms``.
"""

from __future__ import annotations

import sys
from typing import Any

from mcp_server.cli.output import Echo, exec_status, paint, visible
from mcp_server.cli.toolwords import in_cli_words
from sandbox.checks import MAX_TIMEOUT_MS
from sandbox.spec import DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT_MS

TIMEOUT_HELP = (f"kill the command after this many ms (default {DEFAULT_TIMEOUT_MS}: "
                f"{DEFAULT_TIMEOUT_MS // 60_000} min; at most {MAX_TIMEOUT_MS}: 24 h)")


def show_exec(result: dict[str, Any], color_out: bool, color_err: bool, echo: Echo | None = None,
              timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
    """The output ``echo`` has not printed yet, then what ccw has to say about the run (``timeout_ms``:
    the limit it ran under, told in this command's words if it timed out)."""
    # Imported when a run is shown: capsules/exec.py brings the helper's op and reply types,
    # which building the parser (TIMEOUT_HELP) has no need of.
    from mcp_server.capsules.exec import timeout_hint

    echo = echo if echo is not None else Echo()
    sys.stdout.write(echo.rest("stdout", result["stdout"]))
    sys.stdout.flush()
    sys.stderr.write(echo.rest("stderr", result["stderr"]))
    hints = [hint for hint in result.get("hints") or () if hint != timeout_hint(timeout_ms, "timeout_ms")]
    for line in [*(result.get("network_notes") or ()), *hints]:  # hosts the jail named
        print(paint(visible(in_cli_words(line)), "\x1b[33m", color_err), file=sys.stderr)
    unnamed = (result.get("touched_unavailable") or {}).get("not_utf8")  # names ccw cannot carry, and the rename
    if unnamed:
        print(paint(visible(f"ccw: {in_cli_words(unnamed)}"), "\x1b[33m", color_err), file=sys.stderr)
    notes = []
    for stream in ("stdout", "stderr"):  # the helper keeps a stream's head: the rest never reached us
        if result["truncated"][stream]:
            total = f" of {result[f'{stream}_bytes'] / (1 << 20):.1f} MiB" if f"{stream}_bytes" in result else ""
            notes.append(f"{stream} cut after its first {DEFAULT_OUTPUT_CAP >> 20} MiB{total} (the rest is not kept: "
                         f"send it to a file in the capsule, CMD > out.log, and read that)")
    if result.get("timed_out"):
        notes.append(timeout_hint(timeout_ms, "--timeout-ms"))
    if result.get("oom_killed"):
        notes.append("killed: out of memory")
    if result.get("disk_full"):
        notes.append(f"the capsule's disk is full ({result['disk']['limit_mb']} MiB); "
                     "create it with a larger --disk-mb")
    if result.get("signal") and not result.get("timed_out"):  # a timeout's kill is said with it
        notes.append(f"killed by {result['signal']}")
    if notes:
        print(paint(f"ccw: {', '.join(notes)}", "\x1b[33m", color_err), file=sys.stderr)
    return exec_status(result)
