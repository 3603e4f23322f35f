"""capsule_merge: a three-way merge of several capsules' changes against their common base (issue 39).

An adapter over mcp_server/capsules/merge.py, which says how the base is found, the
order of the steps and what ``into`` does; capsules/merge3.py says git's rules for each
path.  ``into: "live"`` goes through capsule_promote's code, so ``policies`` and
``allow_hazards`` mean what they mean there, and it needs the ``promote`` scope; a merge
into a new capsule, or a dry run, needs ``exec`` (``scope_of``).  Not in the ``agent`` profile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mcp_server.capsules.fragments import CAPSULE_ID
from mcp_server.capsules.merge import MAX_INPUTS, MERGE, Question, merge
from mcp_server.core.hazards import KINDS
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.errors import CcwError


async def capsule_merge(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Merge the capsules; a new capsule with the merge, or the merge promoted."""
    unknown = sorted(set(args.get("allow_hazards") or ()) - set(KINDS))
    if unknown:
        raise CcwError("INVALID_ARGUMENT", f"allow_hazards names no hazard kind {unknown}; the kinds are "
                       f"{', '.join(KINDS)}", {"allow_hazards": unknown})
    question = Question(tuple(args["capsule_ids"]), args.get("into") or "new", bool(args.get("dry_run")),
                        tuple(args.get("policies") or ("baseline",)), frozenset(args.get("allow_hazards") or ()))
    return await merge(ctx.capsules, question)


def scope_of(args: Mapping[str, Any]) -> str:
    """``promote`` for a merge written into the live tree; ``exec`` for one that makes a capsule or
    writes nothing (an agent may merge its attempts into a new capsule and test there)."""
    return "promote" if args.get("into") == "live" and not args.get("dry_run") else "exec"


_CONFLICT = {
    "type": "object", "required": ["path", "how", "capsules", "base", "ours", "theirs", "hunks"],
    "properties": {
        "path": {"type": "string"}, "how": {"type": "string"},
        "capsules": {"type": "array", "items": {"type": "string"}},
        "base": {"type": "string"}, "ours": {"type": "string"}, "theirs": {"type": "string"},
        "hunks": {"type": "array", "items": {"type": "object", "required": ["line", "base", "ours", "theirs"]}},
    },
}

TOOLS = [
    ToolSpec(
        name="capsule_merge",
        family="capsule",
        title="Merge capsules",
        description=(
            "Git-style three-way merge of capsules on their common base. into new: a capsule; live: as "
            "capsule_promote. Conflicts (per file: sides, base) write nothing."
        ),
        input_schema={
            "type": "object", "required": ["capsule_ids"], "additionalProperties": False,
            "properties": {
                "capsule_ids": {"type": "array", "minItems": 2, "maxItems": MAX_INPUTS, "items": CAPSULE_ID},
                "into": {"enum": ["new", "live"]},
                "dry_run": {"type": "boolean"},
                "policies": {"type": "array", "maxItems": 16},  # PolicyStore checks each name
                "allow_hazards": {"type": "array", "maxItems": 8},  # checked against KINDS by the handler
            },
        },
        output_schema={
            "type": "object", "additionalProperties": False,
            "required": ["merged", "written"],
            "properties": {
                "base": {"type": "object"}, "merged": {"type": "boolean"},
                "files": {"type": "array", "items": {"type": "object"}}, "counts": {"type": "object"},
                "conflicts": {"type": "array", "items": _CONFLICT},
                "pairs": {"type": "array", "items": {"type": "object", "required": ["capsules", "verdict"]}},
                "written": {"type": "boolean"}, "capsule_id": CAPSULE_ID,
                "promote": {"type": "object"},  # into live: capsule_promote's result
            },
        },
        handler=capsule_merge,
        # a place in each input's line, and in each one's parent's, on arrival
        turn=dataclasses.replace(MERGE, capsules_arg="capsule_ids", parent_too=True),
        scope="promote",
        scope_of=scope_of,
        other_scopes=("exec",),
        destructive=True,
    ),
]
