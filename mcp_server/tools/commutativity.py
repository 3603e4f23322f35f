"""capsule_commutativity: which changed files can be promoted separately (seed 003 §9).

An adapter over mcp_server/capsules/commutativity.py, which says what evidence links two
changed files and how the independent sets and conflict pairs follow.
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules.commutativity import Question, commutativity
from mcp_server.capsules.fragments import CAPSULE_ID
from mcp_server.tools.registry import ToolContext, ToolSpec


async def capsule_commutativity(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Which changed files can be promoted separately, with the evidence for each link."""
    question = Question(args["capsule_id"], args.get("target_cmd"), bool(args.get("verify")),
                        args.get("failure_predicate", "exit_code"))
    return await commutativity(ctx.capsules, question)


TOOLS = [
    ToolSpec(
        name="capsule_commutativity",
        family="capsule",
        title="Change commutativity",
        description=(
            "Which changed files can be promoted separately. Links come from imports between Python "
            "files, processes that touched both files, and (verify) measured interactions of target_cmd. "
            "A file several independent groups depend on is a conflict with each of them."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id"], "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "target_cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "verify": {"type": "boolean"},
                "failure_predicate": {"enum": ["exit_code", "timeout"]},
            },
        },
        output_schema={
            "type": "object", "required": ["independent_sets", "conflict_pairs", "evidence"],
            "additionalProperties": False,
            "properties": {
                "independent_sets": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
                "conflict_pairs": {"type": "array", "items": {
                    "type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}},
                "evidence": {"type": "array", "items": {"type": "object"}},
            },
        },
        handler=capsule_commutativity,
        scope="exec",
        aliases=("capsule/commutativity",),
        read_only=True,
        idempotent=True,
    ),
]
