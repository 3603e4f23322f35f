"""capsule_run: wait again for, fetch or cancel a run that answered "running".

An adapter over mcp_server/capsules/run.py, which says how long calls become
runs, who holds the capsule's turn, and how long a finished run is kept.
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules.run import WAIT_MS, WAIT_MS_DEFAULT
from mcp_server.tools.capsule import exec_text
from mcp_server.tools.registry import ToolContext, ToolSpec


async def capsule_run(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The run's result once it has ended (what its tool answers), or its status within wait_ms."""
    run = ctx.runs.get(args["run_id"])
    if args.get("cancel"):
        return await ctx.runs.cancel(run)
    wait_ms = args.get("wait_ms", WAIT_MS_DEFAULT)
    return await ctx.runs.wait(run, wait_ms, ctx.progress)


TOOLS = [
    ToolSpec(
        name="capsule_run",
        family="capsule",
        title="Fetch or cancel a run",
        description=(
            "Wait again (up to wait_ms) for a run answered as status running: its tool's own result once it "
            "ends. cancel: kill it. Runs end with the server."
        ),
        input_schema={
            "type": "object", "required": ["run_id"], "additionalProperties": False,
            "properties": {
                "run_id": {"type": "string", "minLength": 1, "maxLength": 100},
                "wait_ms": {key: WAIT_MS[key] for key in ("type", "minimum", "maximum")},
                "cancel": {"type": "boolean"},
            },
        },
        # Open: the result of whichever tool started the run, or RUN_STATUS.
        output_schema={"type": "object"},
        handler=capsule_run,
        text=exec_text,
        scope="exec",
    ),
]
