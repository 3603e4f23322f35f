"""capsule_run: wait again for, fetch, cancel or type into a run that answered "running".

An adapter over mcp_server/capsules/run.py, which says how long calls become
runs, who holds the capsule's turn, and how long a finished run is kept; an
interactive exec's input and reads are mcp_server/capsules/console.py's.
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules.console import INPUT_MAX, input_bytes
from mcp_server.capsules.run import CONSOLE_WAIT_MS, WAIT_MS, WAIT_MS_DEFAULT
from mcp_server.tools.exec_result import exec_text
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.errors import CcwError


async def capsule_run(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The run's result once it has ended (what its tool answers), or its status within wait_ms;
    an interactive exec's output since the last read, after the input given is queued."""
    run = ctx.runs.get(args["run_id"])
    typing = args.get("input") is not None or bool(args.get("eof"))
    if run.console is None and (typing or args.get("cursor") is not None):
        raise CcwError("INVALID_ARGUMENT", f"run {run.run_id} is not interactive: input, eof and cursor are for "
                       "runs of capsule_exec with interactive or tty", {"run_id": run.run_id})
    if args.get("cancel"):
        return await ctx.runs.cancel(run)
    if run.console is not None and typing:
        run.console.give(input_bytes("input", args.get("input") or ""), eof=bool(args.get("eof")))
    wait_ms = args.get("wait_ms", WAIT_MS_DEFAULT if run.console is None else CONSOLE_WAIT_MS)
    return await ctx.runs.wait(run, wait_ms, ctx.progress, args.get("cursor"))


TOOLS = [
    ToolSpec(
        name="capsule_run",
        family="capsule",
        title="Fetch or cancel a run",
        description=(
            "Wait again (up to wait_ms) for a run answered as status running: its tool's own result once it "
            "ends. cancel: kill it. Runs end with the server. Of capsule_exec interactive (tty: on a pty): input "
            f"is typed (eof: then end it); answers the output since the last read (default wait {CONSOLE_WAIT_MS} ms)."
        ),
        input_schema={
            "type": "object", "required": ["run_id"], "additionalProperties": False,
            "properties": {
                "run_id": {"type": "string", "minLength": 1, "maxLength": 100},
                "wait_ms": {key: WAIT_MS[key] for key in ("type", "minimum", "maximum")},
                "cancel": {"type": "boolean"},
                "input": {"type": "string", "maxLength": INPUT_MAX},
                "eof": {"type": "boolean"},
                "cursor": {"type": "integer"},  # the handler refuses one outside the output
            },
        },
        # Open: the result of whichever tool started the run, RUN_STATUS, or an interactive exec's answer.
        output_schema={"type": "object"},
        handler=capsule_run,
        text=exec_text,
        scope="exec",
    ),
]
