"""capsule_race: the same command in several capsules at once, ranked (issue 39).

An adapter over mcp_server/capsules/race.py, which says where the commands run (here, or
on the REAPI cluster ``CCW_REAPI_URL`` names, as deltamin's trials), how
each capsule is measured and judged, and the order of the table.  It is a run
(capsules/run.py) like capsule_exec: past ``wait_ms`` it answers "running" with a run id
for capsule_run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mcp_server.capsules.executors import executor_for
from mcp_server.capsules.fragments import CAPSULE_ID
from mcp_server.capsules.race import MAX_RACERS, Question, race
from mcp_server.capsules.run import RUN_STATUS, WAIT_MS, WAIT_MS_DEFAULT, Run
from mcp_server.capsules.service import EXEC
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox import checks
from sandbox.checks import MAX_TIMEOUT_MS


async def capsule_race(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``cmd`` in each capsule, in parallel up to the cores; the ranked table."""
    question = Question(tuple(args["capsule_ids"]), tuple(checks.argv("cmd", args["cmd"])), args.get("timeout_ms"),
                        args.get("policy") or "baseline")
    values = ctx.caller_env  # the whitelist's values: the caller's (mcp_server/caller.py)

    async def body(run: Run) -> dict[str, Any]:
        # Kept as the run's id (none when the caller waits whole: race makes one), the run's owner's;
        # on the cluster deltamin's trials use, when one is configured (capsules/race_remote.py).
        runner = executor_for(ctx.config.reapi_url, ctx.config.reapi_parallel, ctx.config.reapi_platform) \
            if ctx.config.reapi_url else None
        try:
            return await race(ctx.for_run(run).capsules, question, values, run.run_id or None, run.owner, runner)
        finally:
            if runner is not None:
                runner.close()

    return await ctx.runs.call("capsule_race", None, body, args.get("wait_ms", WAIT_MS_DEFAULT), ctx.progress)


_ROW = {
    "type": "object", "required": ["rank", "capsule_id"],
    "properties": {
        "rank": {"type": "integer", "minimum": 1}, "capsule_id": CAPSULE_ID, "where": {"type": "string"},
        "exit_code": {"type": ["integer", "null"]}, "timed_out": {"type": "boolean"},
        "duration_ms": {"type": "integer"}, "usage": {"type": "object"},
        "diff": {"type": "object", "required": ["files", "lines"],
                 "properties": {"files": {"type": "integer"}, "lines": {"type": "integer"}}},
        "verdict": {"enum": ["passed", "failed", "refused"]}, "verdict_details": {"type": "string"},
        "error": {"type": "object", "required": ["code", "message"]},
    },
}

TOOLS = [
    ToolSpec(
        name="capsule_race",
        family="capsule",
        title="Race capsules",
        description=(
            f"Run cmd in each capsule (<={MAX_RACERS}, as capsule_exec; a core each) or on the REAPI cluster: "
            "rows (exit, time, usage, diff size, promote dry-run verdict) ranked."
        ),
        input_schema={
            "type": "object", "required": ["capsule_ids", "cmd"], "additionalProperties": False,
            "properties": {
                "capsule_ids": {"type": "array", "minItems": 1, "items": CAPSULE_ID},
                "cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "timeout_ms": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TIMEOUT_MS},
                "policy": {"type": "string"},  # default baseline; PolicyStore checks the name
                "wait_ms": WAIT_MS,
            },
        },
        output_schema={"type": "object", "oneOf": [RUN_STATUS, {
            "type": "object", "required": ["order", "policy", "parallel", "executor", "elapsed_ms", "rows"],
            "additionalProperties": False,
            "properties": {
                "race_id": {"type": "string"}, "order": {"type": "string"}, "policy": {"type": "string"},
                "parallel": {"type": "integer"}, "executor": {"type": "string"}, "elapsed_ms": {"type": "integer"},
                "rows": {"type": "array", "items": _ROW},
            },
        }]},
        handler=capsule_race,
        scope="exec",
        # Each capsule's exec keeps its place in that capsule's line from the moment the race is read.
        turn=dataclasses.replace(EXEC, capsules_arg="capsule_ids"),
    ),
]
