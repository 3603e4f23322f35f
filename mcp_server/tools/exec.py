"""capsule_exec: run a command in a capsule's jail, journaled (seed 003 §2 shape).

An adapter over the capsule service's ``exec`` (mcp_server/capsules/service.py), run as
a run (capsules/run.py): past ``wait_ms`` it answers "running" with a run id for
capsule_run.  What the result means, where seed 003 is silent:

- ``stdout``/``stderr`` are text (UTF-8, undecodable bytes replaced); the journal hashes
  the raw bytes, and ``stdout_bytes``/``stderr_bytes`` count all the command wrote, even
  past the capture cap (``truncated`` says whether the text is whole).
- The result gives the change generation the exec started on and the one it left, and
  ``queued_ms`` how long it waited for the calls on the capsule before it.
- An ``interactive`` exec (``tty``: on a pseudo-terminal) is a run whose answers carry the
  output since the last read and a ``cursor``; capsule_run types into it
  (mcp_server/capsules/console.py).  Its ``stdin``, if any, is its first input.  The
  shapes are in tools/exec_result.py.
- A call that lends a terminal (``ccw capsule shell``: ``ToolContext.terminal``) runs the
  command on it and waits for it whole: the terminal is the caller's until the call ends.

Its spec is listed after capsule_create's (``LISTED_AFTER``), where tools/list showed it
when it lived in tools/capsule.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from mcp_server.capsules import service
from mcp_server.capsules.console import Console, input_bytes
from mcp_server.capsules.exec import STREAM_PROGRESS_MS, exec_request
from mcp_server.capsules.fragments import CAPSULE_ID
from mcp_server.capsules.run import CONSOLE_WAIT_MS, WAIT_MS, WAIT_MS_DEFAULT, Run
from mcp_server.tools.exec_result import EXEC_OUTPUT, exec_result, exec_text
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox import checks
from sandbox.checks import MAX_TIMEOUT_MS
from sandbox.errors import CcwError

LISTED_AFTER = "capsule_create"  # tools/list's place for this module's tools (Registry.load)


async def capsule_exec(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Run a command in a capsule's jail, after the calls queued before it, and journal it; an
    interactive one (``interactive``, ``tty``) answers with its first output and is driven by
    capsule_run (mcp_server/capsules/console.py)."""
    stdin = args.get("stdin")
    terminal = ctx.terminal  # a shell's pty: the call lasts as long as its session
    tty = bool(args.get("tty"))
    if tty or args.get("interactive"):
        if terminal is not None:
            raise CcwError("INVALID_ARGUMENT", "a call that lends a terminal (ccw capsule shell) is interactive "
                           "already: drop interactive and tty")
        console = Console(tty)
        if stdin:  # the first input, typed as capsule_run's would be
            console.give(input_bytes("stdin", stdin))
        stdin = None
    else:
        console = None
    # Checked here under the name the caller sent: the helper checks it again as its op's `argv`.
    request = exec_request(args["capsule_id"], checks.argv("cmd", args["cmd"]), args.get("cwd"), args.get("timeout_ms"),
                           input_bytes("stdin", stdin) if stdin is not None else None)
    if ctx.wants_output and console is None and terminal is None:  # the ccw command prints it as it comes
        request = dataclasses.replace(request, stream=True, progress_ms=STREAM_PROGRESS_MS)

    async def body(run: Run) -> dict[str, Any]:
        with console if console is not None else contextlib.nullcontext():  # its descriptors, for the run
            # The whitelist's values and TERM: the caller's environment (mcp_server/caller.py).
            outcome = await ctx.for_run(run).capsules.exec(request, ctx.caller_env, terminal, console)
            return exec_result(outcome, tty, request.timeout_ms)

    default = CONSOLE_WAIT_MS if console is not None else WAIT_MS_DEFAULT
    wait_ms = args.get("wait_ms", default) if terminal is None else None
    return await ctx.runs.call("capsule_exec", args["capsule_id"], body, wait_ms, ctx.progress, console)


TOOLS = [
    ToolSpec(
        name="capsule_exec",
        family="capsule",
        title="Run in capsule",
        description=(
            "Run `cmd` in the capsule's jail: own namespaces, the workspace at its own path, no network "
            "but its allowlist's (via ccw's proxy); PATH starts with the workspace's .venv/bin. Returns "
            "exit status, output, usage, files read and written, connections tried. Calls on one "
            "capsule queue in order."
        ),
        input_schema={
            "type": "object",
            "required": ["capsule_id", "cmd"],
            "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "cwd": {"type": ["string", "null"],
                        "description": "Relative to the workspace (default: the workspace)."},
                # Its default (sandbox/spec.py DEFAULT_TIMEOUT_MS) is told in a timed-out result's hints,
                # not here: tools/list has no bytes to spare (tests/test_tool_surface.py).
                "timeout_ms": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TIMEOUT_MS},
                "stdin": {"type": ["string", "null"]},
                "wait_ms": WAIT_MS,
                # Their answers carry run_id, output and cursor; capsule_run's description says the rest.
                "interactive": {"type": "boolean"},
                "tty": {"type": "boolean"},  # interactive, on a pseudo-terminal
            },
        },
        output_schema=EXEC_OUTPUT,
        handler=capsule_exec,
        turn=service.EXEC,
        text=exec_text,
        scope="exec",
        aliases=("capsule/exec",),
    ),
]
