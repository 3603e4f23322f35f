"""capsule_deltamin: the smallest part of a change that still fails (seed 003 §8).

An adapter over mcp_server/capsules/deltamin.py, which says how the change is split,
searched, checked for flakiness and re-run at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_server.capsules.deltamin import READ_CHANGE, Question, deltamin
from mcp_server.capsules.executors import executor_for
from mcp_server.capsules.fragments import CAPSULE_ID
from mcp_server.capsules.run import RUN_STATUS, WAIT_MS, WAIT_MS_DEFAULT, Run
from mcp_server.core.unidiff import hunk_count
from mcp_server.events import finished
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox import checks


async def capsule_deltamin(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The smallest part of the capsule's change that still makes target_cmd fail."""
    target = list(checks.argv("target_cmd", args["target_cmd"]))  # named as sent: the helper's is `argv`
    question = Question(args["capsule_id"], target, args.get("failure_predicate", "exit_code"),
                        args.get("budget_ms") or 600_000, args.get("confirm_runs"))

    async def body(run: Run) -> dict[str, Any]:
        executor = executor_for(ctx.config.reapi_url, ctx.config.reapi_parallel, ctx.config.reapi_platform)
        try:
            return await deltamin(ctx.for_run(run).capsules, question, executor)
        finally:
            executor.close()

    wait_ms = args.get("wait_ms", WAIT_MS_DEFAULT)
    return await ctx.runs.call("capsule_deltamin", question.capsule_id, body, wait_ms, ctx.progress)


def deltamin_events(result: Mapping[str, Any] | None, error: BaseException | None) -> list[tuple[str, dict[str, Any]]]:
    """A search's end (``ToolSpec.outcome``, told when its run ends): the minimal patch's hunks and
    files and what the search cost; a failed or cancelled search is no event."""
    done = finished(result)
    if done is None:
        return []
    return [("deltamin.done",
             {key: done.get(key) for key in ("replay_ok", "trials", "cache_hits", "elapsed_ms", "one_minimal")}
             | {"minimal": hunk_count(done.get("minimal_patch") or ""), "files": len(done.get("units") or [])})]


EXECUTOR = {
    "type": "object", "required": ["kind"],
    "description": "Where the trials ran: local capsules, or a REAPI cluster (CCW_REAPI_URL) with its counts.",
    "properties": {"kind": {"enum": ["local", "reapi"]}, "executed": {"type": "integer"},
                   "action_cache_hits": {"type": "integer"}, "uploaded_blobs": {"type": "integer"},
                   "uploaded_bytes": {"type": "integer"},
                   "retried": {"type": "integer",
                               "description": "Executes sent again after the server went away or lost inputs"}},
}

TOOLS = [
    ToolSpec(
        name="capsule_deltamin",
        family="capsule",
        title="Minimise failing change",
        description=(
            "The smallest part of the capsule's change (files, then hunks) still making target_cmd fail, "
            "by delta debugging in fresh capsules; a git-apply patch."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id", "target_cmd"], "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "target_cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "failure_predicate": {
                    "oneOf": [
                        {"enum": ["exit_code", "timeout"]},
                        {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                         "properties": {"exit_code": {"type": "integer"}, "stdout_regex": {"type": "string"},
                                        "stderr_regex": {"type": "string"}}},
                    ]
                },
                "budget_ms": {"type": "integer", "minimum": 1000, "maximum": 24 * 3600 * 1000},
                "confirm_runs": {"type": "integer", "minimum": 1, "maximum": 10,
                                 "description": ("Fresh runs of the full and empty change (flakiness check; "
                                                 "default 1).")},
                "wait_ms": WAIT_MS,
            },
        },
        output_schema={"type": "object", "oneOf": [RUN_STATUS, {
            "type": "object",
            "required": ["minimal_patch", "replay_ok", "root_hash", "trials", "cache_hits", "elapsed_ms",
                         "one_minimal"],
            "additionalProperties": False,
            "properties": {
                "minimal_patch": {"type": "string"}, "replay_ok": {"type": "boolean"},
                "root_hash": {"type": "string"}, "units": {"type": "array", "items": {"type": "string"}},
                "trials": {"type": "integer"}, "cache_hits": {"type": "integer"},
                "elapsed_ms": {"type": "integer"}, "one_minimal": {"type": "boolean"},
                "executor": EXECUTOR,
                "notes": {"type": "array", "items": {"type": "string"}},  # capsules/carried.moved_notes
            },
        }]},
        handler=capsule_deltamin,
        outcome=deltamin_events,
        turn=READ_CHANGE,
        scope="exec",
        aliases=("capsule/deltamin",),
        read_only=True,
    ),
]
